"""Contract checks and exact equivalences of the GradAlign/FedGA, SCAFFOLD, Mixed FL and
FedAvg-MaSS methods (docs/explanation/algorithms.md §4–§6; Dandi et al. 2021 (arXiv:2106.13897),
Augenstein et al. 2022 (arXiv:2205.13655), Qu et al. 2020 (arXiv:2007.05690))."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedtune.errors import ConfigError
from fedtune.trainers import Trainer, algorithms, get_recipe, parse_trial_config
from fedtune.trainers.algorithms import Cohort, RoundContext
from fedtune.trainers.algorithms.dissimilarity import quadratic_alignment
from fedtune.trainers.algorithms.extensions import extension_hparams
from fedtune.trainers.algorithms.gradalign import AlignedLocalUpdate
from fedtune.trainers.engine import RUNNER_METRIC
from fedtune.trainers.server_opt import make_server_opt
from tests.cohorts import assert_reorders_distinct_clients
from tests.conftest import quadratic_config

# what differs between runs by design: timing and which runner ran
UNTIMED = ("wall_time", RUNNER_METRIC)

MODULES = {f"fedtune.trainers.algorithms.{m}" for m in ("gradalign", "scaffold", "mixed", "mass")}
EXTENSIONS = sorted(n for n, r in algorithms().items() if r.build.__module__ in MODULES)
EXTRA_NAMES = {h.name for h in extension_hparams()}
MIXED_TASK = {
    "name": "mixed_quadratic",
    "clients": 6,
    "dim": 3,
    "examples": 8,
    "noise": 0.5,
    "central_noise": 0.5,
    "central_examples": 20,
    "L": 4.0,
    "init_scale": 3.0,
    "seed": 1,
}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def config_for(name: str, **overrides) -> dict:
    recipe = get_recipe(name)
    hp = {"client_lr": 0.05} if "client_lr" in recipe.params else {}
    if "server_lr" in recipe.params and recipe.units == "gradient":
        hp["server_lr"] = 0.05
    cfg = quadratic_config(name, hparams=hp)
    if name.startswith("mixed"):
        cfg["task"] = dict(MIXED_TASK)
    if recipe.fixed_local_steps is not None:
        cfg["train"]["local_steps"] = recipe.fixed_local_steps
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


def trainer_for(name: str, extras: dict | None = None, **overrides) -> Trainer:
    """A Trainer built by the real config path: extension hyperparameters ``extras`` go into
    the trial config's ``hparams`` (validated by the parts' declarations, handed to the
    recipe by the engine), as a user's ``fedtune train`` file would set them."""
    if extras:
        overrides = {**overrides, "hparams": {**overrides.get("hparams", {}), **extras}}
    return Trainer(config_for(name, **overrides))


def run(trainer: Trainer) -> Trainer:
    while not trainer.done:
        trainer.step()
    return trainer


def curve(trainer: Trainer) -> list[dict]:
    return [{k: v for k, v in r.as_dict().items() if k not in UNTIMED} for r in trainer.records]


def assert_params_close(a: Trainer, b: Trainer, rtol=1e-12, atol=1e-12):
    for k in a.state.params:
        torch.testing.assert_close(a.state.params[k], b.state.params[k], rtol=rtol, atol=atol)


# Non-default settings run through the same table.
VARIANTS = [(n, None) for n in EXTENSIONS] + [
    ("fedga", {"ga_form": "every_step", "ga_full_batch": False, "ga_beta": 0.5}),
    ("scaffold_ga", {"ga_full_batch": False}),
    ("scaffold", {"scaffold_option": 1}),
    ("mixed_gt2", {"mixed_gt2_init": "fresh", "merge_lr": 0.5, "central_steps": 2}),
    ("mixed_pt", {"central_batch_size": 0, "central_lr": 0.02}),
    ("fedavg_mass", {"mass_form": "form1", "mass_grad_point": "w"}),
]
IDS = [n if e is None else f"{n}-{'-'.join(map(str, e.values()))}" for n, e in VARIANTS]


def test_every_extension_is_registered():
    expected = {
        "fedga",
        "gradalign",
        "scaffold_ga",
        "scaffold",
        "mixed_pt",
        "mixed_gt1",
        "mixed_gt2",
        "mixed_fl",
        "fedavg_mass",
        "fedavg_mass_literal",
        "fedavg_nesterov",
    }
    assert expected == set(EXTENSIONS)
    used = {p for n in EXTENSIONS for p in get_recipe(n).params}
    assert used >= EXTRA_NAMES  # every extension hyperparameter is settable somewhere
    for n in EXTENSIONS:  # the docstring of the implementing module cites the recipe's paper
        recipe = get_recipe(n)  # (its round is deferred: its module is imported when built)
        assert recipe.paper in importlib.import_module(recipe.build.__module__).__doc__


@pytest.mark.parametrize(("name", "extras"), VARIANTS, ids=IDS)
def test_deterministic_and_seeded(name, extras):
    a, b = run(trainer_for(name, extras)), run(trainer_for(name, extras))
    assert curve(a) == curve(b)
    assert_params_close(a, b, rtol=0, atol=0)
    c = run(trainer_for(name, extras, seed=8))
    assert curve(c) != curve(a)


@pytest.mark.parametrize(("name", "extras"), VARIANTS, ids=IDS)
def test_vectorized_equals_sequential(name, extras):
    vec = run(trainer_for(name, extras, train={"runner": "vectorized"}))
    seq = run(trainer_for(name, extras, train={"runner": "sequential"}))
    assert vec.runner.fallback is None
    for rv, rs in zip(curve(vec), curve(seq), strict=True):
        assert rv.keys() == rs.keys()
        for key in rv:
            assert rv[key] == pytest.approx(rs[key], rel=1e-10, abs=1e-12), key
    assert_params_close(vec, seq, rtol=1e-10, atol=1e-12)


def _apply(trainer: Trainer, cohort: Cohort, client_lr: float | None = None, algorithm=None):
    """One round of ``algorithm`` (default: the trainer's own) on a copy of its state."""
    state = copy.deepcopy(trainer.state)
    lr = trainer.hparams.client_lr if client_lr is None else client_lr
    ctx = RoundContext(
        trainer.runner,
        trainer.loss_of,
        trainer.data,
        trainer.task,
        lr,
        trainer.hparams.server_lr,
        0,
    )
    return (algorithm or trainer.algorithm).apply(state, cohort, ctx)[0]


@pytest.mark.parametrize(("name", "extras"), VARIANTS, ids=IDS)
def test_independent_of_client_order(name, extras):
    trainer = trainer_for(name, extras, train={"clients_per_round": 4})
    trainer.step()  # stateful methods: some clients already hold state
    cohort = trainer._cohort(1)
    perm = torch.tensor([2, 0, 3, 1])
    permuted = Cohort(cohort.clients[perm], cohort.batches[perm], cohort.weights[perm])
    assert_reorders_distinct_clients(trainer, cohort, permuted)
    a, b = _apply(trainer, cohort), _apply(trainer, permuted)
    for k in a.params:
        torch.testing.assert_close(a.params[k], b.params[k], rtol=1e-12, atol=1e-13)
    assert any(not torch.equal(a.params[k], trainer.state.params[k]) for k in a.params)
    for key, value in a.extra.items():  # per-client state is keyed by client, not position
        flat_a = torch.utils._pytree.tree_leaves(value)
        flat_b = torch.utils._pytree.tree_leaves(b.extra[key])
        for x, y in zip(flat_a, flat_b, strict=True):
            if torch.is_tensor(x):
                torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("name", "extras"), VARIANTS, ids=IDS)
def test_checkpoint_restores_exactly(name, extras):
    full = run(trainer_for(name, extras))
    half = trainer_for(name, extras)
    half.step()
    half.step()
    state = half.state_dict()
    resumed = trainer_for(name, extras)
    resumed.load_state_dict(state)
    run(resumed)
    assert curve(resumed) == curve(full)
    assert_params_close(resumed, full, rtol=0, atol=0)


@pytest.mark.parametrize("name", [n for n in EXTENSIONS if get_recipe(n).units == "delta"])
def test_zero_client_lr_gives_zero_update(name):
    """Model-delta methods: γ = 0 (so η_c = γ·η_s = 0 and MaSS's η₁ = η₂ = 0) moves nothing."""
    extras = {"mass_eta2": 0.0} if "mass" in name else None  # Nesterov fixes η₂ = 0 itself
    trainer = trainer_for(name, extras)
    new = _apply(trainer, trainer._cohort(0), client_lr=0.0)
    for k in new.params:
        assert torch.equal(new.params[k], trainer.state.params[k])


@pytest.mark.parametrize("mode", ["once", "every_step", "correct"])
def test_zero_local_steps_gives_zero_update(mode):
    """K = 0 cannot be configured (``train.local_steps`` must be >= 1, checked here), so the
    class itself runs with K = 0 on the configured trainer's state and cohort."""
    with pytest.raises(ConfigError) as err:
        trainer_for("fedga", train={"local_steps": 0})
    assert err.value.field == "train.local_steps"
    trainer = trainer_for("fedga", {"ga_beta": 0.5})
    zero = AlignedLocalUpdate("fedga", 0, make_server_opt(trainer.hparams), mode, 0.5)
    new = _apply(trainer, trainer._cohort(0), algorithm=zero)
    for k in new.params:
        assert torch.equal(new.params[k], trainer.state.params[k])
    moved = _apply(trainer, trainer._cohort(0))  # the configured K = 3 does move
    assert any(not torch.equal(moved.params[k], trainer.state.params[k]) for k in moved.params)


# -- exact equivalences (docs/explanation/algorithms.md §4.4, §4.5, §5.5, §6.4) ----------
@pytest.mark.parametrize("form", ["once", "every_step"])
def test_fedga_one_step_is_gradalign(form):
    one = {"train": {"local_steps": 1}}
    a = run(trainer_for("fedga", {"ga_beta": 0.7, "ga_form": form}, **one))
    b = run(trainer_for("gradalign", {"ga_beta": 0.7}))
    assert_params_close(a, b)


def test_gradalign_matches_closed_form_on_quadratics():
    """x ← x − η Σ_i w_i A_i (x + β(g_i − ḡ) − c_i) with full participation and exact gradients."""
    t = trainer_for(
        "gradalign",
        {"ga_beta": 0.3},
        task={"name": "quadratic", "clients": 4, "dim": 3, "noise": 0.0, "seed": 2},
        train={"clients_per_round": 4},
    )
    inst = t.task.meta["instance"]
    x = t.state.params["x"].numpy().copy()
    t.step()
    g = np.einsum("ijk,ik->ij", inst.A, x[None] - inst.c)
    point = x[None] + 0.3 * (g - g.mean(0))
    expect = x - 0.05 * np.einsum("ijk,ik->ij", inst.A, point - inst.c).mean(0)
    np.testing.assert_allclose(t.state.params["x"].numpy(), expect, rtol=1e-13, atol=1e-13)


def test_fedga_algorithm_2_equals_algorithm_3():
    a = run(trainer_for("fedga", {"ga_beta": 0.5, "ga_form": "once"}))
    b = run(trainer_for("fedga", {"ga_beta": 0.5, "ga_form": "every_step"}))
    assert_params_close(a, b)
    c = run(trainer_for("fedga", {"ga_beta": 0.0}))
    assert not torch.allclose(a.state.params["x"], c.state.params["x"])  # β matters


def test_equal_hessians_make_fedga_scaffold_and_fedavg_coincide():
    shared = {
        "task": {
            "name": "mixed_quadratic",
            "iid": False,
            "shared_hessian": True,
            "heterogeneity": 1.0,
        }
    }  # common A, different c_i, per-example noise
    fedavg = run(trainer_for("fedavg", **shared))
    for name, extras in (
        ("fedga", {"ga_beta": 0.8}),
        ("fedga", {"ga_beta": 0.8, "ga_form": "every_step"}),
        ("scaffold_ga", None),
    ):
        assert_params_close(run(trainer_for(name, extras, **shared)), fedavg)
    hetero = run(trainer_for("fedga", {"ga_beta": 0.8}))  # different Hessians: not FedAvg
    assert not torch.allclose(
        hetero.state.params["x"], run(trainer_for("fedavg")).state.params["x"]
    )


def test_parallel_training_equals_one_way_transfer_at_one_step():
    one = {"train": {"local_steps": 1}}
    pt, gt1 = run(trainer_for("mixed_pt", **one)), run(trainer_for("mixed_gt1", **one))
    assert_params_close(pt, gt1)
    pt3, gt3 = run(trainer_for("mixed_pt")), run(trainer_for("mixed_gt1"))
    assert not torch.allclose(pt3.state.params["x"], gt3.state.params["x"])


def test_mixed_fl_variant_hparam_selects_the_recipe():
    for variant in ("pt", "gt1", "gt2"):
        a = run(trainer_for("mixed_fl", {"mixed_variant": variant}))
        assert_params_close(a, run(trainer_for(f"mixed_{variant}")), rtol=0, atol=0)


def test_mass_forms_agree_between_communications():
    single = {"task": {"clients": 1}, "train": {"clients_per_round": 1, "local_steps": 5}}
    runs = [
        run(trainer_for("fedavg_mass", {"mass_form": f}, **single))
        for f in ("form2", "form1", "form1_literal")
    ]
    for other in runs[1:]:
        assert_params_close(runs[0], other)
    full = {"train": {"clients_per_round": 6}}  # the note's full participation
    many = [
        run(trainer_for("fedavg_mass", {"mass_form": f}, **full))
        for f in ("form2", "form1", "form1_literal")
    ]
    assert_params_close(many[0], many[1])  # corrected sync ≡ form 2 with averaging too
    assert not torch.allclose(many[0].state.params["x"], many[2].state.params["x"])


def test_nesterov_is_mass_with_zero_eta2():
    a = run(trainer_for("fedavg_nesterov", {"mass_gamma": 0.6}))
    b = run(trainer_for("fedavg_mass", {"mass_gamma": 0.6, "mass_eta2": 0.0}))
    assert_params_close(a, b, rtol=0, atol=0)


# -- diagnostics and state -----------------------------------------------------------------
def test_alignment_diagnostic_is_r_at_the_broadcast_point():
    t = trainer_for(
        "fedga",
        task={"name": "quadratic", "clients": 4, "dim": 3, "noise": 0.0, "seed": 3},
        train={"clients_per_round": 4},
    )
    inst = t.task.meta["instance"]
    r, _ = quadratic_alignment(inst.A, inst.c, inst.p, t.state.params["x"].numpy())
    record = t.step()
    assert record.extra["alignment_r"] == pytest.approx(r, rel=1e-12)
    assert record.extra["comm_rounds"] == 2 and record.extra["comm_vectors"] == 4


def test_mixed_dissimilarity_diagnostics_match_closed_form():
    t = trainer_for(
        "mixed_pt",
        task={**MIXED_TASK, "noise": 0.0, "central_noise": 0.0, "iid": False, "heterogeneity": 1.0},
        train={"clients_per_round": 6},
    )
    m = t.task.meta
    x = t.state.params["x"].numpy()
    gf = 0.5 * np.einsum("ijk,ik->ij", m["A"], x[None] - m["c"]).mean(0)
    gc = 0.5 * m["A_c"] @ (x - m["c_c"])
    spread = gf @ gf / 0.5 + gc @ gc / 0.5
    record = t.step()
    assert record.extra["mixed_G2"] == pytest.approx(spread - (gf + gc) @ (gf + gc), rel=1e-10)
    assert record.extra["mixed_B2"] == pytest.approx(spread / ((gf + gc) @ (gf + gc)), rel=1e-10)


def test_scaffold_state_grows_with_distinct_clients_and_c_is_their_mean():
    t = run(trainer_for("scaffold", train={"rounds": 3}))
    seen = set()
    for r in range(3):
        seen |= set(t._cohort(r).clients.tolist())
    table = t.state.extra["scaffold_controls"]
    assert table["ids"].tolist() == sorted(seen)
    assert t.records[-1].extra["control_clients"] == len(seen)
    n = t.data.num_clients
    mean = table["rows"]["x"].sum(0) / n  # unseen clients hold c_i = 0
    torch.testing.assert_close(t.state.extra["scaffold_c"]["x"], mean, rtol=1e-12, atol=1e-14)


# -- configuration ---------------------------------------------------------------------------
def test_mixed_needs_central_data():
    with pytest.raises(ConfigError) as err:
        Trainer(quadratic_config("mixed_pt"))
    assert err.value.field == "task"


@pytest.mark.parametrize(
    ("name", "extras", "field"),
    [
        ("fedga", {"ga_beta": -1.0}, "hparams.ga_beta"),
        ("fedga", {"ga_form": "twice"}, "hparams.ga_form"),
        ("scaffold", {"scaffold_option": 3}, "hparams.scaffold_option"),
        ("mixed_pt", {"merge_lr": 0.0}, "hparams.merge_lr"),
        ("mixed_fl", {"mixed_variant": "gt3"}, "hparams.mixed_variant"),
        ("fedavg_mass", {"mass_gamma": 1.0}, "hparams.mass_gamma"),
        (
            "fedavg_mass",
            {"mass_auto": True},
            "hparams.mass_auto",
        ),  # quadratic: not linear regression
    ],
)
def test_invalid_extension_hparams_name_the_field(name, extras, field):
    cfg = config_for(name, hparams=extras)
    if extras.get("mass_auto"):
        del cfg["hparams"]["client_lr"]  # with mass_auto a client_lr is itself an error
    with pytest.raises(ConfigError) as err:
        Trainer(cfg)
    assert err.value.field == field


@pytest.mark.parametrize("name", ["train-fedga", "train-scaffold", "train-mixed-pt", "train-mass"])
def test_examples_parse_and_run(name):
    """The `fedtune train` examples parse as trial configs as they stand (extension keys
    included), every hparam of the file is the one in force, and two rounds run."""
    raw = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    assert raw["algorithm"] in EXTENSIONS
    declared = get_recipe(raw["algorithm"]).declared
    assert set(raw["hparams"]) <= set(declared)  # each key declared by one of the method's parts
    assert set(raw["hparams"]) & EXTRA_NAMES  # each example sets an extension hyperparameter
    base = {**raw, "train": {**raw["train"], "rounds": 2, "eval_every": 1}}
    trainer = Trainer(parse_trial_config(base))
    recipe = get_recipe(raw["algorithm"])
    assert set(raw["hparams"]) <= set(recipe.params)
    for key, value in raw["hparams"].items():  # every key of the file is the value in force
        assert getattr(trainer.hparams, key) == value, key
    run(trainer)
    assert trainer.outcome == "completed" and len(trainer.records) == 2
