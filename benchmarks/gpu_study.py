"""Real studies through Ray Tune, Optuna and MLflow on a GPU (``benchmarks/gpu_study.sh``).

Two studies of FedAvgM on the digits MLP (M = 10, K = 10, B = 16, 10 rounds; ``--trials`` TPE
trials, 8 by default, 4 at once), each with its own workdir and MLflow store, on an embedded Ray that sees the host's
GPUs:

* ``shared`` — ``resources: {gpu: 0.25}``: four trials share one GPU, unpacked;
* ``packed`` — ``resources: {gpu: 1, pack: auto}``: the configurations in packs sized by the
  GPU's memory (``fedtune/tuning/packing/memory.py``).

For each, from the outside: the trials finished, the most that ran at once (from Optuna's
start and end times), the device every MLflow child run records (its ``device`` tag), how the
study packed, and the wall time. It fails (exit 1) when a trial did not compute on CUDA, when the
shared study never ran 4 trials at once, or when a study did not finish every trial. Writes
``benchmarks/results/gpu_study.json``.

``--device cpu`` is the dry run a machine without a GPU can do: Ray gets one *logical* GPU, the
trials compute on the CPU (``train.device: cpu``) and the device expected is ``cpu``; ``pack:
auto`` then measures a pack on the CPU first and packs only where it pays
(``fedtune/tuning/packing/speed.py``).

Usage::

    python benchmarks/gpu_study.py [--device cuda] [--trials 8] [--out FILE]

(``tests/integration/test_gpu_study_script.py`` runs the dry run with ``--trials 4``: one wave
of four at once, the least that shows four sharing the GPU.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

RESULTS = Path(__file__).parent / "results"
CONCURRENT = 4


def study(
    name: str, resources: dict[str, Any], device: str, trials: int = 2 * CONCURRENT
) -> dict[str, Any]:
    """The study's spec (see the module docstring).

    Args:
        name: The study's name.
        resources: Its ``resources`` (GPU share, CPUs, pack).
        device: ``cuda``, or ``cpu`` for the dry run.
        trials: Its ``budget.trials`` (4 of them at once).

    Returns:
        The study document.
    """
    train = {"rounds": 10, "clients_per_round": 10, "local_steps": 10, "batch_size": 16}
    if device == "cpu":
        train["device"] = "cpu"  # the dry run: GPUs are logical, the arithmetic on the CPU
    return {
        "name": name,
        "task": {"name": "digits", "clients": 50, "dirichlet": 0.3, "model": "mlp", "seed": 0},
        "algorithm": "fedavgm",
        "train": {**train, "eval_every": 5},
        "search": {"space": "fedavgm", "strategy": "tpe"},
        "objective": {"metric": "train_loss", "last_rounds": 3},
        "sampler": {"seed": 0},
        "budget": {"trials": trials, "max_concurrent": CONCURRENT},
        "resources": resources,
    }


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals ``(start, end)`` that overlap at one time."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def run(
    name: str, resources: dict[str, Any], device: str, root: Path, trials: int = 2 * CONCURRENT
) -> dict[str, Any]:
    """Run one study of ``trials`` trials and read what it did from Optuna and MLflow."""
    import optuna
    from mlflow import MlflowClient

    from fedtune.tuning.driver.study import run_study
    from fedtune.tuning.spec import StudySpec

    spec = StudySpec.from_dict(study(name, resources, device, trials))
    start = time.perf_counter()
    result = run_study(spec, root / name)
    wall = time.perf_counter() - start
    ran = optuna.load_study(study_name=name, storage=result.storage_url).trials
    spans = [
        (t.datetime_start.timestamp(), t.datetime_complete.timestamp())
        for t in ran
        if t.datetime_start and t.datetime_complete
    ]
    client = MlflowClient(result.tracking_uri)
    runs = client.search_runs(
        [result.experiment_id], f"tags.`mlflow.parentRunId` = '{result.parent_run_id}'"
    )
    devices = sorted({r.data.tags.get("device", "none") for r in runs})
    return {
        "resources": resources,
        "trials": trials,
        "finished": result.finished,
        "counts": result.counts,
        "most_at_once": most_at_once(spans),
        "devices": devices,
        "runs": len(runs),
        "packing": result.packing,
        "best": result.best and result.best["values"],
        "wall_s": round(wall, 1),
        "startup_s": round(result.timings["startup_s"], 1),
    }


def problems(out: dict[str, Any], device: str) -> list[str]:
    """What the studies did not do (see the module docstring)."""
    found = []
    for name, row in out["studies"].items():
        if row["finished"] != row["trials"] or row["runs"] != row["trials"]:
            found.append(f"{name}: {row['finished']} trials finished, {row['runs']} runs")
        if not row["devices"] or any(not d.startswith(device) for d in row["devices"]):
            found.append(f"{name}: trials computed on {row['devices']}, not {device}")
    if out["studies"]["shared"]["most_at_once"] < CONCURRENT:
        found.append(f"shared: at most {out['studies']['shared']['most_at_once']} trials at once")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_study.json")
    parser.add_argument(
        "--trials",
        type=int,
        default=2 * CONCURRENT,
        help=f"trials per study, {CONCURRENT} at once (at least {CONCURRENT})",
    )
    args = parser.parse_args(argv)
    if args.trials < CONCURRENT:
        parser.error(f"--trials: at least {CONCURRENT}, the trials at once")
    import ray

    if args.device == "cpu":  # one logical GPU; fractions of a CPU so 4 trials fit 2 cores
        ray.init(num_gpus=1, include_dashboard=False)
        cpu = 0.25
    else:
        ray.init(include_dashboard=False)
        cpu = 1.0
    try:
        gpus = ray.cluster_resources().get("GPU", 0.0)
        with tempfile.TemporaryDirectory(prefix="gpu-study-") as tmp:
            studies = {
                "shared": run(
                    "shared", {"gpu": 0.25, "cpu": cpu}, args.device, Path(tmp), args.trials
                ),
                "packed": run(
                    "packed",
                    {"gpu": 1, "cpu": cpu, "pack": "auto"},
                    args.device,
                    Path(tmp),
                    args.trials,
                ),
            }
    finally:
        ray.shutdown()
    out = {
        "benchmark": "gpu_study",
        "device": args.device,
        "ray_gpus": gpus,
        "studies": studies,
        "environment": environment(),
        "command": "python benchmarks/gpu_study.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
    }
    out["problems"] = problems(out, args.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    for name, row in studies.items():
        print(f"{name}: {json.dumps(row, default=str)}")
    for line in out["problems"]:
        print(f"problem: {line}", file=sys.stderr)
    return 1 if out["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
