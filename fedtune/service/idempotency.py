"""One check per submission: a retry whose ``Idempotency-Key`` is still being checked waits for
that check's answer instead of starting another.

A submission with uploaded code is checked in a sandbox (:mod:`.code_check`) for up to
``FEDTUNE_CODE_CHECK_TIMEOUT_S``; a client that gave up waiting sends the same request again,
with the same key. :func:`once` runs the work of the first request with a key and makes every
other request with that key wait for its outcome:

1. the first request *claims* the key: it inserts a row of ``idempotency_claims`` (key, request
   hash, ``claimed_at``) in a transaction of its own, before the check. The primary key decides
   between concurrent requests, so this holds across every API replica that shares the database;
2. a request that finds a claim (it reads before it inserts: no failed insert per poll) reads it: another body → 409 ``idempotency_key_reused``;
   a refusal stored there → the same refusal (the first request's 4xx, e.g. the check's 422);
   else it logs once that it waits, and polls every :data:`POLL_S` for the first request's
   outcome — the study it created (``replay``), a refusal, or the claim gone (the first request
   failed on a 5xx: it may claim the key itself) — for as long as the check may take,
   :func:`wait_bound_s`, then answers 409 ``submission_in_progress`` with ``Retry-After`` (the
   SDK retries it);
3. the first request, once answered, deletes its claim (a 4xx: keeps it with the answer for
   :data:`REFUSAL_KEPT_S`). An unanswered claim older than :data:`STALE_AFTER` bounds is stale
   (its replica died mid-check): the next request with the key takes it over. Rows older than
   :data:`SWEEP_AFTER_S` are deleted whenever a key is claimed.

The created study is found through ``idempotency_keys`` (``replay``), written in the same
transaction as the study, before the claim is deleted: a waiter never sees the claim gone before
the study.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import delete

from fedtune.errors import ConflictError, FedtuneError

from .db import Database
from .errors import (
    IdempotencyKeyReusedError,
    SubmissionInProgressError,
    error_body,
    exception_from_body,
    status_and_code,
)
from .models import IdempotencyClaim, utcnow
from .settings import Settings

__all__ = ["CLAIM_MARGIN_S", "POLL_S", "REFUSAL_KEPT_S", "once", "wait_bound_s"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: how much longer than the check's own limit a claim may take: extracting the package, the
#: sandbox's start, the database writes before and after
CLAIM_MARGIN_S = 15.0
#: how often a waiting request looks for the first one's outcome
POLL_S = 0.25
#: how long a refused submission's answer is replayed to requests with its key
REFUSAL_KEPT_S = 600.0
#: claims older than this are deleted whenever a key is claimed
SWEEP_AFTER_S = 86_400.0
#: an unanswered claim older than this many bounds is stale: its request died (a replica
#: stopped mid-check); a retry waits one bound, so it meets a 409 before taking a claim over
STALE_AFTER = 2


def wait_bound_s(settings: Settings) -> float:
    """The longest the check of one submission takes, with its margin.

    Args:
        settings: The service's settings.

    Returns:
        ``FEDTUNE_CODE_CHECK_TIMEOUT_S`` + :data:`CLAIM_MARGIN_S`: how long a retry waits for
        the first request's answer, and the age at which an unanswered claim is stale.
    """
    return settings.code_check_timeout_s + CLAIM_MARGIN_S


@dataclass(frozen=True)
class _Seen:
    """Another request's claim, as read."""

    request_hash: str
    claimed_at: dt.datetime
    answer: dict[str, Any] | None


def once(
    db: Database,
    settings: Settings,
    key: str | None,
    digest: str,
    *,
    replay: Callable[[], T | None],
    work: Callable[[], T],
) -> T:
    """Do ``work`` once per ``key``: a concurrent or later request with it gets that outcome.

    Args:
        db: The service's database (the claims live there).
        settings: The service's settings (the check's bound).
        key: The request's Idempotency-Key (None: just ``work()``).
        digest: The request body's hash (another body with the key is a 409).
        replay: What an earlier request with the key created, or None (read each poll).
        work: The check and the creation; it writes what ``replay`` finds before returning.

    Returns:
        ``work()``'s result, or ``replay()``'s once another request with the key made it.

    Raises:
        IdempotencyKeyReusedError: The key was claimed with another body.
        SubmissionInProgressError: Another request with the key is still being checked after
            :func:`wait_bound_s`.
        FedtuneError: ``work``'s error, or the refusal another request with the key got.
    """
    if key is None:
        return work()
    bound = wait_bound_s(settings)
    deadline = time.monotonic() + bound
    waiting = False
    while True:
        done = replay()
        if done is not None:
            return done
        seen = _read(db, key)
        if seen is None:
            if _insert(db, key, digest):
                break  # ours
            continue  # another request claimed it first: read its claim
        if seen.request_hash != digest:
            raise IdempotencyKeyReusedError(
                "this Idempotency-Key was used with a different request body"
            )
        age = (utcnow() - seen.claimed_at).total_seconds()
        if seen.answer is not None and age < REFUSAL_KEPT_S:
            raise exception_from_body(int(seen.answer["status"]), seen.answer["body"])
        if age >= (REFUSAL_KEPT_S if seen.answer is not None else STALE_AFTER * bound):
            log.info("idempotency key %s: taking over a claim of %.0f s ago", key, age)
            _release(db, key, seen.claimed_at)
            continue
        if not waiting:
            log.info(
                "idempotency key %s: waiting for the check of the request that claimed it", key
            )
            waiting = True
        if time.monotonic() >= deadline:
            raise SubmissionInProgressError(
                f"a submission with this Idempotency-Key is still being checked after "
                f"{bound:g} s (FEDTUNE_CODE_CHECK_TIMEOUT_S + {CLAIM_MARGIN_S:g} s); retry later"
            )
        time.sleep(POLL_S)
    return _work(db, key, work)


def _work(db: Database, key: str, work: Callable[[], T]) -> T:
    """Run the claimed work; release the claim, or keep a 4xx refusal in it."""
    try:
        result = work()
    except FedtuneError as exc:
        status, _ = status_and_code(exc)
        if 400 <= status < 500:
            _refused(db, key, {"status": status, "body": error_body(exc)})
        else:
            _release(db, key)
        raise
    except BaseException:
        _release(db, key)
        raise
    _release(db, key)
    return result


def _insert(db: Database, key: str, digest: str) -> bool:
    """Claim ``key`` (sweeping claims older than :data:`SWEEP_AFTER_S`); False: taken."""
    now = utcnow()
    try:
        with db.session() as session:
            cutoff = now - dt.timedelta(seconds=SWEEP_AFTER_S)
            session.execute(delete(IdempotencyClaim).where(IdempotencyClaim.claimed_at < cutoff))
            session.add(IdempotencyClaim(key=key, request_hash=digest, claimed_at=now))
    except ConflictError:
        return False
    return True


def _read(db: Database, key: str) -> _Seen | None:
    """The claim of ``key``, if there is one."""
    with db.session(readonly=True) as session:
        row = session.get(IdempotencyClaim, key)
        return None if row is None else _Seen(row.request_hash, row.claimed_at, row.answer)


def _release(db: Database, key: str, claimed_at: dt.datetime | None = None) -> None:
    """Delete the claim of ``key`` (only the one claimed at ``claimed_at``, when given)."""
    query = delete(IdempotencyClaim).where(IdempotencyClaim.key == key)
    if claimed_at is not None:
        query = query.where(IdempotencyClaim.claimed_at == claimed_at)
    with db.session() as session:
        session.execute(query)


def _refused(db: Database, key: str, answer: dict[str, Any]) -> None:
    """Keep the refusal of ``key``'s submission in its claim, for the retries."""
    with db.session() as session:
        row = session.get(IdempotencyClaim, key)
        if row is not None:
            row.answer, row.claimed_at = answer, utcnow()
