"""Keep a CPU pack's freed memory in its process instead of handing it back to the kernel.

A pack on a CPU allocates and frees tensors of several MiB at every local step (a chunk's
gradients, the step-0 state). glibc's ``malloc`` serves a block above its mmap threshold with a
fresh mapping and unmaps it when freed, and it trims a heap whose free top passes its trim
threshold; the next step's tensor of the same size then faults in every page on first touch
(docs/explanation/packing.md, "A CPU pack and its arithmetic ceiling"). :func:`keep_freed_memory`
raises both thresholds once per process with ``mallopt``, as the ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` variables would: freed blocks up to :data:`MMAP_THRESHOLD` are reused
by the next step. Nothing happens where the C library is not glibc, or where the process's
environment already sets either threshold.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

#: blocks up to this size come from the heap (glibc's largest mmap threshold on 64-bit)
MMAP_THRESHOLD = 32 * 2**20
#: the heap is trimmed only when this much of its top is free
TRIM_THRESHOLD = 2**30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once).

    Returns:
        Whether the thresholds are now raised by this function (False: not glibc, set by the
        environment, or ``mallopt`` refused).
    """
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        own = (
            os.environ.get("MALLOC_MMAP_THRESHOLD_")
            or os.environ.get("MALLOC_TRIM_THRESHOLD_")
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")
        )
        if not own:
            try:
                libc = ctypes.CDLL("libc.so.6")
                return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                )
            except (OSError, AttributeError):
                return False
    return False
