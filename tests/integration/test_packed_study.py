"""Packed studies end to end: several configurations per Ray Tune trial, each its own trial.

Real local Ray, a real ``mlflow server`` and Optuna's RDB storage, as ``test_tuning_study.py``.
Every configuration of a pack must be exactly what it would be unpacked: its own Optuna trial
(told once), its own MLflow child run with every round, its own curve equal to the engine's
unpacked run of its configuration (a refill's too), and a stop rule stops it without stopping
its pack.
"""

from __future__ import annotations

import io
import math

import numpy as np
import optuna
import pytest
from mlflow import MlflowClient

from fedtune.cli.tune import _summary
from fedtune.outcomes import TrialOutcome, mlflow_status
from fedtune.trainers import Trainer
from fedtune.tuning.driver.study import run_study
from fedtune.tuning.optuna.store import CURVE_ATTR
from fedtune.tuning.spec import StudySpec
from fedtune.tuning.trials.results import trial_configs

ROUNDS = 12


def _spec(name: str, quadratic_study, **overrides) -> StudySpec:
    return StudySpec.from_dict(quadratic_study(name, **overrides))


def _packs(study: optuna.Study) -> dict[str, list[int]]:
    """Each pack of the study (its Optuna user attribute ``pack``): its members' numbers."""
    out: dict[str, list[int]] = {}
    for t in study.get_trials():
        out.setdefault(t.user_attrs["pack"], []).append(t.number)
    return out


def _unpacked(spec: StudySpec, params: dict) -> tuple[list[float], list[int]]:
    """ℓ_t of a configuration run by itself on the engine (mean over the study's seeds), and the
    rounds after which its rates decayed (the mean decay count over seeds grew)."""
    trainers = [Trainer(config) for config in trial_configs(spec, params)]
    losses, decay_rounds, decays = [], [], 0.0
    while not any(t.done for t in trainers):
        records = [t.step() for t in trainers]
        if any(r is None for r in records):
            break
        losses.append(float(np.mean([r.client_loss for r in records])))
        now = float(np.mean([t.decay.decays for t in trainers]))
        if now > decays:
            decay_rounds.append(records[0].round)
        decays = now
    return losses, decay_rounds


def _children(client: MlflowClient, result) -> dict[int, object]:
    runs = client.search_runs(
        [result.experiment_id], f"tags.`mlflow.parentRunId` = '{result.parent_run_id}'"
    )
    return {int(r.data.tags["optuna_trial_number"]): r for r in runs}


def test_each_configuration_of_a_pack_is_its_own_trial_with_its_unpacked_curve(
    tmp_path, ray_local, mlflow_server, quadratic_study
):
    spec = _spec(
        "packed-curves",
        quadratic_study,
        seeds=[0, 1],
        decay={"enabled": True, "window": 2, "patience": 1, "cooldown": 1},
        sampler={"name": "random", "seed": 3},
        scheduler={"name": "none"},
        budget={"trials": 6, "max_concurrent": 4},
        resources={"pack": 4},
        report_every=3,
    )
    spec.validate_deep()
    workdir = tmp_path / "study"
    result = run_study(spec, workdir, tracking_uri=mlflow_server, progress=io.StringIO())

    assert result.packing.startswith("4 configurations per trial process, 1 process at once")
    study = optuna.load_study(study_name=spec.name, storage=result.storage_url)
    trials = study.get_trials()
    packs = _packs(study)
    # one process at once, whose places the sampler refilled as members ended: one pack ran
    # all six configurations, two of them started after the first four
    assert list(packs.values()) == [list(range(6))], packs
    for name, members in packs.items():  # the pack's Ray Tune trial, named for its first member
        assert name == f"pack-{members[0]:04d}"
        assert list((workdir / "ray_results").glob(f"session-*/{name}"))
    assert result.finished == 6 == result.counts["trials"]
    children = _children(MlflowClient(mlflow_server), result)
    assert sorted(children) == list(range(6))
    client = MlflowClient(mlflow_server)
    completed = [t for t in trials if t.user_attrs["outcome"] == TrialOutcome.COMPLETED]
    assert len(completed) >= 3 and any(t.user_attrs["decay_rounds"] for t in completed)
    for t in trials:
        assert t.state == optuna.trial.TrialState.COMPLETE, (t.number, t.user_attrs)
        outcome = t.user_attrs["outcome"]
        assert outcome in (TrialOutcome.COMPLETED, TrialOutcome.DIVERGED)
        expected, decay_rounds = _unpacked(spec, dict(t.params))
        curve = t.system_attrs[CURVE_ATTR]
        got = [math.inf if v is None else v for v in curve["loss"]]
        if outcome == TrialOutcome.COMPLETED:
            assert (
                curve["rounds"] == list(range(1, ROUNDS + 1)) == list(range(1, len(expected) + 1))
            )
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
            assert t.values[0] == pytest.approx(np.mean(expected[-3:]), rel=1e-12)
            assert t.user_attrs["decay_rounds"] == decay_rounds
        run = children[t.number]
        assert run.info.status == mlflow_status(outcome)
        assert run.data.tags["outcome"] == outcome
        assert run.data.tags["device"] == "cpu"  # each member's run says where it computed
        logged = {
            m.step: m.value for m in client.get_metric_history(run.info.run_id, "client_loss")
        }
        assert sorted(logged) == curve["rounds"]
        assert "decays" in run.data.metrics
        for path, value in t.params.items():
            assert float(run.data.params[path]) == pytest.approx(value, rel=1e-12)


def test_a_stop_rule_stops_members_one_by_one_and_their_pack_goes_on(
    tmp_path, ray_local, mlflow_server, quadratic_study
):
    spec = _spec(
        "packed-asha",
        quadratic_study,
        search={
            "space": "fedavg",
            "override": {
                "client_lr": {"low": 0.001, "high": 0.3},
                "server_lr": {"low": 0.05, "high": 1.0},
            },
        },
        sampler={"name": "random", "seed": 0},
        scheduler={"name": "asha", "grace_rounds": 2, "reduction_factor": 2},
        budget={"trials": 8, "max_concurrent": 4},
        resources={"pack": 4},
    )
    spec.validate_deep()
    workdir = tmp_path / "study"
    result = run_study(spec, workdir, tracking_uri=mlflow_server, progress=io.StringIO())

    summary = _summary(result, spec, "study.yaml", str(workdir)).splitlines()
    assert "packing        : 4 configurations per trial process, 1 process at once" in "\n".join(
        summary
    )
    study = optuna.load_study(study_name=spec.name, storage=result.storage_url)
    by_number = {t.number: t for t in study.get_trials()}
    stopped = [t for t in by_number.values() if t.user_attrs["outcome"] == TrialOutcome.STOPPED]
    assert stopped, {n: t.user_attrs for n, t in by_number.items()}
    assert result.stop_reasons.get("rung") == len(stopped)
    for t in stopped:
        assert t.state == optuna.trial.TrialState.PRUNED
        assert t.user_attrs["stop_rule"] == "rung"
        assert t.user_attrs["rounds"] < ROUNDS
    # a pack with a stopped member also ran another member to its last round
    mixed = [
        members
        for members in _packs(study).values()
        if any(by_number[n].user_attrs["outcome"] == TrialOutcome.STOPPED for n in members)
        and any(by_number[n].user_attrs["rounds"] == ROUNDS for n in members)
    ]
    assert mixed, _packs(study)
    children = _children(MlflowClient(mlflow_server), result)
    for t in stopped:
        run = children[t.number]
        assert run.data.tags["outcome"] == TrialOutcome.STOPPED
        history = MlflowClient(mlflow_server).get_metric_history(run.info.run_id, "client_loss")
        assert max(m.step for m in history) == t.user_attrs["rounds"]


def test_auto_measures_on_the_cluster_whether_a_pack_pays_before_it_packs(
    tmp_path, ray_local, quadratic_study
):
    # the default pack (auto): 4 configurations at once on 2 one-CPU slots would pack 2 per
    # process, if a pack of 2 measured on this task by a Ray task runs 2× the
    # configuration-rounds/s of one configuration at a time
    doc = quadratic_study("auto-probe", budget={"trials": 4, "max_concurrent": 4})
    doc.pop("resources", None)
    spec = StudySpec.from_dict(doc)
    assert spec.resources.pack == "auto"
    result = run_study(spec, tmp_path / "study", progress=io.StringIO())
    note = result.packing
    assert "auto, 2 process slots, a pack of 2 measured " in note, note
    assert "configuration-rounds/s of one at a time" in note, note
    pays = "(≥ 2×)" in note
    assert note.startswith("2 configurations per trial process" if pays else "one configuration"), (
        note
    )
    assert result.finished == 4 == result.counts["trials"]
    trials = optuna.load_study(study_name=spec.name, storage=result.storage_url).get_trials()
    packs = [t.user_attrs.get("pack") for t in trials]
    if pays:  # each configuration in a pack, and some pack held two
        assert all(packs) and len(set(packs)) < len(packs), packs
    else:  # one configuration per trial process, as with pack: 1
        assert not any(packs), packs


def _no_device(spec, size):
    raise RuntimeError("no such device\nsecond line")


def test_a_measurement_that_fails_on_the_cluster_is_none_and_one_logged_line(
    ray_local, quadratic_study, caplog
):
    from fedtune.tuning.packing.probe import on_a_trials_resources

    spec = StudySpec.from_dict(quadratic_study("probe-fails"))
    with caplog.at_level("WARNING", logger="fedtune.tuning.packing.probe"):
        assert on_a_trials_resources(_no_device, spec, 4, gpu=0, what="the pack's speed") is None
    assert "the pack's speed was not measured: no such device" in caplog.text
    assert "second line" not in caplog.text


USER_TASK = """
from fedtune.trainers.tasks import build_task, register_task


@register_task("probed_quadratic", "the quadratic, from the study's own code")
def build(params, seed):
    return build_task("quadratic", params, seed)
"""


def test_the_speed_probe_imports_the_studys_code_as_a_trial_does(
    tmp_path, ray_local, quadratic_study
):
    from fedtune.tuning.packing.speed import measure_on_cluster

    lab = tmp_path / "lab" / "probed_lab"
    lab.mkdir(parents=True)
    (lab / "__init__.py").write_text("")
    (lab / "tasks.py").write_text(USER_TASK)
    doc = quadratic_study("probe-user-task")
    doc["task"] = {**doc["task"], "name": "probed_quadratic"}
    doc["code"] = {"path": str(tmp_path / "lab"), "modules": ["probed_lab.tasks"]}
    spec = StudySpec.from_dict(doc)
    # a Ray worker has not imported the study's code: the probe does, before it builds the task
    speed = measure_on_cluster(spec, 2)
    assert speed is not None and speed.size == 2
    assert speed.unpacked is not None and speed.unpacked > 0
