"""run_trial outcomes, checkpoint/restore, determinism across processes, tasks."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from fedtune.errors import ConfigError
from fedtune.trainers import Outcome, Trainer, build_task, run_trial
from tests.conftest import quadratic_config


def digits_config(algorithm="fedavg", **hp):
    return {
        "task": {"name": "digits", "clients": 20, "dirichlet": 0.5, "model": "mlp", "seed": 0},
        "algorithm": algorithm,
        "train": {
            "rounds": 6,
            "clients_per_round": 4,
            "local_steps": 3,
            "batch_size": 10,
            "eval_every": 3,
        },
        "hparams": hp or {"client_lr": 0.1, "server_lr": 0.1},
        "seed": 0,
    }


def test_round_record_fields_and_evaluation_schedule():
    result = run_trial(digits_config())
    assert result.outcome == Outcome.COMPLETED and result.rounds_completed == 6
    first = result.records[0].as_dict()
    for key in (
        "client_loss",
        "train_loss",
        "test_loss",
        "test_accuracy",
        "update_norm",
        "client_lr",
        "server_lr",
        "examples",
        "wall_time",
    ):
        assert key in first, key
    evaluated = [r.round for r in result.records if r.train_loss is not None]
    assert evaluated == [1, 3, 6]
    assert [r.examples for r in result.records] == [4 * 3 * 10 * (i + 1) for i in range(6)]
    assert all(
        b.wall_time >= a.wall_time for a, b in zip(result.records, result.records[1:], strict=False)
    )


def test_learning_reduces_loss_on_digits():
    cfg = digits_config(client_lr=0.2, server_lr=0.2)
    cfg["train"].update(rounds=25, eval_every=25)
    result = run_trial(cfg)
    assert result.records[-1].train_loss < 0.6 * result.records[0].train_loss
    assert result.records[-1].test["accuracy"] > 0.5


def test_divergence_is_an_outcome_not_an_exception():
    cfg = quadratic_config(
        "fedavg", hparams={"client_lr": 0.05, "server_lr": 50.0}, train={"rounds": 30}
    )
    result = run_trial(cfg)
    assert result.outcome == Outcome.DIVERGED
    assert 0 < result.rounds_completed < 30
    assert all(math.isfinite(r.client_loss) for r in result.records)
    assert "bound" in result.reason
    assert result.final_loss() == math.inf


def test_on_round_can_stop_the_trial():
    seen = []
    result = run_trial(digits_config(), on_round=lambda r: seen.append(r.round) or r.round < 2)
    assert result.outcome == Outcome.STOPPED and seen == [1, 2]


@pytest.mark.parametrize(
    "algorithm,hp,decay",
    [
        ("fedavgm", {"client_lr": 0.05, "server_lr": 0.05}, {}),
        ("fedadam", {"client_lr": 0.05, "server_lr": 0.05}, {}),
        (
            "fedavg",
            {"client_lr": 0.05, "server_lr": 0.05},
            {"enabled": True, "window": 2, "patience": 1, "cooldown": 1, "threshold": 10.0},
        ),
    ],
)
def test_checkpoint_restore_continues_identically(algorithm, hp, decay, tmp_path):
    cfg = quadratic_config(algorithm, hparams=hp, decay=decay, train={"rounds": 10})
    full = Trainer(cfg)
    while not full.done:
        full.step()
    first = Trainer(cfg)
    for _ in range(4):
        first.step()
    path = tmp_path / "ckpt.pt"
    torch.save(first.state_dict(), path)
    resumed = Trainer(cfg)
    resumed.load_state_dict(torch.load(path, weights_only=False))
    while not resumed.done:
        resumed.step()

    def strip(t):
        return [{k: v for k, v in r.as_dict().items() if k != "wall_time"} for r in t.records]

    assert strip(resumed) == strip(full)
    for k in full.state.params:
        assert torch.equal(full.state.params[k], resumed.state.params[k])
    if decay:
        assert full.decay.decays >= 1 and resumed.decay.decays == full.decay.decays


def test_checkpoint_from_another_config_is_rejected():
    a = Trainer(quadratic_config("fedavg", hparams={"client_lr": 0.05}))
    a.step()
    b = Trainer(quadratic_config("fedavg", hparams={"client_lr": 0.06}))
    with pytest.raises(ConfigError, match="different configuration"):
        b.load_state_dict(a.state_dict())


_SCRIPT = """
import json, sys
from fedtune.trainers import run_trial
cfg = json.loads(sys.argv[1])
r = run_trial(cfg)
print(json.dumps([{k: v for k, v in x.as_dict().items() if k != 'wall_time'} for x in r.records]))
"""


def test_two_processes_give_bit_identical_curves():
    cfg = json.dumps(digits_config())
    outs = [
        subprocess.run(
            [sys.executable, "-c", _SCRIPT, cfg], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    ]
    assert outs[0] == outs[1] and len(json.loads(outs[0])) == 6


def test_client_sampling_is_independent_of_hyperparameters():
    a = Trainer(digits_config(client_lr=0.1, server_lr=0.1))
    b = Trainer(digits_config(client_lr=0.9, server_lr=0.01))
    for t in range(5):
        assert torch.equal(a._cohort(t).clients, b._cohort(t).clients)
    assert not torch.equal(a._cohort(0).clients, a._cohort(1).clients)


def test_clients_sampled_without_replacement_within_round():
    t = Trainer(digits_config())
    for r in range(20):
        clients = t._cohort(r).clients.tolist()
        assert len(set(clients)) == len(clients) == 4


def test_quadratic_task_exposes_exact_instance():
    task = build_task("quadratic", {"clients": 4, "dim": 3, "noise": 1.0}, seed=2)
    inst = task.meta["instance"]
    assert inst.A.shape == (4, 3, 3) and inst.mu >= 1.0 - 1e-9 and inst.L <= 10.0 + 1e-9
    # the per-example noise is centred per client, so f_i is exactly the quadratic
    model = task.model_fn(torch.Generator().manual_seed(0)).double()
    x = model.x.detach().numpy()
    for i in range(4):
        ds = task.train.client(i)
        loss = float(task.loss_fn(model(ds.inputs), ds.targets).mean().detach())
        assert loss == pytest.approx(float(inst.client_losses(x)[i]), rel=1e-10)


def test_digits_task_is_non_iid_and_seeded():
    skewed = build_task("digits", {"clients": 20, "dirichlet": 0.05}, seed=0)
    iid = build_task("digits", {"clients": 20, "dirichlet": 100.0}, seed=0)

    def mean_classes(task):
        return sum(len(set(task.train.client(i).targets.tolist())) for i in range(20)) / 20

    assert mean_classes(skewed) < 0.6 * mean_classes(iid)
    again = build_task("digits", {"clients": 20, "dirichlet": 0.05}, seed=0)
    assert torch.equal(skewed.train.targets, again.train.targets)
    assert skewed.test is not None and len(skewed.test) == 359


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("train", {"local_steps": 0}, "train.local_steps"),
        ("hparams", {"client_lr": -0.1}, "hparams.client_lr"),
        ("hparams", {"prox_alpha": 0.5}, "hparams.prox_alpha: not a parameter"),
        ("algorithm", "nope", "algorithm"),
        ("train", {"bogus": 1}, "train.bogus"),
        ("task", {"name": "digits", "clients": 1}, "task.clients"),
    ],
)
def test_invalid_configs_name_the_field(field, value, match):
    cfg = digits_config()
    cfg[field] = (
        value if not isinstance(value, dict) or field == "task" else {**cfg.get(field, {}), **value}
    )
    with pytest.raises(ConfigError, match=match):
        Trainer(cfg)
