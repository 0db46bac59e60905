"""A user's algorithm packs when its recipe says so (issue 41, item 1): ``packable`` and
``member_hparams`` are declared by the recipe, an aggregator packs through its form over stacked
members (``packed_aggregator``), and a packed user algorithm gives each member the curve of its
unpacked run (≤ 1e-12 relative in float64), as the built-ins do."""

from __future__ import annotations

import pytest
import torch

from fedtune.errors import CodeError
from fedtune.extend import HParam, members_weighted_mean, register_algorithm, weighted_mean
from fedtune.trainers import get_recipe
from fedtune.trainers.algorithms.recipe import MEMBER_HPARAMS
from fedtune.trainers.packed import pack_key, pack_refusal
from tests.unit.test_packed_exactness import assert_pack_matches, unpacked, variants


def work_weighted(messages, weights, steps, client_lr):
    """q = Σ_i w_i τ_i q_i / Σ_i w_i τ_i: clients that ran more steps weigh more."""
    scaled = weights * steps.to(weights.dtype)
    total = scaled.sum()
    return weighted_mean(messages, scaled / total), {"work": float(total * client_lr)}


def work_weighted_packed(messages, weights, steps, client_lr):
    """:func:`work_weighted` of every member: ``messages [P, M, …]``, ``steps [P, M]``."""
    scaled = weights.unsqueeze(0) * steps.to(weights.dtype)  # [P, M]
    total = scaled.sum(1, keepdim=True)
    q = members_weighted_mean(messages, scaled / total)
    return q, {"work": total.squeeze(1) * client_lr}


def mixed(messages, weights, steps, client_lr, mix):
    """q = mix · work-weighted + (1 − mix) · weighted mean: an aggregator with its own
    hyperparameter, ``mix``, read through ``aggregator_hparams``."""
    work, diag = work_weighted(messages, weights, steps, client_lr)
    mean = weighted_mean(messages, weights)
    return {k: mix * work[k] + (1 - mix) * mean[k] for k in mean}, {**diag, "mix": float(mix)}


def mixed_packed(messages, weights, steps, client_lr, mix):
    """:func:`mixed` of every member; ``mix`` is each member's value, ``[P]`` float64."""
    assert mix.dtype == torch.float64 and mix.shape == client_lr.shape
    work, diag = work_weighted_packed(messages, weights, steps, client_lr)
    m = members_weighted_mean(messages, weights)
    q = {
        k: mix.to(v.dtype).view(-1, *([1] * (v.dim() - 1))) * work[k]
        + (1 - mix.to(v.dtype)).view(-1, *([1] * (v.dim() - 1))) * m[k]
        for k, v in m.items()
    }
    return q, {**diag, "mix": mix}


@pytest.fixture(scope="module")
def user_algorithms() -> dict[str, str]:
    names = {
        "packed": "ft_pack_work_weighted",
        "unpackable": "ft_pack_work_weighted_alone",
        "declined": "ft_pack_declined",
        "narrow": "ft_pack_narrow",
        "mixed": "ft_pack_mixed",
    }
    params = ("client_lr", "server_lr", "server_momentum")
    register_algorithm(
        names["packed"],
        summary="work-weighted averaging, packed",
        params=params,
        aggregator=work_weighted,
        packed_aggregator=work_weighted_packed,
    )
    register_algorithm(
        names["unpackable"], summary="no packed form", params=params, aggregator=work_weighted
    )
    register_algorithm(names["declined"], summary="never packed", params=params, packable=False)
    register_algorithm(
        names["narrow"],
        summary="members share β",
        params=params,
        member_hparams=("client_lr", "server_lr"),
    )
    register_algorithm(
        names["mixed"],
        summary="an aggregator with its own hyperparameter",
        params=(*params, "mix"),
        hparams=(HParam("mix", float, 0.5, bounds=(0.0, 1.0)),),
        aggregator=mixed,
        packed_aggregator=mixed_packed,
        aggregator_hparams=("mix",),
    )
    return names


@pytest.mark.parametrize("epochs", [False, True])
def test_a_user_aggregator_packs_exactly_through_its_packed_form(user_algorithms, epochs):
    """Members of different γ, η, β, K (or local epochs, so τ_i differ by client) and decay:
    every round's metrics, the aggregator's diagnostic included, equal the unpacked runs."""
    name = user_algorithms["packed"]
    assert get_recipe(name).packable and pack_refusal(variants(name)[0]) is None
    pack = assert_pack_matches(variants(name, epochs=epochs))
    assert all("work" in r.extra for r in pack.result(0).records)


@pytest.mark.parametrize("epochs", [False, True])
def test_an_aggregator_reads_its_own_hyperparameters_packed_or_not(user_algorithms, epochs):
    """``aggregator_hparams``: the unpacked aggregator gets ``mix`` as a number, the packed one
    every member's as a float64 ``[P]`` tensor; ``mix`` is not a member hyperparameter, so it
    is part of the pack key, and the pack's members equal their unpacked runs."""
    name = user_algorithms["mixed"]
    configs = variants(name, epochs=epochs)
    for cfg in configs:
        cfg["hparams"]["mix"] = 0.3
    assert len({pack_key(c) for c in configs}) == 1
    other = variants(name)[0]
    other["hparams"]["mix"] = 0.6
    assert pack_key(other) != pack_key(configs[0])
    pack = assert_pack_matches(configs)
    assert all(r.extra["mix"] == pytest.approx(0.3) for r in pack.result(2).records)
    mix_free = variants(name)[0]  # the declared default reaches the aggregator too
    assert unpacked(mix_free).records[0].extra["mix"] == 0.5


def test_a_pack_of_a_user_aggregator_runs_in_chunks_and_at_several_rounds(user_algorithms):
    name = user_algorithms["packed"]
    assert_pack_matches(variants(name), chunk=1)


def test_what_a_recipe_declares_decides_whether_and_with_whom_it_packs(user_algorithms):
    alone = pack_refusal(variants(user_algorithms["unpackable"])[0])
    assert alone is not None and "packed_aggregator" in alone
    declined = pack_refusal(variants(user_algorithms["declined"])[0])
    assert declined is not None and "packable=False" in declined
    assert get_recipe("fedavgm").member_hparams == tuple(
        n for n in MEMBER_HPARAMS if n in get_recipe("fedavgm").declared
    )
    narrow = user_algorithms["narrow"]
    a, b, c = variants(narrow)[:3]
    assert get_recipe(narrow).member_hparams == ("client_lr", "server_lr")
    assert pack_key(a) != pack_key(b)  # β differs: members share it
    c["hparams"]["server_momentum"] = a["hparams"]["server_momentum"]
    assert pack_key(a) == pack_key(c)  # γ, η differ only


def test_a_recipe_cannot_declare_what_a_pack_cannot_hold():
    with pytest.raises(CodeError) as err:
        register_algorithm("ft_pack_bad_member", member_hparams=("batch_size",))
    assert err.value.field == "algorithm.member_hparams" and "batch_size" in err.value.reason
    with pytest.raises(CodeError) as err:
        register_algorithm("ft_pack_bad_build", build=lambda *a: None, packable=True)
    assert err.value.field == "algorithm.packable" and "LocalUpdate" in err.value.reason
    with pytest.raises(CodeError) as err:
        register_algorithm(
            "ft_pack_bad_part", aggregator=work_weighted, packed_aggregator="work_weighted"
        )
    assert err.value.field == "algorithm.packed_aggregator"
    for bad, why in [
        ({"aggregator_hparams": ("prox_alpha",)}, "no aggregator"),
        ({"aggregator": mixed, "aggregator_hparams": ("mix",)}, "'mix' must be a declared"),
        (
            {
                "aggregator": mixed,
                "aggregator_hparams": ("mode",),
                "hparams": (HParam("mode", str, "a", choices=("a", "b")),),
            },
            "float, int or bool",
        ),
    ]:
        with pytest.raises(CodeError) as err:
            register_algorithm("ft_pack_bad_reads", **bad)
        assert err.value.field == "algorithm.aggregator_hparams" and why in err.value.reason


def test_the_packed_form_is_checked_against_the_unpacked_aggregator():
    """The two forms of the test's aggregator agree member by member (the contract the
    extension guide asks of a user's ``packed_aggregator``)."""
    gen = torch.Generator().manual_seed(0)
    messages = {"w": torch.randn(3, 4, 2, 5, generator=gen, dtype=torch.float64)}
    weights = torch.rand(4, generator=gen, dtype=torch.float64)
    steps = torch.randint(1, 5, (3, 4), generator=gen)
    lr = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    q, diag = work_weighted_packed(messages, weights, steps, lr)
    for p in range(3):
        one, d = work_weighted({"w": messages["w"][p]}, weights, steps[p], float(lr[p]))
        assert torch.allclose(q["w"][p], one["w"], rtol=1e-14, atol=0)
        assert float(diag["work"][p]) == pytest.approx(d["work"], rel=1e-14)
