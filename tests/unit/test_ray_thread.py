"""An embedded Ray's start can be stopped half-way (``fedtune.tuning.driver.ray_thread``): the
thread that starts Ray is interrupted where it is, its session's clean-up runs as after a
failed start, and Ray, once running, is never interrupted (only shut down). First with a
session that stands in for Ray's start (a loop the test can watch), then with a real Ray:
nothing of the stopped start is left, and the same process starts Ray again."""

from __future__ import annotations

import contextlib
import linecache
import os
import threading
import time
from pathlib import Path

import pytest

from fedtune.tuning.driver.ray_thread import RayStartAborted, RayThread


class _Start:
    """A session whose start loops until released, recording what happened to it."""

    def __init__(self) -> None:
        self.starting, self.release = threading.Event(), threading.Event()
        self.events: list[str] = []

    @contextlib.contextmanager
    def session(self, workdir, address, runtime_env=None):
        self.events.append("start")
        try:
            self.starting.set()
            while not self.release.is_set():  # Ray's start: a polling loop
                time.sleep(0.01)
            self.events.append("running")
        except RayStartAborted:
            self.events.append("start stopped")
            raise
        try:
            yield runtime_env is not None
        finally:
            self.events.append("shutdown")  # never interrupted: no abort reaches a running Ray


def _in_session(frame) -> bool:  # the stand-in's polling loop: where a stop may land
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return frame.f_code.co_name == "session" and "time.sleep(" in line


def test_a_start_stopped_half_way_ends_its_thread_and_is_raised_by_ready(tmp_path: Path) -> None:
    start = _Start()
    thread = RayThread(tmp_path, session=start.session, safe=_in_session).start()
    assert start.starting.wait(30)
    assert thread.abort() is True
    assert thread.abort() is False  # sent once: a second one would land in the clean-up
    with pytest.raises(RayStartAborted):
        thread.ready()
    thread.stop()
    assert start.events == ["start", "start stopped"]
    assert not thread._thread.is_alive()


def test_a_stop_waits_for_an_import_under_way(tmp_path: Path, monkeypatch) -> None:
    """Ray's start imports modules as it goes; a stop asked during an import lands after it
    (a module cut short would stay half made in this process)."""
    import sys

    (tmp_path / "ft_slow_module.py").write_text(
        "import time\nfrom pathlib import Path\n"
        "Path(__file__).with_suffix('.began').touch()\n"
        "time.sleep(0.5)\nfinished = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    release = threading.Event()

    @contextlib.contextmanager
    def session(workdir, address, runtime_env=None):
        import ft_slow_module  # noqa: F401

        while not release.is_set():
            time.sleep(0.01)
        yield False

    thread = RayThread(tmp_path, session=session, safe=_in_session).start()
    while not (tmp_path / "ft_slow_module.began").exists():
        time.sleep(0.01)
    assert thread.abort() is True  # waits for the import, then stops the start
    with pytest.raises(RayStartAborted):
        thread.ready()
    thread.stop()
    assert sys.modules["ft_slow_module"].finished is True
    release.set()


def test_a_running_ray_is_not_interrupted_by_an_abort_and_stops_when_told(tmp_path: Path) -> None:
    start = _Start()
    start.release.set()
    thread = RayThread(tmp_path, {"working_dir": "x"}, session=start.session, safe=_in_session)
    thread.start()
    assert thread.ready() is True  # the runtime_env is the job's
    assert thread.abort() is False  # the study's thread may be using Ray: left running
    assert thread._thread.is_alive() and start.events == ["start", "running"]
    thread.stop()
    thread.stop()  # idempotent
    assert start.events == ["start", "running", "shutdown"]


def test_stopped_before_it_began_it_starts_nothing(tmp_path: Path) -> None:
    start = _Start()
    thread = RayThread(tmp_path, session=start.session, safe=_in_session)
    assert thread.abort() is True
    thread.start()
    with pytest.raises(RayStartAborted):
        thread.ready()
    thread.stop()
    assert start.events == []


def test_a_failed_start_is_raised_by_ready(tmp_path: Path) -> None:
    from fedtune.errors import RayStartError

    @contextlib.contextmanager
    def session(workdir, address, runtime_env=None):
        raise RayStartError("Ray did not start (embedded) after 1 attempt(s): boom")
        yield  # pragma: no cover

    thread = RayThread(tmp_path, session=session).start()
    with pytest.raises(RayStartError, match="boom"):
        thread.ready()
    thread.stop()


@pytest.mark.slow
def test_a_real_ray_stopped_while_it_starts_leaves_nothing_and_ray_starts_again(
    tmp_path: Path,
) -> None:
    """Stopped once Ray's session directory exists (its GCS is starting): the thread ends, no
    process of the session is left, the temp dir is gone, nothing is initialized in this
    process, and a new start here runs."""
    import ray

    from fedtune.tuning.driver.ray_runtime import _candidates, make_ray_temp_dir

    if ray.is_initialized():
        pytest.skip("this process already runs Ray")
    workdir = tmp_path / "w"
    workdir.mkdir()
    temp = make_ray_temp_dir(workdir)  # the session makes (takes back) the same one
    thread = RayThread(workdir).start()
    seen = threading.Event()

    def session_begun() -> None:  # Ray has made its session folder: ray.init is under way
        while not seen.is_set() and thread._thread.is_alive():
            if any(temp.glob("session_*")):
                seen.set()
            seen.wait(0.02)

    watcher = threading.Thread(target=session_begun, daemon=True)
    watcher.start()
    watcher.join(600)
    assert seen.is_set(), "Ray's start never made its session folder"
    assert thread.abort() is True  # ray.init was under way: its start is stopped
    with pytest.raises(RayStartAborted):
        thread.ready()
    thread.stop()
    roots = (os.path.abspath(temp), os.path.realpath(temp))
    assert dict(_candidates(roots)) == {}
    assert not temp.exists() and not ray.is_initialized()
    again = RayThread(tmp_path / "again").start()
    try:
        assert again.ready() is False and ray.is_initialized()
        assert ray.cluster_resources().get("CPU", 0) >= 1
    finally:
        again.stop()
    assert not ray.is_initialized()
