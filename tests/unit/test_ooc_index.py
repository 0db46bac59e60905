"""The out-of-core index pass keeps per-client metadata in compact numpy arrays, and the
population evaluation's batches are written into one output (bit-identical to concatenating)."""

from __future__ import annotations

import h5py
import numpy as np
import torch

from fedtune.trainers.evaluation import _per_example
from fedtune.trainers.tasks.hdf5 import HDF5ClientData, sorted_names
from fedtune.trainers.tasks.lazy import release_freed_memory


def _write(path, names, posts=2):
    with h5py.File(path, "w") as f:
        for name in names:
            f.create_dataset(
                f"examples/{name}/tokens",
                data=np.array([b"a b c"] * posts, dtype=object),
                dtype=h5py.string_dtype(),
            )


def test_sorted_names_is_pythons_order_as_one_bytes_array(tmp_path):
    names = ["b", "a10", "a9", "Z", "é", "ab", "a", "zz_long_name_0001", "日本"]
    _write(tmp_path / "f.h5", names)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        for block in (1, 2, 4, 100):
            got = sorted_names(f["examples"], block=block)
            assert isinstance(got, np.ndarray) and got.dtype.kind == "S"
            assert [g.decode() for g in got.tolist()] == sorted(names)


def test_index_keeps_numpy_arrays_not_python_lists(tmp_path):
    _write(tmp_path / "f.h5", [f"{i:05d}" for i in range(50)], posts=3)
    store = HDF5ClientData.index(
        tmp_path / "f.h5",
        ("tokens",),
        40,
        None,
        None,
        lambda _: lambda path, cid, raw: (np.zeros((len(raw["tokens"]), 1)), np.zeros(1)),
        True,
    )
    assert store.num_clients == 40 and store.client_ids[39] == "00039"
    assert isinstance(store.client_ids._ids, np.ndarray)  # ~8 bytes per client, no str objects
    assert store.client_sizes.dtype == torch.int64 and int(store.client_sizes.sum()) == 120
    assert not any(isinstance(v, list) for v in vars(store).values())
    release_freed_memory()  # a no-op where the C library has no malloc_trim


def test_batches_written_into_one_output_equal_the_concatenation():
    torch.manual_seed(0)
    x, y = torch.randn(1000, 3, dtype=torch.float64), torch.randn(1000, dtype=torch.float64)
    w = torch.randn(3, dtype=torch.float64)

    def fn(params, a, b):
        return (a @ params - b) ** 2

    for bs in (1, 7, 64, 1000, 5000):
        want = torch.cat([fn(w, x[i : i + bs], y[i : i + bs]) for i in range(0, 1000, bs)])
        assert torch.equal(_per_example(fn, w, x, y, bs), want)
    assert _per_example(fn, w, x[:0], y[:0], 8).numel() == 0
