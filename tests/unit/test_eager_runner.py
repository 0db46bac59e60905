"""The sequential runner's eager client path, ``runner: auto`` and the vectorized cohort rows.

* The eager twin of a client function (``fn.eager``: slot-swap forward, ``torch.autograd.grad``,
  the same arithmetic) gives the functional (torch.func) message bit for bit in float64, for the
  digits models, FedProx's proximal term, delta units, Θ weights and masked steps; models with
  tied weights and buffers too; a parametrized model keeps the functional path.
* The sequential runner calls the eager twin.
* ``runner: auto`` resolves by a fixed rule and every round record says which runner ran
  (``runner_vectorized``), which also reaches MLflow as a per-round metric.
* A cohort's batch rows drawn in one vectorized pass are each client's own rows.
No timings here: speed is measured by ``benchmarks/engine_throughput.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils import parametrize

from fedtune.trainers import Trainer, build_task
from fedtune.trainers import runners as runners_mod
from fedtune.trainers.client import ClientRule, make_client_fn, make_masked_client_fn
from fedtune.trainers.engine import RUNNER_METRIC
from fedtune.trainers.module_loss import ModuleLoss
from fedtune.trainers.runners import SequentialRunner, VectorizedRunner, choose_runner
from fedtune.trainers.sampling import batch_indices, cohort_batch_indices
from fedtune.trainers.steps import pad_steps, padded_batches, step_mask, theta_rows
from fedtune.trainers.tasks.losses import cross_entropy

RULES = {
    "fedavg": ClientRule(theta=torch.ones(3)),
    "fedprox": ClientRule(theta=torch.ones(3), prox_alpha=0.3),
    "delta_last": ClientRule(theta=torch.tensor([0.0, 0.0, 1.0]), units="delta", preset="last"),
    "weighted": ClientRule(theta=torch.tensor([0.5, 0.0, 2.0])),
}


def _digits(model: str):
    task = build_task("digits", {"clients": 10, "model": model}, seed=0)
    net = task.model_fn(torch.Generator().manual_seed(0)).to(torch.float64)
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    data = task.train
    rows = torch.randint(0, len(data.inputs), (4, 3, 5), generator=torch.Generator().manual_seed(1))
    xb = data.inputs.to(torch.float64)[rows]
    return ModuleLoss(net, task.loss_fn), params, xb, data.targets[rows]


def _assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("model", ["linear", "mlp", "cnn"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_eager_client_is_the_functional_client_bit_for_bit(model, rule):
    loss, params, xb, yb = _digits(model)
    fn = make_client_fn(loss, RULES[rule])
    lr = torch.tensor(0.07, dtype=torch.float64)
    for i in range(xb.shape[0]):
        _assert_same(fn.eager(params, lr, xb[i], yb[i]), fn(params, lr, xb[i], yb[i]))


@pytest.mark.parametrize("model", ["linear", "cnn"])
def test_eager_masked_client_is_the_functional_one(model):
    loss, params, xb, yb = _digits(model)
    rule = ClientRule(theta=torch.ones(3), prox_alpha=0.1)
    fn = make_masked_client_fn(loss, rule)
    steps = torch.tensor([3, 1, 2, 3])
    theta = theta_rows("sum", steps, 3, torch.float64)
    mask = step_mask(steps, 3)
    lr = torch.tensor(0.05, dtype=torch.float64)
    for i in range(4):
        args = (params, lr, xb[i], yb[i], theta[i], mask[i])
        _assert_same(fn.eager(*args), fn(*args))


def test_sequential_runner_runs_the_eager_twin():
    loss, params, xb, yb = _digits("linear")
    fn = make_client_fn(loss, RULES["fedavg"])
    calls = []
    eager = fn.eager

    def spy(*args):
        calls.append(1)
        return eager(*args)

    fn.eager = spy
    lr = torch.tensor(0.05, dtype=torch.float64)
    seq = SequentialRunner().map(fn, (params, lr), (xb, yb))
    assert len(calls) == xb.shape[0]
    vec = VectorizedRunner().map(fn, (params, lr), (xb, yb))
    for k in vec:
        assert torch.equal(vec[k], seq[k]), k


def test_sequential_runner_passes_any_tree_of_client_arguments():
    """The per-client slicing and the stacking: a tuple of tensors or a nested tree of
    arguments, a dict or a tuple of outputs: each client gets row i of every leaf, the outputs
    stack."""
    a, b = torch.arange(12.0).view(3, 4), torch.arange(6.0).view(3, 2)

    def fn(scale, u, tree):
        return {"s": scale * u, "t": tree["b"] + tree["c"][0]}, (u.sum(), tree["b"])

    out = SequentialRunner().map(fn, (2.0,), (a, {"b": b, "c": [b * 10]}))
    assert torch.equal(out[0]["s"], 2.0 * a) and torch.equal(out[0]["t"], b * 11)
    assert torch.equal(out[1][0], a.sum(1)) and torch.equal(out[1][1], b)
    flat = SequentialRunner().map(lambda u, v: {"p": u * v, "q": v}, (), (a, a + 1))
    assert list(flat) == ["p", "q"] and torch.equal(flat["p"], a * (a + 1))


class _Tied(nn.Module):
    """Tied weights (one parameter in two slots) and a buffer read in the forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(6, 6)
        self.dec = nn.Linear(6, 6)
        self.dec.weight = self.enc.weight
        self.head = nn.Linear(6, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 6, dtype=torch.float64))

    def forward(self, x):
        return self.head(torch.tanh(self.dec(torch.tanh(self.enc(x)) * self.scale)))


def test_tied_weights_and_buffers():
    torch.manual_seed(0)
    net = _Tied().to(torch.float64)
    loss = ModuleLoss(net, cross_entropy)
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    assert "dec.weight" not in params  # the tied slot is filled from enc.weight
    own = {n: p for n, p in net.named_parameters()}
    xb = torch.randn(3, 4, 6, dtype=torch.float64)
    yb = torch.randint(0, 3, (3, 4))
    fn = make_client_fn(loss, ClientRule(theta=torch.ones(3), prox_alpha=0.2))
    lr = torch.tensor(0.1, dtype=torch.float64)
    _assert_same(fn.eager(params, lr, xb, yb), fn(params, lr, xb, yb))
    # the module's own parameters are back in their slots, still tied
    assert all(p is own[n] for n, p in net.named_parameters())
    assert net.dec.weight is net.enc.weight and isinstance(net.dec.weight, nn.Parameter)


def test_parametrized_model_keeps_the_functional_path():
    net = nn.Sequential(nn.Linear(4, 3)).to(torch.float64)
    parametrize.register_parametrization(net[0], "weight", _Symmetric())
    loss = ModuleLoss(net, cross_entropy)
    assert not loss.eager
    fn = make_client_fn(loss, RULES["fedavg"])
    assert not hasattr(fn, "eager")


class _Symmetric(nn.Module):
    def forward(self, w):
        return w


def test_second_order_has_no_eager_twin():
    loss, *_ = _digits("linear")
    fn = make_client_fn(loss, ClientRule(theta=torch.ones(2), second_order=True))
    assert not hasattr(fn, "eager")


# -- runner: auto and the round record ---------------------------------------------------------
def test_choose_runner_rule():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    big = runners_mod.AUTO_SEQUENTIAL_MIN_PARAMS
    assert choose_runner("sequential", 10, cpu, 10, 10) == "sequential"
    assert choose_runner("vectorized", big, cpu, 10, 10) == "vectorized"
    assert choose_runner("auto", 650, cpu, 10, 10) == "vectorized"
    assert choose_runner("auto", big, cpu, 10, 10) == "sequential"
    assert choose_runner("auto", big, cuda, 10, 10) == "vectorized"
    assert choose_runner("auto", 650, cpu, 1, 10) == "sequential"


def _config(runner: str) -> dict:
    return {
        "task": {"name": "digits", "clients": 10, "model": "linear", "seed": 0},
        "algorithm": "fedavg",
        "train": {
            "rounds": 2,
            "clients_per_round": 3,
            "local_steps": 2,
            "runner": runner,
            "dtype": "float64",
            "eval_population": "off",
        },
        "hparams": {"client_lr": 0.05, "server_lr": 0.5},
    }


@pytest.mark.parametrize(
    ("runner", "threshold", "ran", "flag"),
    [
        ("vectorized", None, "vectorized", 1.0),
        ("sequential", None, "sequential", 0.0),
        ("auto", None, "vectorized", 1.0),
        ("auto", 100, "sequential", 0.0),  # the linear model's 650 parameters count as large
    ],
)
def test_round_records_say_which_runner_ran(monkeypatch, runner, threshold, ran, flag):
    if threshold is not None:
        monkeypatch.setattr(runners_mod, "AUTO_SEQUENTIAL_MIN_PARAMS", threshold)
    trainer = Trainer(_config(runner))
    assert trainer.runner_kind == ran
    records = [trainer.step(), trainer.step()]
    assert [r.extra[RUNNER_METRIC] for r in records] == [flag, flag]
    assert trainer.result().runner == ran


def test_runner_metric_reaches_mlflow_rows():
    pytest.importorskip("mlflow")
    from fedtune.tuning.mlflow.tracking import round_metrics

    trainer = Trainer(_config("sequential"))
    metrics = round_metrics([trainer.step().as_dict()], 0)
    assert [m.value for m in metrics if m.key == RUNNER_METRIC] == [0.0]


def test_auto_and_sequential_give_the_vectorized_numbers_in_float64():
    vec, seq = Trainer(_config("vectorized")), Trainer(_config("sequential"))
    for _ in range(2):
        a, b = vec.step(), seq.step()
        assert a.client_loss == b.client_loss and a.update_norm == b.update_norm
    for k in vec.state.params:
        assert torch.equal(vec.state.params[k], seq.state.params[k])


# -- cohort rows in one pass -------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["with_replacement", "shuffle", "full"])
def test_cohort_rows_are_each_clients_own(mode):
    clients = torch.tensor([2, 7, 11, 40])
    offsets = torch.tensor([0, 30, 50, 90])
    counts = torch.tensor([30, 20, 40, 5]) if mode != "full" else torch.full((4,), 6)
    rows = cohort_batch_indices(5, 3, clients, offsets, counts, 4, 6, mode)
    assert rows.shape == (4, 4, 6)
    for i in range(4):
        own = batch_indices(5, 3, int(clients[i]), int(offsets[i]), int(counts[i]), 4, 6, mode)
        assert torch.equal(rows[i], own)
        assert bool(((rows[i] >= offsets[i]) & (rows[i] < offsets[i] + counts[i])).all())


def test_with_replacement_draws_cover_the_client_uniformly():
    rows = batch_indices(0, 0, 3, 0, 10, 500, 40, "with_replacement").flatten()
    freq = torch.bincount(rows, minlength=10).to(torch.float64) / rows.numel()
    assert float((freq - 0.1).abs().max()) < 0.01
    assert not torch.equal(
        rows, batch_indices(0, 1, 3, 0, 10, 500, 40, "with_replacement").flatten()
    )
    assert not torch.equal(
        rows, batch_indices(1, 0, 3, 0, 10, 500, 40, "with_replacement").flatten()
    )
    assert not torch.equal(
        rows, batch_indices(0, 0, 4, 0, 10, 500, 40, "with_replacement").flatten()
    )


@pytest.mark.parametrize("mode", ["with_replacement", "shuffle"])
def test_padded_rows_in_one_pass_match_the_per_client_padding(mode):
    clients = torch.tensor([1, 4, 9])
    offsets, counts = torch.tensor([0, 13, 53]), torch.tensor([13, 40, 3])
    steps = torch.tensor([2, 5, 1])
    rows = padded_batches(7, 2, clients, offsets, counts, steps, 1, 4, mode)
    for i in range(3):
        own = batch_indices(
            7, 2, int(clients[i]), int(offsets[i]), int(counts[i]), int(steps[i]) + 1, 4, mode
        )
        assert torch.equal(rows[i], pad_steps(own, int(steps[i]), 5))


@pytest.mark.parametrize("model", ["linear", "mlp", "cnn"])
def test_eager_evaluation_is_the_functional_one(model):
    loss, params, xb, yb = _digits(model)
    x, y = xb.flatten(0, 2), yb.flatten(0, 2)
    with torch.no_grad():
        reference = cross_entropy(functional_call(loss.module, params, (x,)), y)
        assert torch.equal(loss.evaluate(params, x, y), reference)
        assert torch.equal(loss.per_example(params, x, y), reference)


def _tied_loss():
    torch.manual_seed(0)
    net = _Tied().to(torch.float64)
    params = {n: p.detach().clone() + 0.01 for n, p in net.named_parameters()}
    xb = torch.randn(4, 5, 6, dtype=torch.float64)
    return ModuleLoss(net, cross_entropy), params, xb, torch.randint(0, 3, (4, 5))


@pytest.mark.parametrize("model", ["linear", "mlp", "cnn", "tied"])
def test_slot_swap_under_torch_func_is_functional_call_bit_for_bit(model):
    """The loss the client functions differentiate swaps the parameters into the module's slots
    (no ``functional_call``): under vmap and grad it gives functional_call's gradients bit for
    bit, tied weights and buffers included, and leaves the module's own parameters in place."""
    loss, params, xb, yb = _tied_loss() if model == "tied" else _digits(model)
    own = dict(loss.module.named_parameters())

    def reference(p, x, y):
        return loss.loss_fn(functional_call(loss.module, p, (x,)), y).mean()

    batched = (params, xb, yb) if model == "tied" else (params, xb[:, 0], yb[:, 0])
    ours = vmap(grad(loss), in_dims=(None, 0, 0))(*batched)
    _assert_same(ours, vmap(grad(reference), in_dims=(None, 0, 0))(*batched))
    assert all(p is own[n] for n, p in loss.module.named_parameters())


def test_a_partial_parameter_dict_goes_through_functional_call():
    loss, params, xb, _ = _digits("mlp")
    partial = {k: v + 1 for k, v in list(params.items())[:2]}  # the rest: the module's own
    x = xb.flatten(0, 2)
    with torch.no_grad():
        assert torch.equal(loss.forward(partial, x), functional_call(loss.module, partial, (x,)))
        assert not torch.equal(loss.forward(partial, x), loss.forward(params, x))


def test_first_message_is_zero_plus_theta_g_to_the_sign_of_zero():
    """The message starts as 0 + θ_1·g_1, as an accumulator from zero: a gradient entry of −0
    gives +0 (written θ·g + 0, which rounds the same)."""

    def loss_of(p, x, y):
        return (p["w"] * x).sum() + 0 * y.sum()  # ∇_w = x, its −0 entries included

    x = torch.tensor([[[-0.0, 1.5, -0.0]], [[2.0, -0.0, 0.0]]], dtype=torch.float64)
    y = torch.zeros(2, 1, 3)
    params = {"w": torch.ones(3, dtype=torch.float64)}
    lr = torch.tensor(0.1, dtype=torch.float64)
    for theta in ([1.0], [0.5], [0.0, 1.0]):
        rule = ClientRule(theta=torch.tensor(theta, dtype=torch.float64))
        fn = make_client_fn(loss_of, rule)
        xs = x.expand(2, len(theta), 3) if len(theta) > 1 else x
        ys = y.expand(2, len(theta), 3)
        msg = vmap(fn, in_dims=(None, None, 0, 0))(params, lr, xs, ys)["w"]
        expected = torch.zeros(2, 3, dtype=torch.float64) + theta[-1] * x[:, 0]
        assert torch.equal(msg, expected)
        assert torch.equal(torch.signbit(msg), torch.signbit(expected)), theta
        assert not torch.signbit(msg).any()  # the −0 of g is +0 in the message
