"""The search strategies with their own stop rule through the real study path: Ray Tune +
Optuna storage, and ``fedtune tune``'s summary of the strategy that ran.

A tiny quadratic: with ``search.strategy: tradeoff`` its first trials are the theory sweep's
(tagged on the Optuna trial, γ = η on the line), bad ones are stopped by the stop rule (recorded
as ``stop_rule``), and a resumed study continues the sweep instead of repeating it. Naming no
strategy runs the default (TPE + the guard stop rule, no sweep), and ``hyperband``
stops trials on its rungs (``stop_rule: rung``).
"""

from __future__ import annotations

import optuna
import pytest

from fedtune.tuning import Strategy
from fedtune.tuning.driver.study import run_study
from fedtune.tuning.spec import StudySpec
from fedtune.tuning.trials.sweep import SWEEP_ATTR

SPEC = {
    "name": "tradeoff-quad",
    "task": {"name": "quadratic", "clients": 10, "dim": 5, "seed": 0},
    "algorithm": "fedavg",
    "train": {
        "rounds": 24,
        "clients_per_round": 5,
        "local_steps": 3,
        "batch_size": 4,
        "eval_every": 24,
        "dtype": "float64",
    },
    "objective": {"metric": "train_loss", "last_rounds": 4},
    "budget": {"trials": 6, "max_concurrent": 1},
}


def test_tradeoff_strategy_sweeps_stops_and_resumes(tmp_path, ray_local):
    spec = StudySpec.from_dict({**SPEC, "search": {"strategy": "tradeoff"}})
    assert spec.strategy == Strategy.TRADEOFF
    result = run_study(spec, tmp_path / "study")
    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    tags = [t.user_attrs.get(SWEEP_ATTR) for t in trials]
    assert tags[:3] == ["line:0", "line:1", "line:2"]
    for t in trials[:3]:
        assert t.params["hparams.client_lr"] == pytest.approx(t.params["hparams.server_lr"])
    outcomes = {t.user_attrs.get("outcome") for t in trials}
    assert "completed" in outcomes and result.best is not None
    for t in trials:  # a stopped trial says which rule stopped it
        if t.user_attrs.get("outcome") == "stopped":
            assert t.user_attrs.get("stop_rule") in ("worse", "plateau")

    resumed = run_study(spec, tmp_path / "study", trials=9)
    study = optuna.load_study(study_name=resumed.name, storage=resumed.storage_url)
    tags = [t.user_attrs.get(SWEEP_ATTR) for t in study.get_trials()]
    swept = [t for t in tags if t]
    assert len(swept) == len(set(swept))  # the resumed sweep did not repeat a point
    assert resumed.finished == 9


def test_tune_prints_the_default_strategy_and_hyperband_records_its_rungs(
    tmp_path, ray_local, proc_tools
):
    import subprocess

    import yaml

    from fedtune.tuning.spec import DEFAULT_STRATEGY

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "name": "default-quad"}))
    # `fedtune tune` as a user runs it (its own process and embedded Ray)
    done = subprocess.run(
        [str(proc_tools.bin / "fedtune"), "tune", str(path), "--workdir", str(tmp_path / "cli")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"search         : strategy {DEFAULT_STRATEGY} (the default)" in done.stdout

    spec = StudySpec.from_dict(
        {
            **SPEC,
            "name": "hb-quad",
            "search": {"strategy": "hyperband"},
            "budget": {"trials": 8, "max_concurrent": 1},
        }
    )
    result = run_study(spec, tmp_path / "hb")
    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    stopped = [t for t in study.trials if t.user_attrs.get("outcome") == "stopped"]
    assert stopped and result.best is not None
    assert {t.user_attrs.get("stop_rule") for t in stopped} == {"rung"}
    assert all(t.user_attrs["rounds"] < 24 for t in stopped)
    assert result.stop_reasons == {"rung": len(stopped)}  # what `fedtune tune` prints
