"""SQLAlchemy 2.0 typed models (the database's shape; API schemas live in ``schemas.py``).

Tables: ``studies`` (one row per submitted study), ``trials`` (one per Optuna trial number,
unique per study: a resumed driver upserts, never duplicates), ``trial_rounds`` (the per-round
curve, primary key (trial, round)), ``idempotency_keys`` (submissions already answered),
``code_packages`` (uploaded user code, content-addressed by SHA-256: identical code is stored
once; a study names its package in ``studies.code_sha256``), and since revision 0004 the team's
tables: ``users``, ``projects`` (ownership, quotas, fair-share weight), ``memberships`` (a user's
role in a project), ``api_tokens`` (hashed per-user tokens), ``code_package_owners`` (which
projects uploaded a package) and ``scheduler_lease`` (the one scheduler leader and its fencing
token); since revision 0006 ``method_groups`` (the studies of one study of methods and the
comparison recorded once they have all ended); since revision 0007 ``projects.quota_gpu_hours``;
since revision 0008 ``idempotency_claims`` (the submissions being checked, by key:
:mod:`.idempotency`); since 0009 ``projects.mlflow_workspace``; since 0010 ``driver_tickets``
(each dispatch attempt's one-time start ticket and the driver credential it was redeemed for,
both as SHA-256 digests only).
The schema is owned by the Alembic revisions in ``migrations/versions``; these classes must match
them (``tests/service/test_migrations.py`` compares the two).
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from .states import StudyState, TrialState

if TYPE_CHECKING:
    from fedtune.tuning.spec import StoredSpec

__all__ = [
    "BOOTSTRAP_ADMIN",
    "DEFAULT_PROJECT",
    "ApiToken",
    "Base",
    "CodePackageOwner",
    "CodePackageRow",
    "DriverTicket",
    "IdempotencyClaim",
    "IdempotencyKey",
    "Membership",
    "MethodGroup",
    "Project",
    "SchedulerLease",
    "Study",
    "Trial",
    "TrialRound",
    "User",
    "utcnow",
]

#: the project existing studies move to (revision 0004) and the user FEDTUNE_API_TOKEN names
DEFAULT_PROJECT = "default"
BOOTSTRAP_ADMIN = "admin"
#: the studies that still hold a driver reference (partial index, revision 0005)
_HELD = "driver_ref IS NOT NULL"

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime; use fedtune.service.models.utcnow()")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _enum(cls: type) -> Enum:
    # VARCHAR with the enum's *values*; no native type, so adding a state needs no ALTER TYPE
    return Enum(cls, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e])


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dt.datetime: UTCDateTime, dict[str, Any]: JSON}


class Study(Base):
    __tablename__ = "studies"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    state: Mapped[StudyState] = mapped_column(_enum(StudyState), index=True)
    spec: Mapped[dict[str, Any]]
    algorithm: Mapped[str] = mapped_column(String(64))
    task: Mapped[str] = mapped_column(String(64))
    trials_requested: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str | None] = mapped_column(String(16))
    driver_ref: Mapped[dict[str, Any] | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    mlflow_experiment_id: Mapped[str | None] = mapped_column(String(64))
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    best_trial: Mapped[int | None] = mapped_column(Integer)
    best_value: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    # revision 0002
    heartbeat_at: Mapped[dt.datetime | None]
    # revision 0003
    code_sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    # revision 0004
    # nullable only in the database (SQLite adds a REFERENCES column with a NULL default alone)
    project: Mapped[str] = mapped_column(
        ForeignKey("projects.name"), nullable=True, default=DEFAULT_PROJECT
    )
    owner: Mapped[str | None] = mapped_column(String(64))
    priority: Mapped[int] = mapped_column(Integer, server_default="0", default=0)
    reserved_gpus: Mapped[float] = mapped_column(Float, server_default="0", default=0.0)
    reserved_trials: Mapped[int] = mapped_column(Integer, server_default="0", default=0)
    queued_reason: Mapped[str | None] = mapped_column(Text)
    dispatch_token: Mapped[int | None] = mapped_column(BigInteger)

    trials: Mapped[list[Trial]] = relationship(
        back_populates="study", cascade="all, delete-orphan", passive_deletes=True
    )

    @functools.cached_property
    def sections(self) -> StoredSpec:
        """The typed parts of :attr:`spec` the service reads (``budget``, ``resources``,
        ``objective``), parsed once per study (:func:`.specs.stored_spec_of`): a study's spec
        never changes after it is accepted."""
        from .specs import stored_spec, stored_spec_of

        if self.id is None or self.created_at is None:  # not flushed yet: no identity
            return stored_spec(self.spec)
        return stored_spec_of((self.id, self.created_at), self.spec)

    # revision 0005: every list filter, the scheduler's scans and the fair-share window read
    # an index range ordered like the list's keyset (created_at, id)
    __table_args__ = (
        Index("ix_studies_created_at_id", "created_at", "id"),
        Index("ix_studies_state_created_at_id", "state", "created_at", "id"),
        Index("ix_studies_project_created_at_id", "project", "created_at", "id"),
        Index("ix_studies_project_state_created_at_id", "project", "state", "created_at", "id"),
        Index("ix_studies_finished_at", "finished_at"),
        Index(
            "ix_studies_driver_held",
            "backend",
            "updated_at",
            "id",
            postgresql_where=text(_HELD),
            sqlite_where=text(_HELD),
        ),
    )


class Trial(Base):
    __tablename__ = "trials"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[TrialState] = mapped_column(_enum(TrialState))
    params: Mapped[dict[str, Any]]
    value: Mapped[float | None] = mapped_column(Float)
    outcome: Mapped[str | None] = mapped_column(String(32))
    last_round: Mapped[int] = mapped_column(Integer, default=0)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None]

    study: Mapped[Study] = relationship(back_populates="trials")

    __table_args__ = (UniqueConstraint("study_id", "number", name="uq_trials_study_number"),)


class TrialRound(Base):
    __tablename__ = "trial_rounds"

    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    round: Mapped[int] = mapped_column(Integer, primary_key=True)
    metrics: Mapped[dict[str, Any]]


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    study_id: Mapped[str] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class IdempotencyClaim(Base):
    """A submission being checked (:mod:`.idempotency`): claimed by the first request with its
    key, deleted once answered; ``answer`` keeps a refusal (status and body) for the retries."""

    __tablename__ = "idempotency_claims"

    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    claimed_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    answer: Mapped[dict[str, Any] | None]


class CodePackageRow(Base):
    """One uploaded code package (``fedtune.code_package``): the zip and its SHA-256."""

    __tablename__ = "code_packages"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class User(Base):
    """A person (or robot) who calls the API; ``is_admin`` may do everything."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    disabled_at: Mapped[dt.datetime | None]


class Project(Base):
    """The unit of ownership and quota; NULL quotas are unlimited."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str | None] = mapped_column(ForeignKey("users.name", ondelete="SET NULL"))
    quota_gpus: Mapped[float | None] = mapped_column(Float)
    quota_trials: Mapped[int | None] = mapped_column(Integer)
    quota_studies: Mapped[int | None] = mapped_column(Integer)
    quota_gpu_hours: Mapped[float | None] = mapped_column(Float)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    max_priority: Mapped[int] = mapped_column(Integer, default=0)
    queue_name: Mapped[str | None] = mapped_column(String(63))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # revision 0009: the MLflow workspace the service made for it (``.mlflow_records``)
    mlflow_workspace: Mapped[str | None] = mapped_column(String(64))


class Membership(Base):
    """A user's role in a project: ``member`` (submit, read, cancel) or ``viewer`` (read)."""

    __tablename__ = "memberships"

    user_name: Mapped[str] = mapped_column(
        ForeignKey("users.name", ondelete="CASCADE"), primary_key=True
    )
    project: Mapped[str] = mapped_column(
        ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True, index=True
    )
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A user's bearer token: ``id`` is its public prefix, only the secret's SHA-256 is kept."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(24), primary_key=True)
    user_name: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    label: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]
    last_used_at: Mapped[dt.datetime | None]


class CodePackageOwner(Base):
    """A project that uploaded a code package (the bytes are stored once, in ``code_packages``)."""

    __tablename__ = "code_package_owners"

    sha256: Mapped[str] = mapped_column(
        ForeignKey("code_packages.sha256", ondelete="CASCADE"), primary_key=True
    )
    project: Mapped[str] = mapped_column(
        ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True
    )
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class SchedulerLease(Base):
    """The scheduler leader's lease: ``token`` (fencing) grows by one at every new holder."""

    __tablename__ = "scheduler_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(128))
    token: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[dt.datetime | None]
    renewed_at: Mapped[dt.datetime | None]


class MethodGroup(Base):
    """A study of methods: the studies one submission queued, and their recorded comparison.

    ``claimed_at`` is set, compare-and-set, by the scheduler tick that records the comparison
    (exactly one does); ``comparison`` then holds the MLflow run (or the reason there is none).
    """

    __tablename__ = "method_groups"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    project: Mapped[str] = mapped_column(ForeignKey("projects.name", ondelete="CASCADE"))
    study_ids: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    claimed_at: Mapped[dt.datetime | None] = mapped_column(index=True)
    comparison: Mapped[dict[str, Any] | None]


class DriverTicket(Base):
    """A dispatch attempt's one-time start ticket (:mod:`.tickets`): what a driver's start
    carries instead of a credential.

    Only digests are kept: ``ticket_hash`` (SHA-256 of the ticket) and, once the ticket is
    redeemed, ``token_hash`` (of the driver credential it was exchanged for). A second
    redemption sets ``compromised_at``: the credential stops working and the scheduler
    re-dispatches the study.
    """

    __tablename__ = "driver_tickets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    ticket_hash: Mapped[str] = mapped_column(String(64), unique=True)
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime]
    redeemed_at: Mapped[dt.datetime | None]
    compromised_at: Mapped[dt.datetime | None]

    __table_args__ = (Index("ix_driver_tickets_study_id_attempt", "study_id", "attempt"),)
