"""Compare studies through the service, and submit a study of methods.

A study the caller may not read is not found (404), as everywhere else: a comparison that
includes another project's study reveals nothing of it. The trade-off compared is the one
``GET /v1/studies/{id}/tradeoff`` returns (MLflow's file once the study has ended, else
provisional); the predictions are the parent run's ``tradeoff/theory.json`` when there is one.
Recording a comparison (``POST /v1/compare``) makes it an MLflow run in the first study's
tracking store and tags the compared parent runs (:mod:`fedtune.tuning.mlflow.comparisons`); it needs
the right to change every study (a viewer: 403).

A study of methods (a spec whose ``algorithm`` lists algorithms, :mod:`fedtune.tuning.methods`)
is one submission: every algorithm's spec is validated before any study is created, then one
study per algorithm is queued, same project, task, seed and budget, as one *method group*
(``GET /v1/methods/{id}``). Once every study of a group has ended, the scheduler's next tick
records their comparison as an MLflow run (:func:`record_ended_groups`; a compare-and-set on
the group makes exactly one tick, of one replica, record it), comparing the studies that
succeeded (two or more; otherwise the group says why there is no comparison).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update

from fedtune.errors import NotFoundError, as_mapping
from fedtune.redact import scrub_text
from fedtune.results import Comparison
from fedtune.wire_models import MethodGroupOut, MethodStudy, RecordedRun

from .access import Principal
from .errors import InvalidRequestError
from .idempotency import once
from .mlflow_links import mlflow_links
from .models import MethodGroup, Study, utcnow
from .redact import redact_uri
from .repository import Repository
from .services import (
    ServiceContext,
    accept_submission,
    authorize,
    get_tradeoff,
    has_code,
    replayed_study,
    submission_project,
    submit_study,
)
from .specs import request_hash
from .states import StudyState

__all__ = [
    "MAX_COMPARED",
    "compare_studies",
    "get_method_group",
    "record_ended_groups",
    "submit_methods",
]

log = logging.getLogger(__name__)

#: at most this many studies in one comparison
MAX_COMPARED = 20


def _theory(uri: str | None, run_id: str | None) -> list[dict[str, Any]] | None:
    if not uri or not run_id:
        return None
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from fedtune.tuning.mlflow.client import artifact_text

    try:
        return json.loads(
            artifact_text(MlflowClient(tracking_uri=uri), run_id, "tradeoff/theory.json")
        )
    except (MlflowException, OSError, ValueError):
        return None


def compare_studies(
    ctx: ServiceContext,
    caller: Principal,
    study_ids: Sequence[str],
    force: bool = False,
    record: bool = False,
) -> Comparison:
    """``GET /v1/compare``: the comparison of studies ``caller`` may read.

    Args:
        ctx: The service.
        caller: Who asks (404 for any study they may not read).
        study_ids: Two or more study ids.
        force: Compare studies of a different task, data or objective.
        record: Also make the comparison an MLflow run (the caller must be allowed to change
            every study).

    Returns:
        The comparison (:class:`fedtune.wire_models.Comparison`), its ``mlflow`` the run
        recorded (None: not asked).

    Raises:
        StudyNotFoundError: A study does not exist or is not the caller's to read.
        InvalidRequestError: Fewer than two studies, too many, or a study named twice.
        ConfigError: The studies are not comparable and no ``force``.
    """
    ids = [s.strip() for s in study_ids if s.strip()]
    if not 2 <= len(ids) <= MAX_COMPARED:
        raise InvalidRequestError("studies", f"name 2 to {MAX_COMPARED} studies, got {len(ids)}")
    if len(set(ids)) != len(ids):
        raise InvalidRequestError("studies", "a study is named twice")
    for study_id in ids:  # every one first: no work for a comparison that will be refused
        authorize(ctx, caller, study_id, write=record)
    c, uris, projects = _compare(ctx, ids, force)
    recorded = _record(ctx, c, ids, uris, projects, caller.name) if record else None
    return dataclasses.replace(c, mlflow=recorded)


def _compare(
    ctx: ServiceContext, ids: Sequence[str], force: bool
) -> tuple[Any, list[str | None], list[str]]:
    """The comparison of studies ``ids`` (access already checked), their tracking stores and
    their projects (each study's MLflow files are read in its project's workspace)."""
    from fedtune.tuning.analysis.compare import RunRef, StudyInput, compare

    inputs, uris, projects = [], [], []
    for study_id in ids:
        with ctx.db.session(readonly=True) as session:
            study = Repository(session).require_study(study_id)
            spec, run_id, exp = study.spec, study.mlflow_run_id, study.mlflow_experiment_id
            project = study.project
        with ctx.mlflow(study_id, project) as uri:
            theory = _theory(uri, run_id)
        uris.append(uri)
        projects.append(project)
        run = RunRef(redact_uri(uri) or "", str(exp or ""), run_id) if run_id else None
        inputs.append(
            StudyInput(
                label=study_id,
                document=spec,
                tradeoff=json.loads(get_tradeoff(ctx, study_id)),
                theory=theory,
                run=run,
            )
        )
    return compare(inputs, force=force), uris, projects


def _record(
    ctx: ServiceContext,
    c: Any,
    ids: Sequence[str],
    uris: list[str | None],
    projects: list[str],
    user: str | None,
) -> RecordedRun | None:
    """The comparison as an MLflow run in the first study's store and workspace (None: no
    store), ``user`` its MLflow user; with MLflow workspaces on, only studies of one project
    (one workspace) are recorded together."""
    import tempfile

    from fedtune.tuning.mlflow.comparisons import record_comparison

    if not uris[0]:
        return None
    if uris[0].startswith("sqlite:///"):  # a study that never ran has no workdir yet
        from pathlib import Path

        Path(uris[0].removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    if ctx.settings.mlflow_workspaces and len(set(projects)) > 1:
        raise InvalidRequestError(
            "studies",
            f"studies of several projects ({', '.join(sorted(set(projects)))}) are compared but "
            "not recorded: MLflow keeps each project's runs in its own workspace",
        )
    parents = {s.key: u for s, u in zip(c.studies, uris, strict=True) if u}
    with tempfile.TemporaryDirectory() as tmp, ctx.mlflow(ids[0], projects[0]) as uri:
        done = record_comparison(c, tmp, uri, parent_uris=parents, user=user)
    links = mlflow_links(ctx.settings, uris[0], projects[0], done["experiment_id"], done["run_id"])
    return RecordedRun(
        run_id=done["run_id"],
        experiment_id=done["experiment_id"],
        tracking_uri=links.tracking_uri or "",
        run_url=links.run_url,
    )


def submit_methods(
    ctx: ServiceContext, body: Any, idempotency_key: str | None, caller: Principal
) -> dict[str, Any]:
    """``POST /v1/methods``: one study per algorithm of a study of methods.

    Args:
        ctx: The service.
        body: The spec document, ``algorithm`` a list.
        idempotency_key: Makes a retried submission return the same studies (each study's key
            is this one with ``:<i>`` appended, ``i`` the algorithm's place in the list).
        caller: Who submits (as ``POST /v1/studies``: a member of the project).

    Returns:
        ``studies`` (each one's detail) and ``compare_url``.

    Raises:
        ConfigError: The list or any algorithm's spec is invalid (nothing is created then).
    """
    from fedtune.tuning.methods import expand_methods

    body = as_mapping(
        body, "<body>", what=" (a JSON object: a study spec)", error=InvalidRequestError
    )
    documents = expand_methods(body)
    # the project each study goes to, as submit_study resolves it (and may the caller submit
    # there?), before any check; then every spec valid before the first study is queued, each
    # checked once (with code: one sandboxed check per algorithm, and one per key: a retry
    # while they run waits for their answer, idempotency.once)
    project, _ = submission_project(ctx, body, caller)
    # each study's key: this one and the algorithm's place in the list
    keys = [
        None if idempotency_key is None else f"{idempotency_key}:{i}" for i in range(len(documents))
    ]

    def replay() -> dict[str, Any] | None:
        seen = [
            replayed_study(ctx, k, request_hash(d)) for k, d in zip(keys, documents, strict=True)
        ]
        if idempotency_key is None or any(s is None for s in seen):
            return None
        group = _group_of(ctx, [s.id for s in seen])
        return None if group is None else _methods_answer(group, seen)

    def work() -> dict[str, Any]:
        accepted = [accept_submission(ctx, document, project) for document in documents]
        studies, created = [], False
        for document, key, checked in zip(documents, keys, accepted, strict=True):
            study, new = submit_study(ctx, document, key, caller, checked)
            studies.append(study)
            created = created or new
        ids = [s.id for s in studies]
        group = _group_of(ctx, ids) if not created else None
        if group is None:
            group = uuid.uuid4().hex[:12]
            with ctx.db.session() as session:
                owner = session.get(Study, ids[0]).project
                session.add(
                    MethodGroup(id=group, name=str(body.get("name")), project=owner, study_ids=ids)
                )
        return _methods_answer(group, studies)

    if any(has_code(d) for d in documents):
        digest = request_hash(body)
        return once(ctx.db, ctx.settings, idempotency_key, digest, replay=replay, work=work)
    return work()


def _methods_answer(group: str, studies: Sequence[Any]) -> dict[str, Any]:
    ids = [s.id for s in studies]
    return {
        "group": group,
        "studies": list(studies),
        "compare_url": f"/v1/compare?studies={','.join(ids)}",
        "group_url": f"/v1/methods/{group}",
    }


def _group_of(ctx: ServiceContext, ids: list[str]) -> str | None:
    """The method group of exactly these studies (a replayed submission), if any."""
    with ctx.db.session(readonly=True) as session:
        for row in session.scalars(
            select(MethodGroup).order_by(MethodGroup.created_at.desc()).limit(1000)
        ):
            if row.study_ids == ids:
                return row.id
    return None


def get_method_group(ctx: ServiceContext, caller: Principal, group_id: str) -> MethodGroupOut:
    """``GET /v1/methods/{id}``: a study of methods, its studies' states and its comparison.

    Args:
        ctx: The service.
        caller: Who asks (404 unless they may read the group's project).
        group_id: The group's id.

    Returns:
        The group: its studies (id, algorithm, state), ``compare_url`` and ``comparison``: None
        until every study has ended and the comparison is recorded, then the MLflow run or
        the ``error`` saying why there is none.

    Raises:
        NotFoundError: No such group, or not the caller's to read.
    """
    with ctx.db.session(readonly=True) as session:
        group = session.get(MethodGroup, group_id) if len(group_id) <= 32 else None
        if group is None or not caller.can_read(group.project):
            raise NotFoundError(f"no study of methods {group_id!r}")
        rows = session.execute(
            select(Study.id, Study.algorithm, Study.state).where(Study.id.in_(group.study_ids))
        ).all()
        found = {r.id: r for r in rows}
        studies = [
            MethodStudy(id=i, algorithm=found[i].algorithm, state=found[i].state)
            for i in group.study_ids
            if i in found
        ]
        return MethodGroupOut(
            id=group.id,
            name=group.name,
            project=group.project,
            studies=studies,
            compare_url=f"/v1/compare?studies={','.join(group.study_ids)}",
            comparison=None
            if group.comparison is None
            else RecordedRun.from_json(group.comparison),
        )


def record_ended_groups(ctx: ServiceContext, limit: int = 1) -> list[str]:
    """Record the comparison of method groups whose studies have all ended (a scheduler step).

    Each group is claimed compare-and-set first (``claimed_at``), so exactly one caller records
    it, even with several replicas; the studies that succeeded (two or more) are compared and
    the comparison recorded as an MLflow run, else the group keeps why there is none.

    Args:
        ctx: The service.
        limit: At most this many groups per call (a tick stays short).

    Returns:
        The ids of the groups recorded (or found without a comparison) by this call.
    """
    done: list[str] = []
    with ctx.db.session(readonly=True) as session:
        waiting = session.scalars(
            select(MethodGroup).where(MethodGroup.claimed_at.is_(None)).limit(100)
        ).all()
        ids = {i for group in waiting for i in group.study_ids}
        rows = session.execute(select(Study.id, Study.state).where(Study.id.in_(ids))).all()
        state = {r.id: r.state for r in rows}
        ready = [
            (g.id, [i for i in g.study_ids if state[i] == StudyState.SUCCEEDED])
            for g in waiting
            if all(i in state and state[i].terminal for i in g.study_ids)
        ]
    for group_id, succeeded in ready[:limit]:
        with ctx.db.session() as session:
            claimed = session.execute(
                update(MethodGroup)
                .where(MethodGroup.id == group_id, MethodGroup.claimed_at.is_(None))
                .values(claimed_at=utcnow())
            ).rowcount
        if claimed != 1:
            continue  # another replica's tick has it
        comparison = _record_group(ctx, group_id, succeeded)
        with ctx.db.session() as session:
            session.get(MethodGroup, group_id).comparison = comparison.to_json()
        done.append(group_id)
    return done


def _record_group(ctx: ServiceContext, group_id: str, succeeded: list[str]) -> RecordedRun:
    if len(succeeded) < 2:
        why = f"{len(succeeded)} of the group's studies succeeded: nothing to compare"
        return RecordedRun(error=why)
    try:
        c, uris, projects = _compare(ctx, succeeded, force=False)
        with ctx.db.session(readonly=True) as session:  # who submitted the study of methods
            owner = Repository(session).require_study(succeeded[0]).owner
        recorded = _record(ctx, c, succeeded, uris, projects, owner)
    except Exception as exc:  # recorded on the group: a tick never fails for a comparison
        log.warning(
            "study of methods %s: no comparison recorded: %s", group_id, scrub_text(str(exc))
        )
        return RecordedRun(error=scrub_text(f"{type(exc).__name__}: {exc}")[:2000])
    if recorded is None:
        return RecordedRun(error="the studies have no tracking store")
    log.info("study of methods %s: comparison recorded as run %s", group_id, recorded.run_id)
    return recorded
