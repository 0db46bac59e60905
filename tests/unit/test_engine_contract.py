"""The contract table (docs/development/style.md habit 2): every registered algorithm through the
same checks.

User algorithms go through the same table: ``FEDTUNE_CONTRACT_CODE=PATH:mod1,mod2`` imports that
user code with fedtune's own code loader (``fedtune.extend.load_code``, as a study's ``code:``
section does) before the table is built. ``tests/unit/test_user_contract.py`` runs this file so
in a child process for the example project ``examples/byo``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os

import pytest
import torch

from fedtune.errors import ConfigError
from fedtune.trainers import Trainer, algorithms, get_recipe
from fedtune.trainers.algorithms import Cohort, LocalUpdate, RoundContext
from fedtune.trainers.engine import RUNNER_METRIC
from tests.cohorts import assert_reorders_distinct_clients
from tests.conftest import quadratic_config

# what differs between runs by design: timing and which runner ran
UNTIMED = ("wall_time", RUNNER_METRIC)

if os.environ.get("FEDTUNE_CONTRACT_CODE"):
    from fedtune.extend import load_code

    _path, _, _modules = os.environ["FEDTUNE_CONTRACT_CODE"].rpartition(":")
    load_code({"path": _path, "modules": _modules.split(",")})

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
    return [{k: v for k, v in r.as_dict().items() if k not in UNTIMED} for r in records]


def run(cfg) -> Trainer:
    trainer = Trainer(cfg)
    while not trainer.done:
        trainer.step()
    return trainer


@functools.cache
def base_run(name: str) -> Trainer:
    """``run(config_for(name))`` once per process: the tests that compare against it only read
    it (its records and parameters), so each algorithm's default run is trained once, not once
    per test.

    Args:
        name: the algorithm.

    Returns:
        The finished trainer (not to be modified).
    """
    return run(config_for(name))


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
    a, b = base_run(name), run(config_for(name))  # two runs of one configuration
    assert curve(a) == curve(b)
    for k in a.state.params:
        assert torch.equal(a.state.params[k], b.state.params[k])


@pytest.mark.parametrize("name", ALGORITHMS)
def test_trial_seed_changes_batches(name):
    a, b = base_run(name), run(config_for(name, seed=8))
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


@pytest.mark.parametrize("name", ALGORITHMS)
def test_first_step_losses_equal_the_separate_pass(name):
    """Clients no larger than the batch (n_i = B = 8): an algorithm whose clients give ℓ_t
    from their first local steps (``MeasuringAlgorithm``) runs as with the engine's separate
    ℓ_t pass, to the rounding of a different summation order."""
    cfg = config_for(name, train={"batch_size": 8})
    measured = run(cfg)
    separate = Trainer(cfg)
    separate.measure_in_first_step = False
    while not separate.done:
        separate.step()
    assert measured.round == separate.round > 0
    for rm, rs in zip(curve(measured), curve(separate), strict=True):
        assert rm.keys() == rs.keys()
        for key in rm:
            assert rm[key] == pytest.approx(rs[key], rel=1e-10, abs=1e-12), key
    for k in measured.state.params:
        torch.testing.assert_close(
            measured.state.params[k], separate.state.params[k], rtol=1e-10, atol=1e-12
        )


def _apply(trainer: Trainer, cohort: Cohort):
    return _apply_state(trainer, cohort).params


# methods that run one client per round have no client order to test
ORDERABLE = [n for n in ALGORITHMS if (get_recipe(n).max_clients_per_round or 4) >= 4]


@pytest.mark.parametrize("name", ORDERABLE)
def test_independent_of_client_order(name):
    trainer = Trainer(config_for(name, train={"clients_per_round": 4}))
    cohort = trainer._cohort(0)
    perm = torch.tensor([2, 0, 3, 1])
    permuted = Cohort(cohort.clients[perm], cohort.batches[perm], cohort.weights[perm])
    assert_reorders_distinct_clients(trainer, cohort, permuted)
    a, b = _apply(trainer, cohort), _apply(trainer, permuted)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-13)
    assert any(not torch.equal(a[k], trainer.state.params[k]) for k in a), "the round did nothing"


def test_only_single_client_methods_skip_the_order_test():
    """Lookahead (one client per round) is the only method left out, and it refuses more."""
    assert sorted(set(ALGORITHMS) - set(ORDERABLE)) == ["lookahead"]
    cfg = config_for("lookahead")
    cfg["train"]["clients_per_round"] = 2
    with pytest.raises(ConfigError) as err:
        Trainer(cfg)
    assert err.value.field == "train.clients_per_round"


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in ALGORITHMS
        if get_recipe(n).round_form == "local_update" and not get_recipe(n).second_order
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


def test_every_hyperparameter_has_one_declaration():
    """Each hyperparameter is declared once, by the part that reads it: every
    recipe's validated type is built from the same declaration object, with the declared
    default unless the recipe sets its own."""
    owners: dict = {}
    for name in ALGORITHMS:
        recipe = get_recipe(name)
        values = {**recipe.defaults, **recipe.fixed}
        for key, declared in recipe.declared.items():
            assert owners.setdefault(key, declared) is declared, f"{name}: {key} re-declared"
            field = recipe.hparams_type.__dataclass_fields__[key]
            assert field.default == values.get(key, declared.default), f"{name}.{key}"


# -- heterogeneous local work: train.local_epochs --------------------------------------------


def _supports_epochs(name: str) -> bool:
    recipe = get_recipe(name)
    return not recipe.fixed_k_reason and recipe.fixed_local_steps is None


EPOCH_ALGORITHMS = [n for n in ALGORITHMS if _supports_epochs(n)]
FIXED_K_ALGORITHMS = [n for n in ALGORITHMS if not _supports_epochs(n)]
# cohorts of several clients, hence padded and masked steps (lookahead has one client)
COHORT_EPOCH_ALGORITHMS = [n for n in EPOCH_ALGORITHMS if not get_recipe(n).max_clients_per_round]


def epochs_config(name: str, epochs: float = 1.0, **overrides) -> dict:
    """Unequal clients (n_i in [2, 12], B = 2): τ_i = ⌈E·n_i/2⌉ differ within a round."""
    cfg = config_for(name, **overrides)
    if not get_recipe(name).needs_central:
        cfg["task"] = {**cfg["task"], "examples": 2, "examples_max": 12}
    cfg["train"] = {k: v for k, v in cfg["train"].items() if k != "local_steps"}
    cfg["train"]["local_epochs"] = epochs
    return cfg


def test_epoch_contract_covers_the_registry():
    assert {"fedavg", "fedprox", "fedavgm", "scaffold", "fedga", "fednova"} <= set(EPOCH_ALGORITHMS)
    assert {"maml", "minibatch_sgd", "gradalign", "mixed_pt"} <= set(FIXED_K_ALGORITHMS)


@pytest.mark.parametrize("name", EPOCH_ALGORITHMS)
def test_local_epochs_vectorized_equals_sequential_bit_for_bit(name):
    vec = run(epochs_config(name, train={"runner": "vectorized"}))
    seq = run(epochs_config(name, train={"runner": "sequential"}))
    assert vec.runner.name == "vectorized" and getattr(vec.runner, "fallback", None) is None
    cv, cs = curve(vec), curve(seq)
    assert cv == cs
    if name in COHORT_EPOCH_ALGORITHMS:
        assert any(r["steps_min"] < r["steps_max"] for r in cv), "the steps should differ"
    for k in vec.state.params:
        assert torch.equal(vec.state.params[k], seq.state.params[k]), k


@pytest.mark.parametrize("name", EPOCH_ALGORITHMS)
def test_local_epochs_deterministic_and_seeded(name):
    a, b = run(epochs_config(name)), run(epochs_config(name))
    assert curve(a) == curve(b)
    assert curve(a) != curve(run(epochs_config(name, seed=8)))


@pytest.mark.parametrize("name", EPOCH_ALGORITHMS)
def test_local_epochs_equal_sizes_equals_local_steps(name):
    """n_i = 8, B = 2, E = 0.75 ⇒ τ_i = 3 = K: the masked path is the fixed-K path, bit for bit."""
    fixed = base_run(name)
    cfg = config_for(name)
    cfg["train"] = {k: v for k, v in cfg["train"].items() if k != "local_steps"}
    cfg["train"]["local_epochs"] = 0.75
    epochs = run(cfg)
    for rf, re in zip(curve(fixed), curve(epochs), strict=True):
        assert (re["steps_min"], re["steps_max"]) == (3.0, 3.0)
        assert {k: re[k] for k in rf} == rf
    for k in fixed.state.params:
        assert torch.equal(fixed.state.params[k], epochs.state.params[k]), k


def _nan_padded(trainer: Trainer, cohort: Cohort) -> tuple[Trainer, Cohort]:
    """The same cohort whose masked steps read a row of NaN inputs."""
    data = trainer.data
    nan_row = torch.full_like(data.inputs[:1], float("nan"))
    poisoned = type(data)(
        torch.cat([data.inputs, nan_row]),
        torch.cat([data.targets, data.targets[:1]]),
        data.offsets,
        data.counts,
        data.client_ids,
    )
    batches = cohort.batches.clone()
    k_max = int(cohort.steps.max())
    pad = ~cohort.mask()
    batches[:, :k_max][pad] = data.num_examples
    twin = copy.copy(trainer)
    twin.data = poisoned
    return twin, Cohort(cohort.clients, batches, cohort.weights, cohort.steps)


def _apply_state(trainer: Trainer, cohort: Cohort):
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
    return trainer.algorithm.apply(state, cohort, ctx)[0]


def _flat(tree, prefix=""):
    if torch.is_tensor(tree):
        return {prefix: tree}
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}.{k}"))
        return out
    return {prefix: torch.tensor(float(tree))}


@pytest.mark.parametrize("name", COHORT_EPOCH_ALGORITHMS)
def test_masked_steps_are_exact_no_ops(name):
    """NaN data in every masked step changes nothing: parameters, server-optimizer state and
    the algorithm's per-client state (controls, momenta) are bit for bit those of the run."""
    trainer = Trainer(epochs_config(name, train={"clients_per_round": 4}))
    trainer.step()  # warm states (momentum, controls) first
    cohort = trainer._cohort(1)
    assert bool((~cohort.mask()).any()), "the cohort needs masked steps"
    clean = _apply_state(trainer, cohort)
    twin, poisoned = _nan_padded(trainer, cohort)
    dirty = _apply_state(twin, poisoned)
    for part in ("params", "opt_state", "extra"):
        a, b = _flat(getattr(clean, part)), _flat(getattr(dirty, part))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{part}{k}"


@pytest.mark.parametrize("name", COHORT_EPOCH_ALGORITHMS)
def test_local_epochs_independent_of_client_order(name):
    trainer = Trainer(epochs_config(name, train={"clients_per_round": 4}))
    cohort = trainer._cohort(0)
    perm = torch.tensor([2, 0, 3, 1])
    permuted = Cohort(
        cohort.clients[perm], cohort.batches[perm], cohort.weights[perm], cohort.steps[perm]
    )
    assert_reorders_distinct_clients(trainer, cohort, permuted)
    assert len(set(cohort.steps.tolist())) > 1  # the clients' step counts differ too
    a, b = _apply(trainer, cohort), _apply(trainer, permuted)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("epochs", [0.5, 1.0, 2.5])
def test_step_counts_are_ceil_epochs_times_size_over_batch(epochs):
    trainer = Trainer(epochs_config("fedavg", epochs=epochs))
    for t in range(3):
        cohort = trainer._cohort(t)
        n = trainer.data.counts[cohort.clients.cpu()].tolist()
        expected = [math.ceil(epochs * k / 2) for k in n]
        assert cohort.steps.tolist() == expected
        assert cohort.batches.shape[1] == max(expected)
        assert cohort.mask().sum(1).tolist() == expected
    record = trainer.step()
    assert record.extra["steps_max"] >= record.extra["steps_min"] >= 1
    assert record.examples == int(trainer._cohort(0).steps.sum()) * 2


@pytest.mark.parametrize("name", FIXED_K_ALGORITHMS)
def test_fixed_k_algorithms_reject_local_epochs(name):
    with pytest.raises(ConfigError) as err:
        Trainer(epochs_config(name))
    assert err.value.field == "train.local_epochs"
    assert name in err.value.reason


def test_local_epochs_and_local_steps_are_exclusive():
    cfg = epochs_config("fedavg")
    cfg["train"]["local_steps"] = 3
    with pytest.raises(ConfigError) as err:
        Trainer(cfg)
    assert err.value.field == "train.local_epochs" and "not both" in err.value.reason
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="local_epochs"):
            Trainer(epochs_config("fedavg", epochs=bad))
    with pytest.raises(ConfigError, match="local_epochs"):
        Trainer(epochs_config("fedavg", train={"batch_sampling": "full"}))
