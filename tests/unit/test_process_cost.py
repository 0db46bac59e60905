"""The in-process choice by cost (``fedtune.tuning.packing.cost``): several configurations at once
with ``pack: auto`` run as one pack in the driver's process where that is estimated to cost no
more than Ray Tune's trial processes, Ray's start included, and through Ray where the work
needs it."""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest

from fedtune.tuning.driver.placement import likely_in_process, place
from fedtune.tuning.packing.cost import RAY_START_S, ProcessCost, study_work, weigh
from fedtune.tuning.packing.speed import PackSpeed, measure
from fedtune.tuning.spec import StudySpec
from tests.unit import test_placement as placement_table

#: the placement table's study with two configurations at once
BASE = {**placement_table.BASE, "budget": {"trials": 4, "max_concurrent": 2}}


def _spec(**changes) -> StudySpec:
    doc = copy.deepcopy(BASE)
    for key, value in changes.items():
        doc[key] = value
    return StudySpec.from_dict(doc)


def test_a_short_study_costs_less_as_one_pack_here() -> None:
    speed = PackSpeed(2, packed=50.0, unpacked=30.0, threads=1)
    cost = weigh(speed, work=480, time_s=None, processes=2, threads=2)
    assert cost.here_s == pytest.approx(480 / 50.0)
    assert cost.ray_s == pytest.approx(RAY_START_S + 480 / 60.0)
    assert cost.here and cost.threads == 2
    assert "through Ray, its start included" in cost.describe()


def test_a_long_study_of_arithmetic_needs_ray() -> None:
    """A pack that runs no faster than one configuration alone loses to two processes once the
    work pays Ray's start."""
    speed = PackSpeed(2, packed=12.0, unpacked=10.0, threads=1)
    short = weigh(speed, work=100, time_s=None, processes=2, threads=1)
    long = weigh(speed, work=10_000, time_s=None, processes=2, threads=1)
    assert short.here  # 8.3 s here against 9 + 5 s
    assert not long.here  # 833 s here against 9 + 500 s
    # one process slot (a 1-CPU machine): Ray has no parallelism to sell
    assert weigh(speed, work=10_000, time_s=None, processes=1, threads=1).here


def test_a_time_budget_weighs_what_each_side_trains_in_it() -> None:
    speed = PackSpeed(4, packed=40.0, unpacked=15.0, threads=1)
    cost = weigh(speed, work=None, time_s=60.0, processes=2, threads=1)
    assert cost.here_s == pytest.approx(60.0)
    assert cost.ray_s == pytest.approx(RAY_START_S + 40.0 * 60.0 / 30.0)
    assert cost.here


def test_what_was_not_measured_goes_to_ray() -> None:
    slow = PackSpeed(2, None, None, "a round of one configuration took 1.4 s")
    cost = weigh(slow, work=100, time_s=None, processes=2, threads=1)
    assert not cost.here
    assert cost.describe() == "not estimated: a round of one configuration took 1.4 s"
    unbounded = weigh(PackSpeed(2, 5.0, 5.0), work=None, time_s=None, processes=2, threads=1)
    assert not unbounded.here and "no budget" in unbounded.why
    assert not ProcessCost(1, None, 3.0).here


def test_the_work_is_trials_rounds_and_seeds() -> None:
    assert study_work(_spec(), 4) == 4 * 2  # trials × rounds
    assert study_work(_spec(seeds=[0, 1, 2]), 4) == 4 * 2 * 3
    budget = {"max_concurrent": 2, "configuration_rounds": 6}
    assert study_work(_spec(budget=budget), None) == 6
    assert study_work(_spec(budget={"max_concurrent": 2, "time": 30}), None) is None


def test_a_quadratic_pack_runs_here_and_says_why(no_ray) -> None:
    placed = place(_spec(), allowed=True, target=4)
    assert placed.in_process
    assert placed.why.startswith("estimated ") and "in this process against" in placed.why
    assert placed.threads >= 1


def test_an_algorithm_that_cannot_pack_goes_to_ray(no_ray) -> None:
    """SCAFFOLD's round is its own (control variates): no pack, so Ray's processes; the prefetch,
    which cannot know that before the engine, guesses this process, and ``run_study`` puts it
    right."""
    doc = copy.deepcopy(BASE) | {"algorithm": "scaffold", "search": {"space": "scaffold"}}
    placed = place(StudySpec.from_dict(copy.deepcopy(doc)), allowed=True, target=4)
    assert placed == place(_spec(), allowed=False)  # through Ray, nothing weighed
    assert not placed.in_process and placed.why == ""
    assert likely_in_process(doc, allowed=True)


def test_more_configurations_than_a_cpu_pack_holds_go_to_ray(no_ray) -> None:
    budget = {"trials": 80, "max_concurrent": 65}
    assert not place(_spec(budget=budget), allowed=True, target=80).in_process
    assert not likely_in_process(copy.deepcopy(BASE) | {"budget": budget}, allowed=True)


def test_more_threads_are_kept_only_by_a_margin() -> None:
    """The pack's threads: with no margin the faster of the counts timed; a margin no pack can
    beat keeps the first (one thread)."""
    spec = _spec()
    assert measure(spec, 2, packed_threads=(1, 2), alone=1).threads in (1, 2)
    assert measure(spec, 2, packed_threads=(1, 2), alone=1, margin=float("inf")).threads == 1
    assert measure(spec, 2, packed_threads=(2,), alone=1).threads == 2


def test_ray_start_is_weighed_as_slow_as_the_machine_runs_now() -> None:
    """The rates are timed on the machine as busy as it is; Ray's start, measured on a quiet
    one, is scaled by the same slowdown: a busy machine no longer sends the pack to Ray."""
    work = 1_000
    quiet = weigh(PackSpeed(2, 100.0, 80.0), work=work, time_s=None, processes=2, threads=1)
    assert quiet.ray_s == pytest.approx(RAY_START_S + work / 160.0)
    assert quiet.here  # 10 s here against 9 + 6.25 s
    busy = PackSpeed(2, 20.0, 16.0, slowdown=5.0)  # the same study, five times slower
    unscaled = weigh(
        dataclasses.replace(busy, slowdown=1.0), work=work, time_s=None, processes=2, threads=1
    )
    assert not unscaled.here  # 50 s here against 9 + 31.25 s: what a load of 12 did before
    scaled = weigh(busy, work=work, time_s=None, processes=2, threads=1)
    assert scaled.here_s == pytest.approx(5 * quiet.here_s)
    assert scaled.ray_s == pytest.approx(5 * quiet.ray_s)  # every term five times
    assert scaled.here


def test_the_probe_reads_how_much_slower_its_thread_runs(monkeypatch) -> None:
    """One torch thread: the one-at-a-time rounds' wall time over their thread's CPU time (a
    clock whose thread gets a third of the CPU reads 3); never below 1; 1 for more threads."""
    import fedtune.tuning.packing.speed as speed_module

    class Starved:
        """``time`` whose thread's CPU clock runs at a third of the wall clock: it reads a third
        of the wall clock's last reading (read apart, the two clocks drifted by the time between
        the reads: 3.0033 in a loaded CI-form run)."""

        last = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            cls.last = time.perf_counter()
            return cls.last

        @classmethod
        def thread_time(cls) -> float:
            return cls.last / 3

    monkeypatch.setattr(speed_module, "time", Starved)
    assert measure(_spec(), 2, alone=1).slowdown == pytest.approx(3.0, rel=1e-3)
    assert speed_module._slowdown(0.5, 1.0, 1) == 1.0  # never faster than its CPU time
    assert speed_module._slowdown(3.0, 1.0, 2) == 1.0  # two threads: not all on this one
    assert speed_module._slowdown(3.0, 0.0, 1) == 1.0  # nothing timed
