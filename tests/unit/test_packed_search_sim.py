"""benchmarks/search_sim.py with packed trials on a tiny task: a pack's P configurations are
asked together, each is told once and its place refilled, the stopper stops members one by one
while the others go on, a pack is charged the rounds it ran, and ``pack=1`` is the unpacked
path. Nothing here asserts a timing or a search result."""

from __future__ import annotations

import json
import math
import sys

import pytest
from optuna.trial import TrialState

from tests.benchmarks import load_benchmark
from tests.unit.test_search_efficiency_benchmark import TINY

P = 4


@pytest.fixture(scope="module")
def bench():
    """``search_efficiency`` (it puts ``benchmarks/`` on ``sys.path`` for ``search_sim``)."""
    return load_benchmark("search_efficiency.py")


@pytest.fixture(scope="module")
def sim(bench):
    """``search_sim`` and the tiny task with one curve cache for every test."""
    tasks, module = sys.modules["search_tasks"], sys.modules["search_sim"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tasks.TASKS, "tiny", TINY)
        task = tasks.Task("tiny")
        yield module, task, module.CurveCache(task)


def _logged(module, monkeypatch) -> list[tuple[str, int]]:
    """Record every ask and tell of the studies the sim creates, in order."""
    log: list[tuple[str, int]] = []
    make = module._study

    def study(spec, target):
        s = make(spec, target)
        ask, tell = s.ask, s.tell

        def logged_ask(*a, **k):
            trial = ask(*a, **k)
            log.append(("ask", trial.number))
            return trial

        def logged_tell(trial, *a, **k):
            log.append(("tell", trial.number))
            return tell(trial, *a, **k)

        s.ask, s.tell = logged_ask, logged_tell
        log.append(("study", id(s)))
        return s

    monkeypatch.setattr(module, "_study", study)
    return log


@pytest.mark.parametrize("strategy", ["tpe_guard", "hyperband"])
def test_a_pack_is_asked_together_and_each_member_told_once(sim, monkeypatch, strategy) -> None:
    module, task, cache = sim
    log = _logged(module, monkeypatch)
    steps = module.run_strategy(task, strategy, 0, 4 * task.rounds, 16, 4, cache, pack=P)
    events = [e for e in log if e[0] != "study"]
    asked = [n for kind, n in events if kind == "ask"]
    told = [n for kind, n in events if kind == "tell"]
    assert len(told) == len(set(told)) == len(steps)  # each member told once
    assert [s.number for s in steps] == told and set(told) <= set(asked)
    # P asks together; after that an ask refills a place a tell freed (every configuration of
    # the tiny task shares a pack key): never more than P pending, and the pack took refills
    assert all(kind == "ask" for kind, _ in events[:P])
    pending = 0
    for kind, _ in events:
        pending += 1 if kind == "ask" else -1
        assert 0 <= pending <= P, events
    packs = sorted({s.pack for s in steps})
    assert packs == list(range(len(packs)))
    assert len({s.number for s in steps if s.pack == 0}) > P
    # a pack is charged exactly the rounds its members ran, in the order they ended
    for p in packs:
        mine = [s for s in steps if s.pack == p]
        assert sum(s.cost for s in mine) == sum(s.rounds for s in mine)
        assert all(s.cost >= 0 for s in mine)


def test_the_stopper_stops_members_while_the_others_go_on(sim) -> None:
    module, task, cache = sim
    # seed 4: its rungs stop five members (seed 0's configurations diverge or complete)
    steps = module.run_strategy(task, "hyperband", 4, 4 * task.rounds, 16, 4, cache, pack=P)
    stopped = [s for s in steps if s.value is None]
    assert stopped and all(s.stop == "rung" and s.rounds < task.rounds for s in stopped)
    # a stopped member left its pack, which went on without it (the last one may end a pack)
    went_on = [s for s in stopped if any(o.pack == s.pack for o in steps[steps.index(s) + 1 :])]
    assert len(went_on) >= len(stopped) - 1 and went_on
    completed = [s for s in steps if s.value is not None and math.isfinite(s.value)]
    assert completed and all(s.rounds == task.rounds for s in completed)


def test_the_budget_counts_every_round_a_pack_ran(sim, bench) -> None:
    module, task, cache = sim
    steps = module.run_strategy(task, "tpe_guard", 1, 2 * task.rounds, 8, 2, cache, pack=P)
    ran = sum(s.rounds for s in steps)
    assert ran >= 2 * task.rounds or len(steps) == 8
    for budget in range(0, ran + 1, 5):
        _, done = bench.best_within(steps, budget)
        assert sum(s.cost for s in done) <= budget
        if done and done[-1] is not steps[-1]:  # the next one's rounds did not fit
            assert sum(s.cost for s in done) + steps[len(done)].cost > budget


@pytest.mark.parametrize("strategy", ["tpe_guard", "hyperband", "tpe"])
def test_pack_1_is_the_unpacked_path(sim, strategy) -> None:
    module, task, cache = sim
    args = (task, strategy, 0, 4 * task.rounds, 16, 4, cache)
    plain = module.run_strategy(*args)
    assert module.run_strategy(*args, pack=1) == plain
    assert all(s.cost is None and s.charged == s.rounds for s in plain)
    # the packed path with one configuration per pack decides as the unpacked one (when no
    # trial is stopped at its last round: a pack's final member result is not observed)
    assert not any(s.stop and s.rounds == task.rounds for s in plain)
    spec, _, _ = module.pack_plan(module.study_spec(task, strategy, 0, 4), 1)
    single = module.run_packed(task, spec, 1, 4 * task.rounds, 16, 4, cache)

    def key(s):
        return s.number, s.point, s.rounds, s.value, s.stop

    assert [key(s) for s in single] == [key(s) for s in plain]
    assert [s.cost for s in single] == [s.rounds for s in plain]


def test_a_study_that_cannot_pack_runs_unpacked(sim, monkeypatch) -> None:
    module, task, cache = sim
    import fedtune.tuning.packing.plan as packing

    monkeypatch.setattr(packing, "refusal", lambda spec: "its own round")
    spec, size, note = module.pack_plan(module.study_spec(task, "tpe_guard", 0, 4), P)
    assert size == 1 and "its own round" in note and spec.resources.pack == P
    args = (task, "tpe_guard", 0, 2 * task.rounds, 8, 2, cache)
    assert module.run_strategy(*args, pack=P) == module.run_strategy(*args)


def test_optuna_ends_with_every_told_member_finished(sim, monkeypatch) -> None:
    module, task, cache = sim
    made = []
    make = module._study
    monkeypatch.setattr(module, "_study", lambda spec, n: made.append(make(spec, n)) or made[-1])
    steps = module.run_strategy(task, "hyperband", 2, 3 * task.rounds, 12, 3, cache, pack=P)
    (study,) = made
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    for s in steps:
        want = TrialState.PRUNED if s.value is None else TrialState.COMPLETE
        assert states[s.number] == want
    left = [n for n, st in states.items() if st == TrialState.RUNNING]
    assert not set(left) & {s.number for s in steps}


def test_the_report_compares_the_packed_strategy_with_the_unpacked_one(
    bench, tmp_path, monkeypatch
) -> None:
    tasks = sys.modules["search_tasks"]
    monkeypatch.setitem(tasks.TASKS, "tiny", TINY)
    monkeypatch.setattr(tasks, "GRIDS", tmp_path / "grids")
    out = tmp_path / "packing.json"
    args = ["--tasks", "tiny", "--seeds", "0", "1", "--budgets", "2", "4", "--out", str(out)]
    bench.main([*args, "--strategies", "tpe_guard", "--pack", "1", str(P)])
    doc = json.loads(out.read_text())
    search = doc["tasks"]["tiny"]["search"]
    assert set(search) == {"tpe_guard", f"tpe_guard+pack{P}"}
    pack = dict(search[f"tpe_guard+pack{P}"]["pack"])
    groups = pack.pop("vmapped_groups")
    assert pack.pop("refill_delay") == 0  # the default: a refill runs at the next round
    assert pack == {
        "pack": P,
        "size": P,
        "packed": True,
        "note": f"{P} configurations per trial process, 1 process at once (resources.pack = {P})",
    }
    # refills start at round 0 beside members further on: one vmapped group per round index
    assert 1 <= groups["median_mean"] <= groups["max"] <= P
    assert 0 <= groups["median_share_one"] <= 1
    summary = doc["packing"][f"tpe_guard+pack{P}"]
    assert summary["unpacked"] == "tpe_guard" and summary["cells"] == 2
    cells = summary["by_cell"]
    assert set(cells) == {"tiny@2", "tiny@4"}
    for cell in cells.values():
        gaps = [math.inf if g is None else g for g in cell["median_gap"]]  # None: none completed
        seeds = cell["seeds_within_1pct"]
        assert cell["no_worse"] == (gaps[1] <= gaps[0] + 1e-12 and seeds[1] >= seeds[0])
    assert summary["no_worse"] == sum(c["no_worse"] for c in cells.values())
    assert sorted(summary["worse"]) == sorted(k for k, c in cells.items() if not c["no_worse"])
    packed = doc["tasks"]["tiny"]["traces"][f"tpe_guard+pack{P}"]["4"][0]
    assert all(len(row) == 5 for row in packed)  # rounds, value, stop, cost, pack
    assert "tpe_guard+pack" in bench.packing_table(doc)


C = 3


@pytest.mark.parametrize("strategy", ["tpe_guard", "hyperband", "tpe"])
def test_concurrent_1_is_the_sequential_path(sim, strategy) -> None:
    module, task, cache = sim
    args = (task, strategy, 0, 4 * task.rounds, 16, 4, cache)
    plain = module.run_strategy(*args)
    assert module.run_strategy(*args, concurrent=1) == plain
    # run_concurrent with one slot decides as the sequential path (no trial stopped at its
    # last round here: that corner ends completed in run_concurrent, as the engine's)
    assert not any(s.stop and s.rounds == task.rounds for s in plain)
    single = module.run_concurrent(
        task, module.study_spec(task, strategy, 0, 4), 1, 4 * task.rounds, 16, 4, cache
    )

    def key(s):
        return s.number, s.point, s.rounds, s.value, s.stop

    assert [key(s) for s in single] == [key(s) for s in plain]
    assert [s.cost for s in single] == [s.rounds for s in plain]


@pytest.mark.parametrize("strategy", ["tpe_guard", "hyperband"])
def test_concurrent_trials_refill_their_slots_at_once(sim, monkeypatch, strategy) -> None:
    module, task, cache = sim
    log = _logged(module, monkeypatch)
    budget, cap = 4 * task.rounds, 16
    steps = module.run_strategy(task, strategy, 0, budget, cap, 4, cache, concurrent=C)
    events = [e for e in log if e[0] != "study"]
    asked = [n for kind, n in events if kind == "ask"]
    told = [n for kind, n in events if kind == "tell"]
    assert len(told) == len(set(told)) == len(steps) and set(told) == set(asked)  # told once
    assert [s.number for s in steps] == told
    assert events[:C] == [("ask", n) for n in asked[:C]]
    by = {s.number: s for s in steps}
    if strategy == "hyperband":
        assert any(s.value is None for s in steps)  # the stopper stopped some

    def length(s):  # ticks a trial occupies its slot: its rounds (+ the one it diverged at)
        return s.rounds + (s.value is not None and not math.isfinite(s.value))

    # replay the log: a tick's tells, then the asks that refill the slots they freed
    start: dict[int, int] = {}
    now, running, ran, asks_open = 0, set(), 0, True  # ticks, trials running, rounds run
    i = 0
    while i < len(events):
        kind, n = events[i]
        if kind == "ask":
            assert asks_open
            start[n] = now  # runs its round 1 at the next tick
            running.add(n)
            assert len(running) <= C
            i += 1
            continue
        told_run = []
        while i < len(events) and events[i][0] == "tell":
            told_run.append(events[i][1])
            i += 1
        ends = [start[m] + length(by[m]) for m in told_run]
        assert ends == sorted(ends)  # told in the order they ended
        for end in sorted(set(ends)):  # one tick's tells
            group = [m for m, e in zip(told_run, ends, strict=True) if e == end]
            assert end > now
            # every trial running since the previous tells ran each tick up to this one
            assert all(start[m] + length(by[m]) >= end for m in running)
            rounds = sum(
                min(by[m].rounds, end - start[m]) - min(by[m].rounds, max(0, now - start[m]))
                for m in running
            )
            assert by[group[0]].cost == rounds and all(by[m].cost == 0 for m in group[1:])
            ran += rounds
            now = end
            running -= set(group)
            refill = 0
            if end == ends[-1]:
                while i + refill < len(events) and events[i + refill][0] == "ask":
                    refill += 1
            # freed slots are refilled at once unless the study stopped asking
            if len(start) < cap and ran < budget:
                assert refill == min(C - len(running), cap - len(start))
            else:
                assert refill == 0
                asks_open = False
    assert not running
    assert sum(s.cost for s in steps) == sum(s.rounds for s in steps) == ran
    assert ran >= budget or len(asked) == cap
    # C trials ran at once from the first tick, one told trial's slot went to a later one
    assert sorted(start.values())[: C + 1] == [0] * C + [min(v for v in start.values() if v)]


def test_the_report_compares_packing_with_as_many_trials_at_once(bench, tmp_path, monkeypatch):
    tasks = sys.modules["search_tasks"]
    monkeypatch.setitem(tasks.TASKS, "tiny", TINY)
    monkeypatch.setattr(tasks, "GRIDS", tmp_path / "grids")
    out = tmp_path / "packing.json"
    args = ["--tasks", "tiny", "--seeds", "0", "--budgets", "2", "4", "--out", str(out)]
    args += ["--strategies", "tpe_guard"]
    bench.main([*args, "--pack", "1", str(P), "--concurrent", str(P)])
    doc = json.loads(out.read_text())
    search = doc["tasks"]["tiny"]["search"]
    assert set(search) == {f"tpe_guard@c{P}", f"tpe_guard+pack{P}"}
    assert search[f"tpe_guard@c{P}"]["concurrent"] == P
    assert set(doc["packing"]) == {f"tpe_guard+pack{P}"}
    assert doc["packing"][f"tpe_guard+pack{P}"]["unpacked"] == f"tpe_guard@c{P}"
    wide = doc["tasks"]["tiny"]["traces"][f"tpe_guard@c{P}"]["4"][0]
    assert all(len(row) == 5 and row[4] is None for row in wide)  # cost, no pack
    bench.main(args)  # the sequential study too: both comparisons
    doc = json.loads(out.read_text())
    assert set(doc["tasks"]["tiny"]["search"]) == {
        "tpe_guard",
        f"tpe_guard@c{P}",
        f"tpe_guard+pack{P}",
    }
    packing = doc["packing"]
    assert set(packing) == {f"tpe_guard+pack{P}", f"tpe_guard+pack{P} vs tpe_guard"}
    assert packing[f"tpe_guard+pack{P}"]["unpacked"] == f"tpe_guard@c{P}"
    assert packing[f"tpe_guard+pack{P} vs tpe_guard"]["unpacked"] == "tpe_guard"
    assert all(p["packed"] == f"tpe_guard+pack{P}" and p["cells"] == 2 for p in packing.values())
    table = bench.packing_table(doc)
    assert f"tpe_guard@c{P}: gap" in table and "tpe_guard: gap" in table


def test_a_packs_vmapped_groups_are_its_members_distinct_rounds(sim) -> None:
    module, task, cache = sim
    groups: list[int] = []
    steps = module.run_strategy(
        task, "hyperband", 4, 4 * task.rounds, 16, 4, cache, pack=P, groups=groups
    )
    # one entry per round the pack ran: the first round is one group (every member at round 1),
    # refills make more, never more than the members
    assert groups[0] == 1 and max(groups) > 1 and all(1 <= g <= P for g in groups)
    assert len(groups) >= max(s.rounds for s in steps)


class _NoStop:
    def observe(self, number, values):
        return None

    def complete(self, number, outcome, value):
        return None


@pytest.mark.parametrize(
    ("first", "delay", "groups", "told"),
    [
        # m0 ends at round 3; its refill (2 rounds) starts at once, beside m1 (6 rounds) ...
        ((3, 6), 0, [1, 1, 1, 2, 2, 1], [3, 2, 6]),
        # ... or two rounds later, while m1 runs on
        ((3, 6), 2, [1, 1, 1, 1, 1, 2, 1], [3, 6, 2]),
        # a pack with no member left waits for its refill: no delay then
        ((3,), 2, [1, 1, 1, 1, 1], [3, 2]),
    ],
)
def test_a_refill_waits_its_delay_while_the_pack_runs_on(sim, first, delay, groups, told):
    import optuna

    module = sim[0]
    study = optuna.create_study()
    extra = [module._Member(study.ask(), {}, [1.0, 0.5], "completed")]

    def refill(n: int) -> list:
        return [extra.pop()] if extra else []

    members = [module._Member(study.ask(), {}, [1.0] * r, "completed") for r in first]
    seen: list[int] = []
    run = module._PackedRun(study, _NoStop(), 1, seen, delay)
    run.pack(members, refill)
    assert seen == groups  # one entry per round the pack ran: its members' distinct rounds
    assert run.used == sum(first) + 2  # waiting costs no rounds
    assert [s.rounds for s in run.steps] == told
