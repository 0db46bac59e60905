"""A study end to end with real local Ray, a real ``mlflow server`` and Optuna's RDB storage.

Everything is checked from the outside: the run tree, params, metric histories and artifacts
through ``MlflowClient``; trials, values and intermediate values through ``optuna.load_study``.
Tasks are tiny quadratics (12 rounds) so the whole module takes about a minute on 2 cores.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import os
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from fedtune.cli import main
from fedtune.tuning.analysis.tradeoff import rounds_to_target as rounds_to_target_of
from fedtune.tuning.analysis.tradeoff import smooth
from fedtune.tuning.driver.study import run_study
from fedtune.tuning.keys import SMOOTH_WINDOW
from fedtune.tuning.spec import StudySpec
from tests.images import assert_tuning_plot
from tests.integration.conftest import descendants


def _children(client: MlflowClient, experiment_id: str, parent: str) -> list:
    return client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")


def _load(result) -> optuna.Study:
    return optuna.load_study(study_name=result.name, storage=result.storage_url)


def test_study_end_to_end(tmp_path, ray_local, mlflow_server, quadratic_study):
    spec = StudySpec.from_dict(quadratic_study("e2e-quad"))
    progress = io.StringIO()  # not a terminal: one line per finished trial
    result = run_study(spec, tmp_path / "study", tracking_uri=mlflow_server, progress=progress)

    study = _load(result)
    trials = study.get_trials(
        states=[optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    )
    assert len(trials) == 5 == result.counts["trials"] == result.finished
    client = MlflowClient(mlflow_server)
    parents = client.search_runs([result.experiment_id], "attributes.run_name = 'e2e-quad'")
    assert [p.info.run_id for p in parents] == [result.parent_run_id]
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["algorithm"] == "fedavg"
    assert parent.data.params["budget.trials"] == "5"
    assert parent.data.metrics["n_trials"] == 5
    children = {
        int(r.data.tags["optuna_trial_number"]): r
        for r in _children(client, result.experiment_id, parent.info.run_id)
    }
    assert sorted(children) == sorted(t.number for t in trials)
    for t in trials:
        run = children[t.number]
        assert run.info.status == "FINISHED"
        assert run.info.run_name == f"trial-{t.number:04d}"
        assert run.data.tags["outcome"] == t.user_attrs["outcome"]
        assert run.data.tags["device"] == "cpu"  # where the trial computed
        assert {run.data.tags[k] for k in ("study", "algorithm", "task")} == {
            "e2e-quad",
            "fedavg",
            "quadratic",
        }
        assert t.user_attrs["mlflow_run_id"] == run.info.run_id
        for path, value in t.params.items():
            assert float(run.data.params[path]) == pytest.approx(value, rel=1e-12)
        # per-round history (step = round): the running objective, of which Optuna's
        # intermediate values are a sample (FedtuneSearch.REPORT_INTERVAL_S) ending with the
        # last round; its last value is the trial's value (completed and stopped alike)
        history = client.get_metric_history(run.info.run_id, "client_loss")
        logged = {m.step: m.value for m in history}
        assert sorted(logged) == list(range(1, t.user_attrs["rounds"] + 1))
        objective = {
            m.step: m.value for m in client.get_metric_history(run.info.run_id, "objective")
        }
        assert sorted(objective) == sorted(logged)
        assert max(t.intermediate_values) == t.user_attrs["rounds"]
        assert {s: objective[s] for s in t.intermediate_values} == pytest.approx(
            t.intermediate_values, rel=1e-12
        )
        assert run.data.metrics["objective"] == pytest.approx(t.value, rel=1e-12)
        assert run.data.tags["objective_metric"].startswith("train_loss")
        curve = t.system_attrs["fedtune:curve"]["loss"]
        assert [logged[r] for r in sorted(logged)] == pytest.approx(curve, rel=1e-12)
        if t.user_attrs["outcome"] == "completed":
            rounds = spec.base_trial_config()["train"]["rounds"]
            assert max(t.intermediate_values) == rounds
            tail = [logged[r] for r in range(rounds - 2, rounds + 1)]
            assert t.value == pytest.approx(sum(tail) / 3, rel=1e-12)  # mean of last 3 rounds
            train = client.get_metric_history(run.info.run_id, "train_loss")
            assert [m.step for m in train] == [1, 4, 8, 12]  # eval rounds only
    best = min((t for t in trials if t.user_attrs["outcome"] == "completed"), key=lambda t: t.value)
    assert result.best["number"] == best.number and result.best["value"] == best.value
    lines = progress.getvalue().splitlines()
    assert lines[0] == "e2e-quad  0/5 done · starting trials"
    done_lines = [ln for ln in lines if " done · " in ln][1:]
    assert [ln.split()[1] for ln in done_lines] == [f"{i}/5" for i in range(1, 6)]
    assert f"best {best.value:.4g} (#{best.number})" in done_lines[-1]
    assert parent.data.metrics["best_train_loss"] == pytest.approx(best.value)
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"spec.yaml", "search_space.yaml", "best.json", "tradeoff"} <= names
    files = {a.path: a.file_size for a in client.list_artifacts(parent.info.run_id, "tradeoff")}
    for name in (
        "curves.png",
        "pareto.png",
        "envelope.png",
        "tradeoff.json",
        "tradeoff.csv",
        "theory.png",
        "theory.json",
    ):
        assert files[f"tradeoff/{name}"] > 200
    for kind in ("curves", "pareto", "envelope", "theory"):  # decoded, not only sized
        png = client.download_artifacts(parent.info.run_id, f"tradeoff/{kind}.png", str(tmp_path))
        assert_tuning_plot(png, kind)
    theory = json.loads(
        Path(
            client.download_artifacts(parent.info.run_id, "tradeoff/theory.json", str(tmp_path))
        ).read_text()
    )
    assert theory and all(r["rho_predicted"] > 0 and 0 <= r["delta_predicted"] <= 1 for r in theory)
    local = Path(client.download_artifacts(parent.info.run_id, "best.json", str(tmp_path)))
    assert json.loads(local.read_text())["best"]["number"] == best.number
    spec_file = Path(client.download_artifacts(parent.info.run_id, "spec.yaml", str(tmp_path)))
    assert StudySpec.from_dict(yaml.safe_load(spec_file.read_text())) == spec
    envelope = sorted(
        client.get_metric_history(parent.info.run_id, "envelope_loss"), key=lambda m: m.step
    )
    assert envelope and all(a.value >= b.value for a, b in itertools.pairwise(envelope))
    # E(R) at the last round = lowest smoothed ℓ of any non-diverged trial
    kept = [t for t in trials if t.user_attrs["outcome"] != "diverged"]
    lowest = min(smooth(t.system_attrs["fedtune:curve"]["loss"], SMOOTH_WINDOW).min() for t in kept)
    assert envelope[-1].value == pytest.approx(lowest, rel=1e-12)


def test_diverged_and_failing_trials_are_recorded(tmp_path, ray_local, quadratic_study):
    """Grid over (η, heterogeneity): η = 2 diverges (an outcome), heterogeneity 2 is invalid and
    raises inside the trial (that trial fails, the study goes on). Default local MLflow store."""
    raw = quadratic_study(
        "diverge",
        sampler={"name": "grid"},
        scheduler={"name": "none"},
        search={
            "parameters": {
                "server_lr": {"type": "categorical", "choices": [0.12, 2.0]},
                "task.heterogeneity": {"type": "categorical", "choices": [0.5, 2.0]},
            }
        },
        hparams={"client_lr": 0.05},
    )
    raw["budget"] = {"trials": 10, "max_concurrent": 1}  # one at a time: fewer trial processes
    result = run_study(StudySpec.from_dict(raw), tmp_path / "study")

    assert result.target_trials == 4  # the grid has 4 points
    assert result.tracking_uri == f"sqlite:///{tmp_path / 'study' / 'mlflow.db'}"
    by_point = {
        (t.params["hparams.server_lr"], t.params["task.heterogeneity"]): t
        for t in _load(result).trials
    }
    assert len(by_point) == 4
    ok, diverged = by_point[(0.12, 0.5)], by_point[(2.0, 0.5)]
    assert (ok.state.name, ok.user_attrs["outcome"]) == ("COMPLETE", "completed")
    assert (diverged.state.name, diverged.user_attrs["outcome"]) == ("COMPLETE", "diverged")
    assert diverged.value == math.inf  # the sampler is told: worst possible value
    assert "client loss" in diverged.user_attrs["reason"]
    for eta in (0.12, 2.0):
        failed = by_point[(eta, 2.0)]
        assert (failed.state.name, failed.user_attrs["outcome"]) == ("FAIL", "failed")
    assert result.counts == {
        "trials": 4,
        "completed": 1,
        "diverged": 1,
        "stopped": 0,
        "failed": 2,
        "interrupted": 0,
    }
    client = MlflowClient(result.tracking_uri)
    runs = {
        int(r.data.tags["optuna_trial_number"]): r
        for r in _children(client, result.experiment_id, result.parent_run_id)
    }
    assert runs[ok.number].info.status == "FINISHED"
    assert runs[diverged.number].info.status == "FINISHED"
    assert runs[diverged.number].data.tags["outcome"] == "diverged"
    for eta in (0.12, 2.0):
        failed = runs[by_point[(eta, 2.0)].number]
        assert failed.info.status == "FAILED"
        assert "heterogeneity" in failed.data.tags["error"]
    assert result.best["number"] == ok.number
    assert [p["number"] for p in result.pareto] == [ok.number]  # diverged: never on the set


def test_multi_objective_with_conditional_and_tied_parameters(
    tmp_path, ray_local, mlflow_server, quadratic_study
):
    raw = quadratic_study(
        "multi-cond",
        algorithm="fedavgm",
        decay={"enabled": True},
        search={
            "space": ["fedavgm", "decay"],
            "override": {
                "client_lr": {"low": 0.01, "high": 0.1},
                "server_lr": {"low": 0.05, "high": 0.2},
                "server_opt": {"enabled": True},
                "nesterov_form": {"enabled": True},
                "window": {"low": 2, "high": 6, "log": False, "grid": None, "default": 3},
                "client_decay": None,
                "server_decay": None,
            },
        },
        objective={
            "metrics": ["final_loss", "rounds_to_target"],
            "target_loss": 3.0,
            "last_rounds": 3,
        },
        scheduler={"name": "none"},
        # one at a time: the six trials share one trial process (Tune reuses its actor); what
        # is checked here is per trial, and concurrent trials are test_study_end_to_end's
        budget={"trials": 6, "max_concurrent": 1},
    )
    result = run_study(StudySpec.from_dict(raw), tmp_path / "study", tracking_uri=mlflow_server)

    study = _load(result)
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE"]
    assert study.metric_names == ["final_loss", "rounds_to_target"]
    done = [t for t in study.trials if t.state.is_finished()]
    assert len(done) == 6
    client = MlflowClient(mlflow_server)
    runs = {
        int(r.data.tags["optuna_trial_number"]): r
        for r in _children(client, result.experiment_id, result.parent_run_id)
    }
    for t in done:
        # conditional: nesterov_form is sampled exactly when server_opt is nesterov
        assert ("hparams.nesterov_form" in t.params) == (
            t.params["hparams.server_opt"] == "nesterov"
        )
        # tied: patience and cooldown are never sampled, the trial gets window's value
        assert "decay.patience" not in t.params and "decay.cooldown" not in t.params
        params = runs[t.number].data.params
        assert params["decay.patience"] == params["decay.cooldown"] == str(t.params["decay.window"])
        assert t.intermediate_values == {}  # Optuna keeps none for several objectives
        if t.user_attrs["outcome"] == "completed":
            final_loss, rounds_to_target = t.values
            curve = t.system_attrs["fedtune:curve"]
            assert final_loss == pytest.approx(sum(curve["loss"][-3:]) / 3, rel=1e-12)
            smoothed = smooth(curve["loss"], SMOOTH_WINDOW)
            assert rounds_to_target == rounds_to_target_of(curve["rounds"], smoothed, 3.0)
    front = {t.number for t in study.best_trials}
    assert result.best["number"] in front
    assert result.tradeoff["pareto_target"] == 3.0
    assert client.get_run(result.parent_run_id).data.metrics["best_final_loss"] == pytest.approx(
        result.best["values"]["final_loss"]
    )


def test_gpu_request_fails_fast(tmp_path, ray_local, quadratic_study):
    spec = StudySpec.from_dict(quadratic_study("wants-gpu", resources={"cpu": 1, "gpu": 1}))
    start = time.monotonic()
    with pytest.raises(
        Exception, match=r"resources\.gpu: each trial asks for 1 GPU\(s\) but the Ray cluster has 0"
    ):
        run_study(spec, tmp_path / "study")
    assert time.monotonic() - start < 60
    assert _count_trials(tmp_path / "study") == 0


def _count_trials(workdir) -> int:
    study = optuna.load_study(study_name="wants-gpu", storage=f"sqlite:///{workdir / 'optuna.db'}")
    return len(study.trials)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"budget": {"trials": 0}}, "budget.trials"),
        ({"colour": "blue"}, "colour"),
        (
            {
                "sampler": {"name": "cmaes"},
                "objective": {"metrics": ["final_loss", "rounds_to_target"], "target_loss": 1.0},
            },
            "sampler.name",
        ),
        (
            {
                "search": {
                    "space": "fedavg",
                    "override": {"prox_alpha": {"type": "float", "low": 0.0, "high": 1.0}},
                }
            },
            "search.override.prox_alpha",
        ),
        # unknown model / algorithm parameter: exit 2 before Ray starts
        ({"task": {"name": "quadratic", "clients": 10, "dim": 5, "model": "nope"}}, "task.model"),
        ({"hparams": {"client_lrr": 0.1}}, "hparams.client_lrr"),
    ],
)
def test_invalid_spec_exits_2_with_one_line(tmp_path, capsys, quadratic_study, patch, field):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**quadratic_study("bad"), **patch}))
    assert main(["tune", str(path), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedtune: error: ")
    assert field in err[0]
    assert not (tmp_path / "w").exists()  # nothing started


def test_invalid_trials_argument_exits_2(tmp_path, capsys, quadratic_study):
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(quadratic_study("ok")))
    with pytest.raises(SystemExit) as exc:
        main(["tune", str(path), "--trials", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trials" in err[0]


def test_wall_clock_budget_ends_the_study_early(tmp_path, ray_local, quadratic_study):
    """``budget.wall_clock_s`` (the old name of ``budget.time``) stops launching trials; the
    study still ends cleanly, and a spec of the old name still means 16 trials at most."""
    raw = quadratic_study(
        "short-budget",
        sampler={"name": "random", "seed": 0},
        scheduler={"name": "none"},
        # 4 s (as test_compute_budget's budget.time): trials are in flight when it ends, as
        # with 10 s, and the trial process computes 6 s less
        budget={"trials": 200, "max_concurrent": 1, "wall_clock_s": 4},
    )
    result = run_study(StudySpec.from_dict(raw), tmp_path / "study")
    # how many trials finish inside 4 s depends on the machine's load (none at a load of 20 on
    # 2 cores): the budget is what must hold — the study ends long before its 200 trials
    assert result.finished < 200, result.counts
    study = optuna.load_study(
        study_name="short-budget", storage=f"sqlite:///{tmp_path / 'study' / 'optuna.db'}"
    )
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    runs = MlflowClient(result.tracking_uri).search_runs([result.experiment_id])
    assert runs and not [r for r in runs if r.info.status == "RUNNING"]


def _commands(pid: int) -> dict[int, tuple[str, dict[str, str]]]:
    """``{pid: (command line, environment)}`` of ``pid``'s descendants (:func:`descendants`)."""
    found = {}
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{child}/environ").read_bytes().decode(errors="replace")
            found[child] = (argv, dict(e.split("=", 1) for e in env.split("\0") if "=" in e))
    return found


def test_the_session_ray_is_lean(ray_local):
    """The in-process Ray runs no log monitor and no autoscaler monitor, and its raylet, whose
    environment its dashboard agent inherits, has the agent sample every LEAN_REPORT_MS ms (the
    agent's own ``/proc/PID/environ`` is no witness: its process title overwrites it). Started
    without a dashboard, its raylet runs a minimal dashboard agent (through the wrapper, before
    Ray's script), which loads none of its modules (the metrics agent is one)."""
    import ray

    from fedtune.tuning.driver.ray_lean import MINIMAL_AGENT
    from tests.ray_start import LEAN_ENV

    procs = _commands(os.getpid())
    argvs = [argv for argv, _ in procs.values()]
    raylets = [(argv, env) for argv, env in procs.values() if "/raylet/raylet " in argv]
    assert len(raylets) == 1, argvs  # the Ray is this process's
    assert raylets[0][1].items() >= LEAN_ENV.items()
    assert f"{MINIMAL_AGENT} " in raylets[0][0].split("--dashboard_agent_command=")[1]
    assert [a for a in argvs if a.startswith("ray::DashboardAgent")], argvs
    assert not [a for a in argvs if "log_monitor.py" in a or "autoscaler/_private/monitor" in a]
    log = Path(ray._private.worker.global_worker.node.get_logs_dir_path(), "dashboard_agent.log")
    deadline, text = time.monotonic() + 120, ""
    while "Loaded " not in text and time.monotonic() < deadline:  # the agent may still start
        time.sleep(0.2)
        text = log.read_text() if log.exists() else ""
    assert "Loaded 0 modules." in text, text[-2000:]
