"""A study's parent-run artifacts stay bounded at any number of trials.

300 trials built through the study's own stores and end-of-study code (the synthetic path of
``benchmarks/mlflow_ui_scale.py``: the Optuna study, the MLflow parent run, the driver's
``ending.finalize``), no Ray. ``trials_table.json``, ``tradeoff/tradeoff.json`` and
``tradeoff.csv`` list the best trials, the Pareto set and the best trial, not one row per trial;
the figures stay readable (the plot checks of ``tests/images.py``). Sizes at 10/100/1,000 trials
and the MLflow UI's page load are measured by the benchmark, not asserted here."""

from __future__ import annotations

import csv
import json

import pytest

from fedtune.tuning.analysis.tradeoff import TOP_TRIALS, TradeOff
from tests.benchmarks import load_benchmark
from tests.images import assert_tuning_plot

N = 300


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("mlflow_ui_scale.py")


@pytest.fixture(scope="module")
def study(bench, tmp_path_factory: pytest.TempPathFactory):
    """A 300-trial study's result, the parent run's artifact folder, what the figures drew."""
    from fedtune.tuning.analysis import plots  # matplotlib: not at collection

    drawn: dict[str, object] = {}
    mp = pytest.MonkeyPatch()
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    curves, pareto = plots.plot_curves, plots.pareto_figure

    def spy_curves(shown, path, *args, **kwargs):
        drawn["curves"] = len(shown)
        return curves(shown, path, *args, **kwargs)

    def spy_pareto(tradeoff: TradeOff):
        fig = pareto(tradeoff)
        drawn["pareto_labels"] = len(fig.axes[0].texts)
        return fig

    mp.setattr(plots, "plot_curves", spy_curves)
    mp.setattr(plots, "pareto_figure", spy_pareto)
    try:
        workdir = tmp_path_factory.mktemp("bounded") / "w"
        result = bench.synthetic_study(N, workdir, child_runs=False).to_dict()
    finally:
        mp.undo()
    return result, bench.parent_artifacts(result), workdir / "tradeoff", drawn


def test_the_trials_table_lists_the_best_trials_and_the_front_not_every_trial(study) -> None:
    result, artifacts, _, _ = study
    table = json.loads((artifacts / "trials_table.json").read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    numbers = {r["number"] for r in rows}
    pareto = {p["number"] for p in result["pareto"]}
    assert result["finished"] == N
    assert len(rows) <= TOP_TRIALS + len(pareto) + 1 < N  # bounded, not one row per trial
    assert pareto <= numbers and result["best"]["number"] in numbers
    assert {r["number"] for r in rows if r["on_pareto"]} == pareto
    ranks = sorted(r["rank"] for r in rows if r["rank"] is not None)
    assert ranks[:TOP_TRIALS] == list(range(1, TOP_TRIALS + 1))  # the TOP_TRIALS best objectives
    best = next(r for r in rows if r["rank"] == 1)
    assert best["number"] == result["best"]["number"]


def test_the_tradeoff_files_list_a_bounded_selection_and_count_every_trial(study) -> None:
    result, artifacts, local, _ = study
    logged = json.loads((artifacts / "tradeoff" / "tradeoff.json").read_text())
    assert logged == json.loads((local / "tradeoff.json").read_text())
    assert logged["trials_total"] == N
    listed = {t["trial_id"] for t in logged["trials"]}
    holders = {p["trial_id"] for p in logged["envelope"] if p["trial_id"] is not None}
    assert set(logged["pareto"]) | holders <= listed
    assert len(listed) <= TOP_TRIALS + len(logged["pareto"]) + len(holders) < N
    assert "of 300 trials listed" in logged["notes"]["trials"]
    finals = sorted(t["final_loss"] for t in logged["trials"] if t["final_loss"] is not None)
    assert finals[0] == pytest.approx(result["best"]["value"])
    with (local / "tradeoff.csv").open() as fh:
        assert {int(r["trial_id"]) for r in csv.DictReader(fh)} == listed


def test_the_figures_draw_the_selection_and_stay_readable(study) -> None:
    _, artifacts, local, drawn = study
    logged = json.loads((local / "tradeoff.json").read_text())
    assert drawn["curves"] == len(logged["trials"]) < N
    assert drawn["pareto_labels"] <= len(logged["trials"])  # trial numbers: the selection only
    for kind in ("curves", "pareto", "envelope"):
        assert_tuning_plot(local / f"{kind}.png", kind)
        assert (artifacts / "tradeoff" / f"{kind}.png").is_file()
    theory = json.loads((local / "theory.json").read_text())
    assert 0 < len(theory) <= len(logged["trials"])
