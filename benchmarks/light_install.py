"""The light install (``pip install fedtune``, no extras): its size and its start-up time.

The SDK (``fedtune.Client``) and the service-client verbs of the CLI (``submit``, ``status``,
``whoami``, ...) need only httpx, pydantic and PyYAML. This builds a fresh virtual environment
(``python3 -m venv``), installs the repository into it without extras (pip, from its configured
index) and measures:

* ``installed_mb`` — what the install added: the files of every distribution in the venv's
  site-packages but pip and setuptools (their RECORD), in MB (10^6 bytes), per distribution too;
* ``heavy_absent`` — that none of torch, Ray, MLflow, Optuna, SciPy, scikit-learn, matplotlib,
  h5py, NumPy is installed;
* start-up: the median wall time and CPU time (user + system; ``--repeats`` fresh processes
  each, interleaved) of ``python -c "import fedtune.client"``, ``python -c "import fedtune;
  fedtune.Client"``, ``fedtune --version`` and ``fedtune --help``, with ``python -c pass``
  (the interpreter alone) for reference. The load average before the runs is recorded: on a
  shared machine the wall time grows with the load, the CPU time hardly.

The goal: ≤ 25 MB installed and ≤ 0.3 s for the SDK's import and ``fedtune --version``.

Usage: ``python benchmarks/light_install.py [--repeats 11] [--venv DIR] [--out PATH]``
(writes ``benchmarks/results/light_install.json``). ``--venv DIR`` measures an existing light
install there instead of building one (one that ``build`` made).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "results" / "light_install.json"

#: distributions the light install must not bring
HEAVY = ("torch", "ray", "mlflow", "optuna", "scipy", "scikit-learn", "matplotlib", "h5py", "numpy")
#: what ``python3 -m venv`` puts there before the install
BASELINE = ("pip", "setuptools", "wheel")
GOAL = {"installed_mb": 25.0, "startup_s": 0.3}

#: run by the venv's own Python: {distribution: (version, bytes of its files)}
_SIZES = """
import json, os
from importlib import metadata
out = {}
for dist in metadata.distributions():
    total = 0
    for f in dist.files or []:
        path = f.locate()
        if os.path.isfile(path):
            total += os.path.getsize(path)
    out[dist.metadata["Name"]] = [dist.version, total]
print(json.dumps(out))
"""


def build(venv: Path, python: str = "python3", *, with_pip: bool = True) -> float:
    """Make a fresh venv at ``venv`` and install the repository into it without extras.

    Args:
        venv: the directory (must not exist).
        python: the interpreter that makes the venv.
        with_pip: ``False``: the venv gets no pip of its own (``--without-pip``), and this
            Python's pip installs into it (``pip --python``), for a venv that never runs pip.

    Returns:
        The seconds ``pip install`` took.
    """
    subprocess.run([python, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(venv)],
                   check=True)  # fmt: skip
    pip = (
        [str(venv / "bin" / "pip")]
        if with_pip
        else [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    )
    start = time.perf_counter()
    subprocess.run(
        [*pip, "install", "--quiet", "--disable-pip-version-check", str(ROOT)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def distributions(venv: Path) -> dict[str, tuple[str, int]]:
    """The venv's distributions.

    Args:
        venv: a virtual environment.

    Returns:
        ``{name: (version, bytes of its installed files)}``.
    """
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", _SIZES], check=True, capture_output=True, text=True
    )
    return {k: (v[0], v[1]) for k, v in json.loads(done.stdout).items()}


COMMANDS = {
    "python_pass": ["python", "-c", "pass"],
    "import_fedtune_client": ["python", "-c", "import fedtune.client"],
    "fedtune_Client": ["python", "-c", "import fedtune; fedtune.Client"],
    "fedtune_version": ["fedtune", "--version"],
    "fedtune_help": ["fedtune", "--help"],
}


def timings(venv: Path, repeats: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds of each of :data:`COMMANDS`, ``repeats`` fresh processes each, interleaved.

    Args:
        venv: the light install.
        repeats: processes per command.

    Returns:
        ``({command: [wall seconds, ...]}, {command: [CPU seconds (user + system), ...]})``:
        on a loaded machine the wall time grows with the load, the CPU time hardly.
    """
    wall: dict[str, list[float]] = {k: [] for k in COMMANDS}
    cpu: dict[str, list[float]] = {k: [] for k in COMMANDS}
    for _ in range(repeats):
        for name, (program, *argv) in COMMANDS.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(
                [str(venv / "bin" / program), *argv],
                check=True,
                stdout=subprocess.DEVNULL,
                cwd=tempfile.gettempdir(),
            )
            wall[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return wall, cpu


def measure(venv: Path, repeats: int) -> dict[str, Any]:
    """Size, absent distributions and start-up times of the light install at ``venv``.

    Args:
        venv: a virtual environment holding the light install.
        repeats: processes per timed command.

    Returns:
        The ``results`` part of the JSON.
    """
    dists = distributions(venv)
    added = {n: v for n, v in dists.items() if n.lower() not in BASELINE}
    installed = {name.lower() for name in dists}
    load = [round(x, 2) for x in os.getloadavg()]
    times, cpu = timings(venv, repeats)
    medians = {k: round(statistics.median(v), 4) for k, v in times.items()}
    cpu_medians = {k: round(statistics.median(v), 4) for k, v in cpu.items()}
    timed = ("import_fedtune_client", "fedtune_Client", "fedtune_version")
    size_mb = round(sum(b for _, b in added.values()) / 1e6, 2)
    return {
        "installed_mb": size_mb,
        "distributions": {
            n: {"version": v, "mb": round(b / 1e6, 3)} for n, (v, b) in sorted(added.items())
        },
        "heavy_absent": not any(h in installed for h in HEAVY),
        "median_s": medians,
        "median_cpu_s": cpu_medians,
        "runs_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "load_average_before": load,
        "goal_met": size_mb <= GOAL["installed_mb"]
        and max(medians[k] for k in timed) <= GOAL["startup_s"],
        "goal_met_cpu": size_mb <= GOAL["installed_mb"]
        and max(cpu_medians[k] for k in timed) <= GOAL["startup_s"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build (or take) the light install, measure it and write the JSON.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
        The document written to ``--out``.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=11, help="processes per timed command")
    p.add_argument("--venv", type=Path, help="measure this light install instead of building one")
    p.add_argument("--python", default="python3", help="the interpreter that makes the venv")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fedtune-light-") as tmp:
        venv, install_s = args.venv, None
        if venv is None:
            venv = Path(tmp) / "venv"
            install_s = round(build(venv, args.python), 1)
        results = measure(venv, args.repeats)
        python = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    doc = {
        "benchmark": "light_install",
        "environment": environment(),
        "settings": {
            "repeats": args.repeats,
            "venv_python": python,
            "pip_install_s": install_s,
            "command": "pip install <repo> (no extras) into a fresh python3 -m venv",
        },
        "goal": GOAL,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: results[k]
                for k in (
                    "installed_mb",
                    "median_s",
                    "median_cpu_s",
                    "load_average_before",
                    "heavy_absent",
                    "goal_met",
                    "goal_met_cpu",
                )
            },
            indent=2,
        )
    )
    return doc


if __name__ == "__main__":
    main()
