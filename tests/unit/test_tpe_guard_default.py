"""The default search strategy (``tpe_guard``), its stopping and the ``hyperband`` strategy.

* The default's stop rule keeps a configuration that ends *better* than the incumbent, on real
  engine curves of LEAF synthetic(1, 1) (the task where the best has η = 10 γ): the old
  rule (``StopRule.for_study``) stops it at round 24 because its own recent rate, extrapolated,
  did not reach the incumbent — the best region thrown away.
* Hyperband / successive halving compares trials at the *same* round (a rung), not a trial's
  early value against another's final value.
* Seeded determinism of Hyperband's brackets and of the in-process search.
* ``fedtune tune``'s summary names the strategy that ran and, when most trials were stopped,
  how many completed.
"""

from __future__ import annotations

import optuna
import pytest

from fedtune.tuning import SamplerName, Strategy, StudySpec
from fedtune.tuning.spec import DEFAULT_STRATEGY
from fedtune.tuning.trials.stop_rules import RUNG, IncumbentStopper, PrunerStopper, StopRule
from fedtune.tuning.trials.stoppers import stopper_for

SYNTHETIC = {
    "name": "synthetic-1-1",
    "task": {"name": "synthetic", "clients": 30, "alpha": 1.0, "beta": 1.0, "seed": 0},
    "algorithm": "fedavg",
    "train": {
        "rounds": 30,
        "clients_per_round": 10,
        "local_steps": 10,
        "batch_size": 10,
        "eval_every": 30,
    },
    "search": {"space": "fedavg"},
    "objective": {"metric": "train_loss", "last_rounds": 10},
}
#: two points of the 9 x 9 grid (benchmarks/results/search_grids/synthetic.json): the first ends
#: at 0.672 (2nd best of 81), the second at 0.691 but it is ahead of the first until round ~27
ENDS_BETTER = {"hparams.client_lr": 0.001, "hparams.server_lr": 10**-1.5}
FASTER_START = {"hparams.client_lr": 10**-2.5, "hparams.server_lr": 10**-1.5}


def selection_rule(losses: list[float], last: int = 10) -> list[float]:
    return [
        sum(losses[max(0, t - last) : t]) / len(losses[max(0, t - last) : t])
        for t in range(1, len(losses) + 1)
    ]


@pytest.fixture(scope="module")
def synthetic_curves():
    import torch

    from fedtune.trainers import run_trial

    torch.set_num_threads(1)
    spec = StudySpec.from_dict(SYNTHETIC)
    out = {}
    for key, point in (("better", ENDS_BETTER), ("faster", FASTER_START)):
        result = run_trial(spec.trial(point))
        out[key] = selection_rule([v for _, v in result.curve("client_loss")])
    return spec, out


def test_a_new_study_gets_a_default_that_runs_tpe_and_keeps_its_trials_comparable():
    spec = StudySpec.from_dict(SYNTHETIC)
    assert spec.strategy == DEFAULT_STRATEGY != Strategy.TRADEOFF
    assert spec.sampler_name == SamplerName.TPE
    state = stopper_for(spec, spec.search_space(), 30)
    assert isinstance(state, IncumbentStopper) and state.propose() is None  # no γ = η sweep


def test_the_default_does_not_stop_a_configuration_that_ends_better(synthetic_curves):
    spec, c = synthetic_curves
    better, faster = c["better"], c["faster"]
    assert better[-1] < faster[-1]  # it ends better ...
    assert any(better[t] > faster[t] for t in range(20, 26))  # ... but is behind at round ~24
    old = StopRule.for_study(30, 10)
    assert any(old.decide(better[:k], faster, line=False) for k in range(1, 31))  # old: stopped

    state = stopper_for(spec, spec.search_space(), 30)  # the default strategy's stop rule
    state.started(0, None)
    assert all(state.observe(0, [v]) is None for v in faster)
    state.complete(0, "completed", faster[-1])
    state.started(1, None)
    assert all(state.observe(1, [v]) is None for v in better)  # ran to the end


def test_successive_halving_compares_trials_at_the_same_round():
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=2)
    stop = PrunerStopper(pruner, "sh")
    first = [1.0, 0.8, 0.6, 0.5, 0.45, 0.4]  # completes; its final value is 0.4
    for number, curve in enumerate([first]):
        assert all(stop.observe(number, [v]) is None for v in curve)
        stop.complete(number, "completed", curve[-1])
    # slow start: worse than the first trial's *final* value at round 2, better than its value
    # *at round 2*, so it goes on (an incumbent-final comparison would stop it)
    slow = [0.95, 0.7, 0.55, 0.42, 0.36, 0.3]
    assert all(stop.observe(1, [v]) is None for v in slow)
    stop.complete(1, "completed", slow[-1])
    # worse than both at round 2: stopped there, on the rung
    worse = [1.0, 0.95, 0.9]
    assert [stop.observe(2, [v]) for v in worse][:2] == [None, RUNG]


def test_hyperband_brackets_and_decisions_are_seeded():
    def decisions() -> list:
        stop = PrunerStopper.hyperband("study-x", rounds=27, grace=10, factor=3)
        out = []
        for n in range(12):
            curve = [1.0 / (1 + 0.05 * (n % 5 + 1) * t) for t in range(1, 28)]
            stopped = next((t for t, v in enumerate(curve, 1) if stop.observe(n, [v])), None)
            stop.complete(n, "stopped" if stopped else "completed", None if stopped else curve[-1])
            out.append(stopped)
        return out

    first = decisions()
    assert first == decisions()
    assert any(first)  # some trials were stopped, on rungs


def test_hyperband_is_a_strategy_with_its_own_stop_rule():
    spec = StudySpec.from_dict(
        {**SYNTHETIC, "search": {"space": "fedavg", "strategy": "hyperband"}}
    )
    assert spec.sampler_name == SamplerName.TPE and spec.scheduler_name is None
    state = stopper_for(spec, spec.search_space(), 30)
    assert isinstance(state, PrunerStopper)
    assert type(state.mirror.pruner).__name__ == "HyperbandPruner"


def test_tune_summary_names_the_strategy_and_counts_stopped_trials():
    from fedtune.cli.tune import _strategy_lines

    spec = StudySpec.from_dict(SYNTHETIC)
    lines = _strategy_lines(
        spec, {"trials": 32, "completed": 5, "stopped": 27}, {"worse": 25, "plateau": 2}
    )
    assert lines[0].endswith(
        f"strategy {DEFAULT_STRATEGY} (the default): TPE sampler + guard stop rule"
    )
    assert "27 trials (worse: 25, plateau: 2); 5 completed" in lines[1]
    few = _strategy_lines(spec, {"trials": 10, "completed": 8, "stopped": 2}, {"worse": 2})
    assert few[1] == "stopped early  : 2 trials (worse: 2)"  # why, even when few stopped
    named = StudySpec.from_dict({**SYNTHETIC, "search": {"space": "fedavg", "strategy": "tpe"}})
    assert _strategy_lines(named, {"trials": 4, "completed": 4}, {}) == [
        "search         : strategy tpe: TPE sampler, no early stopping"
    ]
