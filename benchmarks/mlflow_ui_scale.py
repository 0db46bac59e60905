"""A study's parent-run artifacts and the MLflow UI at 10 / 100 / 1,000 trials.

Per size N, one study of N trials with its real stores (Optuna SQLite storage, MLflow SQLite
store, artifacts under the workdir), made one of two ways (``"how"`` in the JSON):

* ``real`` — ``fedtune tune`` (the installed script) on a near-free quadratic study
  (:data:`STUDY`: 1 client, d = 1, 2 rounds, random sampler, ``max_concurrent`` 2): Ray Tune,
  the searcher, the MLflow callback, the end of the study, all as a user runs them;
* ``synthetic`` — the same stores without Ray (:func:`synthetic_study`): the study's stores
  (``fedtune.tuning.driver.study._open_stores`` and ``_open_tracking``: Optuna study, MLflow
  experiment and parent run), then per trial what the searcher and the MLflow callback
  record — the Optuna trial asked from the study's space and told its value, its outcome,
  rounds and curve
  (:class:`~fedtune.tuning.optuna.store.StudyStore`), a child run through
  :class:`~fedtune.tuning.mlflow.tracking.StudyTracker` (``start_trial``, ``log_rounds``,
  ``end_trial``) — and the driver's own end of the study (``ending.finalize``: the trade-off
  analysis, ``tradeoff/*``, plots, ``best.json``, ``trials_table.json``, summary metrics).
  Curves follow a contraction ``ℓ_t = f + (1 − f)·|1 − γη|^{2t}`` of the sampled rates (a
  diverging one when ``|1 − γη| > 1.2``).

Measured per size: the bytes of every artifact of the parent run (``trials_table.json``,
``best.json``, ``tradeoff/*``, the spec files) and its rows; then a real ``mlflow server`` on a
free port (the study's store) and headless Chromium (``--dump-dom``, the flags of
``tests/e2e/test_mlflow_ui.py``) on the experiment's runs page as ``fedtune tune`` prints it
(the parent run) and sorted by run name (the trial runs, not folded under the parent): wall
time from Chromium's launch to its dumped DOM, and whether the DOM shows the runs (the parent's
name; trial names). ``--ui-repeats`` loads, medians. The REST call the page makes
(``runs/search``, 100 runs) is timed as well.

Usage: ``python benchmarks/mlflow_ui_scale.py [--sizes 10 100 1000] [--real-max 1000]
[--ui-repeats 3] [--workdir DIR] [--out PATH]`` (writes
``benchmarks/results/mlflow_ui_scale.json``). Sizes above ``--real-max`` are built
synthetically. With ``--workdir`` the studies are kept there and reused by the next run: make
them with ``--ui-repeats 0`` (not timed), then time the UI under the benchmark lock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests' server helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment
from _studies import free_study

from tests.chromium import CHROMIUM, HEADLESS
from tests.integration.conftest import mlflow_server_process

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "results" / "mlflow_ui_scale.json"
FLAGS = [*HEADLESS, "--virtual-time-budget=15000"]

STUDY = free_study("ui-scale", rounds=2, trials=10, sampler="random", max_concurrent=2)


def study_text(n: int) -> str:
    return free_study("ui-scale", rounds=2, trials=n, sampler="random", max_concurrent=2)


# -- making the study ------------------------------------------------------------------
def real_study(n: int, workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    """``fedtune tune`` on :data:`STUDY` with ``n`` trials; its ``--json`` result."""
    study = workdir.parent / f"{workdir.name}.yaml"
    study.write_text(study_text(n))
    script = Path(sys.executable).parent / "fedtune"
    head = [str(script)] if script.is_file() else [sys.executable, "-m", "fedtune.cli"]
    proc = subprocess.run(
        [*head, "tune", str(study), "--workdir", str(workdir), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"fedtune tune ({n} trials) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def synthetic_study(n: int, workdir: Path, child_runs: bool = True, seed: int = 0) -> Any:
    """The stores of an ``n``-trial study of :data:`STUDY` without Ray (module docstring);
    the driver's :class:`~fedtune.tuning.driver.study.StudyResult`. The Optuna trials are added in one
    batch (``add_trials``: no sampler pass over every earlier trial) with the attributes the
    searcher writes; ``child_runs`` False leaves the MLflow child runs out (only the parent's
    artifacts are wanted)."""
    import numpy as np
    import optuna
    import yaml

    from fedtune.search_spaces import suggest
    from fedtune.tuning.driver.ending import finalize
    from fedtune.tuning.driver.study import (
        Fitted,
        _open_stores,
        _open_tracking,
        _prepare,
    )
    from fedtune.tuning.optuna.store import CURVE_ATTR, OUTCOME_ATTR, RUN_ATTR
    from fedtune.tuning.spec import StudySpec

    spec = StudySpec.from_dict(yaml.safe_load(study_text(n)))
    workdir.mkdir(parents=True, exist_ok=True)
    plan, opened = _prepare(spec, workdir, None, time.perf_counter())
    stores = opened or _open_stores(plan)
    tracking = _open_tracking(stores, plan)
    tracker, study = tracking.tracker, stores.study
    first = study.ask()  # the space's distributions, as the searcher's trials have them
    params0 = suggest(first, plan.space)
    dists = first.distributions
    rounds = [1, 2]
    rng = np.random.default_rng(seed)
    tags = {"study": spec.name, "algorithm": spec.algorithm, "task": "quadratic"}
    made = []
    for i in range(n):
        params = (
            params0
            if i == 0
            else {
                k: float(np.exp(rng.uniform(np.log(d.low), np.log(d.high))))
                for k, d in dists.items()
            }
        )
        rate = abs(1.0 - params["hparams.client_lr"] * params["hparams.server_lr"])
        floor = 0.01 * params["hparams.client_lr"] * float(rng.uniform(0.5, 1.5))
        losses = [floor + (1.0 - floor) * rate ** (2 * r) for r in rounds]
        diverged = rate > 1.2
        outcome = "diverged" if diverged else "completed"
        value = math.inf if diverged else losses[-1]
        curve = {"rounds": rounds, "loss": [v if math.isfinite(v) else None for v in losses]}
        attrs = {OUTCOME_ATTR: outcome, "rounds": rounds[-1]}
        if child_runs:
            run = tracker.start_trial(tracking.parent, i, params, tags)
            rows = [
                {"round": r, "client_loss": v, "objective": v}
                for r, v in zip(rounds, losses, strict=True)
            ]
            tracker.log_rounds(run, rows)
            tracker.end_trial(
                run, "FINISHED", {"outcome": outcome}, {"objective": value}, step=rounds[-1]
            )
            attrs[RUN_ATTR] = run
        if i == 0:  # as the searcher records a trial
            stores.store.set_trial_attrs(0, **attrs)
            stores.store.set_curve(0, rounds, losses)
            study.tell(first, value)
            continue
        made.append(
            optuna.trial.create_trial(
                params=params,
                distributions=dists,
                value=value,
                user_attrs=attrs,
                system_attrs={CURVE_ATTR: curve},
            )
        )
    study.add_trials(made)
    return finalize(plan, Fitted(stores, tracking))


# -- measuring -------------------------------------------------------------------------
def artifact_sizes(root: Path) -> dict[str, int]:
    """Bytes of every file under the parent run's artifact folder, by relative path."""
    return {
        str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()
    }


def parent_artifacts(result: dict[str, Any]) -> Path:
    """The parent run's artifact folder (a local store's ``file:`` artifact location)."""
    from urllib.parse import unquote, urlparse

    from mlflow import MlflowClient

    uri = MlflowClient(result["tracking_uri"]).get_run(result["parent_run_id"]).info.artifact_uri
    return Path(unquote(urlparse(uri).path))


def unbounded_bytes(n: int, workdir: Path) -> dict[str, int]:
    """What the files that list every trial weigh for this study — fedtune before the bound
    wrote them so — beside the bounded ones, all encoded the same way here (JSON text
    of the trade-off; the table's columns and rows as JSON): the growth the bound removes."""
    import csv
    import io

    import yaml

    from fedtune.tuning.analysis.report import tradeoff_of
    from fedtune.tuning.optuna import search as og
    from fedtune.tuning.optuna.store import StudyStore
    from fedtune.tuning.optuna.trials_table import trials_table
    from fedtune.tuning.spec import StudySpec

    spec = StudySpec.from_dict(yaml.safe_load(study_text(n)))
    store = StudyStore.at(workdir, spec.name)
    space = spec.search_space()
    t = tradeoff_of(spec, og.study_curves(store, space))
    out: dict[str, int] = {}
    for label, top in (("every_trial", None), ("bounded", 50)):
        out[f"tradeoff.json_{label}"] = len(json.dumps(t.to_dict(top), indent=2).encode())
        buf = io.StringIO()
        rows = t.to_csv_rows(top)
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        out[f"tradeoff.csv_{label}"] = len(buf.getvalue().encode())
        table, _ = trials_table(store, t, space, top=top or 10**9)
        data = {
            "columns": list(table),
            "data": [list(r) for r in zip(*table.values(), strict=True)],
        }
        out[f"trials_table.json_{label}"] = len(json.dumps(data, default=str).encode())
    return out


def dom_text(dom: str) -> str:
    return re.sub(
        r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"(?s)<(script|style).*?</\1>", "", dom))
    )


def load_page(url: str, profile: Path) -> tuple[float, str]:
    """Headless Chromium's ``--dump-dom`` of ``url``: (seconds from launch to the DOM, text)."""
    shutil.rmtree(profile, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed on {url}:\n{proc.stderr[-2000:]}")
    return took, dom_text(proc.stdout)


def search_api(base: str, experiment_id: str) -> float:
    """Seconds of the runs search the runs page makes (100 runs)."""
    body = json.dumps(
        {
            "experiment_ids": [experiment_id],
            "max_results": 100,
            "order_by": ["attributes.start_time DESC"],
        }
    ).encode()
    request = urllib.request.Request(
        f"{base}/ajax-api/2.0/mlflow/runs/search",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        json.loads(response.read())
    return time.perf_counter() - start


def measure_ui(result: dict[str, Any], repeats: int, scratch: Path) -> dict[str, Any]:
    """The runs page (default and sorted by run name) loaded ``repeats`` times each."""
    from fedtune.tuning.mlflow.urls import ui_url

    out: dict[str, Any] = {}
    scratch.mkdir(parents=True, exist_ok=True)
    with mlflow_server_process(result["tracking_uri"], scratch / "server.log", timeout=120) as (
        _,
        base,
    ):
        page = ui_url(base, result["experiment_id"])
        views = {
            "runs_page": (page, [result["name"]]),
            "runs_page_by_name": (
                f"{page}&orderByKey=attributes.run_name&orderByAsc=true",
                ["trial-0000", "trial-0001"],
            ),
        }
        for view, (url, expected) in views.items():
            times, shown = [], []
            for i in range(repeats):
                took, text = load_page(url, scratch / f"profile-{view}-{i}")
                times.append(took)
                shown.append(all(name in text for name in expected) and "Run Name" in text)
            out[view] = {
                "url": url.replace(base, "<server>"),
                "expects": expected,
                "load_s_median": statistics.median(times),
                "load_s_all": [round(t, 3) for t in times],
                "runs_shown": all(shown),
            }
        api = [search_api(base, result["experiment_id"]) for _ in range(max(repeats, 3))]
        out["runs_search_api_s_median"] = statistics.median(api)
    return out


def one_size(
    n: int, how: str, scratch: Path, env: dict[str, str], ui_repeats: int, child_runs: bool = True
) -> dict[str, Any]:
    workdir = scratch / f"study-{n}"
    made = scratch / f"study-{n}.json"  # kept with --workdir: a later run measures the UI only
    if made.is_file():
        result, how, made_s = json.loads(made.read_text())
    else:
        start = time.perf_counter()
        if how == "real":
            result = real_study(n, workdir, env)
        else:
            result = synthetic_study(n, workdir, child_runs).to_dict()
        made_s = time.perf_counter() - start
        made.write_text(json.dumps([result, how, made_s], default=str))
    folder = parent_artifacts(result)
    sizes = artifact_sizes(folder)
    table = json.loads((folder / "trials_table.json").read_text())
    tradeoff = json.loads((folder / "tradeoff" / "tradeoff.json").read_text())
    out: dict[str, Any] = {
        "trials": n,
        "how": how,
        "made_s": made_s,
        "finished": result["finished"],
        "artifact_bytes": sizes,
        "artifact_bytes_total": sum(sizes.values()),
        "trials_table_rows": len(table["data"]),
        "tradeoff_trials_listed": len(tradeoff["trials"]),
        "tradeoff_trials_total": tradeoff.get("trials_total"),
        "pareto_size": len(tradeoff["pareto"]),
        "listing_every_trial_bytes": unbounded_bytes(n, workdir),
    }
    if ui_repeats:
        if not CHROMIUM.is_file():
            raise RuntimeError(f"{CHROMIUM} is not installed")
        out["ui"] = measure_ui(result, ui_repeats, scratch / f"ui-{n}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument(
        "--real-max",
        type=int,
        default=1000,
        help="sizes above are built synthetically (0: all synthetic)",
    )
    p.add_argument("--ui-repeats", type=int, default=3, help="0: no UI measurement")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument(
        "--workdir",
        type=Path,
        help="keep the studies here; a study found there is reused (its UI measured "
        "again, e.g. under the benchmark lock, without making it again)",
    )
    args = p.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    started = time.time()
    report: dict[str, Any] = {
        "benchmark": "mlflow_ui_scale",
        "environment": environment(),
        "settings": {
            "sizes": args.sizes,
            "real_max": args.real_max,
            "ui_repeats": args.ui_repeats,
            "study": STUDY,
            "chromium_flags": FLAGS,
        },
    }
    sizes = []
    with contextlib.ExitStack() as stack:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            tmp = str(args.workdir.resolve())
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="fedtune-ui-scale-"))
        for n in args.sizes:
            how = "real" if n <= args.real_max else "synthetic"
            row = one_size(n, how, Path(tmp), env, args.ui_repeats)
            sizes.append(row)
            ui = row.get("ui", {}).get("runs_page", {})
            print(
                f"N={n} ({how}): artifacts {row['artifact_bytes_total']} B, table "
                f"{row['trials_table_rows']} rows, page {ui.get('load_s_median', 0):.2f} s",
                file=sys.stderr,
                flush=True,
            )
    report["sizes"] = sizes
    first, last = sizes[0], sizes[-1]
    report["bounded"] = {
        "artifact_bytes_ratio_largest_over_smallest": last["artifact_bytes_total"]
        / first["artifact_bytes_total"],
        "trials_ratio": last["trials"] / first["trials"],
        "trials_table_rows": {str(s["trials"]): s["trials_table_rows"] for s in sizes},
    }
    report["load_average_at_end"] = list(os.getloadavg())
    report["wall_s"] = time.time() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"sizes": sizes, "bounded": report["bounded"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
