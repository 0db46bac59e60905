"""A study's processes start with Python's cyclic garbage collector paused
(``fedtune.tuning.common.start_gc``): ``fedtune tune`` and the service's driver (``fedtune
worker run-study``) pause it before the driver's imports and turn it back on, with the start's
objects frozen, once the tuner begins (or at their end); the study's MLflow process pauses it
before MLflow's import and resumes once its store is open. The driver's resume at the tuner's
start is checked by ``tests/integration/test_tracker_process.py``, where a driver runs a
study."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from fedtune.cli import tune
from fedtune.tuning.common import start_gc

ROOT = Path(__file__).resolve().parents[2]


def test_pause_then_resume_freezes_the_objects_alive(collector) -> None:
    gc.unfreeze()
    start_gc.pause()
    assert not gc.isenabled() and start_gc.paused()
    start_gc.pause()  # again: still paused, one resume turns it on
    start_gc.resume()
    assert gc.isenabled() and not start_gc.paused()
    assert gc.get_freeze_count() > 1000  # this interpreter's modules, functions, classes
    gc.unfreeze()
    start_gc.resume()  # again: nothing more
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_resume_leaves_a_collector_that_someone_else_turned_off(collector) -> None:
    gc.disable()
    start_gc.pause()  # off already: not this module's to turn on
    start_gc.resume()
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_collected_collects_what_the_paused_block_left_in_cycles(collector) -> None:
    """The MLflow server's start (``fedtune.service.mlflow_run``): paused, then one collection."""
    import weakref

    class Node:
        pass

    with start_gc.collected():
        assert not gc.isenabled()
        cycle = Node()
        cycle.me = cycle
        gone = weakref.ref(cycle)
        del cycle
        assert gone() is not None  # paused: nothing collects it yet
    assert gone() is None and gc.isenabled()
    gc.disable()  # a caller's paused collector stays paused
    with start_gc.collected():
        assert not gc.isenabled()
    assert not gc.isenabled()


def _entry_point(monkeypatch, *argv: str) -> None:
    """``fedtune ARGV`` as the process's entry point (``main()``), without its fast exit."""
    from fedtune import cli

    monkeypatch.setattr(sys, "argv", ["fedtune", *argv])
    monkeypatch.setattr(cli, "exit_now", lambda code: None)


def test_fedtune_tune_runs_its_start_with_the_collector_paused(collector, monkeypatch) -> None:
    from fedtune.cli import main

    seen = {}

    def run(args, early, tracking):
        seen.update(enabled=gc.isenabled(), paused=start_gc.paused())
        return 0

    monkeypatch.setattr(tune, "_early_start", lambda args: (None, None))
    monkeypatch.setattr(tune, "_run", run)
    _entry_point(monkeypatch, "tune", "study.yaml")
    gc.unfreeze()
    assert main() == 0
    assert seen == {"enabled": False, "paused": True}  # the driver's imports: no collections
    assert gc.isenabled() and gc.get_freeze_count() > 0  # at the end at the latest
    # called as a library (argv given): the caller's collector is left as it is
    seen.clear()
    gc.unfreeze()
    assert main(["tune", "study.yaml"]) == 0
    assert seen == {"enabled": True, "paused": False} and gc.get_freeze_count() == 0


def test_the_service_driver_runs_its_start_with_the_collector_paused(
    collector, monkeypatch
) -> None:
    from fedtune.cli import main
    from fedtune.service import driver

    seen = {}

    def run_driver(study_id, settings, attempt):
        seen.update(enabled=gc.isenabled(), paused=start_gc.paused(), study=study_id)
        return 0

    monkeypatch.setattr(driver, "run_driver", run_driver)
    monkeypatch.setattr(driver, "load_driver_settings", lambda: None)
    _entry_point(monkeypatch, "worker", "run-study", "0123456789ab", "--attempt", "1")
    gc.unfreeze()
    assert main() == 0
    assert seen == {"enabled": False, "paused": True, "study": "0123456789ab"}
    assert gc.isenabled() and gc.get_freeze_count() > 0


_CHILD = textwrap.dedent(
    """
    import gc, json, sys, threading, time
    from multiprocessing import Pipe
    from fedtune.tuning.mlflow import process

    passes = []  # the collector's passes since MLflow's import began (not before _serve)
    gc.callbacks.append(lambda phase, info: phase == "start" and "mlflow" in sys.modules
                        and passes.append(info["generation"]))
    here, there = Pipe()

    def drive():
        here.send((process._OPEN, (sys.argv[1], "exp", None), {}))
        ok, value = here.recv()
        during = len(passes)  # MLflow imported, the store opened
        deadline = time.monotonic() + 300
        while not gc.isenabled() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"ok": ok, "passes": during, "enabled": gc.isenabled(),
                          "frozen": gc.get_freeze_count(), "pandas": "pandas" in sys.modules}),
              flush=True)
        here.send(None)

    threading.Thread(target=drive).start()
    process._serve(there)
    """
)


def test_the_mlflow_process_starts_with_the_collector_paused(tmp_path) -> None:
    """``_serve`` as the study's MLflow process runs it (in a fresh interpreter's main thread):
    no collection while MLflow is imported and the store opened, the collector on once pandas
    is imported too, every object of the start frozen."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = subprocess.run(
        [sys.executable, "-c", _CHILD, uri],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["passes"] == 0, out
    assert out["enabled"] and out["pandas"] and out["frozen"] > 100_000, out
