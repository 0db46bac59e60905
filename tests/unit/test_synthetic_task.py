"""LEAF / FedProx synthetic(α, β) task (`fedtune.trainers.tasks.synthetic`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedtune.errors import ConfigError
from fedtune.trainers.tasks import build_task
from fedtune.trainers.tasks.synthetic import SyntheticParams, generate

SMALL = {"clients": 6, "max_examples": 150}


def _label_skew(clients, classes=10) -> float:
    """Mean total-variation distance between each client's label histogram and the pooled one."""
    hist = np.array([np.bincount(y, minlength=classes) / len(y) for _, y in clients])
    pooled = np.bincount(np.concatenate([y for _, y in clients]), minlength=classes)
    return float(0.5 * np.abs(hist - pooled / pooled.sum()).sum(1).mean())


def test_shapes_dtypes_and_labels():
    task = build_task("synthetic", SMALL, seed=0)
    assert task.train.num_clients == 6
    assert task.train.inputs.shape == (task.train.num_examples, 60)
    assert task.train.inputs.dtype == torch.float32
    assert task.train.targets.dtype == torch.int64
    assert int(task.train.targets.min()) >= 0 and int(task.train.targets.max()) <= 9
    assert task.test is not None and task.test.inputs.shape[1] == 60
    assert set(task.metric_fns) == {"accuracy"}


def test_client_sizes_follow_the_lognormal_rule_and_hold_out():
    params = {
        "clients": 4,
        "log_std_examples": 0.0,
        "log_mean_examples": 3.0,
        "test_fraction": 0.25,
    }
    task = build_task("synthetic", {**params, "min_examples": 10}, seed=1)
    size = 10 + math.floor(math.exp(3.0))  # σ = 0: every client has min + ⌊e^μ⌋ examples
    held_out = math.floor(0.25 * size)
    assert task.train.counts.tolist() == [size - held_out] * 4
    assert len(task.test) == 4 * held_out


def test_sizes_respect_min_and_max():
    task = build_task(
        "synthetic", {"clients": 30, "min_examples": 20, "max_examples": 60, "test_fraction": 0}, 2
    )
    assert task.test is None
    assert int(task.train.counts.min()) >= 20 and int(task.train.counts.max()) <= 60


def test_deterministic_in_seed():
    a, b = build_task("synthetic", SMALL, 5), build_task("synthetic", SMALL, 5)
    c = build_task("synthetic", SMALL, 6)
    assert torch.equal(a.train.inputs, b.train.inputs)
    assert torch.equal(a.train.targets, b.train.targets)
    assert torch.equal(a.test.inputs, b.test.inputs)
    assert not torch.equal(a.train.inputs[0], c.train.inputs[0])


def test_input_covariance_is_diagonal_power_law():
    p = SyntheticParams(clients=1, min_examples=4000, log_std_examples=0.0, model="linear")
    ((x, _),) = generate(p, seed=3)
    var = x.var(axis=0)
    expected = np.arange(1, 61) ** -1.2
    assert np.all(np.abs(var / expected - 1) < 0.12)  # n ≈ 4000: relative sd of var ≈ 2 %


def test_labels_are_a_linear_argmax_per_client():
    from sklearn.linear_model import LogisticRegression  # ~1 CPU-s: not at collection

    p = SyntheticParams(clients=4, max_examples=300, model="linear")
    fitted = 0
    for x, y in generate(p, seed=0):
        if len(set(y)) > 1:
            fitted += 1
            assert LogisticRegression(C=1e6, max_iter=5000).fit(x, y).score(x, y) == 1.0
    assert fitted >= 2


def test_iid_clients_share_the_label_distribution_and_non_iid_do_not():
    common = {"clients": 20, "max_examples": 300, "model": "linear"}
    iid = generate(SyntheticParams(iid=True, **common), seed=0)
    skewed = generate(SyntheticParams(alpha=1.0, beta=1.0, **common), seed=0)
    assert _label_skew(iid) < 0.2 < 0.6 < _label_skew(skewed)


def test_model_gives_finite_per_example_loss():
    task = build_task("synthetic", SMALL, seed=0)
    model = task.model_fn(torch.Generator().manual_seed(0))
    out = model(task.train.inputs[:8])
    loss = task.loss_fn(out, task.train.targets[:8])
    acc = task.metric_fns["accuracy"](out, task.train.targets[:8])
    assert loss.shape == (8,) and torch.isfinite(loss).all() and (loss > 0).all()
    torch.testing.assert_close(
        loss, torch.nn.functional.cross_entropy(out, task.train.targets[:8], reduction="none")
    )
    assert set(acc.tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"alpha": -1.0}, "task.alpha"),
        ({"clients": 0}, "task.clients"),
        ({"classes": 1}, "task.classes"),
        ({"test_fraction": 1.0}, "task.test_fraction"),
        ({"max_examples": 3}, "task.max_examples"),
        ({"model": "nope"}, "task.model"),
        ({"iid": "yes"}, "task.iid"),
        ({"bogus": 1}, "task.bogus"),
    ],
)
def test_bad_params_name_the_field(params, field):
    with pytest.raises(ConfigError) as err:
        build_task("synthetic", params, seed=0)
    assert err.value.field == field
