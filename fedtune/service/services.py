"""Service functions: what each API handler calls (one call per handler).

They validate, open one transaction through ``Database.session`` (the commit/rollback
boundary), use the repository and return API schemas. Nothing here knows about HTTP.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from fedtune.errors import ConflictError
from fedtune.outcomes import RAN, TrialOutcome

from .access import ANONYMOUS_ADMIN, Principal, default_project, require_study_access
from .code_check_cache import PassedChecks
from .code_services import accept_code_study
from .db import Database
from .errors import (
    ForbiddenError,
    IdempotencyKeyReusedError,
    IllegalStateChangeError,
    InvalidRequestError,
    StudyNotFoundError,
)
from .idempotency import once
from .mlflow_workspaces import study_mlflow
from .models import Project, Study, Trial
from .paging import Cursor, ListQuery, Order, decode_token, encode_token
from .repository import Repository
from .schemas import (
    CurveOut,
    CurvePoint,
    StudyDetail,
    StudyPage,
    TrialOut,
)
from .settings import Settings
from .specs import AcceptedSpec, accept_spec, request_hash
from .states import StudyState, TrialState
from .study_views import study_detail, study_out
from .warmup import Warmup

__all__ = [
    "ServiceContext",
    "StopRequester",
    "cancel_study",
    "get_curve",
    "get_study",
    "get_tradeoff",
    "has_code",
    "list_studies",
    "list_trials",
    "new_study_id",
    "read_study",
    "replayed_study",
    "submit_study",
]

log = logging.getLogger(__name__)
_KEY = re.compile(r"^[A-Za-z0-9._:+/=-]{1,128}$")
STUDY_ID = re.compile(r"^[0-9a-f]{12}$")


class StopRequester(Protocol):
    """Who stops a cancelled study's driver (the scheduler)."""

    def request_stop(self, study_id: str) -> None: ...


@dataclass(frozen=True)
class ServiceContext:
    """What service functions work with (built once by the app, injected into handlers)."""

    db: Database
    settings: Settings
    stopper: StopRequester | None = None
    warmup: Warmup | None = None  # readiness waits for it (fedtune.service.warmup)
    #: MLflow's workspaces and roles kept in step with projects (``mlflow_sync.TenancyLoop``)
    tenancy: Any = None
    #: passed code checks of this process (:mod:`.code_check_cache`): the same code and spec
    #: are checked once
    passed_checks: PassedChecks = field(default_factory=PassedChecks)

    def mlflow(self, study_id: str, project: str | None) -> AbstractContextManager[str]:
        """A study's MLflow store: yields its tracking URI, with the service's MLflow calls in
        the block in its project's workspace (:func:`.mlflow_workspaces.study_mlflow`)."""
        return study_mlflow(self.settings, study_id, project)


def new_study_id() -> str:
    """12 hex digits: safe in paths, Ray submission ids and Kubernetes names."""
    return uuid.uuid4().hex[:12]


# ------------------------------------------------------------------------ studies


def accept_submission(
    ctx: ServiceContext, body: Any, project: str
) -> tuple[AcceptedSpec, str | None]:
    """Validate a submitted document once: ``(accepted, code_sha256)``.

    Args:
        ctx: The service.
        body: The spec document.
        project: The project it is submitted to (its uploaded packages only).

    Returns:
        The accepted spec, and the digest of its code package (None without code).

    Raises:
        ConfigError: The document is invalid (with code: as its sandboxed check found it).
    """
    if isinstance(body, Mapping) and body.get("code") is not None:
        # user code: checked in a child; the package must be this project's upload
        return accept_code_study(ctx, body, project)
    return accept_spec(body, ctx.settings), None


def submit_study(
    ctx: ServiceContext,
    body: Any,
    idempotency_key: str | None = None,
    caller: Principal = ANONYMOUS_ADMIN,
    accepted: tuple[AcceptedSpec, str | None] | None = None,
) -> tuple[StudyDetail, bool]:
    """Queue a study for ``caller``; ``(study, created)``. A repeated ``idempotency_key`` with
    the same body returns the study created the first time (``created`` False), with another
    body → 409; one that arrives while the first request's code is still being checked waits
    for that check's answer (:func:`.idempotency.once`). The caller must be a member of the
    spec's ``project`` (default ``default``). ``accepted``: what :func:`accept_submission`
    already made of ``body`` (it is not checked again)."""
    digest = request_hash(body)
    if idempotency_key is not None and not _KEY.match(idempotency_key):
        raise InvalidRequestError("Idempotency-Key", "1-128 characters of [A-Za-z0-9._:+/=-]")
    project, max_priority = submission_project(ctx, body, caller)

    def replay() -> tuple[StudyDetail, bool] | None:
        seen = replayed_study(ctx, idempotency_key, digest)
        return None if seen is None else (seen, False)

    def work() -> tuple[StudyDetail, bool]:
        checked = accepted or accept_submission(ctx, body, project)
        return _create(ctx, checked, project, max_priority, caller, idempotency_key, digest)

    if accepted is None and has_code(body):  # a sandboxed check: one per key (idempotency.py)
        return once(ctx.db, ctx.settings, idempotency_key, digest, replay=replay, work=work)
    return replay() or work()


def has_code(body: Any) -> bool:
    """Whether a submitted document names uploaded code (its check runs in a sandbox)."""
    return isinstance(body, Mapping) and body.get("code") is not None


def _create(
    ctx: ServiceContext,
    checked: tuple[AcceptedSpec, str | None],
    project: str,
    max_priority: int,
    caller: Principal,
    key: str | None,
    digest: str,
) -> tuple[StudyDetail, bool]:
    """Queue the checked study and record its Idempotency-Key in the same transaction."""
    accepted, code_sha256 = checked
    if accepted.priority > max_priority:
        raise InvalidRequestError(
            "priority",
            f"at most {max_priority} in project {project!r} "
            f"(its max_priority), got {accepted.priority}",
        )
    study = Study(
        id=new_study_id(),
        name=accepted.name,
        state=StudyState.QUEUED,
        spec=accepted.document,
        algorithm=accepted.algorithm,
        task=accepted.task,
        trials_requested=ctx.settings.study_trials(accepted.trials),  # as the driver runs it
        attempts=0,
        code_sha256=code_sha256,
        project=project,
        owner=caller.name,
        priority=accepted.priority,
    )
    try:
        with ctx.db.session() as session:
            repo = Repository(session)
            repo.add_study(study)
            if key is not None:
                repo.put_idempotency(key, digest, study.id)
    except ConflictError:
        # a concurrent request with the same key won the insert: answer with its study
        replay = replayed_study(ctx, key, digest)
        if replay is None:
            raise
        return replay, False
    log.info("study %s (%s) queued", study.id, study.name)
    return get_study(ctx, study.id), True


def submission_project(ctx: ServiceContext, body: Any, caller: Principal) -> tuple[str, int]:
    """The project a submission goes to and its ``max_priority``, if ``caller`` may submit
    there: an unknown project and one the caller cannot see are the same 422 (no existence
    oracle); a viewer gets 403. A submission naming none goes to :func:`default_project`."""
    raw = body.get("project") if isinstance(body, Mapping) else None
    project = default_project(caller) if raw is None else raw
    if not isinstance(project, str):
        raise InvalidRequestError("project", f"must be a project name, got {project!r}")
    with ctx.db.session(readonly=True) as session:
        row = session.get(Project, project)
        max_priority = None if row is None else row.max_priority or 0
    if max_priority is None or not caller.can_read(project):
        raise InvalidRequestError("project", f"no project {project!r} that you may submit to")
    if not caller.can_write(project):
        raise ForbiddenError(f"{caller.name} is a viewer of project {project!r}: reading only")
    return project, max_priority


def authorize(ctx: ServiceContext, caller: Principal, study_id: str, write: bool = False) -> str:
    """404 unless ``caller`` may read study ``study_id`` (403: may read, not change it)."""
    _known(study_id)
    with ctx.db.session(readonly=True) as session:
        return require_study_access(session, caller, study_id, write)


def replayed_study(ctx: ServiceContext, key: str | None, digest: str) -> StudyDetail | None:
    if key is None:
        return None
    with ctx.db.session(readonly=True) as session:
        seen = Repository(session).get_idempotency(key)
        if seen is None:
            return None
        if seen.request_hash != digest:
            raise IdempotencyKeyReusedError(
                "this Idempotency-Key was used with a different request body"
            )
        study_id = seen.study_id
    return get_study(ctx, study_id)


def list_studies(
    ctx: ServiceContext,
    state: StudyState | Sequence[StudyState] | None = None,
    limit: int = 50,
    offset: int = 0,
    *,
    caller: Principal = ANONYMOUS_ADMIN,
    project: str | None = None,
    page_token: str | None = None,
    order: Order | str = Order.DESC,
    include_total: bool | None = None,
) -> StudyPage:
    """A page of the studies ``caller`` may read (in one of ``state``, of ``project`` only, when
    given), ordered by creation time (``order``). ``page_token`` (a previous page's
    ``next_page_token``) continues after that page by keyset (``paging``), else ``offset``
    rows are skipped. ``total`` is counted when ``include_total`` says so — by default on a
    first page (no token) only: pages reached by token cost one index range read, no count."""
    query = ListQuery.of(state, project, order)
    if page_token is not None and offset:
        raise InvalidRequestError("query.offset", "give either page_token or offset, not both")
    after = None if page_token is None else decode_token(page_token, query)
    projects = caller.readable()
    if project is not None:
        projects = [project] if projects is None or project in projects else []
    count = page_token is None if include_total is None else include_total
    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        rows = repo.page_studies(
            query.states,
            projects,
            limit=limit + 1,
            offset=offset,
            ascending=query.ascending,
            after=None if after is None else (after.created_at, after.study_id),
            summary=True,
        )
        total = repo.count_studies(query.states, projects) if count else None
        items = [study_out(s) for s in rows[:limit]]
        last = rows[limit - 1] if len(rows) > limit else None
    token = None if last is None else encode_token(query, Cursor(last.created_at, last.id))
    return StudyPage(items=items, total=total, limit=limit, offset=offset, next_page_token=token)


def _known(study_id: str) -> str:
    """Ids are 12 hex digits; anything else is not found without asking the database."""
    if not STUDY_ID.match(study_id):
        raise StudyNotFoundError(f"no study {study_id!r}")
    return study_id


def get_study(ctx: ServiceContext, study_id: str) -> StudyDetail:
    """One study with its progress (trial counts by state) and best trial: three index reads
    (the study, its trials' states, the best one), whatever its number of trials."""
    _known(study_id)
    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        return study_detail(ctx.settings, repo, repo.require_study(study_id))


def read_study(ctx: ServiceContext, caller: Principal, study_id: str) -> StudyDetail:
    """``GET /v1/studies/{id}``: :func:`get_study` for a ``caller`` who may read it, checked in
    the same transaction (404 otherwise, as for a study that does not exist)."""
    _known(study_id)
    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        study = repo.get_study(study_id)
        if study is None or not caller.can_read(study.project):
            raise StudyNotFoundError(f"no study {study_id!r}")
        return study_detail(ctx.settings, repo, study)


def cancel_study(ctx: ServiceContext, study_id: str) -> StudyDetail:
    """Cancel a queued or running study (idempotent on a cancelled one; 409 once finished)."""
    _known(study_id)
    with ctx.db.session() as session:
        repo = Repository(session)
        study = repo.require_study(study_id)
        was = study.state
        if was == StudyState.CANCELLED:
            pass
        elif was.terminal:
            raise IllegalStateChangeError(f"study {study_id} already {was}; it cannot be cancelled")
        elif not repo.transition(study_id, StudyState.CANCELLED, expected=[was]):
            raise IllegalStateChangeError(f"study {study_id} changed state; retry")
        else:
            repo.kill_running_trials(study_id)
    if was == StudyState.RUNNING and ctx.stopper is not None:
        ctx.stopper.request_stop(study_id)
    return get_study(ctx, study_id)


# ------------------------------------------------------------------------ trials


def list_trials(
    ctx: ServiceContext, study_id: str, state: TrialState | None = None
) -> list[TrialOut]:
    _known(study_id)
    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        repo.require_study(study_id)
        return [TrialOut.from_attributes(t) for t in repo.list_trials(study_id, state)]


def get_curve(ctx: ServiceContext, study_id: str, number: int) -> CurveOut:
    _known(study_id)
    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        repo.require_study(study_id)
        rows = repo.curve(study_id, number)
        points = [CurvePoint(round=r.round, metrics=r.metrics) for r in rows]
    return CurveOut(study_id=study_id, trial=number, rounds=points)


def get_tradeoff(ctx: ServiceContext, study_id: str) -> str:
    """The study's trade-off as JSON text: once the study has ended, MLflow's
    ``tradeoff/tradeoff.json`` of its parent run byte for byte (computed once, by the driver);
    before, the same computation (``fedtune.tuning.analysis.report``) on the trials finished so far,
    with a ``notes.provisional`` line."""
    _known(study_id)
    from fedtune.tuning.analysis.report import tradeoff_of
    from fedtune.tuning.analysis.tradeoff import TrialCurve, tradeoff_text
    from fedtune.tuning.mlflow.client import stored_tradeoff

    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        study = repo.require_study(study_id)
        ended, run_id, project = study.state.terminal, study.mlflow_run_id, study.project
        sections, trials, rounds = study.sections, repo.list_trials(study_id), repo.curves(study_id)
        curves = []
        for trial in trials:
            if trial.state not in (TrialState.COMPLETED, TrialState.PRUNED):
                continue  # as the driver: completed, diverged and stopped trials
            points = [(r.round, r.metrics.get("client_loss")) for r in rounds.get(trial.number, [])]
            points = [(r, float("inf") if v is None else float(v)) for r, v in points]
            if points:
                curves.append(
                    TrialCurve(
                        trial.number,
                        trial.params,
                        [r for r, _ in points],
                        [v for _, v in points],
                        _outcome(trial),
                    )
                )
    if ended and run_id:
        with ctx.mlflow(study_id, project) as uri:
            text = stored_tradeoff(uri, run_id)
        if text is not None:
            return text
    return tradeoff_text(tradeoff_of(sections, curves, provisional=True))


def _outcome(trial: Trial) -> str:
    if trial.outcome in RAN:
        return trial.outcome
    stopped = trial.state in (TrialState.PRUNED, TrialState.KILLED)
    return TrialOutcome.STOPPED if stopped else TrialOutcome.COMPLETED
