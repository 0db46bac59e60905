"""``train.eval_population``: the population loss of an evaluation round over every client
(default, unchanged), over a seeded sample E_t of S clients, or off.

E_t is a function of the data seed and the round only, so every hyperparameter setting (and
trial seed) of a study is evaluated on the same clients; its loss is the mean of the sampled
clients' f_i, read in bounded row windows (a file-backed store loads the sample, never the
population).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedtune.errors import ConfigError
from fedtune.trainers import Trainer, build_task, parse_trial_config, run_trial
from fedtune.trainers.evaluation import client_mean_losses, evaluation_clients, population_loss
from fedtune.trainers.tasks.lazy import CallableData

_TASK = {"name": "digits", "clients": 30, "dirichlet": 0.5, "model": "mlp", "seed": 0}


def _config(train: dict | None = None, client_lr: float = 0.1, seed: int = 1) -> dict:
    return {
        "task": dict(_TASK),
        "algorithm": "fedavg",
        "train": {
            "rounds": 4,
            "clients_per_round": 5,
            "local_steps": 3,
            "batch_size": 8,
            "eval_every": 2,
            "eval_batch_size": 16,
            "dtype": "float64",
            **(train or {}),
        },
        "hparams": {"client_lr": client_lr, "server_lr": 1.0},
        "seed": seed,
    }


def _task():
    params = {k: v for k, v in _TASK.items() if k not in ("name", "seed")}
    return build_task("digits", params, _TASK["seed"])


def _lazy(task, chunk_rows: int | None):
    calls: list[int] = []

    def load(i: int):
        calls.append(i)
        c = task.train.client(i)
        return c.inputs.clone(), c.targets.clone()

    store = CallableData(task.train.counts.numpy(), load, task.train.client_ids)
    store.eval_chunk_rows = chunk_rows
    return dataclasses.replace(task, train=store), calls


@pytest.mark.parametrize(
    ("train", "field"),
    [
        ({"eval_population": "sample"}, "train.eval_clients"),
        ({"eval_population": "sample", "eval_clients": 0}, "train.eval_clients"),
        ({"eval_clients": 5}, "train.eval_clients"),
        ({"eval_population": "off", "eval_clients": 5}, "train.eval_clients"),
        ({"eval_population": "some"}, "train.eval_population"),
    ],
)
def test_bad_eval_population_names_the_field(train, field):
    with pytest.raises(ConfigError) as err:
        parse_trial_config(_config(train))
    assert err.value.field == field


def test_full_is_the_default_and_records_the_population():
    result = run_trial(_config(), task=_task())
    evals = [r for r in result.records if r.train_loss is not None]
    assert [r.round for r in evals] == [1, 2, 4]
    assert all(r.extra["eval_clients"] == 30 for r in evals)
    assert all("eval_clients" not in r.extra for r in result.records if r.train_loss is None)


def test_sample_depends_on_the_data_seed_and_round_only():
    a = evaluation_clients(0, 3, 1000, 50)
    assert torch.equal(a, evaluation_clients(0, 3, 1000, 50))
    assert not torch.equal(a, evaluation_clients(1, 3, 1000, 50))
    assert not torch.equal(a, evaluation_clients(0, 4, 1000, 50))
    assert len(set(a.tolist())) == 50 and torch.equal(a, a.sort().values)
    assert evaluation_clients(0, 3, 50, 50) is None  # S ≥ population: every client


def test_sample_is_the_same_for_every_hyperparameter_setting_and_trial_seed():
    seen = []
    for client_lr, seed in ((0.1, 1), (0.5, 1), (0.1, 7)):
        task, calls = _lazy(_task(), chunk_rows=32)
        trainer = Trainer(
            _config(
                {"eval_population": "sample", "eval_clients": 7, "eval_every": 100},
                client_lr,
                seed,
            ),
            task=task,
        )
        calls.clear()  # the model check at start-up reads a client
        trainer.step()  # round 1 trains its cohort, then evaluates E_0
        cohort = set(trainer._cohort(0).clients.tolist())
        seen.append((list(calls), trainer.records[0].train_loss is not None))
        evaluated = set(evaluation_clients(_TASK["seed"], 0, 30, 7).tolist())
        assert set(calls) == cohort | evaluated  # never the rest of the population
        assert trainer.records[0].extra["eval_clients"] == 7
    assert seen[0] == seen[1] == seen[2]


def test_sample_loss_is_the_mean_of_the_sampled_clients_losses():
    task = _task()
    trainer = Trainer(_config(), task=task)
    params, fn = trainer.state.params, trainer.per_example_loss
    clients = evaluation_clients(0, 0, 30, 9)
    want = float(client_mean_losses(fn, params, trainer.data, clients, 16).mean())
    got = population_loss(fn, params, trainer.data, 16, clients)
    assert got == pytest.approx(want, rel=1e-12)
    # every client listed: the full population loss, to the bit
    everyone = torch.arange(30)
    assert population_loss(fn, params, trainer.data, 16, everyone) == population_loss(
        fn, params, trainer.data, 16
    )


@pytest.mark.parametrize("chunk_rows", [16, 48, 10_000, None])
def test_sample_in_windows_equals_the_sample_at_once_in_float64(chunk_rows):
    task = _task()
    trainer = Trainer(_config(), task=task)
    params, fn = trainer.state.params, trainer.per_example_loss
    clients = evaluation_clients(0, 2, 30, 11)
    whole = population_loss(fn, params, trainer.data, 16, clients)
    lazy, calls = _lazy(task, chunk_rows)
    data = lazy.train.to("cpu", torch.float64)
    assert population_loss(fn, params, data, 16, clients) == whole
    assert set(calls) == set(clients.tolist())


def test_sample_of_the_whole_population_equals_full():
    full = run_trial(_config(), task=_task())
    same = run_trial(_config({"eval_population": "sample", "eval_clients": 30}), task=_task())
    assert [r.train_loss for r in full.records] == [r.train_loss for r in same.records]
    assert [r.client_loss for r in full.records] == [r.client_loss for r in same.records]


def test_off_keeps_training_test_metrics_and_the_objective():
    full = run_trial(_config(), task=_task())
    off = run_trial(_config({"eval_population": "off"}), task=_task())
    assert all(r.train_loss is None for r in off.records)
    assert [r.client_loss for r in off.records] == [r.client_loss for r in full.records]
    assert [r.test for r in off.records] == [r.test for r in full.records]
    assert [r.extra.get("eval_clients") for r in off.records] == [0.0, 0.0, None, 0.0]


def test_set_from_a_study_spec_and_the_train_cli(tmp_path, capsys):
    import copy
    import json
    from pathlib import Path

    import yaml

    from fedtune.cli import main
    from fedtune.tuning import StudySpec

    root = Path(__file__).resolve().parents[2]
    base = yaml.safe_load((root / "examples" / "quickstart.yaml").read_text())
    data = copy.deepcopy(base)
    data["train"].update(eval_population="sample", eval_clients=4)
    spec = StudySpec.from_dict(data)
    parsed = spec.trial({}, seed=0)
    assert (parsed.train.eval_population, parsed.train.eval_clients) == ("sample", 4)
    data["train"].update(eval_population="off")
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(data)
    assert "train.eval_clients" in str(err.value)

    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(_config({"rounds": 2})))
    sets = ["--set", "train.eval_population=sample", "--set", "train.eval_clients=3"]
    assert main(["train", str(path), "--json", *sets]) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    assert [r.get("eval_clients") for r in records] == [3.0, 3.0]
