"""Runner fallback and the `fedtune train` command line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import torch
from torch import nn

from fedtune.cli import main
from fedtune.trainers import Trainer, build_task
from fedtune.trainers.tasks import Task
from fedtune.trainers.tasks.losses import cross_entropy


class NotVmappable(nn.Module):
    """A model with data-dependent Python control flow: vmap cannot trace `.item()`."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 10)

    def forward(self, x):
        h = self.lin(x.flatten(1))
        return h * 2 if float(h.sum().item()) > 1e9 else h


def _model(generator: torch.Generator) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
        return NotVmappable()


def _task() -> Task:
    base = build_task("digits", {"clients": 10}, seed=0)
    return Task("odd", base.train, _model, cross_entropy, test=base.test)


def test_unvmappable_model_falls_back_with_reason(caplog):
    cfg = {
        "task": {"name": "digits", "clients": 10},
        "algorithm": "fedavg",
        # on the CPU: the exact equality below is of the CPU's kernels (on CUDA the fallback's
        # first ℓ_t, evaluated batched before the vectorized step failed, rounds differently)
        "train": {
            "rounds": 2,
            "clients_per_round": 3,
            "local_steps": 2,
            "runner": "vectorized",
            "device": "cpu",
        },
    }
    with caplog.at_level(logging.WARNING, logger="fedtune.trainers"):
        vec = Trainer(cfg, task=_task())
        vec.step()
        vec.step()
    assert vec.runner.fallback_reason and "sequential" in caplog.text
    assert vec.result().runner == "sequential(fallback)"
    seq = Trainer({**cfg, "train": {**cfg["train"], "runner": "sequential"}}, task=_task())
    seq.step()
    seq.step()
    assert [r.client_loss for r in vec.records] == [r.client_loss for r in seq.records]


def test_train_cli_json(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "task: {name: quadratic, clients: 4, dim: 2}\nalgorithm: fedavgm\n"
        "train: {rounds: 3, clients_per_round: 2, local_steps: 2, dtype: float64}\n"
        "hparams: {client_lr: 0.01, server_lr: 0.01}\n"
    )
    assert main(["train", str(cfg), "--json", "--set", "train.rounds=4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outcome"] == "completed" and out["rounds"] == 4 and len(out["records"]) == 4
    assert out["config"]["algorithm"] == "fedavgm"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedtune.cli", *args], capture_output=True, text=True
    )


def test_train_cli_invalid_config_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("task: quadratic\nalgorithm: fedavg\nhparams: {client_lr: 0.1}\n")
    cases = {
        "hparams.client_lr=-1": "hparams.client_lr: must be >= 0",
        "train.local_steps=0": "train.local_steps: must be >= 1",
        "algorithm=fedfoo": "algorithm: unknown algorithm 'fedfoo'",
        "train.speed=3": "train.speed: unknown key",
    }
    for override, message in cases.items():
        proc = _cli("train", str(cfg), "--set", override)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], proc.stderr
    missing = _cli("train", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "file not found" in missing.stderr


def test_train_cli_shows_summary_table(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "task: {name: quadratic, clients: 4, dim: 2}\nalgorithm: fedavg\n"
        "train: {rounds: 3, clients_per_round: 2, local_steps: 2}\n"
        "hparams: {client_lr: 0.01, server_lr: 0.01}\n"
    )
    proc = _cli("train", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "outcome" in proc.stdout and "completed" in proc.stdout and "final loss" in proc.stdout
    assert "3/3" in proc.stderr  # the progress bar reached the last round


def test_train_runs_on_the_requested_device():
    t = Trainer(
        {"task": "quadratic", "algorithm": "fedavg", "train": {"rounds": 1, "device": "cpu"}}
    )
    t.step()
    assert t.state.params["x"].device == torch.device("cpu")


def test_cuda_requested_without_gpu_is_a_config_error():
    if torch.cuda.is_available():
        import pytest

        pytest.skip("a GPU is present: the error path cannot be exercised")
    from fedtune.errors import ConfigError

    try:
        Trainer({"task": "quadratic", "algorithm": "fedavg", "train": {"device": "cuda"}})
    except ConfigError as exc:
        assert exc.field == "train.device" and "no GPU" in exc.reason
    else:  # pragma: no cover
        raise AssertionError("expected ConfigError")


def test_engine_on_cuda_matches_cpu():
    import pytest

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine (run on a GPU host to exercise the CUDA path)")
    base = {
        "task": {"name": "digits", "clients": 10},
        "algorithm": "fedavgm",
        "train": {"rounds": 3, "clients_per_round": 4, "local_steps": 3, "dtype": "float64"},
    }
    cpu = Trainer({**base, "train": {**base["train"], "device": "cpu"}})
    gpu = Trainer({**base, "train": {**base["train"], "device": "cuda"}})
    for t in (cpu, gpu):
        while not t.done:
            t.step()
    assert all(v.is_cuda for v in gpu.state.params.values())
    for a, b in zip(cpu.records, gpu.records, strict=True):
        assert a.client_loss == pytest.approx(b.client_loss, rel=1e-9)


def test_tune_summary_explains_more_trials_than_the_target(tmp_path):
    """20 trials after an extension to 20, resumed without --trials (target:
    the budget, 16), is explained instead of printed as "20/16 trials"."""
    from types import SimpleNamespace

    from fedtune.cli.tune import _summary
    from fedtune.tuning.spec import StudySpec

    spec = StudySpec.from_dict(
        {
            "name": "s",
            "task": {"name": "quadratic", "clients": 4, "dim": 2},
            "algorithm": "fedavg",
            "train": {"rounds": 10},
        }
    )
    counts = {"trials": 20, "completed": 20, "diverged": 0, "stopped": 0, "failed": 0}
    result = SimpleNamespace(
        name="s",
        counts=counts,
        target_trials=16,
        ran=0,
        interrupted=[],
        best=None,
        pareto=[],
        failure="no completed trial has a finite value",
        tradeoff=None,
        timings={"total_s": 1.0},
        stop_reasons={},
        packing=None,
        workdir=str(tmp_path),
        storage_url="sqlite:///x",
        tracking_uri="sqlite:///y",
        experiment_id="1",
        parent_run_id="p" * 32,
        commands={
            "mlflow_ui": "mlflow ui",
            "mlflow_page": "http://127.0.0.1:5000/#/",
            "optuna_dashboard": "optuna-dashboard sqlite:///x",
        },
    )
    text = _summary(result, spec, "study.yaml", str(tmp_path))
    assert "trials         :" not in text and "packing" not in text
    from fedtune.tuning.driver.in_process import in_process_note

    result.packing = in_process_note(1)  # its trials ran in the driver: the summary says so
    here = _summary(result, spec, "study.yaml", str(tmp_path))
    assert f"trials         : {in_process_note(1)}; --ray runs them as Ray Tune trials" in here
    assert "20/16" not in text
    assert "20 trials (more than this run's target of 16" in text and "--trials" in text
