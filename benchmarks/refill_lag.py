"""How many rounds after a member's end its place in a pack is refilled, through real Ray Tune.

A packed study (the quadratic, FedAvg, ``resources.pack`` P, ASHA stopping members) runs through
``run_study`` on an embedded Ray. Each pack's Ray Tune results (``result.json`` of its trial)
give, for every report, the pack's step (``round``) and the members that reported. A member's
join step is the step of its first report less the rounds in it; the members that ended in a
report at step r free their places, and the next members to join take them, in order. The lag
of a refill is its join step less r: 0 would be the simulation's "at the pack's next round"
(``search_sim``). A pack that ran out of members waits for its refills, so those count 0.

Writes ``benchmarks/results/refill_lag.json`` (median, mean, max and the histogram of lags)::

    python benchmarks/refill_lag.py [--pack 4] [--trials 24] [--rounds 30]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import environment

OUT = Path(__file__).resolve().parent / "results" / "refill_lag.json"


def study(pack: int, trials: int, rounds: int) -> dict:
    """The packed quadratic study: ASHA stops members, so their places are refilled."""
    return {
        "name": "refill-lag",
        "task": {"name": "quadratic", "clients": 10, "dim": 5, "seed": 0},
        "algorithm": "fedavg",
        "train": {
            "rounds": rounds,
            "clients_per_round": 5,
            "local_steps": 3,
            "batch_size": 4,
            "eval_every": rounds,
            "dtype": "float64",
        },
        "search": {
            "space": "fedavg",
            "override": {
                "client_lr": {"low": 0.001, "high": 0.3},
                "server_lr": {"low": 0.05, "high": 1.0},
            },
        },
        "objective": {"metric": "train_loss", "last_rounds": 3},
        "sampler": {"name": "random", "seed": 0},
        "scheduler": {"name": "asha", "grace_rounds": 2, "reduction_factor": 2},
        "budget": {"trials": trials, "max_concurrent": pack},
        "resources": {"pack": pack},
    }


def lags(results: list[dict]) -> list[int]:
    """Refill lags of one pack from its Tune results (module docstring).

    A member's place is freed at its last report (it ended then: completed, diverged, or
    stopped by the driver at that report). Refills take the freed places oldest first.
    """
    from fedtune.tuning.keys import HISTORY, ROUND, TRIAL_KEY
    from fedtune.tuning.trials.results import MEMBERS

    joined: dict[int, int] = {}
    last: dict[int, int] = {}
    for result in results:
        step = int(result[ROUND])
        for member in result.get(MEMBERS, ()):
            number = int(member[TRIAL_KEY])
            if number not in joined:
                rows = member.get(HISTORY, [])  # none: it diverged at its first round
                joined[number] = step - (int(rows[-1][ROUND]) if rows else 1)
            last[number] = step
    freed = sorted(last.values())
    out = []
    for join in sorted(j for j in joined.values() if j > 0):  # refills: the first joined at 0
        place = next((f for f in freed if f <= join), None)
        if place is not None:
            freed.remove(place)
            out.append(join - place)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", type=int, default=4)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    from fedtune.tuning.driver import fit as fit_module
    from fedtune.tuning.driver.study import run_study
    from fedtune.tuning.spec import StudySpec

    # Tune's own JSON logger (off in studies: Optuna and MLflow are the record) writes each
    # pack's results, with its step, to its trial directory: this measurement reads them
    fit_module._TUNE_ENV = {**fit_module._TUNE_ENV, "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "0"}

    spec = StudySpec.from_dict(study(args.pack, args.trials, args.rounds))
    with tempfile.TemporaryDirectory(prefix="refill-lag-") as root:
        workdir = Path(root) / "study"
        start = time.perf_counter()
        result = run_study(spec, workdir, progress=io.StringIO())
        wall = time.perf_counter() - start
        found: list[int] = []
        packs = 0
        for path in sorted(workdir.glob("ray_results/session-*/pack-*/result.json")):
            packs += 1
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            found += lags(rows)
    doc = {
        "benchmark": "refill_lag",
        "environment": environment(),
        "setting": {"pack": args.pack, "trials": args.trials, "rounds": args.rounds},
        "finished": result.finished,
        "packs": packs,
        "refills": len(found),
        "lag_rounds": {
            "median": statistics.median(found) if found else None,
            "mean": round(statistics.fmean(found), 3) if found else None,
            "max": max(found, default=None),
            "histogram": dict(sorted(Counter(found).items())),
        },
        "study_wall_s": round(wall, 1),
        "command": "python benchmarks/refill_lag.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["lag_rounds"]), "refills", len(found), "packs", packs)
    return doc


if __name__ == "__main__":
    main()
