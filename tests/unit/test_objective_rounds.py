"""The running objective of a trial costs the same at every round (no
per-round work that grows with the round number): rounds-to-target is kept incrementally and
equals, bit for bit, the trade-off's definition on the whole curve."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedtune.tuning.analysis.tradeoff import rounds_to_target, smooth
from fedtune.tuning.keys import SMOOTH_WINDOW
from fedtune.tuning.spec import StudySpec
from fedtune.tuning.trials import results
from fedtune.tuning.trials.results import ObjectiveTracker, _FirstReach


def _curve(seed: int, n: int) -> list[float]:
    rng = np.random.default_rng(seed)
    losses = list(np.exp(-np.linspace(0, 3, n)) + 0.05 * rng.standard_normal(n))
    for i in rng.choice(n, size=3, replace=False):
        losses[i] = float(rng.choice([math.inf, math.nan, -math.inf]))
    return [float(v) for v in losses]


@pytest.mark.parametrize("seed", range(6))
def test_incremental_rounds_to_target_is_the_tradeoffs_bit_for_bit(seed) -> None:
    losses = _curve(seed, 60)
    rounds = list(range(1, 61))
    for target in (0.9, 0.5, 0.3, 0.1, 1e-6):
        reach = _FirstReach(target)
        for k, (r, v) in enumerate(zip(rounds, losses, strict=True), start=1):
            reach.observe(r, v)
            expected = rounds_to_target(rounds[:k], smooth(losses[:k], SMOOTH_WINDOW), target)
            assert reach.round == expected


def test_the_trackers_values_never_walk_the_whole_curve(monkeypatch) -> None:
    spec = StudySpec.from_dict(
        {
            "name": "m",
            "task": {"name": "quadratic", "clients": 4, "dim": 2},
            "algorithm": "fedavg",
            "objective": {"metrics": ["final_loss", "rounds_to_target"], "target_loss": 0.2},
            "sampler": {"name": "nsga2"},
        }
    )
    longest: list[int] = []

    def spy(losses, window):  # the old tracker smoothed all rounds so far at every report
        longest.append(len(losses))
        return smooth(losses, window)

    monkeypatch.setattr(results, "smooth", spy, raising=False)
    tracker = ObjectiveTracker(spec)
    for r, loss in enumerate(_curve(0, 200), start=1):
        tracker.observe({"round": r, "client_loss": loss})
        values = tracker.values()
    assert max(longest, default=0) <= SMOOTH_WINDOW
    losses = _curve(0, 200)
    assert values["rounds_to_target"] == rounds_to_target(
        list(range(1, 201)), smooth(losses, SMOOTH_WINDOW), 0.2
    )
