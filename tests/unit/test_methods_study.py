"""A spec listing algorithms expands into one ordinary study per algorithm: same task, seed and
budget, one MLflow experiment, each algorithm's own search override."""

from __future__ import annotations

import pytest

from fedtune.errors import ConfigError
from fedtune.tuning.methods import expand_methods, is_methods_study
from fedtune.tuning.spec import StudySpec

BASE = {
    "name": "m",
    "task": {"name": "quadratic", "clients": 6, "dim": 3, "seed": 1},
    "train": {"rounds": 4, "clients_per_round": 3, "local_steps": 2, "batch_size": 2},
    "seed": 3,
    "search": {"strategy": "tpe", "override": {"client_lr": {"high": 0.05, "default": 0.01}}},
    "objective": {"last_rounds": 2},
    "budget": {"trials": 5, "max_concurrent": 1},
}


def test_each_algorithm_gets_its_study_with_the_same_task_seed_and_budget() -> None:
    doc = {
        **BASE,
        "algorithm": ["fedavg", {"name": "fedprox", "search": {"space": "fedprox"}}],
    }
    assert is_methods_study(doc) and not is_methods_study({**BASE, "algorithm": "fedavg"})
    fedavg, fedprox = expand_methods(doc)
    assert (fedavg["name"], fedavg["algorithm"]) == ("m-fedavg", "fedavg")
    assert (fedprox["name"], fedprox["algorithm"]) == ("m-fedprox", "fedprox")
    for one in (fedavg, fedprox):
        for key in ("task", "train", "seed", "budget", "objective"):
            assert one[key] == BASE[key]
        assert one["tracking"] == {"experiment": "m"}  # side by side in one experiment
    assert fedavg["search"] == BASE["search"]
    assert fedprox["search"] == {**BASE["search"], "space": "fedprox"}  # key by key
    assert "space" not in BASE["search"]  # the input is not changed
    for one in (fedavg, fedprox):  # each is an ordinary, valid study
        assert StudySpec.from_dict(one).algorithm == one["algorithm"]


def test_a_named_experiment_is_kept() -> None:
    doc = {**BASE, "algorithm": ["fedavg", "fedsgd"], "tracking": {"experiment": "mine"}}
    assert {d["tracking"]["experiment"] for d in expand_methods(doc)} == {"mine"}


@pytest.mark.parametrize(
    ("algorithms", "field"),
    [
        (["fedavg"], "algorithm"),
        (["fedavg", "fedavg"], "algorithm"),
        (["fedavg", 3], "algorithm[1]"),
        (["fedavg", {"name": "fedprox", "hparams": {}}], "algorithm[1].hparams"),
        (["fedavg", {"name": "fedprox", "search": "fedprox"}], "algorithm[1].search"),
        (["fedavg", {"search": {}}], "algorithm[1].name"),
    ],
)
def test_malformed_lists_name_the_field(algorithms: list, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        expand_methods({**BASE, "algorithm": algorithms})
    assert err.value.field == field
