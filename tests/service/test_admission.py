"""Admission on the ``local``/``ray`` backends: quotas, weighted fair share, priority.

Before, dispatch was first come first served: one project's 20 studies took every slot. Here the
planning rule (:func:`fedtune.service.admission.plan`) and the real scheduler with a scripted
backend on a real database: a project never reserves above its quota, a study that does not fit
waits ``queued`` with the reason and never fails for it, the next slot goes to the project
furthest below its weighted share, and within a project priority beats age.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from fedtune.service import identity
from fedtune.service.access import Principal
from fedtune.service.admission import Candidate, ProjectLoad, gpu_seconds, plan
from fedtune.service.db import Database
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, get_study, submit_study
from fedtune.service.states import StudyState

from .helpers import FakeBackend, tiny_spec

T0 = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)


def _c(
    sid: str, project: str, minute: int, gpus: float = 2.0, trials: int = 2, priority: int = 0
) -> Candidate:
    return Candidate(sid, project, priority, T0 + dt.timedelta(minutes=minute), gpus, trials)


def test_a_study_over_its_projects_quota_waits_with_the_reason() -> None:
    loads = [
        ProjectLoad("a", quota_gpus=4, gpus=4),
        ProjectLoad("b", quota_trials=2, trials=2),
        ProjectLoad("c", quota_studies=1, studies=1),
    ]
    d = plan([_c("a1", "a", 0), _c("b1", "b", 1), _c("c1", "c", 2)], loads, slots=10)
    assert d.admit == []
    assert d.waiting == {
        "a1": "waiting for project quota: 4/4 GPUs",
        "b1": "waiting for project quota: 2/2 trials",
        "c1": "waiting for project quota: 1/1 active studies",
    }


def test_the_next_slot_goes_to_the_project_furthest_below_its_weighted_share() -> None:
    loads = [
        ProjectLoad("heavy", weight=1.0, gpu_seconds=7200.0),
        ProjectLoad("light", weight=1.0, gpu_seconds=600.0),
        ProjectLoad("vip", weight=4.0, gpu_seconds=3600.0),
    ]
    queued = [_c("h1", "heavy", 0), _c("l1", "light", 5), _c("v1", "vip", 9)]
    d = plan(queued, loads, slots=1)
    assert d.admit == ["l1"]  # 600 < 3600/4 = 900 < 7200
    d = plan(queued, loads, slots=3)
    assert d.admit == ["l1", "v1", "h1"]


def test_fair_share_alternates_between_equal_projects_instead_of_fifo() -> None:
    queued = [_c(f"a{i}", "a", i) for i in range(6)] + [_c(f"b{i}", "b", 10 + i) for i in range(6)]
    d = plan(queued, [ProjectLoad("a"), ProjectLoad("b")], slots=4)
    assert sorted(d.admit) == ["a0", "a1", "b0", "b1"]  # FIFO would have taken a0..a3


def test_priority_then_age_within_a_project() -> None:
    queued = [_c("old", "a", 0), _c("urgent", "a", 9, priority=5), _c("new", "a", 5)]
    assert plan(queued, [ProjectLoad("a")], slots=3).admit == ["urgent", "old", "new"]


def test_cluster_capacity_bounds_all_projects() -> None:
    d = plan(
        [_c("a1", "a", 0, gpus=6), _c("b1", "b", 1, gpus=6)],
        [],
        slots=5,
        cluster_gpus=8,
        cluster_used=0,
    )
    assert d.admit == ["a1"] and d.waiting["b1"] == "waiting for cluster capacity: 6/8 GPUs"


def test_gpu_seconds_count_the_window_only() -> None:
    now = T0 + dt.timedelta(hours=3)
    spans = [
        (2.0, T0, T0 + dt.timedelta(hours=1)),  # outside a 1 h window
        (2.0, now - dt.timedelta(minutes=30), None),  # 1800 s × 2 GPUs
        (0.0, now - dt.timedelta(minutes=10), now),
    ]  # CPU only: counts as one GPU
    assert gpu_seconds(spans, now, 3600) == pytest.approx(2 * 1800 + 600)


# ------------------------------------------------------------------ the scheduler, for real


@pytest.fixture
def team(sqlite_db: Database, make_settings: Callable):
    settings = make_settings(database_url=sqlite_db.url, max_concurrent_studies=20)
    backend = FakeBackend()
    scheduler = Scheduler(sqlite_db, backend, settings)
    ctx = ServiceContext(sqlite_db, settings, scheduler)
    with sqlite_db.session() as s:
        for name, gpus, weight in (("a", 4, 1.0), ("b", 4, 1.0), ("c", 8, 2.0)):
            identity.create_project(s, name)
            identity.set_quota(s, name, quota_gpus=gpus, weight=weight, max_priority=5)
    return ctx, scheduler, backend


def _submit(ctx: ServiceContext, project: str, n: int, gpus: float = 2.0, **extra) -> list[str]:
    admin = Principal("admin", admin=True)
    spec = lambda i: tiny_spec(  # noqa: E731
        name=f"{project}{i}",
        project=project,
        resources={"cpu": 1, "gpu": gpus},
        **extra,
    )
    return [submit_study(ctx, spec(i), caller=admin)[0].id for i in range(n)]


def _reserved(ctx: ServiceContext) -> dict[str, float]:
    with ctx.db.session(readonly=True) as s:
        running = Repository(s).studies_in(StudyState.RUNNING)
        out: dict[str, float] = {}
        for study in running:
            out[study.project] = out.get(study.project, 0.0) + study.reserved_gpus
        return out


def test_the_scheduler_never_dispatches_above_a_quota_and_says_why(team) -> None:
    ctx, scheduler, _ = team
    ids = {p: _submit(ctx, p, 6) for p in ("a", "b", "c")}
    scheduler.tick()
    assert _reserved(ctx) == {"a": 4.0, "b": 4.0, "c": 8.0}  # FIFO would have run a's six
    waiting = get_study(ctx, ids["a"][2])
    assert waiting.state == StudyState.QUEUED
    assert waiting.queued_reason == "waiting for project quota: 4/4 GPUs"
    for _ in range(3):  # quota full: ticks change nothing, and nothing fails for it
        scheduler.tick()
    assert _reserved(ctx) == {"a": 4.0, "b": 4.0, "c": 8.0}
    first = get_study(ctx, ids["a"][0])
    with ctx.db.session() as s:  # one of a's studies ends: its next study takes the room
        Repository(s).transition(first.id, StudyState.SUCCEEDED)
    scheduler.tick()
    assert _reserved(ctx)["a"] == 4.0
    assert get_study(ctx, ids["a"][2]).state == StudyState.RUNNING
    assert get_study(ctx, ids["a"][2]).queued_reason is None
    with ctx.db.session(readonly=True) as s:
        states = {st.state for st in Repository(s).page_studies(limit=100)}
    assert StudyState.FAILED not in states


def test_priority_orders_a_projects_queue_and_is_bounded(team) -> None:
    ctx, scheduler, _ = team
    low = _submit(ctx, "a", 2)
    high = _submit(ctx, "a", 1, priority=5)
    scheduler.tick()
    assert get_study(ctx, high[0]).state == StudyState.RUNNING
    assert get_study(ctx, low[0]).state == StudyState.RUNNING
    assert get_study(ctx, low[1]).state == StudyState.QUEUED
    from fedtune.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as err:
        _submit(ctx, "a", 1, priority=6)
    assert err.value.field == "priority"
