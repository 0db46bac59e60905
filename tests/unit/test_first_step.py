"""ℓ_i from the client's first local step (``fedtune.trainers.first_step``).

Where every sampled client has at most B examples and the rule's first step is at the broadcast
model, one forward pass over a client's examples gives its loss ℓ_i and its first step's
gradient. These tests check that this path gives what the separate ℓ_t pass and the plain
client function give, to the rounding of a different summation order (the contract table's
sequential-vs-vectorized tolerance, float64), for the digits models, FedProx, delta units, Θ
weights, masked steps and padded (unequal) clients; that the engine takes it exactly where it
is declared; and that a diverged round leaves the state as the separate path does.
"""

from __future__ import annotations

import copy

import pytest
import torch

from fedtune.trainers import Outcome, Trainer, build_task, get_recipe
from fedtune.trainers import engine as engine_mod
from fedtune.trainers.client import ClientRule, make_client_fn, make_masked_client_fn
from fedtune.trainers.evaluation import client_mean_losses
from fedtune.trainers.first_step import (
    client_data,
    client_means,
    make_measuring_client_fn,
    measures_in_first_step,
)
from fedtune.trainers.module_loss import ModuleLoss
from fedtune.trainers.runners import SequentialRunner, VectorizedRunner
from fedtune.trainers.steps import step_mask, theta_rows
from fedtune.trainers.tasks.base import FederatedData
from tests.conftest import quadratic_config
from tests.spies import count_calls

RTOL, ATOL = 1e-10, 1e-12  # the contract table's vectorized-vs-sequential tolerance

RULES = {
    "fedavg": ClientRule(theta=torch.ones(1)),
    "fedavg_k3": ClientRule(theta=torch.ones(3)),
    "fedprox": ClientRule(theta=torch.ones(3), prox_alpha=0.3),
    "delta_last": ClientRule(theta=torch.tensor([0.0, 0.0, 1.0]), units="delta", preset="last"),
    "weighted": ClientRule(theta=torch.tensor([0.5, 0.0, 2.0])),
}
B = 6


def _cohort(model: str):
    """Digits clients of 2 to 6 examples (unequal: padded), B = 6, float64; each client's K
    batches drawn with replacement from its own rows."""
    task = build_task("digits", {"clients": 10, "model": model}, seed=0)
    gen = torch.Generator().manual_seed(3)
    sizes = [2, 6, 3, 5, 4]
    clients = []
    for i, n in enumerate(sizes):
        rows = torch.arange(n) + 7 * i
        clients.append((task.train.inputs[rows].to(torch.float64), task.train.targets[rows]))
    data = FederatedData.from_clients(clients)
    net = task.model_fn(torch.Generator().manual_seed(0)).to(torch.float64)
    x = {n: p.detach().clone() for n, p in net.named_parameters()}
    ids = torch.arange(len(sizes))
    local = [torch.randint(0, n, (3, B), generator=gen) for n in sizes]
    batches = torch.stack([r + int(data.offsets[i]) for i, r in enumerate(local)])
    return ModuleLoss(net, task.loss_fn), x, data, ids, batches


def _separate(loss, x, data, ids, batches, rule, runner, masked=None):
    """The messages of the plain client function and ℓ_t from its own pass."""
    xb, yb = data.inputs[batches], data.targets[batches]
    lr = torch.tensor(0.07, dtype=torch.float64)
    if masked is None:
        msgs = runner.map(make_client_fn(loss, rule), (x, lr), (xb, yb))
    else:
        fn = make_masked_client_fn(loss, rule)
        msgs = runner.map(fn, (x, lr), (xb, yb, *masked))
    return msgs, client_mean_losses(loss.evaluate, x, data, ids, 4096)


def _measured(loss, x, data, ids, batches, rule, runner, masked=None):
    """The measuring client function's messages and ℓ_t from its per-example losses."""
    own = client_data(data, ids, batches, torch.float64)
    rest = batches[:, 1:]
    xb, yb = data.inputs[rest], data.targets[rest]
    lr = torch.tensor(0.07, dtype=torch.float64)
    fn = make_measuring_client_fn(loss, rule, masked=masked is not None)
    msgs, losses = runner.map(fn, (x, lr), (xb, yb, *(masked or ()), *own.per_client()))
    assert losses.shape == own.inputs.shape[:2]
    return msgs, client_means(losses, own.counts)


def _close(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("runner", [SequentialRunner, VectorizedRunner])
@pytest.mark.parametrize("model", ["linear", "mlp", "cnn"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_measured_first_step_is_the_separate_pass(model, rule, runner):
    loss, x, data, ids, batches = _cohort(model)
    rule_ = RULES[rule]
    k = int(rule_.theta.shape[0])
    msgs, lt = _separate(loss, x, data, ids, batches[:, :k], rule_, runner())
    got, losses = _measured(loss, x, data, ids, batches[:, :k], rule_, runner())
    _close(got, msgs)
    torch.testing.assert_close(losses, lt, rtol=RTOL, atol=ATOL)
    assert losses.shape == (5,) and bool((losses > 0).all())


@pytest.mark.parametrize("runner", [SequentialRunner, VectorizedRunner])
@pytest.mark.parametrize("model", ["linear", "cnn"])
def test_measured_masked_steps_are_the_separate_pass(model, runner):
    loss, x, data, ids, batches = _cohort(model)
    rule = ClientRule(theta=torch.ones(3), prox_alpha=0.1)
    steps = torch.tensor([3, 1, 2, 3, 1])
    masked = (theta_rows("sum", steps, 3, torch.float64), step_mask(steps, 3))
    msgs, lt = _separate(loss, x, data, ids, batches, rule, runner(), masked)
    got, losses = _measured(loss, x, data, ids, batches, rule, runner(), masked)
    _close(got, msgs)
    torch.testing.assert_close(losses, lt, rtol=RTOL, atol=ATOL)


def test_the_padding_is_left_out_and_the_first_batch_reads_the_clients_rows():
    loss, x, data, ids, batches = _cohort("linear")
    own = client_data(data, ids, batches, torch.float64)
    assert own.inputs.shape[:2] == (5, 6) and own.counts.tolist() == [2, 6, 3, 5, 4]
    for i, n in enumerate(own.counts.tolist()):
        lo = int(data.offsets[i])
        assert torch.equal(own.inputs[i, :n], data.inputs[lo : lo + n])
        assert torch.equal(own.inputs[i, n:], data.inputs[lo + n - 1].expand(6 - n, 1, 8, 8))
        # the first batch's draws of each example, over B; none of the padding
        draws = torch.bincount(batches[i, 0] - lo, minlength=6).to(torch.float64)
        assert torch.equal(own.weights[i], draws / B) and float(own.weights[i, n:].sum()) == 0
    # the padding repeats a real row: a loss on it would count twice if it were not left out
    _, losses = _measured(loss, x, data, ids, batches[:, :1], RULES["fedavg"], SequentialRunner())
    _, lt = _separate(loss, x, data, ids, batches[:, :1], RULES["fedavg"], SequentialRunner())
    torch.testing.assert_close(losses, lt, rtol=RTOL, atol=ATOL)


def test_which_rounds_measure_in_the_first_step():
    loss, *_ = _cohort("linear")
    counts = torch.tensor([3, 6])
    assert measures_in_first_step(RULES["fedprox"], loss, counts, 6)
    assert not measures_in_first_step(RULES["fedprox"], loss, counts, 5)  # a client > B
    maml = ClientRule(theta=torch.ones(1), second_order=True)
    assert not measures_in_first_step(maml, loss, counts, 6)
    assert not measures_in_first_step(ClientRule(theta=torch.zeros(0)), loss, counts, 6)
    assert not measures_in_first_step(RULES["fedavg"], loss.__call__, counts, 6)
    with pytest.raises(ValueError, match="MAML"):
        make_measuring_client_fn(loss, maml, masked=False)


# -- the engine -----------------------------------------------------------------------------


def _small_clients(name: str = "fedavg", **train) -> dict:
    """The contract table's quadratic trial with clients of 2 to 4 examples and B = 4."""
    hparams = {"client_lr": 0.05}
    if get_recipe(name).units == "gradient":
        hparams["server_lr"] = 0.05
    cfg = quadratic_config(name, hparams=hparams)
    cfg["task"] = {**cfg["task"], "examples": 2, "examples_max": 4}
    cfg["train"] = {**cfg["train"], "batch_size": 4, "rounds": 5, **train}
    return cfg


def _run(cfg: dict, measure: bool) -> Trainer:
    trainer = Trainer(cfg)
    trainer.measure_in_first_step = measure
    while not trainer.done:
        trainer.step()
    return trainer


def _curve(trainer: Trainer) -> list[dict]:
    skip = ("wall_time", engine_mod.RUNNER_METRIC)
    return [{k: v for k, v in r.as_dict().items() if k not in skip} for r in trainer.records]


@pytest.fixture
def lt_passes(monkeypatch) -> list:
    """Every separate ℓ_t pass of the engine."""
    return count_calls(monkeypatch, engine_mod, "client_mean_losses")


@pytest.mark.parametrize("runner", ["sequential", "vectorized"])
@pytest.mark.parametrize(
    ("name", "train"),
    [
        ("fedavg", {}),
        ("fedprox", {}),
        ("fedadam", {"local_steps": 1}),
        ("fednova", {}),
        ("fedavg", {"local_epochs": 1.5, "local_steps": None}),
    ],
)
def test_engine_measures_in_the_first_step_as_the_separate_pass(name, train, runner, lt_passes):
    train = {k: v for k, v in train.items() if v is not None}
    cfg = _small_clients(name, runner=runner, **train)
    if "local_epochs" in train:
        del cfg["train"]["local_steps"]
    measured = _run(cfg, True)
    assert lt_passes == [], "every round should take ℓ_t from the first steps"
    separate = _run(cfg, False)
    assert separate.outcome == Outcome.COMPLETED
    assert len(lt_passes) == separate.round == 5
    for a, b in zip(_curve(measured), _curve(separate), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=RTOL, abs=ATOL), key
    for k in measured.state.params:
        torch.testing.assert_close(
            measured.state.params[k], separate.state.params[k], rtol=RTOL, atol=ATOL
        )


def test_engine_keeps_the_separate_pass_where_it_cannot_measure(lt_passes):
    big = _small_clients(batch_size=3)
    big["task"]["examples"] = 4  # every client has 4 examples, one more than B
    _run(big, True)
    assert len(lt_passes) == 5
    maml = _small_clients("maml")
    maml["train"]["local_steps"] = 1
    _run(maml, True)
    assert len(lt_passes) == 10


def test_a_diverged_measured_round_leaves_the_state_as_the_separate_pass(lt_passes):
    cfg = _small_clients(rounds=30)
    cfg["hparams"] = {"client_lr": 0.05, "server_lr": 50.0}
    measured, separate = _run(cfg, True), _run(copy.deepcopy(cfg), False)
    assert measured.outcome == separate.outcome == Outcome.DIVERGED
    assert measured.round == separate.round < 30 and measured.reason == separate.reason
    diverged_round = len(lt_passes)  # the separate run's passes, its diverged round included
    assert diverged_round == separate.round + 1
    for k in measured.state.params:
        torch.testing.assert_close(
            measured.state.params[k], separate.state.params[k], rtol=RTOL, atol=ATOL
        )
