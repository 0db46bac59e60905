"""FederatedData: the in-memory store and a lazy (per-cohort) store are interchangeable.

The lazy store loads only the round's clients, evaluates the population in bounded windows, and
gives bit-identical float64 training curves to the in-memory store on the same data.
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from fedtune.trainers import Trainer, build_task, run_trial
from fedtune.trainers.evaluation import population_loss
from fedtune.trainers.tasks import FederatedData, InMemoryData
from fedtune.trainers.tasks.lazy import CallableData

_TASK = {"name": "digits", "clients": 30, "dirichlet": 0.5, "model": "mlp", "seed": 0}


def _config(algorithm: str, rounds: int = 5, eval_every: int = 2, server_lr=0.5) -> dict:
    return {
        "task": _TASK,
        "algorithm": algorithm,
        "train": {
            "rounds": rounds,
            "clients_per_round": 5,
            "local_steps": 3,
            "batch_size": 8,
            "eval_every": eval_every,
            "eval_batch_size": 16,
            "dtype": "float64",
        },
        "hparams": {"client_lr": 0.1, "server_lr": server_lr},
        "seed": 1,
    }


class Counting:
    """``load(i)`` over an in-memory store that remembers every client it returned."""

    def __init__(self, data: InMemoryData) -> None:
        self.data, self.calls = data, []

    def __call__(self, i: int):
        self.calls.append(i)
        c = self.data.client(i)
        return c.inputs.clone(), c.targets.clone()


def _lazy_task(chunk_rows: int | None = 40):
    params = {k: v for k, v in _TASK.items() if k not in ("name", "seed")}
    task = build_task("digits", params, _TASK["seed"])
    load = Counting(task.train)
    lazy = CallableData(task.train.counts.numpy(), load, task.train.client_ids)
    lazy.eval_chunk_rows = chunk_rows
    return task, dataclasses.replace(task, train=lazy), load


def _curve(result):
    return [
        (r.client_loss, r.train_loss, r.update_norm, sorted(r.test.items())) for r in result.records
    ]


@pytest.mark.parametrize(
    ("algorithm", "server_lr"), [("fedavg", 0.5), ("scaffold", 0.5), ("fedadam", 0.01)]
)
def test_lazy_and_in_memory_stores_give_bit_identical_curves(algorithm, server_lr):
    memory, lazy, _ = _lazy_task()
    a = run_trial(_config(algorithm, server_lr=server_lr), task=memory)
    b = run_trial(_config(algorithm, server_lr=server_lr), task=lazy)
    assert a.rounds_completed == 5 and _curve(a) == _curve(b)
    assert any(r.train_loss is not None for r in b.records)


def test_a_round_loads_only_its_cohort():
    _, lazy, load = _lazy_task()
    trainer = Trainer(_config("fedavg", rounds=3, eval_every=100), task=lazy)
    trainer.step()  # round 1 also evaluates the whole population (in windows)
    load.calls.clear()
    before = trainer.data.loaded
    trainer.step()  # round 2: no evaluation
    calls, loaded = list(load.calls), trainer.data.loaded - before
    cohort = trainer._cohort(1).clients.tolist()
    assert calls == cohort and len(cohort) == 5 and loaded == 5


def test_population_evaluation_in_windows_equals_the_whole_population():
    memory, lazy, load = _lazy_task()
    trainer = Trainer(_config("fedavg"), task=memory)
    params = trainer.state.params
    whole = population_loss(trainer.per_example_loss, params, trainer.data, 16)
    sizes = memory.train.counts
    assert int(sizes.max()) > 16  # some clients straddle a window edge
    for rows in (16, 48, 10_000):
        lazy.train.eval_chunk_rows = rows
        load.calls.clear()
        data = lazy.train.to("cpu", torch.float64)
        assert population_loss(trainer.per_example_loss, params, data, 16) == whole
        # each window loads only the clients overlapping it: the population once, plus
        # one extra load per client cut by a window edge
        assert len(load.calls) < memory.train.num_clients + memory.train.num_examples // rows + 1


def test_default_row_chunks_equal_the_in_memory_windows():
    data = FederatedData.from_clients(
        [
            (torch.arange(3 * n, dtype=torch.float64).reshape(n, 3), torch.ones(n))
            for n in (5, 1, 7, 2)
        ]
    )
    lazy = CallableData(data.counts, lambda i: (data.client(i).inputs, data.client(i).targets))
    for rows in (1, 4, 6, 100):
        ours = list(FederatedData.row_chunks(lazy, rows))
        ref = list(data.row_chunks(rows))
        assert len(ours) == len(ref)
        for got, want in zip(ours, ref, strict=True):
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_cohort_view_addresses_clients_by_global_index():
    data = FederatedData.from_clients(
        [(torch.full((n, 2), float(i)), torch.full((n,), i)) for i, n in enumerate((2, 3, 1, 4))]
    )
    lazy = CallableData(data.counts, lambda i: (data.client(i).inputs, data.client(i).targets))
    view = lazy.cohort([1, 3])
    assert view.num_examples == 7 and view.num_clients == 4
    for c in (1, 3):
        assert torch.equal(view.client(c).inputs, data.client(c).inputs)
    assert int(view.offsets[0]) == 7  # clients outside the cohort are not addressable


def test_lazy_store_metadata_and_pickling():
    data = FederatedData.from_clients(
        [(torch.ones(n, 1), torch.zeros(n)) for n in (2, 3)], ["a", "é"]
    )
    lazy = CallableData(data.counts, _ones, data.client_ids)
    assert lazy.num_clients == 2 and lazy.num_examples == 5 and list(lazy.client_ids) == ["a", "é"]
    back = pickle.loads(pickle.dumps(lazy.to("cpu", torch.float64)))
    assert back.cohort([1]).inputs.dtype == torch.float64 and back.client_ids[1] == "é"
    with pytest.raises(ValueError, match="at least one example"):
        CallableData([2, 0], _ones)


def _ones(i: int):
    n = (2, 3)[i]
    return torch.ones(n, 1), torch.zeros(n)
