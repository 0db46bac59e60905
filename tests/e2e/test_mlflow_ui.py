"""The MLflow UI shows a finished study: headless Chromium renders the experiment's runs page.

What a user does after ``fedtune tune``: from a plain shell (no virtual environment on PATH,
another directory) run the printed follow-up commands exactly — resume/extend, the
``optuna-dashboard`` command, ``mlflow ui`` — and open the printed page. MLflow 3 opens an
experiment on its GenAI "Overview / Traces" pages unless the URL asks for the model-training
workflow, so the printed page must land on the runs table. Nested runs
are collapsed under their parent unless the list is sorted by something else than the start
time, so the list is also opened sorted by run name, which shows every trial run; the best
trial's page shows its ``objective``. Chromium's ``--dump-dom`` gives the rendered DOM after
the single-page app has fetched the runs (``--virtual-time-budget``), ``--screenshot`` a PNG.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from fedtune.tuning.mlflow.urls import UI_QUERY
from tests.chromium import CHROMIUM, HEADLESS
from tests.integration.conftest import make_quadratic_study
from tests.needs import need
from tests.ports import free_port

BIN = Path(sys.executable).parent
FLAGS = [*HEADLESS, "--virtual-time-budget=15000"]
STUDY = make_quadratic_study(
    "ui-quad",
    train={
        "rounds": 8,
        "clients_per_round": 5,
        "local_steps": 3,
        "batch_size": 4,
        "eval_every": 4,
        "dtype": "float64",
    },
    sampler={"name": "random", "seed": 0},
    scheduler={"name": "none"},
    budget={"trials": 3, "max_concurrent": 2},
)


def _plain_env(home: Path) -> dict[str, str]:
    """A plain shell's environment: no virtual environment on PATH, no tracking URI (a
    PYTHONPATH of the checkout under test is kept: it selects the code, not the tools)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }  # no GenAI job workers
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


@contextlib.contextmanager
def _serve(argv: list[str], health: str, log: Path, env: dict[str, str], cwd: Path):
    """Start ``argv`` (as printed, plus host/port), wait for ``health``, stop by group id."""
    with log.open("w") as fh:
        proc = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=2):
                break
            assert time.monotonic() < deadline, f"{argv[0]} did not come up"
            time.sleep(0.5)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _printed(stdout: str) -> dict[str, str]:
    """The follow-up lines of ``fedtune tune``'s summary: ``label : command``."""
    out = {}
    for line in stdout.splitlines():
        label, sep, value = line.partition(" : ")
        if sep:
            out[label.strip()] = value.strip()
    return out


def _text(dom: str) -> str:
    return re.sub(
        r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"(?s)<(script|style).*?</\1>", "", dom))
    )


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    shutil.rmtree(profile, ignore_errors=True)
    return subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_mlflow_ui_shows_the_study(tmp_path):
    need(
        "chromium",
        None if CHROMIUM.is_file() else f"{CHROMIUM} is not installed (apt-get install chromium)",
    )
    spec = tmp_path / "study.yaml"
    spec.write_text(yaml.safe_dump(STUDY))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    tune = subprocess.run(
        [str(BIN / "fedtune"), "tune", str(spec), "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert tune.returncode == 0, tune.stderr[-3000:]
    printed = _printed(tune.stdout)
    elsewhere = tmp_path / "elsewhere"  # a plain shell, in another directory
    elsewhere.mkdir()
    plain = _plain_env(elsewhere)

    # resume/extend, as printed (plus --json to read the result): nothing left to run
    again = shlex.split(printed["resume/extend"].removesuffix("[--trials N]"))
    rerun = subprocess.run(
        [*again, "--json"], capture_output=True, text=True, env=plain, cwd=elsewhere, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    result = json.loads(rerun.stdout)
    assert result["ran"] == 0 and result["finished"] == 3
    trials = [f"trial-{n:04d}" for n in range(result["finished"])]
    assert printed["open the runs"] == result["commands"]["mlflow_page"]

    # optuna-dashboard, as printed: serves the study
    port = free_port()
    dash = [*shlex.split(printed["open the study"]), "--host", "127.0.0.1", "--port", str(port)]
    api = f"http://127.0.0.1:{port}/api/studies"
    with _serve(dash, api, tmp_path / "dash.log", plain, elsewhere):
        body = urllib.request.urlopen(api, timeout=10).read().decode()
    assert "ui-quad" in body

    # mlflow ui, as printed; the printed page is the runs table of a model-training experiment
    port = free_port()
    ui = [*shlex.split(printed["start the UI"]), "--host", "127.0.0.1", "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    page = printed["open the runs"].replace("http://127.0.0.1:5000", base)
    assert page.startswith(f"{base}/#/experiments/{result['experiment_id']}/runs?")
    sorted_page = f"{page}&orderByKey=attributes.run_name&orderByAsc=true"  # trials not folded
    from mlflow import MlflowClient

    client = MlflowClient(result["tracking_uri"])
    children = client.search_runs(
        [result["experiment_id"]], f"tags.`mlflow.parentRunId` = '{result['parent_run_id']}'"
    )
    best = next(r for r in children if r.data.tags.get("best_trial") == "true")
    child = f"{base}/#/experiments/{result['experiment_id']}/runs/{best.info.run_id}?{UI_QUERY}"
    with _serve(ui, f"{base}/health", tmp_path / "ui.log", plain, elsewhere):
        shot = tmp_path / "runs.png"
        # the landing page's DOM and its screenshot from one browser (a launch is ~3 CPU-s)
        landing = _chromium(
            ["--window-size=1400,900", f"--screenshot={shot}", "--dump-dom", page],
            tmp_path / "profile-landing",
        )
        listed = _chromium(["--dump-dom", sorted_page], tmp_path / "profile-dom")
        run_page = _chromium(["--dump-dom", child], tmp_path / "profile-run")

    for dom in (landing, listed, run_page):
        assert dom.returncode == 0, dom.stderr[-2000:]
    text = _text(landing.stdout)
    assert f"Runs - Experiment {result['experiment_id']}" in landing.stdout, text[:500]
    assert "Overview - Experiment" not in landing.stdout  # not the GenAI landing page
    assert "ui-quad" in text and "Run Name" in text  # the runs table with the parent run
    listed_text = _text(listed.stdout)
    for name in trials:
        assert name in listed_text, f"{name} missing from the rendered runs list"
    run_text = _text(run_page.stdout)
    value = best.data.metrics["objective"]
    assert re.search(r"\bobjective\b", run_text) and f"{value:.6g}"[:6] in run_text
    assert "objective_metric" in run_text and "best_trial" in run_text
    assert shot.is_file() and shot.stat().st_size > 20_000
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3].reshape(-1, 3)
    assert len({tuple(p) for p in pixels[::97]}) > 50  # a rendered page, not a blank canvas
    assert float(pixels.std()) > 0.05
