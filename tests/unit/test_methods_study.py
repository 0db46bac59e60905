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


class _Process:
    """A stand-in :class:`~fedtune.tuning.mlflow.process.TrackerProcess` that counts closes."""

    started = 0

    def __init__(self) -> None:
        type(self).started += 1
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_a_study_of_methods_begins_one_mlflow_process_for_its_studies(
    tmp_path, monkeypatch
) -> None:
    import argparse

    from fedtune.cli import study_of_methods
    from fedtune.tuning.mlflow import process

    monkeypatch.setattr(process, "TrackerProcess", _Process)
    documents = expand_methods({**BASE, "algorithm": ["fedavg", "fedsgd"]})

    def args(**given):
        base = {"workdir": str(tmp_path), "trials": None, "ray": False}
        return argparse.Namespace(**{**base, **given})

    workdirs = [tmp_path / d["algorithm"] for d in documents]

    def begun(given: argparse.Namespace):
        return study_of_methods._tracker_process(given, documents, workdirs)

    _Process.started = 0
    assert isinstance(begun(args()), _Process)
    assert begun(args(ray=True)) is None  # Ray's trials
    for workdir in workdirs:  # stored studies: a re-run of finished ones reads their summaries
        workdir.mkdir()
        (workdir / "optuna.db").touch()
    assert begun(args()) is None
    assert isinstance(begun(args(trials=9)), _Process)
    assert _Process.started == 2  # one per run of the whole study of methods, not per study


@pytest.mark.parametrize("in_process", [True, False])
def test_a_study_given_a_kept_mlflow_process_leaves_it_to_its_caller(in_process: bool) -> None:
    import types

    from fedtune.tuning.driver.study import _tracker_process

    plan = types.SimpleNamespace(in_process=in_process)
    given = _Process()
    with _tracker_process(plan, given, keep=True) as used:
        assert used is (given if in_process else None)
    assert given.closed == 0  # the next study of the study of methods opens its store in it
    with _tracker_process(plan, given) as used:
        pass
    assert given.closed == 1  # not kept: closed, as fedtune tune's one study has it
