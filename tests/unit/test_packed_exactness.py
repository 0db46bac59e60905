"""Packed trials (fedtune.trainers.packed): each member of a pack gives the curve of its own
unpacked run (≤ 1e-12 relative in float64), a divergent member is masked out without touching
the others, members stop individually and a pack takes new members."""

from __future__ import annotations

import math

import pytest

from fedtune.errors import ConfigError
from fedtune.trainers import Trainer, algorithms, get_recipe
from fedtune.trainers.engine import RUNNER_METRIC
from fedtune.trainers.packed import PackedTrainer, pack_key, pack_refusal
from fedtune.trainers.records import Outcome
from tests.conftest import quadratic_config

REL = 1e-12
PACKABLE = sorted(n for n in algorithms() if pack_refusal(quadratic_config(n)) is None)
DECAY = {
    "enabled": True,
    "window": 1,
    "patience": 1,
    "cooldown": 0,
    "threshold": 10.0,
    "client_decay": 0.5,
    "server_decay": 0.7,
}


def base(name: str, **overrides) -> dict:
    recipe = get_recipe(name)
    train = {"rounds": 6, "eval_every": 2, **overrides.pop("train", {})}
    cfg = quadratic_config(name, train=train, **overrides)
    if recipe.max_clients_per_round:
        cfg["train"]["clients_per_round"] = recipe.max_clients_per_round
    if recipe.fixed_local_steps is not None:
        cfg["train"]["local_steps"] = recipe.fixed_local_steps
    return cfg


def variants(name: str, epochs: bool = False) -> list[dict]:
    """Configurations of ``name`` differing in every searched scalar the recipe takes."""
    recipe = get_recipe(name)
    out = []
    for j, (gamma, eta, beta, k, decay) in enumerate(
        [
            (0.05, 0.05, 0.9, 3, {}),
            (0.02, 0.3, 0.5, 1, DECAY),
            (0.08, 0.1, 0.0, 4, {"enabled": False}),
            (0.03, 0.02, 0.99, 2, {**DECAY, "semantics": "reference"}),
        ]
    ):
        hp = {}
        if "client_lr" in recipe.params:
            hp["client_lr"] = gamma
        if "server_lr" in recipe.params:
            hp["server_lr"] = eta if recipe.units == "gradient" else 10 * eta
        if "server_momentum" in recipe.params:
            hp["server_momentum"] = beta
        if "server_beta1" in recipe.params:
            hp["server_beta1"] = 0.9 - 0.2 * j
            hp["server_beta2"] = 0.99 - 0.03 * j
            hp["server_eps"] = 10.0 ** (-3 - j)
        if "prox_alpha" in recipe.params:
            hp["prox_alpha"] = 0.1 * j
        cfg = base(name, hparams=hp, decay=decay, seed=7 + j)
        if epochs:
            cfg["task"] = {**cfg["task"], "examples": 2, "examples_max": 12}
            cfg["train"].pop("local_steps", None)
            cfg["train"]["local_epochs"] = (0.5, 1.0, 1.5, 0.25)[j]
        elif recipe.fixed_local_steps is None and "theta" not in recipe.params:
            cfg["train"]["local_steps"] = k
        out.append(cfg)
    return out


def unpacked(cfg: dict) -> Trainer:
    trainer = Trainer(cfg)
    while not trainer.done:
        trainer.step()
    return trainer


def run_pack(configs: list[dict], chunk: int | None = None) -> PackedTrainer:
    pack = PackedTrainer(configs, chunk=chunk)
    while not pack.done:
        pack.step()
    return pack


def close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if math.isinf(a) or math.isnan(a):
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= REL * max(abs(a), abs(b)) + 1e-300


def assert_same_curve(packed_records, records) -> None:
    assert len(packed_records) == len(records)
    for rp, ru in zip(packed_records, records, strict=True):
        p, u = rp.as_dict(), ru.as_dict()
        for key in ("wall_time", RUNNER_METRIC):
            p.pop(key, None)
            u.pop(key, None)
        assert p.keys() == u.keys(), (p.keys(), u.keys())
        for key in u:
            assert close(p[key], u[key]), (rp.round, key, p[key], u[key])


def assert_pack_matches(configs: list[dict], chunk: int | None = None) -> PackedTrainer:
    pack = run_pack(configs, chunk)
    for i, cfg in enumerate(configs):
        single = unpacked(cfg)
        result = pack.result(i)
        assert result.outcome == single.result().outcome
        assert result.decays == single.decay.decays
        assert_same_curve(result.records, single.records)
    return pack


def test_the_packable_algorithms():
    assert {
        "fedavg",
        "fedprox",
        "fedavgm",
        "fedadam",
        "fedyogi",
        "fedadagrad",
        "fomaml",
        "lookahead",
        "minibatch_sgd",
        "fedavg_vanilla",
        "fednova",
    } <= set(PACKABLE)


@pytest.mark.parametrize("name", sorted(algorithms()))
def test_every_algorithm_packs_or_refuses_in_one_line(name):
    reason = pack_refusal(
        quadratic_config(name) if not get_recipe(name).needs_central else base(name)
    )
    assert reason is None or (reason and "\n" not in reason)
    if reason is not None:
        with pytest.raises(ConfigError):
            PackedTrainer([base(name)])


@pytest.mark.parametrize("name", PACKABLE)
def test_each_member_equals_its_unpacked_run(name):
    pack = assert_pack_matches(variants(name))
    assert all(r.outcome == Outcome.COMPLETED for r in pack.results())


@pytest.mark.parametrize("server", ["sgd", "momentum", "nesterov", "adam", "yogi", "adagrad"])
def test_every_server_optimizer_packs_exactly(server):
    configs = variants("local_update")
    for j, cfg in enumerate(configs):
        cfg["hparams"].update(server_opt=server, theta=[1.0, 0.5, 0.0, 2.0][: 1 + j])
        if server == "nesterov" and j % 2:
            cfg["hparams"]["nesterov_form"] = "keras"
    if server == "nesterov":  # the form is part of the pack key: one of each pack
        assert_pack_matches(configs[0::2])
        for cfg in configs:
            cfg["hparams"]["nesterov_form"] = "theory"
    assert_pack_matches(configs)


def test_decay_applies_per_member():
    configs = variants("fedavgm")
    pack = assert_pack_matches(configs)
    assert pack.result(1).decays > 0 and pack.result(2).decays == 0


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedadam", "fomaml", "fednova"])
def test_local_epochs_over_unequal_clients(name):
    pack = assert_pack_matches(variants(name, epochs=True), chunk=3)
    steps = [r.extra for r in pack.result(1).records]
    assert any(e["steps_min"] < e["steps_max"] for e in steps), "the steps should differ"


def test_a_divergent_member_is_masked_out():
    configs = variants("fedavg")
    configs[1]["hparams"]["client_lr"] = 5.0
    configs[1]["hparams"]["server_lr"] = 5.0
    configs[1]["train"]["divergence_factor"] = 2.0
    pack = assert_pack_matches(configs)
    assert pack.result(1).outcome == Outcome.DIVERGED
    assert [pack.result(i).outcome for i in (0, 2, 3)] == [Outcome.COMPLETED] * 3


def test_stop_member_and_refill():
    configs = variants("fedavgm")
    pack = PackedTrainer(configs[:3])
    for _ in range(2):
        pack.step()
    pack.stop(1)
    assert pack.active == [0, 2]
    new = pack.add(configs[3])
    records = pack.step()
    assert records[1] is None and records[0] is not None and records[new] is not None
    while not pack.done:
        pack.step()
    assert pack.result(1).outcome == Outcome.STOPPED
    assert len(pack.result(1).records) == 2
    for i, cfg in enumerate(configs):
        single = unpacked(cfg)
        n = len(pack.result(i).records)
        assert_same_curve(pack.result(i).records, single.records[:n])
    assert len(pack.result(new).records) == configs[3]["train"]["rounds"]


@pytest.mark.parametrize(
    ("name", "epochs"), [("fedavgm", False), ("fedprox", False), ("fedavg", True)]
)
def test_members_at_three_rounds_run_their_local_steps_in_one_batch(monkeypatch, name, epochs):
    """Refills after steps 1 and 3: up to three round indices (three cohorts, K_p or τ_i of
    different lengths) in a step, one client call each step, every curve the unpacked one."""
    configs = variants(name, epochs)
    calls = []
    clients = PackedTrainer._clients

    def spy(self, *args):
        calls.append(1)
        return clients(self, *args)

    monkeypatch.setattr(PackedTrainer, "_clients", spy)
    pack = PackedTrainer(configs[:2], chunk=64)
    joins = {1: configs[2], 3: configs[3]}  # step -> the configuration that joins after it
    groups, step = [], 0
    while not pack.done or step in joins:
        if step in joins:
            pack.add(joins[step])
        groups.append(len({pack._members[i].round for i in pack._slots}))
        before = len(calls)
        pack.step()
        step += 1
        assert len(calls) - before == 1, (step, groups[-1])  # every group's pairs at once
    assert max(groups) == 3
    for i, cfg in enumerate(configs):
        assert_same_curve(pack.result(i).records, unpacked(cfg).records)


def test_pack_key_separates_what_must_be_shared():
    a, b = variants("fedavg")[:2]
    assert pack_key(a) == pack_key(b)
    c = base("fedavg", train={"batch_size": 4})
    assert pack_key(a) != pack_key(c)
    with pytest.raises(ConfigError, match="pack_key"):
        PackedTrainer([a, c])


def digits(j: int, **train) -> dict:
    return {
        "task": {"name": "digits", "seed": 3, "clients": 12, "model": "mlp", "size_skew": 2.0},
        "algorithm": "fedavgm",
        "train": {
            "rounds": 3,
            "clients_per_round": 4,
            "local_epochs": (0.5, 1.0)[j % 2],
            "batch_size": 16,
            "eval_every": 2,
            "dtype": "float64",
            "weighting": "examples",
            **train,
        },
        "hparams": {"client_lr": 0.05 * (j + 1), "server_lr": 0.5, "server_momentum": 0.3 * j},
        "decay": DECAY if j % 2 else {},
        "seed": j,
    }


@pytest.mark.parametrize(("population", "chunk"), [("full", None), ("sample", 2)])
def test_digits_mlp_with_test_metrics(population, chunk):
    extra = {"eval_population": population}
    if population == "sample":
        extra["eval_clients"] = 5
    pack = assert_pack_matches([digits(j, **extra) for j in range(3)], chunk)
    record = pack.result(0).records[-1]
    assert record.test and record.train_loss is not None
