"""Heterogeneous local work (``train.local_epochs``): step counts, masks, real tasks, search."""

from __future__ import annotations

import math

import optuna
import pytest
import torch

from fedtune.errors import ConfigError
from fedtune.search_spaces import suggest
from fedtune.trainers import Trainer, build_task, parse_trial_config
from fedtune.trainers.algorithms.gradalign import local_sgd_fn
from fedtune.trainers.client import ClientRule, make_client_fn, make_masked_client_fn
from fedtune.trainers.engine import RUNNER_METRIC
from fedtune.trainers.steps import epoch_steps, pad_steps, step_mask, theta_rows
from fedtune.trainers.theta import theta_vector
from fedtune.tuning import StudySpec

# what differs between runs by design: timing and which runner ran
UNTIMED = ("wall_time", RUNNER_METRIC)


def run(cfg) -> Trainer:
    trainer = Trainer(cfg)
    while not trainer.done:
        trainer.step()
    return trainer


# -- step counts -----------------------------------------------------------------------------


def test_epoch_steps_are_exact_ceilings():
    counts = torch.tensor([1, 7, 30, 31, 200])
    for e, b in [(1.0, 4), (0.1, 3), (2.5, 7), (0.3, 10), (3.0, 1)]:
        expected = [max(1, math.ceil(round(e * 10) * n / (10 * b))) for n in counts.tolist()]
        assert epoch_steps(counts, e, b).tolist() == expected, (e, b)
    # 0.1 · 30 / 3 is 1.0000000000000002 in floating point: still exactly one step
    assert epoch_steps(torch.tensor([30]), 0.1, 3).tolist() == [1]


def test_pad_and_mask_layout():
    rows = torch.arange(12).reshape(6, 2)  # 4 local-step batches + 2 extra batches
    padded = pad_steps(rows, 4, 6)
    assert padded[:4].tolist() == rows[:4].tolist()
    assert padded[4:6].tolist() == [rows[3].tolist()] * 2  # the last real batch, masked
    assert padded[6:].tolist() == rows[4:].tolist()  # extras after the K_max step columns
    assert step_mask(torch.tensor([1, 3]), 4).tolist() == [
        [True, False, False, False],
        [True, True, True, False],
    ]
    last = theta_rows("last", torch.tensor([1, 3]), 4)
    assert last.tolist() == [[1, 0, 0, 0], [0, 0, 1, 0]]


# -- masked client functions ≡ τ_i unpadded steps, bit for bit ------------------------------


def _least_squares(params, x, y):
    return ((x @ params["w"] - y) ** 2).mean()


def _client_data(k_max: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    xb = torch.randn(k_max, 5, 3, generator=g, dtype=torch.float64)
    yb = torch.randn(k_max, 5, generator=g, dtype=torch.float64)
    x = {"w": torch.randn(3, generator=g, dtype=torch.float64)}
    return x, xb, yb


@pytest.mark.parametrize("preset", ["sum", "last"])
@pytest.mark.parametrize("alpha", [0.0, 0.3])
@pytest.mark.parametrize("tau", [1, 3, 6])
def test_masked_client_fn_equals_unpadded_steps(preset, alpha, tau):
    k_max = 6
    x, xb, yb = _client_data(k_max)
    xb[tau:] = float("nan")  # whatever the masked steps read, nothing leaks
    lr = torch.tensor(0.07, dtype=torch.float64)
    rule = ClientRule(theta=theta_vector(preset, tau), prox_alpha=alpha, preset=preset)
    plain = make_client_fn(_least_squares, rule)(x, lr, xb[:tau], yb[:tau])
    steps = torch.tensor([tau])
    masked = make_masked_client_fn(_least_squares, rule)(
        x, lr, xb, yb, theta_rows(preset, steps, k_max)[0], step_mask(steps, k_max)[0]
    )
    assert torch.equal(plain["w"], masked["w"])


@pytest.mark.parametrize("tau", [1, 4])
def test_masked_local_sgd_equals_unpadded_steps(tau):
    k_max = 5
    x, xb, yb = _client_data(k_max, seed=1)
    xb[tau:] = float("inf")
    lr = torch.tensor(0.05, dtype=torch.float64)
    corr = {"w": torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)}
    plain = local_sgd_fn(_least_squares, tau)(x, lr, {}, xb[:tau], yb[:tau], {"corr": corr})
    mask = step_mask(torch.tensor([tau]), k_max)[0]
    masked = local_sgd_fn(_least_squares, k_max)(x, lr, {}, xb, yb, {"corr": corr, "mask": mask})
    for key in plain:
        assert torch.equal(plain[key]["w"], masked[key]["w"]), key


# -- real tasks with unequal clients ---------------------------------------------------------

DIGITS = {"name": "digits", "clients": 12, "dirichlet": 0.3, "size_skew": 1.0, "model": "linear"}
SYNTHETIC = {
    "name": "synthetic",
    "clients": 12,
    "min_examples": 3,
    "log_mean_examples": 2.5,
    "log_std_examples": 1.5,
    "max_examples": 300,
    "dim": 20,
    "classes": 5,
}


def _task_config(task: dict, algorithm: str, runner: str, **hparams) -> dict:
    return {
        "task": {**task, "seed": 2},
        "algorithm": algorithm,
        "train": {
            "rounds": 3,
            "clients_per_round": 5,
            "local_epochs": 1.0,
            "batch_size": 16,
            "eval_every": 3,
            "dtype": "float64",
            "runner": runner,
            "weighting": "examples",
        },
        "hparams": {"client_lr": 0.05, **hparams},
        "seed": 4,
    }


def test_size_options_give_very_different_clients():
    digits = build_task("digits", {k: v for k, v in DIGITS.items() if k != "name"}, 2)
    counts = digits.train.counts
    assert int(counts.max()) >= 5 * int(counts.min())
    plain = build_task("digits", {"clients": 12, "dirichlet": 0.3}, 2)
    assert len(set(plain.train.counts.tolist())) == 1  # the default split is unchanged
    synthetic = build_task("synthetic", {k: v for k, v in SYNTHETIC.items() if k != "name"}, 2)
    assert int(synthetic.train.counts.max()) >= 10 * int(synthetic.train.counts.min())


@pytest.mark.parametrize("task", [DIGITS, SYNTHETIC], ids=["digits", "synthetic"])
@pytest.mark.parametrize(
    ("algorithm", "hparams"),
    [
        ("fedavg", {}),
        ("fednova", {}),
        ("fedprox", {"prox_alpha": 0.1}),
        ("scaffold", {}),
        ("fedavgm", {"server_momentum": 0.9}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_real_tasks_vectorized_equals_sequential_bit_for_bit(task, algorithm, hparams):
    vec = run(_task_config(task, algorithm, "vectorized", **hparams))
    seq = run(_task_config(task, algorithm, "sequential", **hparams))
    assert getattr(vec.runner, "fallback", None) is None
    assert any(r.extra["steps_max"] > r.extra["steps_min"] for r in vec.records)
    strip = [{k: v for k, v in r.as_dict().items() if k not in UNTIMED} for r in vec.records]
    assert strip == [
        {k: v for k, v in r.as_dict().items() if k not in UNTIMED} for r in seq.records
    ]
    for k in vec.state.params:
        assert torch.equal(vec.state.params[k], seq.state.params[k]), k


@pytest.mark.parametrize("mode", ["local_steps", "local_epochs"])
def test_mlp_vectorized_matches_sequential_as_with_fixed_k(mode):
    """With hidden layers vmap batches the matmuls (bmm), whose float64 rounding differs from
    the per-client mm by an ulp — already with a fixed K. Heterogeneous steps add nothing:
    both modes agree to the same 1e-12 as the fixed-K contract table."""
    cfg = {
        r: _task_config({**DIGITS, "model": "mlp"}, "fedavg", r)
        for r in ("vectorized", "sequential")
    }
    if mode == "local_steps":
        for c in cfg.values():
            del c["train"]["local_epochs"]
            c["train"]["local_steps"] = 4
    vec, seq = run(cfg["vectorized"]), run(cfg["sequential"])
    assert getattr(vec.runner, "fallback", None) is None
    for k in vec.state.params:
        torch.testing.assert_close(vec.state.params[k], seq.state.params[k], rtol=1e-12, atol=1e-14)


def test_record_step_counts_match_the_cohort():
    trainer = Trainer(_task_config(SYNTHETIC, "fedavg", "vectorized"))
    cohort = trainer._cohort(0)
    record = trainer.step()
    n = trainer.data.counts[cohort.clients.cpu()]
    tau = [math.ceil(int(k) / 16) for k in n]
    assert cohort.steps.tolist() == tau
    assert record.extra["steps_min"] == min(tau) and record.extra["steps_max"] == max(tau)
    assert record.extra["steps_mean"] == pytest.approx(sum(tau) / len(tau))
    assert record.examples == 16 * sum(tau)


# -- configuration and search ----------------------------------------------------------------


def test_local_epochs_parses_and_round_trips():
    cfg = parse_trial_config(_task_config(SYNTHETIC, "fedavg", "auto"))
    assert cfg.train.local_epochs == 1.0 and cfg.train.local_steps is None
    assert parse_trial_config(cfg.to_dict()).train.local_epochs == 1.0


def _study(algorithm: str, train: dict, override: dict) -> dict:
    return {
        "name": "epochs-study",
        "task": {"name": "quadratic", "examples": 4, "examples_max": 20},
        "algorithm": algorithm,
        "train": {"rounds": 10, **train},
        "search": {"override": override},
        "budget": {"trials": 2},
    }


def test_local_epochs_is_searchable_like_k():
    spec = StudySpec.from_dict(_study("fednova", {}, {"local_epochs": {"enabled": True}}))
    spec.validate_deep()
    space = spec.search_space()
    param = next(p for p in space.enabled if p.path == "train.local_epochs")
    assert param.low > 0 and param.log
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    config = spec.trial(suggest(trial, space))
    assert config.train.local_epochs is not None and config.train.local_steps is None
    Trainer(config)  # builds


def test_searching_local_epochs_for_a_fixed_k_method_is_refused():
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(_study("maml", {}, {"local_epochs": {"enabled": True}}))
    assert "local_epochs" in err.value.field and "maml" in err.value.reason


def test_searching_local_epochs_beside_fixed_local_steps_is_refused():
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(
            _study("fedavg", {"local_steps": 5}, {"local_epochs": {"enabled": True}})
        )
    assert "local_epochs" in err.value.field and "not both" in err.value.reason
