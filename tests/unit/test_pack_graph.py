"""A pack's local steps recorded once per shape and replayed (fedtune.trainers.pack_graph).

A CUDA graph needs a GPU (tests/unit/test_packed_cuda.py); here the recording is a CPU stand-in
that keeps the contract of :func:`~fedtune.trainers.pack_graph.cuda_capture`: the replay
recomputes the recorded call on the recording's own input buffers and writes the outputs it
first gave. What these tests check is the bookkeeping around a graph — each call's values
copied in, the right recording for each shape and data, fresh outputs, the fallback.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils import _pytree as pytree

from fedtune.trainers.pack_graph import ReplayedCalls, cuda_capture
from fedtune.trainers.packed import PackedTrainer
from fedtune.trainers.records import Outcome
from fedtune.trainers.tasks.lazy import CallableData
from tests.unit.test_packed_exactness import digits, variants


class CpuReplay:
    """A capture on the CPU: the replay reruns the recorded call and writes its outputs."""

    def __init__(self) -> None:
        self.captures = self.replays = 0

    def __call__(self, run):
        self.captures += 1
        outputs = run()

        def replay() -> None:
            self.replays += 1
            for buffer, value in zip(
                pytree.tree_leaves(outputs), pytree.tree_leaves(run()), strict=True
            ):
                buffer.copy_(value)

        return replay, outputs


def affine(a: dict, scale: torch.Tensor, shift: torch.Tensor | None, data: torch.Tensor):
    out = {k: v * scale + data.sum() for k, v in a.items()}
    return out if shift is None else {k: v + shift for k, v in out.items()}


def test_a_replayed_call_gives_each_calls_values():
    capture = CpuReplay()
    calls = ReplayedCalls(affine, capture)
    data = torch.arange(4.0)
    for j in range(4):
        a = {"w": torch.randn(3, 2, generator=torch.Generator().manual_seed(j))}
        scale = torch.tensor(float(j + 1))
        got = calls((a, scale, None), (data,))
        assert torch.equal(got["w"], affine(a, scale, None, data)["w"])
    assert calls.recorded == 1 and capture.captures == 1 and capture.replays == 4


def test_outputs_are_fresh_and_shapes_data_and_none_pick_the_recording():
    capture = CpuReplay()
    calls = ReplayedCalls(affine, capture, kept=8)
    data, other = torch.arange(4.0), torch.arange(4.0) + 1
    a = {"w": torch.ones(2)}
    first = calls((a, torch.tensor(2.0), None), (data,))
    second = calls((a, torch.tensor(3.0), None), (data,))  # a replay does not touch `first`
    assert torch.equal(first["w"], torch.full((2,), 8.0))
    assert torch.equal(second["w"], torch.full((2,), 9.0))
    assert calls.recorded == 1
    got = calls((a, torch.tensor(2.0), None), (other,))  # other data of the same shape
    assert torch.equal(got["w"], torch.full((2,), 12.0))
    calls((a, torch.tensor(2.0), torch.tensor(1.0)), (data,))  # a tensor where None was
    calls(({"w": torch.ones(3)}, torch.tensor(2.0), None), (data,))  # another shape
    assert calls.recorded == 4
    again = calls((a, torch.tensor(1.0), None), (data,))  # the first recording, still kept
    assert torch.equal(again["w"], torch.full((2,), 7.0)) and calls.recorded == 4


def test_recordings_are_kept_up_to_the_limit():
    calls = ReplayedCalls(affine, CpuReplay(), kept=2)
    data = torch.zeros(1)
    shapes = [1, 2, 3, 2, 1]  # 1 is dropped when 3 is recorded; 2 is still kept
    for n in shapes:
        calls(({"w": torch.ones(n)}, torch.tensor(1.0), None), (data,))
    assert calls.recorded == 4


def test_a_recording_that_fails_turns_the_recorder_off_with_one_line(caplog):
    def refuses(run):
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors")

    calls = ReplayedCalls(affine, refuses)
    a, data = {"w": torch.ones(2)}, torch.arange(3.0)
    with caplog.at_level(logging.WARNING, logger="fedtune.trainers.pack_graph"):
        got = calls((a, torch.tensor(3.0), None), (data,))
        again = calls((a, torch.tensor(4.0), None), (data,))
    assert torch.equal(got["w"], torch.full((2,), 6.0))
    assert torch.equal(again["w"], torch.full((2,), 7.0))
    assert calls.failed == "operation not permitted when stream is capturing"
    assert calls.recorded == 0
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["the pack's local steps run without graphs: " + calls.failed]


def fixed_k(configs: list[dict], k: int = 3) -> list[dict]:
    """The configurations with K local steps each (no step mask)."""
    out = []
    for cfg in configs:
        train = {key: v for key, v in cfg["train"].items() if key != "local_epochs"}
        out.append({**cfg, "train": {**train, "local_steps": k}})
    return out


#: (recipe, how its members' local steps differ): the same K (no step mask), different K, or
#: local epochs over clients of different sizes
STEP_CASES = [
    ("fedavgm", "equal"),
    ("fedprox", "equal"),
    ("fedadam", "equal"),
    ("fedavgm", "K"),
    ("fedprox", "K"),
    ("fedavg", "epochs"),
]


def step_configs(name: str, steps: str) -> list[dict]:
    """``variants(name)`` for a case of :data:`STEP_CASES`, member 1 set to diverge."""
    configs = fixed_k(variants(name)) if steps == "equal" else variants(name, steps == "epochs")
    configs[1]["hparams"] = {**configs[1]["hparams"], "client_lr": 5.0, "server_lr": 5.0}
    configs[1]["train"] = {**configs[1]["train"], "divergence_factor": 2.0}
    return configs


def same_records(a, b) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        x, y = ra.as_dict(), rb.as_dict()
        x.pop("wall_time")
        y.pop("wall_time")
        assert x == y, ra.round


def replaying(monkeypatch) -> CpuReplay:
    capture = CpuReplay()
    monkeypatch.setattr(PackedTrainer, "_capture", lambda self: capture)
    return capture


@pytest.mark.parametrize(("name", "steps"), STEP_CASES)
def test_a_replayed_pack_equals_the_pack_run_as_it_is(monkeypatch, name, steps):
    """Bit for bit, through a divergence (the pack shrinks: a new shape), with a proximal
    term (a copied argument that is None for the other recipes), and with a step mask (members
    of different K, or clients of different τ_i: every pair computes every step)."""
    configs = step_configs(name, steps)
    plain = PackedTrainer(configs, graphs=False)
    while not plain.done:
        plain.step()
    capture = replaying(monkeypatch)
    pack = PackedTrainer(configs)
    while not pack.done:
        pack.step()
    assert pack.result(1).outcome == Outcome.DIVERGED
    assert pack.step_graphs.recorded == capture.captures >= 2
    assert capture.replays > capture.captures
    for i in range(len(configs)):
        assert pack.result(i).outcome == plain.result(i).outcome
        same_records(pack.result(i).records, plain.result(i).records)


def test_a_replayed_pack_with_refills_and_staggered_members(monkeypatch):
    """Members at two round indices (one call with both groups' pairs) and a stop: each
    shape is recorded once, and every curve is the one of the pack run as it is."""
    configs = fixed_k([digits(j) for j in range(4)], k=2)

    def run(pack: PackedTrainer) -> PackedTrainer:
        pack.step()
        pack.add(configs[2])
        pack.step()
        pack.stop(0)
        pack.add(configs[3])
        while not pack.done:
            pack.step()
        return pack

    plain = run(PackedTrainer(configs[:2], graphs=False))
    capture = replaying(monkeypatch)
    pack = run(PackedTrainer(configs[:2]))
    assert capture.captures == pack.step_graphs.recorded >= 2
    assert capture.replays >= 5
    for i in range(4):
        same_records(pack.result(i).records, plain.result(i).records)


def test_a_pack_records_only_on_a_gpu_with_its_data_in_memory():
    pack = PackedTrainer(fixed_k(variants("fedavgm"))[:2])
    assert pack._capture() is None  # a CPU
    pack.step()
    assert pack.step_graphs is None
    pack.device = torch.device("cuda")  # what it would decide on a GPU (nothing runs there)
    assert pack._capture() is cuda_capture
    data = pack.data
    pack.data = CallableData(data.counts, lambda i: (data.client(i).inputs, data.client(i).targets))
    assert pack._capture() is None  # a lazy store: every cohort is new tensors
    pack.data, pack.graphs = data, False
    assert pack._capture() is None
