"""A pack's local steps recorded once per shape and replayed: CUDA graphs on a GPU.

On a GPU the host bounds a pack's round: the local steps issue the same few hundred kernels
round after round, each through vmap, autograd and the dispatcher, while the device idles
(docs/explanation/packing.md, "CUDA graphs"). :class:`ReplayedCalls` records a call once per
shape of its arguments and replays the recording afterwards: its tensor arguments are copied
into the recording's own input buffers, the recording is replayed, and its outputs are cloned
(so that a second replay, in the same round, cannot overwrite what the first one returned).

How a call is recorded is a :data:`Capture`; :func:`cuda_capture` records a CUDA graph
(``torch.cuda.CUDAGraph``), after warm-up calls on a side stream, as capture requires. The
replay runs the recorded kernels on the recorded buffers, so its numbers are those of the call
it recorded: exactness does not change. A recording that fails (an operation a graph cannot
hold) turns the recorder off, with one logged line, and every later call runs as it is.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["GRAPHS_KEPT", "Capture", "ReplayedCalls", "capture_for", "cuda_capture"]

log = logging.getLogger(__name__)

#: a capture records ``run`` (a call on fixed input buffers) and gives its replay (which
#: rewrites the outputs the recording gave) and those outputs
Capture = Callable[[Callable[[], Any]], tuple[Callable[[], None], Any]]

#: recordings kept per recorder, the least recently used dropped first (a pack whose members
#: leave or join changes shape; each CUDA graph holds its own memory pool)
GRAPHS_KEPT = 2
#: calls on a side stream before a CUDA graph is captured (cuBLAS handles, autograd's threads)
WARMUP_CALLS = 2


def cuda_capture(run: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
    """Record ``run`` as a CUDA graph.

    Args:
        run: The call, reading only its fixed input buffers.

    Returns:
        The graph's replay and the outputs of the captured call (the buffers a replay writes).
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run()
    return graph.replay, outputs


def capture_for(device: torch.device, fixed_data: bool, wanted: bool = True) -> Capture | None:
    """How a pack's local steps are recorded on ``device``.

    Args:
        device: Where the pack computes.
        fixed_data: Whether every round reads the same data tensors (data in memory; a lazy
            store's cohorts are new tensors every round, so a graph would never be replayed).
        wanted: Whether the pack records at all (``PackedTrainer(..., graphs=False)``: no).

    Returns:
        :func:`cuda_capture` on a GPU with fixed data; None (no recording) otherwise: a CPU pack
        is bound by its arithmetic, not by the host.
    """
    return cuda_capture if wanted and device.type == "cuda" and fixed_data else None


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.dtype, value.device)
    return value


def _identity(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.data_ptr(), *_signature(value))
    return value


@dataclass
class _Recording:
    inputs: list[Any]  # the buffers each call's tensors are copied into (None: not a tensor)
    replay: Callable[[], None]
    outputs: Any


class ReplayedCalls:
    """A function of tensors recorded once per shape of its arguments and replayed.

    ``calls(copied, fixed)`` gives ``fn(*copied, *fixed)``. ``copied`` is a tuple of
    arguments (pytrees of tensors, None or numbers) whose values change from call to call: a
    recording has its own buffers for them, into which each call's tensors are copied.
    ``fixed`` are tensors read where they are (a pack's data): a recording holds them and is
    used only with the same tensors (the same memory, shape and strides).

    Args:
        fn: The function; it must not read anything else that changes between calls, nor
            write its arguments.
        capture: How a call is recorded (:func:`cuda_capture`).
        kept: Recordings kept (:data:`GRAPHS_KEPT`).
    """

    def __init__(self, fn: Callable[..., Any], capture: Capture, kept: int = GRAPHS_KEPT) -> None:
        self._fn, self._capture, self._kept = fn, capture, kept
        self._recordings: OrderedDict[Any, _Recording] = OrderedDict()
        #: why recording was turned off (None: it is on)
        self.failed: str | None = None
        #: how many calls were recorded (each one a capture)
        self.recorded = 0

    def __call__(self, copied: tuple[Any, ...], fixed: tuple[torch.Tensor, ...]) -> Any:
        """``fn(*copied, *fixed)``, by a replay where the recorder is on.

        Args:
            copied: The arguments whose values are copied into a recording's buffers.
            fixed: The arguments a recording reads where they are.

        Returns:
            The function's outputs (fresh tensors, not the recording's buffers).
        """
        if self.failed is not None:
            return self._fn(*copied, *fixed)
        leaves, spec = pytree.tree_flatten(copied)
        key = (spec, tuple(map(_signature, leaves)), tuple(map(_identity, fixed)))
        recording = self._recordings.get(key)
        if recording is None:
            recording = self._record(leaves, spec, fixed)
            if recording is None:
                return self._fn(*copied, *fixed)
            self._recordings[key] = recording
            if len(self._recordings) > self._kept:
                self._recordings.popitem(last=False)
        else:
            self._recordings.move_to_end(key)
            for buffer, value in zip(recording.inputs, leaves, strict=True):
                if buffer is not None:
                    buffer.copy_(value)
        recording.replay()
        return pytree.tree_map(torch.clone, recording.outputs)

    def _record(self, leaves: list[Any], spec: Any, fixed: tuple[torch.Tensor, ...]):
        inputs = [v.clone() if isinstance(v, torch.Tensor) else None for v in leaves]
        args = pytree.tree_unflatten(
            [v if b is None else b for v, b in zip(leaves, inputs, strict=True)], spec
        )
        try:
            replay, outputs = self._capture(lambda: self._fn(*args, *fixed))
        except RuntimeError as exc:
            self.failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._recordings.clear()
            log.warning("the pack's local steps run without graphs: %s", self.failed)
            return None
        self.recorded += 1
        return _Recording(inputs, replay, outputs)
