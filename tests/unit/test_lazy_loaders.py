"""Out-of-core loaders (``lazy: true``): the TFF HDF5 and LEAF JSON stores give the same
clients as the in-memory loaders, read only the clients asked for, and survive pickling and
``fork`` (the file handle is per process, never pickled)."""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from fedtune.errors import DataError
from fedtune.trainers import Trainer, run_trial
from fedtune.trainers.tasks import InMemoryData, build_task
from fedtune.trainers.tasks import hdf5 as hdf5_module
from fedtune.trainers.tasks.hdf5 import HDF5ClientData
from fedtune.trainers.tasks.leaf_store import LeafClientData
from tests.unit.test_loaders import (
    TEXT,
    _bytes,
    _char_user,
    _emnist,
    _femnist_user,
    _h5,
    _leaf_file,
    _stackoverflow,
)

RNG = np.random.default_rng(1)


def _emnist_file(tmp_path: Path, clients: int = 12) -> Path:
    sizes = RNG.integers(1, 9, clients)
    return _h5(tmp_path / "e.h5", {f"w{i:02d}": _emnist(int(n)) for i, n in enumerate(sizes)})


def _shakespeare_file(tmp_path: Path) -> Path:
    snippets = {"A": ["To be", (TEXT * 2)[:85]], "B": [TEXT[:30]], "D": [TEXT[5:9]]}
    path = _h5(tmp_path / "s.h5", {u: {"snippets": _bytes(s)} for u, s in snippets.items()})
    with h5py.File(path, "a") as f:  # a client without snippets is dropped
        f.create_dataset("examples/C/snippets", shape=(0,), dtype=h5py.string_dtype())
    return path


def _same_clients(lazy, memory: InMemoryData) -> None:
    assert list(lazy.client_ids) == list(memory.client_ids)
    assert torch.equal(lazy.client_sizes, memory.counts)
    view = lazy.cohort(range(lazy.num_clients))
    for c in range(memory.num_clients):
        got, want = view.client(c), memory.client(c)
        assert torch.equal(got.inputs, want.inputs) and torch.equal(got.targets, want.targets)


@pytest.mark.parametrize(
    ("task", "make", "extra"),
    [
        ("emnist", _emnist_file, {"max_clients": 10, "max_examples_per_client": 5}),
        ("shakespeare_tff", _shakespeare_file, {}),
        ("stackoverflow_tp", _stackoverflow, {"vocab_size": 2, "num_tags": 2}),
        ("stackoverflow_nwp", _stackoverflow, {"vocab_size": 3, "max_examples_per_client": 1}),
    ],
)
def test_hdf5_lazy_store_equals_in_memory_loader(tmp_path, task, make, extra):
    params = {"train_path": str(make(tmp_path)), **extra}
    memory = build_task(task, params, 0)
    lazy = build_task(task, {**params, "lazy": True}, 0)
    assert isinstance(lazy.train, HDF5ClientData) and isinstance(memory.train, InMemoryData)
    assert {k: v for k, v in lazy.meta.items()} == dict(memory.meta)
    _same_clients(lazy.train, memory.train)


def test_hdf5_lazy_store_reads_only_the_requested_clients(tmp_path, monkeypatch):
    task = build_task("emnist", {"train_path": str(_emnist_file(tmp_path)), "lazy": True}, 0)
    read: list[str] = []
    original = hdf5_module.read_client

    def counting(path, group, cid, features):
        read.append(cid)
        return original(path, group, cid, features)

    monkeypatch.setattr(hdf5_module, "read_client", counting)
    task.train.cohort([3, 7])
    assert read == ["w03", "w07"]


def _config(task_params: dict, rounds: int = 4, eval_every: int = 2) -> dict:
    return {
        "task": {"name": "emnist", **task_params},
        "algorithm": "fedavg",
        "train": {
            "rounds": rounds,
            "clients_per_round": 3,
            "local_steps": 2,
            "batch_size": 4,
            "eval_every": eval_every,
            "eval_batch_size": 8,
            "dtype": "float64",
        },
        "hparams": {"client_lr": 0.05, "server_lr": 1.0},
    }


def _emnist_params(tmp_path: Path, **more) -> dict:
    return {"train_path": str(_emnist_file(tmp_path)), "model": "linear", **more}


def test_hdf5_lazy_training_is_bit_identical_and_reads_only_the_cohort(tmp_path, monkeypatch):
    params = _emnist_params(tmp_path)
    memory = run_trial(_config(params))
    lazy_cfg = _config({**params, "lazy": True})
    lazy = run_trial(lazy_cfg)
    curve = [(r.client_loss, r.train_loss, r.update_norm) for r in memory.records]
    assert len(curve) == 4 and curve == [
        (r.client_loss, r.train_loss, r.update_norm) for r in lazy.records
    ]

    trainer = Trainer({**lazy_cfg, "train": {**lazy_cfg["train"], "eval_every": 100}})
    trainer.step()  # round 1 evaluates the population
    read: list[str] = []
    original = hdf5_module.read_client
    monkeypatch.setattr(
        hdf5_module, "read_client", lambda p, g, cid, f: read.append(cid) or original(p, g, cid, f)
    )
    trainer.step()  # round 2: no evaluation, so only the cohort is read
    calls = list(read)
    cohort = [trainer.data.client_ids[c] for c in trainer._cohort(1).clients.tolist()]
    assert calls == cohort and len(cohort) == 3


def _cohort_sum(store) -> float:
    return float(store.cohort([0, 2]).inputs.sum())


def test_hdf5_store_pickles_without_its_handle_and_reopens_after_fork(tmp_path):
    store = build_task("emnist", _emnist_params(tmp_path, lazy=True), 0).train
    expected = _cohort_sum(store)  # opens the handle in this process
    assert store._handle is not None
    clone = pickle.loads(pickle.dumps(store))
    assert clone._handle is None and _cohort_sum(clone) == expected
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_cohort_sum, (store,)) == expected


def test_hdf5_lazy_reports_a_malformed_client_when_it_is_read(tmp_path):
    bad = _emnist(3) | {"label": np.array([0, 70, 1])}
    path = _h5(tmp_path / "b.h5", {"a": _emnist(2), "b": bad})
    store = build_task("emnist", {"train_path": str(path), "lazy": True}, 0).train
    assert store.num_clients == 2 and store.cohort([0]).num_examples == 2
    with pytest.raises(DataError, match="'b'"):
        store.cohort([1])


# ---------------------------------------------------------------- LEAF JSON


@pytest.fixture
def leaf_dir(tmp_path: Path) -> Path:
    _leaf_file(tmp_path / "train" / "a.json", {"f_b": _femnist_user(4), "f_a": _femnist_user(3)})
    _leaf_file(tmp_path / "train" / "b.json", {"f_c": _femnist_user(5), "f_é": _femnist_user(2)})
    _leaf_file(tmp_path / "train" / "c.json", {"f_0": ([], [])})
    return tmp_path


def test_leaf_lazy_store_equals_in_memory_loader(leaf_dir):
    memory = build_task("femnist", {"path": str(leaf_dir)}, 0)
    lazy = build_task("femnist", {"path": str(leaf_dir), "lazy": True}, 0)
    assert isinstance(lazy.train, LeafClientData)
    _same_clients(lazy.train, memory.train)
    assert list(lazy.train.client_ids) == ["f_a", "f_b", "f_c", "f_é"]
    back = pickle.loads(pickle.dumps(lazy.train))
    assert torch.equal(back.cohort([3]).inputs, memory.train.client(3).inputs)


def test_leaf_lazy_shakespeare_equals_in_memory(tmp_path):
    _leaf_file(
        tmp_path / "train" / "x.json", {"ROMEO": _char_user(0, 3), "JULIET": _char_user(1, 2)}
    )
    memory = build_task("shakespeare", {"path": str(tmp_path)}, 0)
    lazy = build_task("shakespeare", {"path": str(tmp_path), "lazy": True}, 0)
    _same_clients(lazy.train, memory.train)


def test_leaf_lazy_store_reads_only_the_requested_users(leaf_dir, monkeypatch):
    lazy = build_task("femnist", {"path": str(leaf_dir), "lazy": True}, 0).train
    opened: list[str] = []
    real_open = open

    def counting_open(file, *args, **kwargs):
        opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    view = lazy.cohort([2])  # f_c, in b.json
    assert opened == ["b.json"] and view.num_examples == 5


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (
            '{"users": ["u"], "num_samples": [2], "user_data": {"u": {"x": [[1]], "y": [1]}}}',
            "num_samples says 2",
        ),
        (
            '{"users": ["u"], "user_data": {"u": {"x": [[1]], "y": [1, 2]}}}',
            "1 inputs but 2 labels",
        ),
        ('{"users": ["u"]}', "missing key 'user_data'"),
        ('{"users": ["u"], "user_data": {"u": {"x": [[1]], "y": [1]}', "cannot read as JSON"),
        ('{"users": ["u"], "user_data": {"u": {"x": [[1]], "y": [1]} "v": 1}}', "at character"),
    ],
)
def test_leaf_lazy_index_rejects_malformed_files(tmp_path, content, needle):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "bad.json").write_text(content)
    with pytest.raises(DataError, match=needle) as err:
        build_task("femnist", {"path": str(tmp_path), "lazy": True}, 0)
    assert "bad.json" in str(err.value)
