"""Comparing studies from their stored trade-offs (no MLflow, no Ray): envelopes, budget curves,
Pareto sets, matched budgets, predictions, the comparability verdict and its refusal."""

from __future__ import annotations

import json
import math
import re

import pytest

from fedtune.errors import ConfigError
from fedtune.tuning.analysis.compare import (
    BUDGET_ROUNDS,
    BUDGET_TRIALS,
    BUDGET_WHOLE,
    Comparison,
    StudyInput,
    budget_curve,
    compare,
)
from fedtune.tuning.analysis.compare_render import render_html, write_figures
from fedtune.tuning.analysis.tradeoff import TrialCurve, analyze_tradeoff

TASK = {"name": "quadratic", "clients": 10, "dim": 5, "seed": 0}
OBJECTIVE = {"metric": "train_loss", "last_rounds": 3}


def _curve(tid: int, lr: float, rate: float, floor: float, rounds: int = 20) -> TrialCurve:
    rs = list(range(1, rounds + 1))
    return TrialCurve(tid, {"client_lr": lr}, rs, [floor + 10 * rate**r for r in rs])


def _study(name: str, algorithm: str, curves: list[TrialCurve], **doc) -> StudyInput:
    t = analyze_tradeoff(curves, last_rounds=3, smooth_window=1)
    document = {"name": name, "algorithm": algorithm, "task": TASK, "objective": OBJECTIVE}
    document.update(doc)
    return StudyInput(label=f"runs/{name}", document=document, tradeoff=t.to_dict())


# fast-but-worse vs slow-but-better, the trade-off of the papers; B's trial 1 beats all of A
A = _study(
    "a", "fedavg", [_curve(0, 0.1, 0.5, 1.0), _curve(1, 0.01, 0.7, 0.5), _curve(2, 0.05, 0.9, 0.8)]
)
B = _study("b", "fedprox", [_curve(0, 0.1, 0.6, 0.9), _curve(1, 0.02, 0.5, 0.2, rounds=10)])


def test_matched_budgets_pick_each_studys_best_within_the_same_trials_and_rounds() -> None:
    c = compare([A, B])
    assert c.comparable and not c.differences and not c.forced
    trials = c.best_at(BUDGET_TRIALS)  # two trials each: A's first two, B's both
    assert trials["a"].amount == 2 and trials["a"].trial_id == 1 and trials["a"].trials_used == 2
    assert trials["b"].trial_id == 1
    rounds = c.best_at(BUDGET_ROUNDS)  # B spent 20 + 10 = 30 rounds: A gets its first trial only
    assert rounds["a"].amount == 30 and rounds["a"].trials_used == 1 and rounds["a"].trial_id == 0
    assert rounds["b"].rounds_used == 30
    whole = c.best_at(BUDGET_WHOLE)
    assert whole["a"].trials_used == 3 and whole["a"].rounds_used == 60
    assert c.winner(BUDGET_WHOLE) == "b"
    assert whole["b"].final_loss == pytest.approx(0.2 + 10 * sum(0.5**r for r in (8, 9, 10)) / 3)


def test_budget_curve_is_the_running_best_against_total_rounds() -> None:
    curve = budget_curve(A.tradeoff)
    assert [r for r, _ in curve] == [20, 40, 60]
    values = [v for _, v in curve]
    assert values == sorted(values, reverse=True) and values[1] < values[0]


def test_envelopes_and_pareto_sets_are_each_studys_own() -> None:
    c = compare([A, B])
    assert c.envelopes["a"] == [(p["round"], p["loss"]) for p in A.tradeoff["envelope"]]
    assert {p["trial_id"] for p in c.pareto["b"]} == set(B.tradeoff["pareto"])
    assert all(p["rounds_to_target"] >= 1 for p in c.pareto["a"])
    assert c.predictions == {"a": [], "b": []}  # no theory.json: no prediction


def test_predictions_come_from_theory_rows_where_the_theory_applies() -> None:
    rows = [
        {"trial": 0, "rho_predicted": 0.9, "delta_predicted": 0.1, "rho_measured": 0.88},
        {"trial": 1, "rho_predicted": None, "delta_predicted": None},
    ]
    a = StudyInput(A.label, A.document, A.tradeoff, theory=rows)
    c = compare([a, B])
    assert c.predictions["a"] == [
        {
            "trial_id": 0,
            "rho_predicted": 0.9,
            "delta_predicted": 0.1,
            "rho_measured": 0.88,
            "final_loss": None,
        }
    ]


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"task": {**TASK, "name": "digits"}}, "different task"),
        ({"task": {**TASK, "seed": 1}}, "different data"),
        ({"objective": {**OBJECTIVE, "last_rounds": 5}}, "different objective"),
    ],
)
def test_studies_that_differ_are_refused_unless_forced(change: dict, what: str) -> None:
    other = StudyInput(B.label, {**B.document, **change}, B.tradeoff)
    with pytest.raises(ConfigError, match=what) as info:
        compare([A, other])
    assert "force" in str(info.value)
    c = compare([A, other], force=True)
    assert not c.comparable and c.forced and what in c.differences[0]
    assert "forced" in c.notes["comparable"]


def test_one_study_is_not_a_comparison() -> None:
    with pytest.raises(ConfigError, match="at least two"):
        compare([A])


def test_the_json_round_trips_and_has_no_infinity() -> None:
    c = compare([A, B])
    text = json.dumps(c.to_json(), allow_nan=False)  # strict JSON: raises on ∞ or NaN
    back = Comparison.from_json(json.loads(text))
    assert back == c  # the engine's result and the SDK's answer are one class
    assert back.best_at(BUDGET_TRIALS) == c.best_at(BUDGET_TRIALS)
    assert back.envelopes == c.envelopes and back.study_keys() == ["a", "b"]


def test_same_names_get_distinct_keys() -> None:
    c = compare([A, StudyInput("elsewhere", A.document, A.tradeoff)])
    assert c.study_keys() == ["a#1", "a#2"]


def test_files_and_a_self_contained_page(tmp_path) -> None:
    c = compare([A, B])
    paths = write_figures(c, tmp_path)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        paths["csv"].read_text().splitlines()[0].startswith("budget,amount,study,trial,final_loss")
    )
    page = paths["html"].read_text()
    assert "<svg" in page and 'data-study="a"' in page and 'data-study="b"' in page
    # nothing fetched: no external script, stylesheet, image or font
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "comparable: same task" in page.lower() or "are comparable" in page
    forced = compare(
        [A, StudyInput(B.label, {**B.document, "task": "digits"}, B.tradeoff)], force=True
    )
    bad = render_html(forced, tmp_path / "forced.html").read_text()
    assert "NOT comparable" in bad and "different task" in bad


def test_infinite_final_losses_are_no_best() -> None:
    diverged = TrialCurve(0, {"client_lr": 9.0}, [1, 2, 3], [1.0, math.inf, math.inf], "diverged")
    d = _study("d", "scaffold", [diverged])
    c = compare([A, d])
    assert "d" not in c.best_at(BUDGET_WHOLE) and c.winner() == "a"
