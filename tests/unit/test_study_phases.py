"""The study's phases: the start-up handle (:mod:`fedtune.tuning.driver.startup`) and the frozen,
picklable data the phases pass on (:mod:`fedtune.tuning.driver.study`). No Ray."""

from __future__ import annotations

import dataclasses
import gc
import io
import pickle
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fedtune.tuning.driver.startup import Deferred, Startup
from tests.unit.test_startup_paths import tiny_spec


def test_work_runs_concurrently_in_the_named_threads() -> None:
    both = threading.Barrier(2, timeout=30)  # passes only when two jobs run at once

    def job(k: int) -> tuple[int, str]:
        both.wait()
        return k, threading.current_thread().name

    with Startup("probe", workers=2) as startup:
        a, b = startup.submit(job, 1), startup.submit(job, 2)
        assert a.result(30)[0] == 1 and b.result(30)[0] == 2
    assert {a.result()[1], b.result()[1]} == {"probe_0", "probe_1"}


def test_then_chains_and_inline_runs_here() -> None:
    with Startup("probe") as startup:
        here = startup.submit(threading.current_thread, inline=True)
        assert here.done() and here.result() is threading.current_thread()
        doubled = startup.then(startup.submit(lambda: 21), lambda x, y: x * y, 2)
        assert doubled.result(30) == 42
        with pytest.raises(ZeroDivisionError):  # inline: its error is raised at once
            startup.submit(lambda: 1 / 0, inline=True)


def test_an_error_is_raised_at_result_and_by_check_once_known() -> None:
    release = threading.Event()

    def fails() -> None:
        release.wait(30)
        raise ValueError("store is broken")

    with Startup("probe") as startup:
        broken = startup.submit(fails)
        after = startup.then(broken, lambda value: value)
        broken.check()  # not failed yet: nothing raised, nothing waited for
        release.set()
        with pytest.raises(ValueError, match="store is broken"):
            broken.result(30)
        with pytest.raises(ValueError, match="store is broken"):
            broken.check()
        with pytest.raises(ValueError, match="store is broken"):
            after.result(30)  # what depends on it fails the same way


def test_a_failure_cancels_pending_work_and_joins_the_threads() -> None:
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(30)
        ran.append("slow")
        return "slow"

    with pytest.raises(RuntimeError, match="Ray did not start"), Startup("probe", 1) as startup:
        running = startup.submit(slow)
        queued = startup.submit(ran.append, "queued")
        assert started.wait(30)
        threading.Timer(0.2, release.set).start()
        raise RuntimeError("Ray did not start")
    assert ran == ["slow"]  # the running work was joined, the queued one never began
    assert running.result(0) == "slow"
    with pytest.raises(CancelledError):
        queued.result(0)
    assert not [t for t in threading.enumerate() if t.name.startswith("probe_")]


def test_a_deferred_is_a_frozen_name_that_pickles_without_its_future() -> None:
    startup = Startup("probe")
    with startup:
        handle = startup.submit(lambda: "opened")
    assert handle.result() == "opened"
    with pytest.raises(dataclasses.FrozenInstanceError):
        handle.index = 3  # type: ignore[misc]
    copy = pickle.loads(pickle.dumps(handle))
    assert copy == handle and copy.result() == "opened"  # this process: the same result
    del startup
    gc.collect()
    with pytest.raises(LookupError):  # a copy elsewhere has nothing to wait for
        copy.result()


class _TracingPickler(pickle.Pickler):
    """Pickles normally, recording every object of the given types it meets."""

    def __init__(self, kinds: tuple[type, ...]) -> None:
        super().__init__(io.BytesIO())
        self.kinds, self.met = kinds, []

    def persistent_id(self, obj: Any) -> None:
        if isinstance(obj, self.kinds):
            self.met.append(type(obj).__name__)
        return None


def test_the_phases_context_is_frozen_and_what_tune_pickles_holds_no_future(
    tmp_path: Path,
) -> None:
    from fedtune.tuning.driver import fit, study

    workdir = tmp_path / "w"
    workdir.mkdir()
    plan, opened = study._prepare(tiny_spec("phases"), workdir, None, time.perf_counter())
    assert opened is None  # a new study: its storage is made after the preflight
    assert plan.target == 2 and not plan.stored
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.target = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(plan)).target == 2

    with Startup("probe") as startup:
        stores = startup.submit(study._open_stores, plan, inline=True)
        release = threading.Event()
        tracking = startup.submit(release.wait, 30)  # still opening, as at Tune's set-up
        runtime = study.Runtime(stores.result(), tracking, shipped=False)
        with pytest.raises(dataclasses.FrozenInstanceError):
            runtime.shipped = True  # type: ignore[misc]
        callback = fit._AfterTracking(plan.spec, runtime)  # in Tune's run_config
        pickler = _TracingPickler((Future, ThreadPoolExecutor, Startup, threading.Thread))
        pickler.dump([callback, runtime, plan])
        assert pickler.met == []
        assert isinstance(runtime.tracking, Deferred)
        release.set()
