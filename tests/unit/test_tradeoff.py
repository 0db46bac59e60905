"""The measured convergence–accuracy trade-off on synthetic curves with known answers."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from fedtune.errors import ConfigError
from fedtune.trainers.records import Outcome, RoundRecord, TrialResult
from fedtune.tuning import (
    TrialCurve,
    analyze_tradeoff,
    lower_envelope,
    pareto_front,
    smooth,
)
from fedtune.tuning.analysis.tradeoff import write_tradeoff
from tests.images import assert_tuning_plot

T = 200
ROUNDS = np.arange(1, T + 1)


def decay(floor: float, start: float, tau: float, t=ROUNDS):
    """ℓ(t) = floor + (start − floor)·e^{−t/τ}: converges at rate 1/τ to ``floor``."""
    return floor + (start - floor) * np.exp(-np.asarray(t, dtype=float) / tau)


# large γ: fast to a worse floor; small γ: slow to a better floor
# (docs/explanation/algorithms.md §8 prediction 8)
FAST = dict(floor=1.0, start=10.0, tau=5.0)
SLOW = dict(floor=0.1, start=10.0, tau=40.0)
MEDIUM = dict(floor=1.5, start=10.0, tau=10.0)  # dominated by FAST everywhere


def curve(trial_id, lr, spec, outcome="completed", rounds=ROUNDS):
    return TrialCurve(
        trial_id, {"client_lr": lr}, list(rounds), list(decay(**spec, t=rounds)), outcome
    )


def crossing() -> float:
    from scipy.optimize import brentq  # SciPy: not at collection

    return brentq(lambda t: decay(**FAST, t=t) - decay(**SLOW, t=t), 1.0, T)


@pytest.fixture
def curves():
    return [curve("fast", 1.0, FAST), curve("slow", 0.01, SLOW), curve("medium", 0.1, MEDIUM)]


def test_rounds_to_target_and_final_loss(curves):
    out = analyze_tradeoff(curves, targets=[2.0, 0.5], last_rounds=10, smooth_window=1)
    assert out.targets == [0.5, 2.0]
    fast, slow, medium = (out.summary_of(i) for i in ("fast", "slow", "medium"))
    # first integer t with floor + (start − floor)e^{−t/τ} ≤ target
    assert fast.rounds_to_target == [math.inf, math.ceil(5 * math.log(9 / 1))]
    assert slow.rounds_to_target == [
        math.ceil(40 * math.log(9.9 / 0.4)),
        math.ceil(40 * math.log(9.9 / 1.9)),
    ]
    assert medium.rounds_to_target[1] == math.ceil(10 * math.log(8.5 / 0.5))
    assert slow.final_loss == pytest.approx(np.mean(decay(**SLOW)[-10:]), rel=1e-12)
    assert fast.last_round == T and fast.best_loss == pytest.approx(decay(**FAST)[-1])
    assert out.best_final().trial_id == "slow"


def test_pareto_set_membership_and_ties(curves):
    twin = curve("fast-twin", 1.0, FAST)  # identical point: both stay on the set
    out = analyze_tradeoff([*curves, twin], targets=[2.0], smooth_window=1)
    assert out.pareto_target == 2.0
    assert set(out.pareto) == {"fast", "fast-twin", "slow"}
    assert out.pareto[-1] == "slow"  # ordered by rounds to target
    assert pareto_front(
        [(1, 5), (2, 3), (2, 3), (3, 4), (math.inf, 1), (math.inf, 2), (math.nan, 0)]
    ) == [0, 1, 2, 4]


def test_target_nobody_reaches_keeps_only_the_best_final_loss(curves):
    out = analyze_tradeoff(curves, targets=[0.01], smooth_window=1)
    assert all(s.rounds_to_target == [math.inf] for s in out.trials)
    assert out.pareto == ["slow"]


def test_envelope_switches_from_fast_to_slow_at_the_crossing(curves):
    out = analyze_tradeoff(curves, smooth_window=1)
    t_star = crossing()
    assert not float(t_star).is_integer()
    assert [(c.round, c.from_trial, c.to_trial) for c in out.regime_changes] == [
        (math.ceil(t_star), "fast", "slow")
    ]
    by_round = {p.round: p for p in out.envelope}
    assert by_round[1].trial_id == "fast" and by_round[T].trial_id == "slow"
    assert by_round[math.floor(t_star)].loss == pytest.approx(decay(**FAST, t=math.floor(t_star)))
    assert by_round[T].loss == pytest.approx(decay(**SLOW)[-1])


def test_envelope_with_smoothing_matches_a_direct_computation(curves):
    w = 7
    out = analyze_tradeoff(curves, smooth_window=w)

    def trailing(spec, r):  # mean of the last w values up to round r (fewer at the start)
        lo = max(1, r - w + 1)
        return sum(decay(**spec, t=[t])[0] for t in range(lo, r + 1)) / (r - lo + 1)

    switch = next(r for r in range(1, T + 1) if trailing(SLOW, r) < trailing(FAST, r))
    assert switch > math.ceil(crossing())  # a trailing mean lags the crossing
    assert [(c.round, c.to_trial) for c in out.regime_changes] == [(switch, "slow")]
    assert smooth([1.0, 3.0, math.inf, 5.0, 7.0, 9.0], 2).tolist() == [
        1.0,
        2.0,
        math.inf,
        math.inf,
        6.0,
        8.0,
    ]


def test_diverged_and_early_stopped_trials(curves):
    blowup = [0.05, 0.04, 0.03, 50.0, math.nan]  # best early, then diverges
    diverged = TrialCurve("boom", {"client_lr": 10.0}, [1, 2, 3, 4, 5], blowup, "diverged")
    stopped = curve("cut", 0.1, MEDIUM, outcome="stopped", rounds=ROUNDS[:20])
    out = analyze_tradeoff([*curves, diverged, stopped], targets=[2.0], smooth_window=1)
    boom, cut = out.summary_of("boom"), out.summary_of("cut")
    assert boom.final_loss == math.inf and boom.outcome == Outcome.DIVERGED
    assert "boom" not in out.pareto
    assert all(p.trial_id != "boom" for p in out.envelope)  # excluded by default
    assert cut.last_round == 20 and cut.rounds_to_target == [math.inf]
    assert cut.final_loss == pytest.approx(np.mean(decay(**MEDIUM)[10:20]))
    with_boom = analyze_tradeoff([*curves, diverged], smooth_window=1, include_diverged=True)
    assert {p.trial_id for p in with_boom.envelope} == {"boom"}
    assert with_boom.envelope[-1].loss == 0.03  # running minimum survives the blow-up
    # a stopped trial keeps the best loss it reached for every later budget R
    points, changes = lower_envelope([stopped], [10, 20, 50, 200], smooth_window=1)
    assert [p.loss for p in points[1:]] == [decay(**MEDIUM, t=[20])[0]] * 3 and not changes


def test_all_diverged_gives_empty_results():
    d = TrialCurve(0, {}, [1, 2], [1.0, math.inf], "diverged")
    out = analyze_tradeoff([d])
    assert (
        out.targets == [] and out.pareto == [] and out.envelope == [] and out.best_final() is None
    )
    assert json.loads(json.dumps(out.to_dict(), allow_nan=False))["trials"][0]["final_loss"] is None


def test_default_targets_are_quantiles_of_best_smoothed_losses(curves):
    out = analyze_tradeoff(curves, target_quantiles=(0.0, 0.5, 1.0), last_rounds=5, smooth_window=1)
    best = sorted(s.best_loss for s in out.trials)
    assert out.targets == pytest.approx(best)
    assert out.pareto_target == out.targets[1]
    assert out.start_loss == pytest.approx(np.median([c.losses[0] for c in curves]))


def _issue_curves():
    """The issue's study: ℓ_0 ≈ 2.77; one trial blows up to ~21 without going non-finite, one
    is stopped by ASHA at round 10 (its round-10 loss looks better than any final loss)."""
    r = np.arange(1, 31)
    t = r - 1.0
    good = TrialCurve(0, {"client_lr": 0.1}, r, 0.5 + 2.27 * np.exp(-t / 8.0))
    fast = TrialCurve(1, {"client_lr": 0.3}, r, 0.9 + 1.87 * np.exp(-t / 2.0))
    boom = TrialCurve(2, {"client_lr": 3.0}, r, 2.77 * np.exp(t / 14.0))  # ends ≈ 22.6
    cut = TrialCurve(3, {"client_lr": 0.2}, r[:10], 0.1 + 2.67 * np.exp(-t[:10] / 0.8), "stopped")
    return [good, fast, boom, cut]


def test_blown_up_trials_are_flagged_and_targets_stay_below_the_start():
    out = analyze_tradeoff(_issue_curves(), last_rounds=10, smooth_window=5)
    assert out.start_loss == pytest.approx(2.77, rel=0.05)
    assert out.targets and all(t < out.start_loss for t in out.targets)
    assert [s.flag for s in out.trials] == ["", "", "blown_up", "stopped"]
    assert 2 not in out.pareto and all(p.trial_id != 2 for p in out.envelope)
    # a target no trial reaches at round 1: the fastest needs several rounds
    assert all(s.rounds_to_target[0] > 1 for s in out.trials if s.trial_id in (0, 1))
    rows = {r["trial_id"]: r for r in out.to_csv_rows()}
    assert rows[2]["flag"] == "blown_up" and not rows[2]["on_pareto"]


def test_a_stopped_trial_is_not_on_the_final_loss_front():
    out = analyze_tradeoff(_issue_curves(), last_rounds=10, smooth_window=5)
    cut = out.summary_of(3)
    assert cut.flag == "stopped" and cut.last_round == 10
    # its loss at round 10 is below every finished trial's final loss, yet it is not on the set
    assert cut.final_loss < min(out.summary_of(i).final_loss for i in (0, 1))
    assert 3 not in out.pareto and set(out.pareto) <= {0, 1} and out.pareto
    # it is compared on the rounds it reached: it reaches the targets and may hold E(R) early
    assert any(math.isfinite(r) for r in cut.rounds_to_target)
    assert 3 in {p.trial_id for p in out.envelope}


def test_a_trial_that_ends_at_the_start_gives_no_target_at_or_above_it():
    r = np.arange(1, 21)
    flat = [TrialCurve(i, {}, r, np.full(20, 2.32)) for i in (0, 1)]
    down = TrialCurve(2, {}, r, 1.0 + 1.32 * np.exp(-(r - 1) / 4.0))
    out = analyze_tradeoff([*flat, down], target_quantiles=(0.1, 0.5, 0.9), smooth_window=3)
    assert out.start_loss == pytest.approx(2.32)
    assert out.targets and max(out.targets) < 2.32


def test_json_and_csv(tmp_path, curves):
    out = analyze_tradeoff(curves, targets=[0.5, 2.0], smooth_window=1)
    data = json.loads(json.dumps(out.to_dict(), allow_nan=False))
    fast = next(t for t in data["trials"] if t["trial_id"] == "fast")
    assert fast["rounds_to_target"] == [None, 11] and fast["params"] == {"client_lr": 1.0}
    assert data["regime_changes"][0]["to_trial"] == "slow"
    rows = out.to_csv_rows()
    assert [r["on_pareto"] for r in rows] == [t in out.pareto for t in ("fast", "slow", "medium")]
    assert rows[0]["rounds_to_0.5"] == math.inf and rows[0]["param.client_lr"] == 1.0
    paths = write_tradeoff(out, tmp_path)
    with paths["csv"].open() as fh:
        read = list(csv.DictReader(fh))
    assert float(read[0]["rounds_to_0.5"]) == math.inf and read[1]["trial_id"] == "slow"
    assert json.loads(paths["json"].read_text()) == data


def test_curve_validation_and_from_result():
    with pytest.raises(ConfigError, match="one loss per round"):
        TrialCurve(1, {}, [1, 2], [1.0])
    with pytest.raises(ConfigError, match="increasing"):
        TrialCurve(1, {}, [2, 2], [1.0, 1.0])
    with pytest.raises(ConfigError, match="outcome"):
        TrialCurve(1, {}, [1], [1.0], "exploded")
    records = [RoundRecord(r, 1.0 / r, 0.1, 0.1, 1.0, 10, 0.0) for r in (1, 2, 3)]
    result = TrialResult(
        Outcome.STOPPED, records, {"hparams": {"client_lr": 0.3}}, "sequential", "cpu"
    )
    c = TrialCurve.from_result(7, result)
    assert c.params == {"client_lr": 0.3} and c.rounds == (1, 2, 3) and c.outcome == "stopped"
    assert c.losses == pytest.approx((1.0, 0.5, 1 / 3))


def test_contraction_rate_and_theory_table():
    from fedtune.tuning import contraction_rate, theory_table  # matplotlib: not at collection

    t = np.arange(0, 60)
    loss = 1.0 + 5.0 * 0.9 ** (2 * t)  # loss gap ∝ ‖x_t − x*‖², distance contracts by 0.9
    assert contraction_rate(t, loss, floor=1.0) == pytest.approx(0.9, rel=1e-9)
    assert contraction_rate(t, loss, window=(0, 30)) == pytest.approx(0.9, rel=1e-3)
    assert contraction_rate(t, loss, floor=1.0, loss_exponent=1.0) == pytest.approx(0.81, rel=1e-9)
    assert math.isnan(contraction_rate([1], [1.0]))
    curves = [
        TrialCurve("a", {"client_lr": 0.1}, t, loss),
        TrialCurve("b", {"client_lr": 0.5}, t, 2.0 + 3.0 * 0.5 ** (2 * t)),
        TrialCurve("c", {"client_lr": 0.9}, t, loss),
    ]
    rows = theory_table(
        curves, {"a": (0.9, 0.0), "b": (0.5, 0.3)}, last_rounds=5, floor=None, window=(0, 20)
    )
    assert [r.trial_id for r in rows] == ["a", "b"]
    assert rows[1].rho_measured == pytest.approx(0.5, rel=1e-3)
    assert rows[1].final_loss == pytest.approx(2.0, rel=1e-9)


def test_plots_are_written(tmp_path, curves):
    from fedtune.tuning import plot_theory, theory_table, write_artifacts

    diverged = TrialCurve("boom", {"client_lr": 10.0}, [1, 2, 3], [5.0, 80.0, math.inf], "diverged")
    everything = [*curves, diverged]
    out = analyze_tradeoff(everything, smooth_window=3)
    paths = write_artifacts(out, everything, tmp_path / "log", color_by="client_lr")
    assert set(paths) == {"json", "csv", "curves", "pareto", "envelope"}
    for kind in ("curves", "pareto", "envelope"):
        assert_tuning_plot(paths[kind], kind)
    # categorical colouring and no colouring also render
    cat = [
        TrialCurve(c.trial_id, {"opt": str(i % 2)}, c.rounds, c.losses, c.outcome)
        for i, c in enumerate(curves)
    ]
    assert_tuning_plot(
        write_artifacts(out, cat, tmp_path / "cat", color_by="opt")["curves"], "curves"
    )
    assert_tuning_plot(write_artifacts(out, curves, tmp_path / "plain")["curves"], "curves")
    rows = theory_table(curves, {"fast": (0.8, 0.5), "slow": (0.97, 0.1)}, floor=None)
    assert_tuning_plot(plot_theory(rows, tmp_path / "theory.png"), "theory")


def test_pareto_plot_labels_every_point_with_its_trial_number():
    from fedtune.tuning.analysis.plots import pareto_figure

    out = analyze_tradeoff(_issue_curves(), last_rounds=10, smooth_window=5)
    fig = pareto_figure(out)
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert labels == {"0", "1", "3"}  # the blown-up trial 2 is left out, and said so
    assert "1 diverged / blown-up" in fig.axes[0].get_title()
