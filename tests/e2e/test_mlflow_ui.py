"""The MLflow UI shows a finished study: headless Chromium renders the experiment's runs page.

What a user does after ``fedtune tune``: run the printed ``mlflow ui --backend-store-uri …``
command and open the experiment. The runs list of MLflow 3 lives at
``#/experiments/<id>/runs``; nested runs are collapsed under their parent unless the list is
sorted by something else than the start time, so the page is opened sorted by run name, which
lists the parent run and every trial run. Chromium's ``--dump-dom`` gives the rendered DOM after
the single-page app has fetched the runs (``--virtual-time-budget``), ``--screenshot`` a PNG.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import make_quadratic_study
from tests.needs import need

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
BIN = Path(sys.executable).parent
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--virtual-time-budget=15000",
]  # fmt: skip
STUDY = make_quadratic_study(
    "ui-quad",
    train={"rounds": 8, "clients_per_round": 5, "local_steps": 3, "batch_size": 4,
           "eval_every": 4, "dtype": "float64"},
    sampler={"name": "random", "seed": 0},
    scheduler={"name": "none"},
    budget={"trials": 3, "max_concurrent": 2},
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _mlflow_ui(command: str, port: int, log: Path):
    """The printed ``mlflow ui`` command on ``port``, stopped by its process group id."""
    argv = shlex.split(command)
    assert argv[:2] == ["mlflow", "ui"], command
    argv = [str(BIN / "mlflow"), *argv[1:], "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no GenAI job workers
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            health = f"http://127.0.0.1:{port}/health"
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=2):
                break
            assert time.monotonic() < deadline, "mlflow ui did not come up"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    shutil.rmtree(profile, ignore_errors=True)
    return subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_mlflow_ui_shows_the_study(tmp_path):
    need("chromium", None if CHROMIUM.is_file()
         else f"{CHROMIUM} is not installed (apt-get install chromium)")  # fmt: skip
    spec = tmp_path / "study.yaml"
    spec.write_text(yaml.safe_dump(STUDY))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    tune = subprocess.run(
        [str(BIN / "fedtune"), "tune", str(spec), "--workdir", str(tmp_path / "w"), "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert tune.returncode == 0, tune.stderr[-3000:]
    result = json.loads(tune.stdout)
    trials = [f"trial-{n:04d}" for n in range(result["finished"])]
    assert len(trials) == 3

    with _mlflow_ui(result["commands"]["mlflow_ui"], _free_port(), tmp_path / "ui.log") as base:
        url = (f"{base}/#/experiments/{result['experiment_id']}/runs"
               "?orderByKey=attributes.run_name&orderByAsc=true")  # fmt: skip
        dom = _chromium(["--dump-dom", url], tmp_path / "profile-dom")
        shot = tmp_path / "runs.png"
        _chromium(["--window-size=1400,900", f"--screenshot={shot}", url], tmp_path / "profile-png")

    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Training runs" in dom.stdout or "Runs" in dom.stdout
    assert "ui-quad" in dom.stdout  # the study's parent run (and experiment)
    for name in trials:
        assert name in dom.stdout, f"{name} missing from the rendered runs list"
    assert shot.is_file() and shot.stat().st_size > 20_000
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3].reshape(-1, 3)
    assert len({tuple(p) for p in pixels[::97]}) > 50  # a rendered page, not a blank canvas
    assert float(pixels.std()) > 0.05
