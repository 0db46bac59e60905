"""The papers' models (docs/explanation/algorithms.md §7.2): shapes, parameter counts, purity under
torch.func."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedtune.trainers.models import build_model, model_names

_G = torch.Generator().manual_seed(0)  # test inputs are fixed, not drawn from the global RNG


def _rand(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_G)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=_G)


def _ints(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_G)


def _conv(k: int, cin: int, cout: int, bias: bool = True) -> int:
    return k * k * cin * cout + (cout if bias else 0)


def _dense(i: int, o: int) -> int:
    return i * o + o


def _lstm(i: int, h: int) -> int:
    return 4 * h * (i + h) + 4 * h  # one bias per layer, as Keras


def _resnet18_gn(channels: int, classes: int) -> int:
    gn = lambda c: 2 * c  # noqa: E731  (GroupNorm affine weight + bias)
    total = _conv(3, channels, 64, False) + gn(64)
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            c_in = cin if block == 0 else cout
            total += _conv(3, c_in, cout, False) + gn(cout) + _conv(3, cout, cout, False) + gn(cout)
            if block == 0 and stage > 0:
                total += _conv(1, c_in, cout, False) + gn(cout)
        cin = cout
    return total + _dense(512, classes)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _build(name: str, shape: tuple[int, ...], outputs: int, seed: int = 0) -> nn.Module:
    return build_model(name, shape, outputs, torch.Generator().manual_seed(seed))


EXPECTED = {
    # name: (input_shape, outputs, count from the architecture, documented count)
    "femnist_cnn": (
        (1, 28, 28),
        62,
        _conv(5, 1, 32) + _conv(5, 32, 64) + _dense(7 * 7 * 64, 512) + _dense(512, 62),
        1_690_046,
    ),
    "femnist_cnn_small": (
        (1, 28, 28),
        62,
        _conv(3, 1, 32) + _conv(3, 32, 64) + _dense(12 * 12 * 64, 128) + _dense(128, 62),
        1_206_590,
    ),
    "char_lstm": (
        (80,),
        90,
        90 * 8 + _lstm(8, 256) + _lstm(256, 256) + _dense(256, 90),
        820_522,
    ),
    "resnet18_gn": ((3, 24, 24), 100, _resnet18_gn(3, 100), 11_220_132),
    "bow_logistic": ((10_000,), 500, _dense(10_000, 500), 5_000_500),
    "word_lstm": (
        (20,),
        10_004,
        10_004 * 96 + _lstm(96, 670) + _dense(670, 96) + _dense(96, 10_004),
        4_050_748,
    ),
}


def test_all_paper_models_registered():
    assert set(EXPECTED) <= set(model_names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parameter_counts(name):
    shape, outputs, from_architecture, documented = EXPECTED[name]
    model = _build(name, shape, outputs)
    assert _count(model) == from_architecture == documented


def test_femnist_cnn_matches_mcmahan_count_for_ten_classes():
    # McMahan et al. 2017 report 1,663,370 parameters for the 10-class MNIST version
    assert _count(_build("femnist_cnn", (1, 28, 28), 10)) == 1_663_370


def test_lstm_matches_the_reference_recurrence():
    """Our vmap-able LSTM equals torch.nn.LSTM given the same weights (gate order i, f, g, o)."""
    from fedtune.trainers.models.paper import LSTM

    ours, ref = LSTM(5, 7), nn.LSTM(5, 7, batch_first=True)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(ours.weight_x.T)
        ref.weight_hh_l0.copy_(ours.weight_h.T)
        ref.bias_ih_l0.copy_(ours.bias)
        ref.bias_hh_l0.zero_()
    x = _randn(3, 6, 5)
    torch.testing.assert_close(ours(x), ref(x)[0])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_batchnorm_or_dropout(name):
    shape, outputs, _, _ = EXPECTED[name]
    kinds = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    assert not any(isinstance(m, kinds) for m in _build(name, shape, outputs).modules())


def test_resnet_uses_groupnorm():
    model = _build("resnet18_gn", (3, 32, 32), 100)
    assert sum(isinstance(m, nn.GroupNorm) for m in model.modules()) == 1 + 8 * 2 + 3


@pytest.mark.parametrize(
    ("name", "shape", "outputs", "batch", "expected"),
    [
        ("femnist_cnn", (1, 28, 28), 62, _rand(3, 1, 28, 28), (3, 62)),
        ("femnist_cnn", (1, 28, 28), 62, _rand(3, 784), (3, 62)),
        ("femnist_cnn_small", (1, 28, 28), 62, _rand(3, 1, 28, 28), (3, 62)),
        ("char_lstm", (80,), 90, _ints(90, 3, 80), (3, 80, 90)),
        ("resnet18_gn", (3, 24, 24), 100, _randn(2, 3, 24, 24), (2, 100)),
        ("resnet18_gn", (3, 32, 32), 100, _randn(2, 3, 32, 32), (2, 100)),
        ("bow_logistic", (10_000,), 500, _rand(3, 10_000), (3, 500)),
        ("word_lstm", (20,), 10_004, _ints(10_004, 2, 20), (2, 20, 10_004)),
    ],
)
def test_output_shapes(name, shape, outputs, batch, expected):
    out = _build(name, shape, outputs)(batch)
    assert out.shape == expected
    assert torch.isfinite(out).all()


def test_sizes_follow_input_shape_and_outputs():
    assert _build("char_lstm", (40,), 30)(_ints(30, 2, 40)).shape == (2, 40, 30)
    assert _build("bow_logistic", (50,), 7)(_rand(2, 50)).shape == (2, 7)
    assert _build("femnist_cnn_small", (1, 20, 20), 10)(_rand(2, 1, 20, 20)).shape == (2, 10)


def test_build_is_deterministic_in_the_generator():
    a = _build("femnist_cnn", (1, 28, 28), 62, seed=3).state_dict()
    b = _build("femnist_cnn", (1, 28, 28), 62, seed=3).state_dict()
    c = _build("femnist_cnn", (1, 28, 28), 62, seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def _two_clients(model: nn.Module) -> dict[str, torch.Tensor]:
    p0 = {k: v.detach() for k, v in model.named_parameters()}
    p1 = {k: v + 0.01 * torch.randn(v.shape, generator=_G) for k, v in p0.items()}
    return {k: torch.stack([p0[k], p1[k]]) for k in p0}


@pytest.mark.parametrize(
    ("name", "shape", "outputs", "inputs"),
    [
        ("femnist_cnn", (1, 28, 28), 62, _rand(2, 3, 1, 28, 28)),
        ("femnist_cnn_small", (1, 28, 28), 62, _rand(2, 3, 1, 28, 28)),
        ("resnet18_gn", (3, 24, 24), 100, _randn(2, 2, 3, 24, 24)),
        ("bow_logistic", (100,), 5, _rand(2, 3, 100)),
        ("char_lstm", (12,), 90, _ints(90, 2, 3, 12)),
    ],
)
def test_vmap_over_two_clients_equals_each_client(name, shape, outputs, inputs):
    model = _build(name, shape, outputs)
    stacked = _two_clients(model)

    def forward(params, x):
        return functional_call(model, params, (x,))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no slow-path fallbacks either
        batched = vmap(forward)(stacked, inputs)
    for i in range(2):
        single = forward({k: v[i] for k, v in stacked.items()}, inputs[i])
        torch.testing.assert_close(batched[i], single, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(batched[0], batched[1])


@pytest.mark.parametrize(
    ("name", "shape", "outputs", "x", "y"),
    [
        ("femnist_cnn", (1, 28, 28), 62, _rand(2, 4, 1, 28, 28), _ints(62, 2, 4)),
        (
            "char_lstm",
            (10,),
            90,
            _ints(90, 2, 3, 10),
            _ints(90, 2, 3, 10),
        ),
    ],
)
def test_vmap_grad_per_client(name, shape, outputs, x, y):
    model = _build(name, shape, outputs)
    stacked = _two_clients(model)

    def loss(params, xb, yb):
        logits = functional_call(model, params, (xb,))
        return nn.functional.cross_entropy(logits.reshape(-1, outputs), yb.reshape(-1))

    grads = vmap(grad(loss))(stacked, x, y)
    for i in range(2):
        single = grad(loss)({k: v[i] for k, v in stacked.items()}, x[i], y[i])
        for k in single:
            # float32 reductions in another order: errors scale with the gradient's magnitude
            atol = 1e-5 * float(single[k].abs().max())
            torch.testing.assert_close(grads[k][i], single[k], rtol=1e-4, atol=atol)
