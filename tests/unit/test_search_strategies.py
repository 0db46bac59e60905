"""The search strategies: the default of a new study (``tpe_guard``), ``search.strategy``
validation, and the ``tradeoff`` strategy's selection-rule stop rule on constructed curves and
its theory-guided sweep's proposals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedtune.errors import ConfigError
from fedtune.tuning import SamplerName, SchedulerName, Strategy, StudySpec
from fedtune.tuning.trials.stop_rules import (
    PLATEAU,
    WORSE,
    IncumbentStopper,
    Observed,
    StopRule,
)
from fedtune.tuning.trials.sweep import LINE_STEP, TheorySweep

QUAD = {
    "name": "q",
    "task": {"name": "quadratic", "clients": 4, "dim": 2, "seed": 0},
    "algorithm": "fedavg",
    "train": {"rounds": 60, "clients_per_round": 2, "local_steps": 5, "batch_size": 2},
}


def spec(**extra) -> StudySpec:
    return StudySpec.from_dict({**QUAD, **extra})


# -- the strategy field -----------------------------------------------------------------------
def test_a_new_study_gets_the_default_strategy():
    s = spec()
    assert s.strategy == Strategy.TPE_GUARD  # the default (was tradeoff)
    assert s.sampler_name == SamplerName.TPE and s.scheduler_name is None
    assert StudySpec.from_dict(s.to_dict()).strategy == Strategy.TPE_GUARD  # survives storage


def test_every_strategy_has_a_stopper_that_decides_on_each_configuration():
    """One stopper per study, asked by the one scheduler (PackScheduler) for every
    configuration, packed or not: Ray Tune's ASHA and median rule, which can only stop a whole
    trial, are Optuna's pruners over the same rounds."""
    from fedtune.tuning.trials.stop_rules import (
        IncumbentStopper,
        NeverStop,
        PrunerStopper,
        StopReason,
    )
    from fedtune.tuning.trials.stoppers import stopper_for

    def stopper(s: StudySpec):
        return stopper_for(s, s.search_space(), 60)

    assert isinstance(stopper(spec()), IncumbentStopper)  # the default: its own stop rule
    tradeoff = stopper(spec(search={"strategy": "tradeoff"}))
    assert isinstance(tradeoff, IncumbentStopper) and tradeoff.sweep
    asha = stopper(spec(search={"strategy": "asha"}, scheduler={"grace_rounds": 4}))
    assert isinstance(asha, PrunerStopper) and asha.reason == StopReason.RUNG
    pruner = asha.mirror.pruner
    assert type(pruner).__name__ == "SuccessiveHalvingPruner"
    assert (pruner._min_resource, pruner._reduction_factor) == (4, 3)
    median = stopper(spec(search={"strategy": "median"}))
    assert type(median.mirror.pruner).__name__ == "MedianPruner"
    assert median.reason == StopReason.MEDIAN
    assert isinstance(stopper(spec(search={"strategy": "tpe"})), NeverStop)  # no early stopping
    free = spec(sampler={"name": "random"}, scheduler={"name": "median"})  # no strategy
    assert type(stopper(free).mirror.pruner).__name__ == "MedianPruner"


@pytest.mark.parametrize(
    ("strategy", "sampler", "scheduler"),
    [
        ("tpe", SamplerName.TPE, SchedulerName.NONE),
        ("random", SamplerName.RANDOM, SchedulerName.NONE),
        ("asha", SamplerName.TPE, SchedulerName.ASHA),
        ("median", SamplerName.TPE, SchedulerName.MEDIAN),
        ("tradeoff", SamplerName.TPE, None),
        ("tpe_guard", SamplerName.TPE, None),
        ("hyperband", SamplerName.TPE, None),
    ],
)
def test_each_strategy_selects_its_sampler_and_scheduler(strategy, sampler, scheduler):
    s = spec(search={"strategy": strategy})
    assert (s.sampler_name, s.scheduler_name) == (sampler, scheduler)


def test_naming_a_sampler_or_scheduler_without_a_strategy_keeps_them():
    s = spec(sampler={"name": "random"}, scheduler={"name": "median", "grace_rounds": 5})
    assert s.strategy is None
    assert (s.sampler_name, s.scheduler_name) == (SamplerName.RANDOM, SchedulerName.MEDIAN)
    only = spec(sampler={"name": "nsga2"})  # the other part keeps the former default
    assert (only.sampler_name, only.scheduler_name) == (SamplerName.NSGA2, SchedulerName.ASHA)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"search": {"strategy": "bohb"}}, "Input should be"),
        ({"search": {"strategy": "tpe"}, "sampler": {"name": "random"}}, "sampler.name"),
        ({"search": {"strategy": "asha"}, "scheduler": {"name": "none"}}, "scheduler.name"),
        (
            {
                "search": {"strategy": "tradeoff"},
                "objective": {"metrics": ["final_loss", "rounds_to_target"], "target_loss": 1.0},
            },
            "objective.metrics",
        ),
    ],
)
def test_strategy_errors_name_the_dotted_field(extra, reason):
    with pytest.raises(ConfigError) as err:
        spec(**extra)
    assert err.value.field == "search.strategy"
    assert reason in err.value.reason


def test_a_multi_objective_study_keeps_sampler_and_scheduler():
    s = spec(objective={"metrics": ["final_loss", "rounds_to_target"], "target_loss": 1.0})
    assert s.strategy is None and s.sampler_name == SamplerName.TPE


# -- the stop rule on constructed curves ------------------------------------------------------
T = 60


def selection_rule(losses: np.ndarray, last: int = 10) -> list[float]:
    """The running mean of the last ``last`` rounds (what a trial reports)."""
    return [float(np.mean(losses[max(0, t - last) : t])) for t in range(1, len(losses) + 1)]


def curve(rate: float, floor: float, start: float = 10.0) -> np.ndarray:
    t = np.arange(1, T + 1)
    return floor + (start - floor) * np.exp(-rate * t)


def test_a_slow_starting_small_lr_is_not_stopped_where_a_raw_comparison_stops_it():
    rule = StopRule.for_study(T, 10)
    fast = selection_rule(curve(0.5, 1.0))  # large lr: fast start, worse floor
    slow = selection_rule(curve(0.12, 0.9))  # small lr: slow start, better floor
    assert slow[-1] < fast[-1]  # the selection rule prefers the small lr in the end
    stopped_raw = [t for t in range(1, T + 1) if rule.raw_worse(slow[:t], fast)]
    assert stopped_raw and stopped_raw[0] <= 15  # an early rung would stop it
    assert all(rule.decide(slow[:t], fast, line=False) is None for t in range(1, T + 1))


def test_a_trial_flat_at_a_worse_value_is_stopped_early():
    rule = StopRule.for_study(T, 10)
    incumbent = selection_rule(curve(0.12, 0.9))
    bad = selection_rule(curve(0.5, 1.5))
    stops = [t for t in range(1, T + 1) if rule.decide(bad[:t], incumbent, line=False) == WORSE]
    assert stops and stops[0] <= T // 2


def test_the_stop_rule_compares_the_selection_rule_not_the_last_value():
    rule = StopRule.for_study(T, 10)
    incumbent = selection_rule(np.full(T, 1.0))
    noisy = np.full(T, 1.0)
    noisy[29] = 5.0  # one bad round: the raw value is 5x worse, the mean of 10 only 1.4x
    values = selection_rule(noisy)
    assert rule.raw_worse(list(noisy[:30]), incumbent)
    assert rule.decide(values[:30], incumbent, line=False) is None or values[29] < 5.0


def test_plateau_only_in_the_first_half_and_only_for_line_trials():
    rule = StopRule.for_study(T, 10)
    flat = selection_rule(curve(1.0, 2.0))  # converged within a few rounds
    assert rule.decide(flat[:25], None, line=True) == PLATEAU
    assert rule.decide(flat[:25], None, line=False) is None
    assert rule.decide(flat[: T // 2 + 5], None, line=True) is None  # second half: let it run


def test_a_diverged_value_is_worse():
    rule = StopRule.for_study(T, 10)
    incumbent = selection_rule(curve(0.12, 0.9))
    assert rule.decide([*incumbent[:19], math.inf], incumbent, line=False) == WORSE


def test_max_mode_gaps():
    rule = StopRule.for_study(T, 10, minimize=False)
    incumbent = [0.9] * T
    assert rule.decide([0.5] * 30, incumbent, line=False) == WORSE
    assert rule.decide([0.95] * 30, incumbent, line=False) is None


# -- the theory-guided sweep ------------------------------------------------------------------
def test_the_line_walks_eta_equals_gamma_down_in_half_decades_with_a_seeded_phase():
    space = spec().search_space()
    sweep = TheorySweep(space, seed=3)
    seen: list[Observed] = []
    points = []
    for _ in range(4):
        tag, point = sweep.propose(seen)
        assert tag.startswith("line:")
        points.append(point)
        seen.append(Observed(tag, "diverged"))
    logs = [math.log10(p["hparams.client_lr"]) for p in points]
    assert all(p["hparams.client_lr"] == p["hparams.server_lr"] for p in points)  # η = γ
    assert np.allclose(np.diff(logs), -LINE_STEP)
    assert 1.0 - LINE_STEP < logs[0] <= 1.0  # from the top of [1e-3, 10], a phase below it
    phases = {round(TheorySweep(space, seed=s).top, 6) for s in range(5)}
    assert len(phases) == 5 and TheorySweep(space, seed=3).top == sweep.top


def test_the_line_ends_once_results_get_worse_then_refines_and_moves_k():
    s = spec(
        train={"rounds": 60, "clients_per_round": 2, "batch_size": 2},
        search={
            "override": {
                "local_steps": {
                    "enabled": True,
                    "default": 5,
                    "low": 1,
                    "grid": [1, 5, 20],
                    "high": 20,
                }
            }
        },
    )
    sweep = TheorySweep(s.search_space(), seed=0)
    seen = [
        Observed("line:0", "diverged"),
        Observed("line:1", "stopped", stop=PLATEAU),
        Observed("line:2", "completed", 1.0),
        Observed("line:3", "stopped", stop=WORSE),
    ]
    s_best = sweep.line(2)
    proposals = []
    while (nxt := sweep.propose(seen)) is not None:
        tag, point = nxt
        proposals.append((tag, point))
        seen.append(Observed(tag, "stopped", stop=WORSE))
    tags = [t for t, _ in proposals]
    assert not any(t.startswith("line:") for t in tags)
    near = [p for t, p in proposals if t.startswith("near:")]
    assert sorted(math.log10(p["hparams.client_lr"]) - s_best for p in near) == pytest.approx(
        [-0.25, 0.25]
    )
    for tag, p in proposals:
        if tag.startswith(("k:", "ke:")):
            k = p["train.local_steps"]
            assert k in (1, 20)
            # the server's progress per round η·K is kept; γ·K too for "k:" proposals
            assert p["hparams.server_lr"] * k == pytest.approx(10**s_best * 5)
            gamma_k = p["hparams.client_lr"] * (k if tag.startswith("k:") else 5)
            assert gamma_k == pytest.approx(10**s_best * 5)


def test_state_stops_and_tracks_the_incumbent():
    s = spec()
    state = IncumbentStopper(TheorySweep(s.search_space(), 0), StopRule.for_study(T, 10))
    inc = selection_rule(curve(0.12, 0.9))
    assert state.observe(0, inc) is None
    state.complete(0, "completed", inc[-1])
    assert state.incumbent[0] == inc[-1]
    bad = selection_rule(curve(0.5, 1.5))
    reasons = [state.observe(1, [v]) for v in bad]
    assert WORSE in reasons
    tag, _ = state.propose()
    assert tag == "line:0"


def test_a_curve_that_starts_flat_then_drops_is_not_stopped():
    """A non-convex model's curve: flat near its start value, then a drop (digits MLP)."""
    rounds = 30
    rule = StopRule.for_study(rounds, 10)
    t = np.arange(1, rounds + 1)
    incumbent = selection_rule(0.1 + 2.2 / (1 + np.exp(0.6 * (t - 6))), 10)
    late = selection_rule(0.08 + 2.2 / (1 + np.exp(0.6 * (t - 8))), 10)
    assert late[-1] < incumbent[-1]  # the late starter ends better
    assert rule.raw_worse(late[:5], incumbent)  # an early comparison stops it at round 5
    assert all(rule.decide(late[:k], incumbent, line=False) is None for k in range(1, rounds + 1))


def test_a_stopper_hears_each_new_round_once():
    """RoundFeed (the scheduler's): a round delivered twice, or without a value,
    does not reach the stopper; a report without a new round does not call it."""
    from fedtune.tuning.keys import OBJECTIVE, ROUND
    from fedtune.tuning.trials.schedulers import RoundFeed
    from fedtune.tuning.trials.stop_rules import Stopper, StopReason

    class Recorder(Stopper):
        def __init__(self) -> None:
            self.calls: list[tuple[int, list[float]]] = []

        def observe(self, number, values):
            self.calls.append((number, list(values)))
            return StopReason.WORSE if values[-1] > 5 else None

    def rows(*pairs):
        return [{ROUND: r, OBJECTIVE: v} for r, v in pairs]

    recorder = Recorder()
    feed = RoundFeed(recorder)
    assert feed.observe(3, rows((1, 1.0), (2, None), (3, 2.0))) is None
    assert feed.observe(3, rows((2, 9.0), (3, 9.0))) is None  # delivered again: nothing new
    assert feed.observe(4, rows((1, 6.0))) == StopReason.WORSE  # trials are apart
    assert feed.observe(3, rows((3, 2.0), (4, 7.0))) == StopReason.WORSE
    assert recorder.calls == [(3, [1.0, 2.0]), (4, [6.0]), (3, [7.0])]
    assert feed.observe(3, []) is None and len(recorder.calls) == 3
