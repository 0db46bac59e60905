"""The light install: ``pip install fedtune`` (no extras) in a fresh venv runs the SDK and the
service's client verbs against a real server without torch, Ray, MLflow, Optuna, SciPy,
scikit-learn, matplotlib or h5py; a verb that needs the engine says which extra to install.

The venv is built once (``benchmarks/light_install.py``'s ``build``: pip from its configured
index), for the module: a fixture of module scope keeps the tests that use it on one pytest-xdist
worker (``tests/conftest.py``'s ``module_group``), where a session fixture was built by both
workers; the server is ``fedtune serve`` of the development venv."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedtune import __version__
from tests.benchmarks import load_benchmark

from .conftest import TOKEN
from .helpers import Server, tiny_spec

pytestmark = pytest.mark.slow

HEAVY = ("torch", "ray", "mlflow", "optuna", "scipy", "sklearn", "matplotlib", "h5py")


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("light") / "venv"
    load_benchmark("light_install.py").build(venv)
    return venv


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    env = {
        "FEDTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'fedtune.db'}",
        "FEDTUNE_WORKDIR": str(tmp_path / "work"),
        "FEDTUNE_BACKEND": "none",
        "FEDTUNE_API_TOKEN": TOKEN,
    }
    s = Server(env, tmp_path / "serve.log").start(timeout=120)
    try:
        yield s
    finally:
        s.stop()


def _run(
    venv: Path, *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def test_the_light_install_has_no_engine(light_venv: Path) -> None:
    probe = (
        "import importlib.util, json; print(json.dumps({m: importlib.util.find_spec(m) "
        f"is not None for m in {HEAVY!r}}}))"
    )
    found = json.loads(_run(light_venv, "python", "-c", probe).stdout)
    assert found == dict.fromkeys(HEAVY, False)
    sdk = _run(
        light_venv,
        "python",
        "-c",
        "import fedtune, sys; fedtune.Client; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'numpy', 'torch', 'sqlalchemy', 'pydantic_settings'}))",
    )
    assert sdk.returncode == 0 and sdk.stdout.strip() == "[]", sdk.stderr


def test_version_and_help_run_in_the_light_install(light_venv: Path) -> None:
    version = _run(light_venv, "fedtune", "--version")
    assert (version.returncode, version.stdout) == (0, f"fedtune {__version__}\n")
    helped = _run(light_venv, "fedtune", "--help")
    assert helped.returncode == 0 and "the service's client:" in helped.stdout
    assert helped.stderr == ""


def test_client_verbs_against_a_real_service(
    light_venv: Path, server: Server, tmp_path: Path
) -> None:
    env = {"FEDTUNE_URL": server.url, "FEDTUNE_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"}
    me = _run(light_venv, "fedtune", "whoami", env=env)
    assert me.returncode == 0, me.stderr
    assert me.stdout.startswith("admin (admin) via bootstrap")
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(tiny_spec(trials=3)))
    sent = _run(light_venv, "fedtune", "submit", str(study), "--set", "budget.trials=2", env=env)
    assert sent.returncode == 0, sent.stderr
    sid = sent.stdout.strip()
    status = _run(light_venv, "fedtune", "status", sid, "--json", env=env)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert (doc["id"], doc["state"], doc["progress"]["requested"]) == (sid, "queued", 2)
    listed = _run(light_venv, "fedtune", "studies", env=env)
    assert listed.returncode == 0 and sid in listed.stdout
    cancelled = _run(light_venv, "fedtune", "cancel", sid, env=env)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == f"{sid} cancelled"


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["tune", "x.yaml"], "tune"),
        (["train", "x.yaml"], "engine"),
        (["tasks"], "engine"),
        (["serve"], "service"),
    ],
)
def test_a_verb_of_the_engine_names_its_extra(
    light_venv: Path, tmp_path: Path, argv, extra: str
) -> None:
    done = _run(light_venv, "fedtune", *argv, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"fedtune: error: 'fedtune {argv[0]}' needs the {extra} extra")
    assert done.stderr.endswith(f"pip install 'fedtune[{extra}]'\n")


def test_the_benchmark_writes_its_json(light_venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "light_install.json"
    doc = load_benchmark("light_install.py").main(
        ["--repeats", "1", "--venv", str(light_venv), "--out", str(out)]
    )
    assert json.loads(out.read_text()) == doc
    assert set(doc) == {"benchmark", "environment", "settings", "goal", "results"}
    results = doc["results"]
    assert results["heavy_absent"] is True and "fedtune" in results["distributions"]
    assert 0 < results["installed_mb"] < 200
    assert set(results["median_s"]) == {
        "python_pass",
        "import_fedtune_client",
        "fedtune_Client",
        "fedtune_version",
        "fedtune_help",
    }
    assert all(v > 0 for v in results["median_s"].values())
