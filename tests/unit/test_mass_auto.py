"""``mass_auto: true`` is honest (Qu et al. 2020 (arXiv:2007.05690)): the theorem's
η₁, η₂, γ replace client_lr, mass_eta2, mass_gamma, so setting those (or decaying γ) is an
error naming the field, a study cannot search them, and each record holds the rates in force."""

from __future__ import annotations

import pytest

from fedtune.errors import ConfigError
from fedtune.trainers import Trainer
from fedtune.tuning import StudySpec

_FIXED = ("client_lr", "mass_gamma", "mass_eta2")


def _config(algorithm="fedavg_mass", hparams=None, decay=None):
    return {
        "task": {"name": "linreg_interp", "seed": 0, "clients": 4},
        "algorithm": algorithm,
        "train": {
            "rounds": 3,
            "clients_per_round": 4,
            "local_steps": 5,
            "batch_size": 2,
            "dtype": "float64",
            "eval_every": 1,
        },
        "hparams": {"mass_auto": True, **(hparams or {})},
        "decay": decay or {},
    }


@pytest.mark.parametrize(
    ("algorithm", "name"),
    [(a, n) for a in ("fedavg_mass", "fedavg_mass_literal") for n in _FIXED]
    + [("fedavg_nesterov", "client_lr"), ("fedavg_nesterov", "mass_gamma")],  # η₂ = 0 fixed
)
def test_settings_the_theorem_replaces_are_rejected(algorithm, name):
    with pytest.raises(ConfigError) as err:
        Trainer(_config(algorithm, {name: 0.05}))
    assert err.value.field == f"hparams.{name}"
    assert "mass_auto" in err.value.reason


def test_decay_of_gamma_is_rejected_and_false_auto_accepts_everything():
    with pytest.raises(ConfigError) as err:
        Trainer(_config(decay={"enabled": True, "window": 1, "patience": 1, "cooldown": 0}))
    assert err.value.field == "decay.enabled"
    cfg = _config(hparams={"client_lr": 0.01, "mass_gamma": 0.5, "mass_eta2": 0.001})
    cfg["hparams"]["mass_auto"] = False
    cfg["decay"] = {"enabled": True, "window": 1, "patience": 1, "cooldown": 0}
    Trainer(cfg)  # without mass_auto all of them are in force


def test_records_hold_the_rates_in_force():
    """The record's client_lr is the theorem's η₁ (not the unused default 0.1), server_lr the
    fixed 1.0, and the extras the theorem's η₂, γ."""
    t = Trainer(_config())
    while not t.done:
        t.step()
    eta1 = t.records[0].extra["mass_eta1"]
    assert eta1 != pytest.approx(0.1)  # the declared default, which is not in force
    for r in t.records:
        assert r.client_lr == eta1 == r.extra["mass_eta1"]
        assert r.server_lr == 1.0
        assert 0 < r.extra["mass_gamma"] < 1 and r.extra["mass_eta2"] > 0
    # the same η₁ from the theorem's closed form on the task's data constants
    from fedtune.trainers.algorithms.mass import device_constants, theorem_steps

    data = t.task.train
    feats = [data.client(i).inputs.double().numpy() for i in range(data.num_clients)]
    assert eta1 == pytest.approx(theorem_steps([device_constants(X, 2) for X in feats])[0])


def test_rates_without_auto_are_recorded_as_configured_and_decayed():
    cfg = _config(hparams={"client_lr": 0.01, "mass_gamma": 0.5, "mass_eta2": 0.001})
    cfg["hparams"]["mass_auto"] = False
    cfg["train"]["rounds"] = 4
    cfg["decay"] = {"enabled": True, "window": 1, "patience": 1, "cooldown": 0, "threshold": 1e9}
    t = Trainer(cfg)
    while not t.done:
        t.step()
    # decays after rounds 2, 3 (round 1 sets the minimum): γ in force 0.01, 0.01, 0.001, 0.0001
    assert [r.client_lr for r in t.records] == pytest.approx([0.01, 0.01, 0.001, 0.0001])
    assert [r.extra["mass_eta1"] for r in t.records] == [r.client_lr for r in t.records]
    assert all(r.server_lr == 1.0 for r in t.records)  # fixed; the server decay is not in force


def _study(**hparams):
    return {
        "name": "mass-auto",
        "task": {"name": "linreg_interp", "seed": 0, "clients": 4},
        "algorithm": "fedavg_mass",
        "train": {"rounds": 5, "clients_per_round": 4, "local_steps": 5, "batch_size": 2},
        "hparams": hparams,
        "search": {"space": "mass"},
        "objective": {"metric": "train_loss", "last_rounds": 2, "mode": "min"},
        "sampler": {"name": "random", "seed": 0},
        "scheduler": {"name": "none"},
        "budget": {"trials": 2},
    }


def test_a_study_cannot_search_what_mass_auto_fixes():
    StudySpec.from_dict(_study())  # searching η₁, η₂, γ without mass_auto is fine
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(_study(mass_auto=True))  # the mass space searches η₁, η₂, γ
    assert err.value.field == "search.space"
    assert "client_lr" in err.value.reason and "mass_auto is true" in err.value.reason
    # with mass_auto a study searches what is left, e.g. the local steps
    spec = _study(mass_auto=True)
    del spec["train"]["local_steps"]
    spec["search"] = {"parameters": {"local_steps": {"type": "int", "low": 1, "high": 5}}}
    assert StudySpec.from_dict(spec).search_space().paths == ("train.local_steps",)
