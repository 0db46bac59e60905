"""How soon ``fedtune tune`` refuses a broken package, and a correct study's start-up, before
and after: two checkouts of fedtune, interleaved.

A user's package ``brk`` broken four ways, each a fresh process and workdir:

* ``import_error`` — its module fails to import (``import`` of a module that does not exist):
  refused while the spec is validated, the reference;
* ``builder_raises`` — its task builder raises ``OSError``: refused by the driver's preflight;
* ``model_misfit`` — its model's outputs ``[B, 3]`` do not fit its labels ``[B, 2]`` (the
  pre-training model check): refused by the preflight;

each as an installed distribution (an entry point on ``PYTHONPATH``: ``fedtune tune`` begins
Ray before it reads the spec) and as a study's ``code:`` section (Ray begun by the driver, the
code in its ``runtime_env``); ``builder_raises`` also one configuration at a time
(``in_process``: the trials would run in the driver, no Ray). Each a 4-trial, 2-round study,
2 at a time. Per run ``error_s`` (launch → the ``fedtune: error:`` line on stderr) and
``total_s`` (launch → exit, exit code 2).

Then a correct study's start-up (:data:`CORRECT`, ``benchmarks/_studies.py``: 2 trials of 3
rounds on a trivial quadratic, one at a time), in the driver's process and with ``--ray``:
``first_trial_s`` (launch → the first trial's code runs, from the timeline,
:mod:`fedtune.tuning.common.timeline`) and ``total_s``.

Each checkout runs with ``PYTHONPATH`` naming it (``--before``, ``--after``: this one), the same
interpreter and packages. Per checkout and case the medians, and after/before of the medians.

Usage: ``python benchmarks/refusal.py --before /path/to/old/checkout [--repeats 5]
[--out PATH]`` (writes ``benchmarks/results/refusal.json``).
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
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import write_report
from _studies import free_study

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "results" / "refusal.json"

#: the package's ``brk/tasks.py`` per breakage
PACKAGES = {
    "import_error": "import brk_no_such_module  # noqa\n",
    "builder_raises": textwrap.dedent(
        """
        from fedtune.extend import register_task


        @register_task("brk")
        def build(params, seed):
            raise OSError("the data share is not mounted")
        """
    ),
    "model_misfit": textwrap.dedent(
        """
        import torch
        from torch import nn

        from fedtune.extend import FederatedData, Task, register_task


        def _loss(outputs, targets):
            logp = torch.log_softmax(outputs, -1)
            return -logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


        @register_task("brk")
        def build(params, seed):
            g = torch.Generator().manual_seed(seed)
            clients = [
                (torch.randn(8, 4, generator=g), torch.randint(0, 3, (8, 2), generator=g))
                for _ in range(4)
            ]
            return Task(
                name="brk",
                train=FederatedData.from_clients(clients),
                model_fn=lambda gen: nn.Linear(4, 3),
                loss_fn=_loss,
            )
        """
    ),
}

#: (case, breakage, how the package is found, budget.max_concurrent)
CASES = [
    (f"{breakage}_{where}", breakage, where, 2)
    for breakage in PACKAGES
    for where in ("installed", "code")
] + [("builder_raises_in_process", "builder_raises", "code", 1)]

CORRECT = free_study("refusal-correct", rounds=3, trials=2, sampler="tpe")
#: the correct study's runs: in the driver's process, and with ``--ray``
CORRECT_KINDS = ("correct_in_process", "correct_ray")


def broken_study(where: str, max_concurrent: int) -> str:
    """The study of a broken package (``code:`` section or not)."""
    code = "code: {path: ./lab, modules: [brk.tasks]}\n" if where == "code" else ""
    return code + textwrap.dedent(
        f"""
        name: refused
        task: {{name: brk}}
        algorithm: fedavg
        train: {{rounds: 2, clients_per_round: 2, local_steps: 1, batch_size: 4}}
        search: {{space: fedavg}}
        sampler: {{name: random, seed: 0}}
        scheduler: {{name: none}}
        objective: {{metric: train_loss, last_rounds: 1}}
        budget: {{trials: 4, max_concurrent: {max_concurrent}}}
        """
    )


def make_package(folder: Path, breakage: str, where: str) -> str | None:
    """Write the package into ``folder`` (``lab/`` or an installed ``site/``); returns the
    folder to put on ``PYTHONPATH`` (installed), else None."""
    base = folder / ("site" if where == "installed" else "lab")
    (base / "brk").mkdir(parents=True)
    (base / "brk" / "__init__.py").write_text("")
    (base / "brk" / "tasks.py").write_text(PACKAGES[breakage])
    if where != "installed":
        return None
    info = base / "brk-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brk\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedtune.tasks]\nbrk = brk.tasks\n")
    return str(base)


def launch(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd``; the seconds to its first ``fedtune: error:`` line and to its exit."""
    started = time.time()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    error: list[float] = []
    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("fedtune: error:") and not error:
                error.append(time.time() - started)

    reader = threading.Thread(target=read)
    reader.start()
    stdout = proc.stdout.read()
    proc.wait()
    total = time.time() - started
    reader.join()
    return {
        "rc": proc.returncode,
        "error_s": error[0] if error else None,
        "total_s": total,
        "stdout": stdout,
        "stderr": "".join(lines),
        "started": started,
    }


def run_case(checkout: str, case: tuple, scratch: Path) -> dict[str, Any]:
    """One broken package, refused by the checkout (exit code 2 expected)."""
    name, breakage, where, concurrent = case
    folder = Path(tempfile.mkdtemp(prefix="r-", dir=scratch))
    extra = make_package(folder, breakage, where)
    (folder / "study.yaml").write_text(broken_study(where, concurrent))
    env = _env(checkout, extra)
    script = str(Path(sys.executable).parent / "fedtune")
    r = launch([script, "tune", "study.yaml", "--workdir", "w"], folder, env)
    if r["rc"] != 2 or r["error_s"] is None:
        raise RuntimeError(f"{name} ({checkout}): exit {r['rc']}\n{r['stderr'][-3000:]}")
    return {"case": name, "error_s": r["error_s"], "total_s": r["total_s"]}


def run_correct(checkout: str, kind: str, scratch: Path) -> dict[str, Any]:
    """The correct study's start-up: launch → first trial entered, and → exit."""
    folder = Path(tempfile.mkdtemp(prefix="c-", dir=scratch))
    (folder / "study.yaml").write_text(CORRECT)
    timeline = folder / "timeline.jsonl"
    env = {**_env(checkout, None), "FEDTUNE_TIMELINE": str(timeline)}
    cmd = [str(Path(sys.executable).parent / "fedtune"), "tune", "study.yaml", "--workdir", "w"]
    r = launch(cmd + ["--json"] + (["--ray"] if kind == "correct_ray" else []), folder, env)
    if r["rc"] != 0:
        raise RuntimeError(f"{kind} ({checkout}): exit {r['rc']}\n{r['stderr'][-3000:]}")
    marks = [json.loads(line) for line in timeline.read_text().splitlines()]
    entered = min(m["t"] for m in marks if m["phase"] == "trial_entered")
    return {"case": kind, "first_trial_s": entered - r["started"], "total_s": r["total_s"]}


def _env(checkout: str, extra: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "FEDTUNE_TIMELINE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [checkout, extra]))
    return env


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: each checkout's medians, and after / before of the medians.

    Args:
        runs: Every run, each with ``checkout`` (``before``/``after``), ``case`` and its
            seconds (``error_s``, ``first_trial_s``, ``total_s``).

    Returns:
        ``{case: {checkout: {field_median, field_all, runs}, "after_over_before": {field}}}``.
    """
    out: dict[str, Any] = {}
    for case in dict.fromkeys(r["case"] for r in runs):
        mine = [r for r in runs if r["case"] == case]
        fields = [f for f in ("error_s", "first_trial_s", "total_s") if f in mine[0]]
        row: dict[str, Any] = {}
        for checkout in ("before", "after"):
            theirs = [r for r in mine if r["checkout"] == checkout]
            if theirs:
                row[checkout] = {"runs": len(theirs)}
                for f in fields:
                    values = [r[f] for r in theirs]
                    row[checkout][f"{f}_median"] = round(statistics.median(values), 2)
                    row[checkout][f"{f}_all"] = [round(v, 2) for v in values]
        if "before" in row and "after" in row:
            row["after_over_before"] = {
                f: round(row["after"][f"{f}_median"] / row["before"][f"{f}_median"], 3)
                for f in fields
            }
        out[case] = row
    return out


def _revision(checkout: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", checkout, "rev-parse", "--show-toplevel", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    lines = done.stdout.split()  # a folder inside another repository is not that checkout
    return lines[1] if done.returncode == 0 and lines[0] == str(Path(checkout)) else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the checkout to compare with")
    p.add_argument("--before-revision", help="its commit, when it is not a git checkout")
    p.add_argument("--after", default=str(ROOT), help="the checkout measured (this one)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=[c[0] for c in CASES] + list(CORRECT_KINDS))
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    checkouts = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after))}
    started = time.time()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedtune-refusal-") as tmp:
        for rep in range(args.repeats):
            order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
            for case in args.cases:  # the two checkouts side by side, case by case
                for checkout in order:
                    load = os.getloadavg()[0]
                    known = [c for c in CASES if c[0] == case]
                    if known:
                        r = run_case(checkouts[checkout], known[0], Path(tmp))
                    else:
                        r = run_correct(checkouts[checkout], case, Path(tmp))
                    r.update(checkout=checkout, repeat=rep, load_1min=round(load, 2))
                    runs.append(r)
                    shown = r.get("error_s") or r.get("first_trial_s")
                    print(f"{case:28s} {checkout:6s} {shown:6.1f} s (load {load:.1f})")
    body = {
        "benchmark": "refusal",
        "settings": {
            "repeats": args.repeats,
            "checkouts": {
                k: {"path": v, "revision": _revision(v) or args.before_revision}
                for k, v in checkouts.items()
            },
        },
        "runs": runs,
        "summary": summarize(runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(args.out, body, started, "benchmarks/refusal.py", argv or sys.argv[1:])
    print(json.dumps(body["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
