"""A study of methods end to end: ``fedtune tune`` of a spec listing two algorithms runs one
real study per algorithm (Ray trials, Optuna, a real ``mlflow server``), compares them, and the
comparison is an MLflow run of its own with its artifacts, linked both ways with the parent
runs; ``fedtune compare`` of the two workdirs gives the same table. ``--ray`` and one trial
at a time: each study's two trials are Ray Tune trials in one trial process (Tune reuses it)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml
from mlflow import MlflowClient

from fedtune.cli import main
from fedtune.tuning.analysis.compare import BUDGET_TRIALS

from .conftest import make_quadratic_study


def _methods_spec(name: str) -> dict:
    spec = make_quadratic_study(
        name,
        sampler={"name": "random", "seed": 0},
        scheduler={"name": "none"},
        budget={"trials": 2, "max_concurrent": 1},
    )
    spec["algorithm"] = [
        "fedavg",
        {
            "name": "fedprox",
            "search": {
                "space": "fedprox",
                "override": {
                    "client_lr": {"low": 0.01, "high": 0.1},
                    "server_lr": {"low": 0.05, "high": 0.2},
                    "prox_alpha": {"low": 0.01, "high": 1.0},
                },
            },
        },
    ]
    return spec


def test_a_study_of_methods_runs_each_algorithm_and_records_the_comparison(
    tmp_path, ray_local, mlflow_server, capsys
):
    study_file = tmp_path / "methods.yaml"
    study_file.write_text(yaml.safe_dump(_methods_spec("quad-methods")))
    root = tmp_path / "work"
    tune = ["tune", str(study_file), "--workdir", str(root), "--tracking-uri", mlflow_server]
    # Ray Tune trials (--ray), one at a time: a study's two share one trial process
    code = main([*tune, "--json", "--ray"])
    assert code == 0
    body = json.loads(capsys.readouterr().out)
    names = [s["name"] for s in body["studies"]]
    assert names == ["quad-methods-fedavg", "quad-methods-fedprox"]
    assert all(s["finished"] == 2 for s in body["studies"])
    assert all(s["packing"] == "one configuration per trial process" for s in body["studies"])
    comparison = body["comparison"]
    assert comparison["comparable"] is True
    assert [s["algorithm"] for s in comparison["studies"]] == ["fedavg", "fedprox"]
    trials = [r for r in comparison["matched"] if r["budget"] == BUDGET_TRIALS]
    assert {r["key"] for r in trials} == set(names)
    assert "hparams.prox_alpha" in next(r for r in trials if r["key"].endswith("fedprox"))["params"]

    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(body["run_id"])
    assert run.data.tags["fedtune.kind"] == "comparison"
    parents = {s["key"]: s["run_id"] for s in comparison["studies"]}
    for key, parent_id in parents.items():
        assert run.data.tags[f"compared.{key}"] == parent_id
        parent = client.get_run(parent_id)
        assert parent.data.tags["last_comparison_run_id"] == run.info.run_id
        assert f"comparison.{run.info.run_id}" in parent.data.tags
        assert "final_loss_equal_trials" in parent.data.metrics
        assert parent.info.experiment_id == run.info.experiment_id  # one experiment
        history = client.get_metric_history(run.info.run_id, f"{key}.envelope_loss")
        assert len(history) >= 2 and history == sorted(history, key=lambda m: m.step)
    assert parents[names[0]] in run.data.tags["mlflow.note.content"]
    files = {f.path for f in client.list_artifacts(run.info.run_id, "comparison")}
    assert files == {f"comparison/comparison.{x}" for x in ("png", "html", "json", "csv")}
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(
            client.download_artifacts(run.info.run_id, "comparison/comparison.html", tmp)
        ).read_text()
        stored = json.loads(
            Path(
                client.download_artifacts(run.info.run_id, "comparison/comparison.json", tmp)
            ).read_text()
        )
    assert "<svg" in page and "quad-methods-fedprox" in page and "https://" not in page
    assert stored["matched"] == comparison["matched"]

    # the same studies compared again by their workdirs
    code = main(
        [
            "compare",
            str(root / "fedavg"),
            str(root / "fedprox"),
            "--tracking-uri",
            mlflow_server,
            "--out",
            str(tmp_path / "again"),
            "--json",
        ]
    )
    assert code == 0
    again = json.loads(capsys.readouterr().out)
    assert again["comparison"]["matched"] == comparison["matched"]
    assert again["run_id"] != body["run_id"]
    assert (tmp_path / "again" / "comparison.png").stat().st_size > 1000
