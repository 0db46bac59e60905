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


# ------------------------------------------------------------------ the GPU-hour quota


def test_a_gpu_hour_quota_admits_what_fits_the_window_and_says_why_not() -> None:
    hour = 3600.0
    load = lambda: ProjectLoad("a", quota_gpu_hours=10, gpu_hour_seconds=8 * hour)  # noqa: E731
    fits = Candidate("fits", "a", 0, T0, 1.0, 1, gpu_seconds=2 * hour)
    d = plan([fits], [load()], slots=5)
    assert d.admit == ["fits"]
    over = Candidate("over", "a", 0, T0, 1.0, 1, gpu_seconds=3 * hour)
    d = plan([over], [load()], slots=5)
    assert d.admit == [] and d.waiting == {
        "over": "waiting for project quota: 8.00/10 GPU-hours used or held in the window,"
        " and it may use 3.00"
    }
    # two that fit one at a time: the first admitted holds its hours, the second waits
    first = Candidate("first", "a", 0, T0, 1.0, 1, gpu_seconds=1.5 * hour)
    second = Candidate("second", "a", 0, T0 + dt.timedelta(minutes=1), 1.0, 1, 1.5 * hour)
    d = plan([first, second], [load()], slots=5)
    assert d.admit == ["first"] and "9.50/10 GPU-hours" in d.waiting["second"]
    alone = Candidate("alone", "a", 0, T0, 4.0, 4, gpu_seconds=4 * 3 * hour)
    d = plan([alone], [ProjectLoad("a", quota_gpu_hours=10)], slots=5)
    assert d.waiting["alone"] == (
        "waiting for project quota: it may use 12.00 GPU-hours (GPUs × budget.time),"
        " more than the project's 10 per window"
    )
    endless = Candidate("endless", "a", 0, T0, 1.0, 1, gpu_seconds=float("inf"))
    d = plan([endless], [ProjectLoad("a", quota_gpu_hours=1e9)], slots=5)
    assert "no time limit" in d.waiting["endless"]
    cpu = Candidate("cpu", "a", 0, T0, 0.0, 1, gpu_seconds=0.0)  # no GPU: nothing to charge
    assert plan([cpu], [load()], slots=5).admit == ["cpu"]


def test_the_charge_counts_the_window_and_what_a_running_study_may_still_use(
    make_settings: Callable,
) -> None:
    from fedtune.service.project_usage import gpu_hour_charge, time_limit_s
    from fedtune.service.specs import stored_spec

    settings = make_settings(fair_share_window_s=3600, study_deadline_s=86400)
    now = T0 + dt.timedelta(hours=5)
    timed = stored_spec({"resources": {"gpu": 2}, "budget": {"time": "90m", "max_concurrent": 1}})
    gpus = stored_spec({"resources": {"gpu": 2}})
    assert time_limit_s(timed, settings) == 5400
    assert time_limit_s(gpus, settings) == 86400
    unbounded = settings.model_copy(update={"study_deadline_s": 0})
    assert time_limit_s(gpus, unbounded) == float("inf")
    began = now - dt.timedelta(minutes=30)
    charge = gpu_hour_charge(timed, began, None, running=True, now=now, settings=settings)
    assert charge == pytest.approx(2 * 5400)  # 30 min used + 60 min it may still use
    # ended after 30 min, within the window: what it used, nothing held
    ended = gpu_hour_charge(timed, began, now, running=False, now=now, settings=settings)
    assert ended == pytest.approx(2 * 1800)
    # started 3 h ago, ended 30 min ago: only its last 30 min lie in the 1 h window
    old = gpu_hour_charge(
        timed,
        now - dt.timedelta(hours=3),
        now - dt.timedelta(minutes=30),
        running=False,
        now=now,
        settings=settings,
    )
    assert old == pytest.approx(2 * 1800)
    requeued = gpu_hour_charge(timed, began, None, running=False, now=now, settings=settings)
    cpu = gpu_hour_charge(stored_spec({}), began, None, running=True, now=now, settings=settings)
    assert requeued == 0.0 and cpu == 0.0


def test_the_scheduler_admits_under_a_gpu_hour_quota_by_budget_time(
    sqlite_db: Database, make_settings: Callable
) -> None:
    """A project with 2 GPU-hours per 8 h window: a 1 GPU × 1 h study runs, a 1 GPU × 90 min
    one waits with the reason (1 + 1.5 > 2) and runs once the first ends early (it then counts
    only what it used); the project's usage shows the hours counted."""
    from fedtune.service.api.routes_admin import get_project

    settings = make_settings(
        database_url=sqlite_db.url, max_concurrent_studies=20, fair_share_window_s=8 * 3600
    )
    scheduler = Scheduler(sqlite_db, FakeBackend(), settings)
    ctx = ServiceContext(sqlite_db, settings, scheduler)
    with sqlite_db.session() as s:
        identity.create_project(s, "g")
        identity.set_quota(s, "g", quota_gpu_hours=2)
    hour = _submit(ctx, "g", 1, gpus=1.0, budget={"trials": 2, "time": "1h"})[0]
    longer = _submit(ctx, "g", 1, gpus=1.0, budget={"trials": 2, "time": "90m"})[0]
    scheduler.tick()
    assert get_study(ctx, hour).state == StudyState.RUNNING
    waiting = get_study(ctx, longer)
    assert waiting.state == StudyState.QUEUED
    assert waiting.queued_reason is not None
    assert waiting.queued_reason.startswith("waiting for project quota: 1.00/2 GPU-hours")
    detail = get_project(ctx, Principal("admin", admin=True), "g")
    assert detail.quota.gpu_hours == 2
    assert detail.usage.gpu_hours == pytest.approx(1.0, abs=0.01)
    with ctx.db.session() as s:
        Repository(s).transition(hour, StudyState.SUCCEEDED)
    scheduler.tick()
    assert get_study(ctx, longer).state == StudyState.RUNNING
    detail = get_project(ctx, Principal("admin", admin=True), "g")
    assert detail.usage.gpu_hours == pytest.approx(1.5, abs=0.01)
