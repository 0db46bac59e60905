"""One-time start tickets: what a driver's start carries instead of a credential.

Whatever starts a study's driver can be read by others: a Ray job's ``runtime_env`` by anything
on the cluster (Ray's job API, ``ray.util.state``, the dashboard), a RayJob by whoever reads
RayJobs, a process's environment by its user's other processes. So a dispatch carries no
credential, only a **ticket** (``ftt_`` and 43 random characters) that the driver exchanges,
once, for its credential (:mod:`.api.routes_driver`, ``POST /v1/driver/studies/<id>/ticket``):

1. the scheduler issues a ticket with each dispatch attempt (:func:`issue`) and hands it to the
   backend, which puts it in the driver's environment (``FEDTUNE_DRIVER_TICKET``); the
   database keeps its SHA-256 only, with its study, attempt and expiry
   (``FEDTUNE_DRIVER_TICKET_TTL_S``);
2. the driver redeems it (:func:`redeem`): the answer holds a fresh driver credential
   (``ftd_…``: the ``/v1/driver`` routes of that study, as that attempt; its SHA-256 is kept)
   and its project's MLflow login, which the driver holds in memory only;
3. a ticket redeemed a second time — by whoever read it, before or after the driver — marks the
   attempt **compromised** (``compromised_at``): the credential it was exchanged for stops
   working (401 on every driver route, :func:`verify`), the scheduler stops the attempt's
   driver and re-dispatches the study with a new attempt and a new ticket
   (:func:`compromised_running`, ``reconcile.reconcile_running``), and the study shows the event
   (:func:`events`). An expired ticket is refused (401), spent or not: past its expiry a reuse
   is no longer a race with the driver's own start. A ticket of another study is refused as an
   unknown one (404: no existence oracle).

A ticket or credential is never logged, stored or put in an error: only their digests are kept,
and the log names the study and attempt.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from fedtune.errors import ConflictError

from .db import Database
from .errors import InvalidTokenError, StudyNotFoundError
from .models import DriverTicket, Study, utcnow
from .states import StudyState

__all__ = [
    "TICKET_PREFIX",
    "TOKEN_PREFIX",
    "DriverAccess",
    "Redeemed",
    "TicketEvent",
    "compromised_running",
    "digest",
    "events",
    "issue",
    "redeem",
    "verify",
]

log = logging.getLogger(__name__)

TICKET_PREFIX, TOKEN_PREFIX = "ftt_", "ftd_"
#: what a study shows for an attempt whose ticket was redeemed twice
COMPROMISED = "driver_ticket_reused"


def digest(secret: str) -> str:
    """SHA-256 of a ticket or a driver credential, in hex (what the database keeps)."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Redeemed:
    """A ticket exchanged for its driver credential."""

    attempt: int
    token: str
    project: str | None

    def __repr__(self) -> str:  # never the credential
        return f"Redeemed(attempt={self.attempt}, project={self.project!r})"


@dataclass(frozen=True)
class DriverAccess:
    """What a driver credential opens: its study as ``attempt``, while ``current`` is the
    study's own attempt (a superseded driver's writes are refused)."""

    attempt: int
    current: int


@dataclass(frozen=True)
class TicketEvent:
    """An attempt whose ticket was redeemed twice, as the study shows it."""

    at: dt.datetime
    attempt: int


def issue(session: Session, study_id: str, attempt: int, ttl_s: float) -> str:
    """A new ticket for one dispatch attempt of a study (its digest added to the session).

    Args:
        session: the transaction the dispatch is written in.
        study_id: the study.
        attempt: the dispatch attempt the ticket starts.
        ttl_s: seconds until it expires unredeemed (``FEDTUNE_DRIVER_TICKET_TTL_S``).

    Returns:
        The ticket: give it to the driver's start only.
    """
    ticket = TICKET_PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    session.add(
        DriverTicket(
            study_id=study_id,
            attempt=attempt,
            ticket_hash=digest(ticket),
            created_at=now,
            expires_at=now + dt.timedelta(seconds=ttl_s),
        )
    )
    session.flush()
    return ticket


def redeem(db: Database, study_id: str, ticket: str) -> Redeemed:
    """Exchange a ticket for its driver credential, once (see the module docstring).

    Args:
        db: the service database.
        study_id: the study the caller names (the ticket must be of that study).
        ticket: the ticket.

    Returns:
        The attempt, the new credential and the study's project.

    Raises:
        StudyNotFoundError: no such ticket for that study.
        InvalidTokenError: the ticket expired unredeemed.
        ConflictError: the ticket was redeemed before: the attempt is now compromised.
    """
    hashed, now = digest(ticket), utcnow()
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with db.session() as session:
        row = session.execute(
            select(DriverTicket.id, DriverTicket.attempt, DriverTicket.expires_at, Study.project)
            .join(Study, Study.id == DriverTicket.study_id)
            .where(DriverTicket.ticket_hash == hashed, DriverTicket.study_id == study_id)
        ).first()
        if row is None:
            raise StudyNotFoundError(f"no study {study_id!r}")
        ticket_id, attempt, expires_at, project = row
        if expires_at <= now:  # spent or not: dead, and no longer a sign of a race
            log.warning(
                "study %s: an expired start ticket of attempt %d was presented", study_id, attempt
            )
            raise InvalidTokenError(
                f"the start ticket of attempt {attempt} of study {study_id} expired unredeemed "
                "(FEDTUNE_DRIVER_TICKET_TTL_S)"
            )
        won = session.execute(
            update(DriverTicket)
            .where(DriverTicket.id == ticket_id, DriverTicket.redeemed_at.is_(None))
            .values(redeemed_at=now, token_hash=digest(token))
            .execution_options(synchronize_session=False)
        ).rowcount
        if won == 1:
            log.info("study %s: attempt %d's start ticket redeemed", study_id, attempt)
            return Redeemed(attempt, token, project)
        session.execute(
            update(DriverTicket)
            .where(DriverTicket.id == ticket_id, DriverTicket.compromised_at.is_(None))
            .values(compromised_at=now)
            .execution_options(synchronize_session=False)
        )
    log.warning(
        "study %s: attempt %d's start ticket was redeemed a second time: the attempt is "
        "compromised, its driver credential revoked; the study is re-dispatched",
        study_id,
        attempt,
    )
    raise ConflictError(
        f"the start ticket of attempt {attempt} of study {study_id} was already redeemed: "
        "the attempt is marked compromised and its driver credential revoked"
    )


def verify(session: Session, study_id: str, token: str) -> DriverAccess | None:
    """What a driver credential opens, in one query.

    Args:
        session: a session.
        study_id: the study the caller names.
        token: the credential (``Authorization: Bearer``).

    Returns:
        The attempt it is valid for and the study's current one; None for anything that is no
        credential of that study.

    Raises:
        InvalidTokenError: it was, but its attempt was marked compromised (revoked).
    """
    if not token.startswith(TOKEN_PREFIX):
        return None
    # looked up by its SHA-256: what is compared is no secret, so no constant-time compare
    row = session.execute(
        select(DriverTicket.attempt, DriverTicket.compromised_at, Study.attempts)
        .join(Study, Study.id == DriverTicket.study_id)
        .where(DriverTicket.token_hash == digest(token), DriverTicket.study_id == study_id)
    ).first()
    if row is None:
        return None
    if row.compromised_at is not None:
        raise InvalidTokenError(
            f"the driver credential of attempt {row.attempt} of study {study_id} was revoked: "
            "its start ticket was redeemed twice"
        )
    return DriverAccess(row.attempt, row.attempts)


def compromised_running(session: Session) -> list[tuple[str, int]]:
    """Running studies whose current attempt was marked compromised.

    Args:
        session: a session.

    Returns:
        ``(study id, attempt)`` pairs: the scheduler stops their drivers and re-dispatches them.
    """
    rows = session.execute(
        select(Study.id, Study.attempts)
        .join(
            DriverTicket,
            (DriverTicket.study_id == Study.id) & (DriverTicket.attempt == Study.attempts),
        )
        .where(Study.state == StudyState.RUNNING, DriverTicket.compromised_at.is_not(None))
        .distinct()
    )
    return [(study_id, int(attempt)) for study_id, attempt in rows]


def events(session: Session, study_id: str) -> list[TicketEvent]:
    """The study's attempts marked compromised, oldest first.

    Args:
        session: a session.
        study_id: the study.

    Returns:
        One event per compromised ticket.
    """
    rows = session.execute(
        select(DriverTicket.compromised_at, DriverTicket.attempt)
        .where(DriverTicket.study_id == study_id, DriverTicket.compromised_at.is_not(None))
        .order_by(DriverTicket.compromised_at, DriverTicket.attempt)
    )
    return [TicketEvent(at, int(attempt)) for at, attempt in rows]
