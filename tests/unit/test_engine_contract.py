"""The contract table (STYLE.md habit 2): every registered algorithm through the same checks."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from fedtune.trainers import Trainer, algorithms, get_recipe
from fedtune.trainers.algorithms import Cohort, LocalUpdate, RoundContext
from tests.conftest import quadratic_config

ALGORITHMS = sorted(algorithms())


def config_for(name: str, **overrides) -> dict:
    recipe = get_recipe(name)
    hp = {}
    if "client_lr" in recipe.params:
        hp["client_lr"] = 0.05
    if "server_lr" in recipe.params and recipe.units == "gradient":
        hp["server_lr"] = 0.05
    cfg = quadratic_config(name, hparams=hp)
    if recipe.needs_central:
        cfg["task"] = {
            **cfg["task"],
            "name": "mixed_quadratic",
            "central_noise": 0.5,
            "central_examples": 20,
        }
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    if recipe.max_clients_per_round:
        cfg["train"]["clients_per_round"] = recipe.max_clients_per_round
    if recipe.fixed_local_steps is not None:
        cfg["train"]["local_steps"] = recipe.fixed_local_steps
    return cfg


def curve(trainer_or_result) -> list[dict]:
    records = trainer_or_result.records
    return [{k: v for k, v in r.as_dict().items() if k != "wall_time"} for r in records]


def run(cfg) -> Trainer:
    trainer = Trainer(cfg)
    while not trainer.done:
        trainer.step()
    return trainer


def test_registry_has_every_required_method():
    required = {
        "minibatch_sgd",
        "fedsgd",
        "fedavg",
        "fedavg_vanilla",
        "reptile",
        "fedprox",
        "lookahead",
        "fomaml",
        "maml",
        "fedavgm",
        "fedadam",
        "fedyogi",
        "fedadagrad",
    }
    assert required <= set(ALGORITHMS)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_deterministic_under_seed(name):
    a, b = run(config_for(name)), run(config_for(name))
    assert curve(a) == curve(b)
    for k in a.state.params:
        assert torch.equal(a.state.params[k], b.state.params[k])


@pytest.mark.parametrize("name", ALGORITHMS)
def test_trial_seed_changes_batches(name):
    a, b = run(config_for(name)), run(config_for(name, seed=8))
    assert curve(a) != curve(b)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_vectorized_equals_sequential(name):
    vec = run(config_for(name, train={"runner": "vectorized"}))
    seq = run(config_for(name, train={"runner": "sequential"}))
    assert vec.runner.name == "vectorized" and getattr(vec.runner, "fallback", None) is None
    for rv, rs in zip(curve(vec), curve(seq), strict=True):
        assert rv.keys() == rs.keys()
        for key in rv:
            assert rv[key] == pytest.approx(rs[key], rel=1e-10, abs=1e-12), key
    for k in vec.state.params:
        torch.testing.assert_close(vec.state.params[k], seq.state.params[k], rtol=1e-10, atol=1e-12)


def _apply(trainer: Trainer, cohort: Cohort):
    state = copy.deepcopy(trainer.state)
    ctx = RoundContext(
        trainer.runner,
        trainer.loss_of,
        trainer.data,
        trainer.task,
        trainer.hparams.client_lr,
        trainer.hparams.server_lr,
        0,
    )
    new_state, _ = trainer.algorithm.apply(state, cohort, ctx)
    return new_state.params


@pytest.mark.parametrize("name", ALGORITHMS)
def test_independent_of_client_order(name):
    trainer = Trainer(config_for(name, train={"clients_per_round": 4}))
    cohort = trainer._cohort(0)
    perm = (
        torch.tensor([2, 0, 3, 1])[: cohort.size] if cohort.size == 4 else torch.arange(cohort.size)
    )
    permuted = Cohort(cohort.clients[perm], cohort.batches[perm], cohort.weights[perm])
    a, b = _apply(trainer, cohort), _apply(trainer, permuted)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-13)
    assert any(not torch.equal(a[k], trainer.state.params[k]) for k in a), "the round did nothing"


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in ALGORITHMS
        if get_recipe(n).build.__name__ == "_build_local_update" and not get_recipe(n).second_order
    ],
)
def test_zero_local_steps_gives_zero_update(name):
    trainer = Trainer(config_for(name))
    alg = trainer.algorithm
    assert isinstance(alg, LocalUpdate)
    trainer.algorithm = LocalUpdate(
        alg.name, dataclasses.replace(alg.rule, theta=torch.zeros(0)), alg.server_opt
    )
    trainer.state = trainer.algorithm.init(trainer.state.params)
    before = copy.deepcopy(trainer.state.params)
    record = trainer.step()
    assert record.update_norm == 0.0
    for k in before:
        assert torch.equal(before[k], trainer.state.params[k])


def test_extension_hyperparameter_defaults_are_owned_by_hparams():
    """The parts' own parameter dataclasses must not disagree with HParams (one owner)."""
    from fedtune.trainers import HParams
    from fedtune.trainers.algorithms.extensions import EXTENSION_PARAMS

    base = HParams()
    for cls in EXTENSION_PARAMS:
        for f in dataclasses.fields(cls):
            assert getattr(base, f.name) == f.default, f"{cls.__name__}.{f.name}"
