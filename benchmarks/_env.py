"""Machine and version facts written into every benchmark's JSON."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path


def environment() -> dict:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        **cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "versions": {
            n: version(n) for n in ("fedtune", "torch", "numpy", "ray", "optuna", "mlflow")
        },
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover
        pass
    return info


#: the vector and matrix extensions behind a CPU's fp32 rate (two machines of the same kind,
#: both "Intel Xeon Processor" with 2 cores, ran the MLP's batched products at 62-72 and at
#: 96-131 GFLOP/s: docs/explanation/packing.md)
_ISA = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu_model() -> dict:
    """The CPU's model name and which of :data:`_ISA` it has, from ``/proc/cpuinfo`` (Linux;
    nothing elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines())
    )
    flags = set(fields.get("flags", "").split())
    return {"cpu_model": fields.get("model name"), "cpu_isa": [f for f in _ISA if f in flags]}


def memory_mib(pid: int | str = "self") -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of a process in MiB, from *one* read of ``/proc/<pid>/status``
    (the kernel reports them together, so the peak is never below the current size, as it
    could be with two reads while the process grows).

    Args:
        pid: The process (``self``: this one).

    Returns:
        The fields found, by name (none for a process without memory, e.g. a zombie).

    Raises:
        OSError: The process is gone.
    """
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def sync(device: str) -> None:
    """Wait for the device's queued work (a CUDA device; nothing to wait for on a CPU).

    Args:
        device: ``cpu``, ``cuda`` or ``cuda:N``.
    """
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def write_report(out: str | Path, body: dict, started: float, script: str, argv: list[str]) -> None:
    """Write a benchmark's JSON: ``body`` with the machine, the wall time, the command and the
    date, then say where.

    Args:
        out: The JSON file.
        body: The benchmark's own fields (``benchmark`` first).
        started: ``time.time()`` when the measurement began.
        script: The script's path in the repository (``benchmarks/<name>.py``).
        argv: Its arguments.
    """
    import json
    import time

    report = {
        **body,
        "environment": environment(),
        "wall_s": round(time.time() - started, 1),
        "command": " ".join(["python", script, *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    Path(out).write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
