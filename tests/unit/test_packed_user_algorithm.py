"""A user's algorithm packs when its recipe says so (issue 41, item 1; issue 61, item 1):
``packable`` and ``member_hparams`` are declared by the recipe, an aggregator packs through its
form over stacked members (``packed_aggregator``), a user's own hyperparameter read by it may
differ between members, a user ``build`` packs when it declares ``packable=True`` and returns the
round a pack runs, and a packed user algorithm gives each member the curve of its unpacked run
(≤ 1e-12 relative in float64), as the built-ins do."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from fedtune.errors import CodeError
from fedtune.extend import (
    ClientRule,
    HParam,
    LocalUpdate,
    make_server_opt,
    members_weighted_mean,
    register_algorithm,
    weighted_mean,
)
from fedtune.trainers import get_recipe
from fedtune.trainers.algorithms.recipe import MEMBER_HPARAMS
from fedtune.trainers.packed import PackedTrainer, pack_key, pack_refusal
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


def build_mixed(recipe, hp, local_steps, task):
    """A user's own round: the plain LocalUpdate (Θ_1:K, α, the server optimizer ``hp``
    names) whose aggregator is :func:`mixed` with this configuration's ``mix``."""
    rule = ClientRule(theta=torch.ones(local_steps, dtype=torch.float64), prox_alpha=hp.prox_alpha)
    return LocalUpdate(recipe.name, rule, make_server_opt(hp), functools.partial(mixed, mix=hp.mix))


def build_unpackable(recipe, hp, local_steps, task):
    """A user's own round with its own aggregator: declared packable without its packed form."""
    rule = ClientRule(theta=torch.ones(local_steps, dtype=torch.float64))
    return LocalUpdate(recipe.name, rule, make_server_opt(hp), work_weighted)


MIX = HParam("mix", float, 0.5, bounds=(0.0, 1.0))


@pytest.fixture(scope="module")
def user_algorithms() -> dict[str, str]:
    names = {
        "packed": "ft_pack_work_weighted",
        "unpackable": "ft_pack_work_weighted_alone",
        "declined": "ft_pack_declined",
        "narrow": "ft_pack_narrow",
        "mixed": "ft_pack_mixed",
        "per_member": "ft_pack_mix_per_member",
        "built": "ft_pack_built",
        "not_a_round": "ft_pack_not_a_round",
        "no_packed_form": "ft_pack_no_packed_form",
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
    register_algorithm(
        names["per_member"],
        summary="an aggregator whose own hyperparameter differs within a pack",
        params=(*params, "mix"),
        hparams=(MIX,),
        aggregator=mixed,
        packed_aggregator=mixed_packed,
        aggregator_hparams=("mix",),
        member_hparams=(*MEMBER_HPARAMS, "mix"),
    )
    register_algorithm(
        names["built"],
        summary="a build of its own, packed",
        params=(*params, "mix"),
        hparams=(MIX,),
        build=build_mixed,
        packable=True,
        packed_aggregator=mixed_packed,
        aggregator_hparams=("mix",),
        member_hparams=("client_lr", "server_lr", "server_momentum", "mix"),
    )
    register_algorithm(names["not_a_round"], params=params, build=lambda *a: None, packable=True)
    register_algorithm(
        names["no_packed_form"], params=params, build=build_unpackable, packable=True
    )
    return names


def mixes(name: str, epochs: bool = False) -> list[dict]:
    """:func:`variants` whose members differ in ``mix`` too."""
    configs = variants(name, epochs=epochs)
    for cfg, mix in zip(configs, (0.1, 0.4, 0.7, 1.0), strict=True):
        cfg["hparams"]["mix"] = mix
    return configs


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


@pytest.mark.parametrize("epochs", [False, True])
@pytest.mark.parametrize("kind", ["per_member", "built"])
def test_a_user_hyperparameter_differs_between_members_exactly(user_algorithms, kind, epochs):
    """``mix``, the user's own HParam, named in ``member_hparams``: members of different ``mix``
    (and γ, η, β, K or local epochs, decay) share one pack, whose aggregator receives every
    member's ``mix`` as a ``[P]`` tensor, and each member's curve equals its unpacked run; the
    same through the user's own ``build`` declared ``packable=True``."""
    name = user_algorithms[kind]
    recipe = get_recipe(name)
    assert recipe.packable and "mix" in recipe.member_hparams
    assert recipe.round_form == ("own" if kind == "built" else "local_update")
    configs = mixes(name, epochs=epochs)
    assert all(pack_refusal(c) is None for c in configs)
    assert len({pack_key(c) for c in configs}) == 1
    pack = assert_pack_matches(configs)
    for i, mix in enumerate((0.1, 0.4, 0.7, 1.0)):
        records = pack.result(i).records
        assert [r.extra["mix"] for r in records] == pytest.approx([mix] * len(records))


def test_a_user_build_declared_packable_must_return_the_round_a_pack_runs(user_algorithms):
    """``packable=True`` on a ``build`` is a promise the pack checks when the round is built:
    a LocalUpdate, whose own aggregator comes with ``packed_aggregator``."""
    for kind, why in [
        ("not_a_round", "not a LocalUpdate"),
        ("no_packed_form", "packed_aggregator"),
    ]:
        name = user_algorithms[kind]
        assert get_recipe(name).packable and pack_refusal(variants(name)[0]) is None
        with pytest.raises(CodeError) as err:
            PackedTrainer(variants(name)[:2])
        assert err.value.field == "algorithm.build" and why in err.value.reason


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
        register_algorithm("ft_pack_bad_agg", aggregator=work_weighted, packable=True)
    assert err.value.field == "algorithm.packable" and "packed_aggregator" in err.value.reason
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


def test_a_user_hyperparameter_differs_in_a_pack_only_where_the_pack_holds_it():
    """Where a name cannot differ within a pack, the error names ``algorithm.member_hparams``
    and says why: the engine holds γ, η, α, Θ, β, β₁, β₂, ε per member and a
    ``packed_aggregator`` its ``aggregator_hparams``; anything else is built into the round."""
    damping = HParam("damping", float, 0.5, bounds=(0.0, 1.0))
    for fields in [
        {"hparams": (damping,), "build": build_mixed, "packable": True},
        {"hparams": (MIX,), "aggregator": mixed, "aggregator_hparams": ("mix",)},
    ]:
        name = fields["hparams"][0].name
        with pytest.raises(CodeError) as err:
            register_algorithm("ft_pack_not_held", member_hparams=(name,), **fields)
        assert err.value.field == "algorithm.member_hparams"
        assert f"'{name}' cannot differ within a pack" in err.value.reason
        assert "once for the whole pack" in err.value.reason


def test_a_recipe_declares_its_round_form_and_packable_with_a_reason():
    """``round_form`` says what the round is and must fit ``build``; ``packable`` is True,
    False or the reason the refusal prints."""
    for fields, field, why in [
        ({"round_form": "loop"}, "algorithm.round_form", "must be one of"),
        ({"round_form": "own"}, "algorithm.build", "needs build"),
        ({"build": "build_mixed"}, "algorithm.build", "callable"),
        ({"packable": ""}, "algorithm.packable", "True, False or the reason"),
        ({"packable": 3}, "algorithm.packable", "True, False or the reason"),
    ]:
        with pytest.raises(CodeError) as err:
            register_algorithm("ft_pack_bad_declaration", **fields)
        assert err.value.field == field and why in err.value.reason, fields
    said = register_algorithm("ft_pack_said_no", packable="it is tuned one by one on purpose")
    assert said.packable is False and said.round_form == "local_update"
    assert said.pack_refusal == (
        "algorithm 'ft_pack_said_no' does not pack: it is tuned one by one on purpose; "
        "one configuration per process"
    )
    own = register_algorithm("ft_pack_own_silent", build=build_mixed, hparams=(MIX,))
    assert own.round_form == "own" and not own.packable
    assert "packable=True" in own.pack_refusal
    fednova = get_recipe("fednova")  # a copy keeps what the recipe said, its build included
    again = dataclasses.replace(fednova, name="ft_pack_fednova_again")
    assert (again.round_form, again.packable, again.member_hparams, again.build) == (
        "local_update",
        True,
        fednova.member_hparams,
        fednova.build,
    )
