"""The quick start at its own size: ``fedtune tune examples/quickstart.yaml`` against plain Ray
Tune + ``OptunaSearch`` running the same search with fedtune's engine.

The quick start (digits, FedAvgM, 16 configurations × 30 rounds, 2 at a time, γ, η and β) three
ways, interleaved, each a fresh process and folder, timed from launch to exit:

* **plain** — a ``python -c`` script (:data:`PLAIN`): ``ray.tune.Tuner`` with ``OptunaSearch``
  (TPE, seeded) over the same three parameters and ranges, ``num_samples = 16``,
  ``max_concurrent_trials = 2``, one CPU per trial, no scheduler; its function trainable builds
  the trial's configuration with fedtune's spec and trains it with fedtune's ``Trainer``,
  reporting the train loss of every evaluated round, as a user who wrote the orchestration by hand around
  fedtune's engine would. Then ``ray.shutdown()``.
* **fedtune_tpe** — ``fedtune tune examples/quickstart.yaml --set sampler.name=tpe --set
  scheduler.name=none``: the same search, every configuration trained to its last round (the
  same configuration-rounds as plain, up to diverged trials): the comparison of the goal;
* **fedtune** — ``fedtune tune examples/quickstart.yaml`` as a user runs it (``tpe_guard``, which
  stops trials that cannot catch up: fewer rounds), wherever its placement puts the trials (two
  configurations at once with ``pack: auto``: weighed by cost, ``docs/explanation/architecture.md``
  *placed by cost*);
* **fedtune_ray** — the same with ``--ray``: its trials as Ray Tune's trial processes, the path
  the quick start took before its placement was weighed by cost (the ratio
  ``fedtune / fedtune_ray`` is the quick start against that).

Per kind the median of ``total_s`` and of the configuration-rounds trained; the goal is
``fedtune_tpe ≤ 0.8 × plain``.

Usage: ``python benchmarks/quickstart_cost.py [--repeats 2] [--out PATH]`` (writes
``benchmarks/results/quickstart_cost.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
OUT = Path(__file__).resolve().parent / "results" / "quickstart_cost.json"
KINDS = ("plain", "fedtune_tpe", "fedtune", "fedtune_ray")
GOAL = 0.8

PLAIN = textwrap.dedent(
    """
    import json, math, sys
    spec_path, storage, out = sys.argv[1], sys.argv[2], sys.argv[3]

    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    def trainable(config):
        from fedtune.trainers import Trainer
        from fedtune.tuning.spec import StudySpec

        spec = StudySpec.from_file(spec_path)
        paths = {p.name: p.path for p in spec.search_space().drawn}
        trainer = Trainer(spec.trial({paths[k]: v for k, v in config.items()}))
        while not trainer.done:
            record = trainer.step()
            if record is None:  # diverged: the worst value, as fedtune records it
                tune.report({"train_loss": math.inf, "round": trainer.round})
                return
            if record.train_loss is not None:  # an evaluated round (every eval_every)
                tune.report({"train_loss": record.train_loss, "round": record.round})

    space = {
        "client_lr": tune.loguniform(1e-3, 1.0),
        "server_lr": tune.loguniform(1e-2, 10.0),
        "server_momentum": tune.uniform(0.0, 0.99),
    }
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            search_alg=OptunaSearch(metric="train_loss", mode="min", seed=0),
            num_samples=16,
            max_concurrent_trials=2,
        ),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    )
    results = tuner.fit()
    rounds = sum(int(r.metrics.get("round", 0)) for r in results)
    ray.shutdown()
    with open(out, "w") as fh:
        json.dump({"configuration_rounds": rounds, "trials": len(results)}, fh)
    """
)


def run(kind: str, scratch: Path, env: dict[str, str]) -> dict[str, Any]:
    """One fresh process of ``kind``, launch to exit, and the configuration-rounds it trained."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=scratch))
    out = run_dir / "out.json"
    if kind == "plain":
        cmd = [sys.executable, "-c", PLAIN, str(QUICKSTART), str(run_dir / "ray_results"), str(out)]
    else:
        script = Path(sys.executable).parent / "fedtune"
        cmd = [str(script), "tune", str(QUICKSTART), "--workdir", str(run_dir / "w"), "--json"]
        if kind == "fedtune_tpe":
            cmd += ["--set", "sampler.name=tpe", "--set", "scheduler.name=none"]
        if kind == "fedtune_ray":
            cmd += ["--ray"]
    load = os.getloadavg()[0]
    launch = time.time()
    proc = subprocess.run(cmd, env=env, cwd=run_dir, capture_output=True, text=True)
    total = time.time() - launch
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if kind == "plain":
        done = json.loads(out.read_text())
    else:
        result = json.loads(proc.stdout)
        done = {
            "configuration_rounds": result["configuration_rounds"],
            "trials": result["finished"],
        }
    return {"kind": kind, "total_s": total, "load_1min": round(load, 2), **done}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per kind and the ratios to plain."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        mine = [r for r in runs if r["kind"] == kind]
        if mine:
            out[kind] = {
                "runs": len(mine),
                "total_s_median": statistics.median(r["total_s"] for r in mine),
                "total_s_all": [round(r["total_s"], 2) for r in mine],
                "configuration_rounds": [r["configuration_rounds"] for r in mine],
            }
    if "plain" in out:
        plain = out["plain"]["total_s_median"]
        for kind in ("fedtune_tpe", "fedtune", "fedtune_ray"):
            if kind in out:
                out[kind]["ratio_over_plain"] = out[kind]["total_s_median"] / plain
    if {"fedtune", "fedtune_ray"} <= out.keys():
        pairs: dict[int, dict[str, float]] = {}
        for r in runs:
            pairs.setdefault(r["repeat"], {})[r["kind"]] = r["total_s"]
        ratios = [
            v["fedtune"] / v["fedtune_ray"]
            for v in pairs.values()
            if {"fedtune", "fedtune_ray"} <= v.keys()
        ]
        out["fedtune"]["ratio_over_fedtune_ray_pairs"] = [round(x, 3) for x in ratios]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    started = time.time()
    runs = []
    with tempfile.TemporaryDirectory(prefix="fedtune-quick-") as tmp:
        for rep in range(args.repeats):
            kinds = args.kinds if rep % 2 == 0 else list(reversed(args.kinds))
            for kind in kinds:
                r = run(kind, Path(tmp), env)
                r["repeat"] = rep
                runs.append(r)
                print(f"{kind:12s} {r['total_s']:.1f} s (load {r['load_1min']})", file=sys.stderr)
    summary = summarize(runs)
    tpe = summary.get("fedtune_tpe", {}).get("ratio_over_plain")
    report = {
        "benchmark": "quickstart_cost",
        "environment": environment(),
        "settings": {"repeats": args.repeats, "study": str(QUICKSTART.relative_to(ROOT))},
        "runs": runs,
        "summary": summary,
        "goal": {"ratio": GOAL, "met": tpe is not None and tpe <= GOAL},
        "wall_s": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"summary": summary, "goal": report["goal"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
