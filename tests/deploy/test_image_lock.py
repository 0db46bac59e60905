"""Reproducible images without version skew.

* ``constraints/image.txt`` pins every distribution the image installs (the closure of
  ``fedtune[service]`` and the build backend) to the versions the tests ran against; the file
  must equal what ``constraints/freeze.py`` computes now (a new dependency, an upgraded venv or a
  hand edit shows up here);
* one Ray version everywhere: the lock, the Ray installed here (which ``rayjob_manifest()``
  writes as each RayJob's ``rayVersion``) and the chart's ``rayCluster.rayVersion``;
* the Dockerfile installs the lock before it copies the code, and installs the project with
  ``--no-deps``: with Docker's layer cache a code change rebuilds only the last layer.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tomllib

import pytest
import yaml

from fedtune.service.backends.k8s_manifest import ray_version
from tests.deploy.conftest import CHART_DIR, EXAMPLES_DIR, REPO_ROOT
from tests.deploy.test_dockerfile import DOCKERFILE, Dockerfile, arg_defaults, parse_dockerfile

LOCK = REPO_ROOT / "constraints" / "image.txt"
PROJECT_SOURCES = {"fedtune", "fedtune/", "pyproject.toml", "README.md", "."}


def _freeze():
    spec = importlib.util.spec_from_file_location("freeze", REPO_ROOT / "constraints" / "freeze.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name] = version
    return pins


def test_the_lock_is_the_closure_installed_here() -> None:
    expected = _freeze().lock_text()
    assert LOCK.read_text() == expected, "constraints/image.txt is stale: run `make lock`"
    pins = lock_pins()
    assert {"ray", "mlflow", "torch", "optuna", "sqlalchemy", "setuptools"} <= set(pins)
    assert "fedtune" not in pins and not [n for n in pins if n.startswith("pytest")]


def test_pyproject_pins_and_the_dockerfile_agree_with_the_lock() -> None:
    pins = lock_pins()
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    exact = [r for extra in project["optional-dependencies"].values() for r in extra]
    for requirement in [*project["dependencies"], *exact]:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", requirement.replace(" ", ""))
        if match and match.group(1).lower() in pins:
            assert pins[match.group(1).lower()] == match.group(2), requirement
    build = arg_defaults(parse_dockerfile(DOCKERFILE.read_text()).stage("deps").instructions)
    assert build["TORCH_VERSION"] == pins["torch"]


def test_one_ray_version_in_the_lock_the_rayjobs_and_the_chart() -> None:
    """A skewed Ray (head/workers of another version than the driver's) fails here."""
    installed = importlib.metadata.version("ray")
    assert lock_pins()["ray"] == installed == ray_version()
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["rayCluster"]["rayVersion"] == installed, (
        f"helm/fedtune/values.yaml rayCluster.rayVersion is "
        f"{values['rayCluster']['rayVersion']}, the image's Ray is {installed}"
    )
    for example in EXAMPLES_DIR.glob("*.yaml"):
        pinned = (yaml.safe_load(example.read_text()) or {}).get("rayCluster", {})
        assert pinned.get("rayVersion", installed) == installed, example.name


def _chain(dockerfile: Dockerfile) -> tuple:
    """The instructions that make the installed venv: ``deps`` (when there is one), ``build``."""
    names = {stage.name for stage in dockerfile.stages}
    return tuple(
        i
        for name in ("deps", "build")
        if name in names
        for i in dockerfile.stage(name).instructions
    )


def _copied_sources(dockerfile: Dockerfile, upto: int) -> set[str]:
    """Build-context paths copied into the build chain before instruction ``upto``."""
    return {
        source.rstrip("/") or "."
        for copy in _chain(dockerfile)[:upto]
        if copy.keyword == "COPY" and "from" not in copy.flags
        for source in copy.args.split()[:-1]
    }


def test_dependencies_install_before_the_code_is_copied(dockerfile: Dockerfile) -> None:
    installs = [
        (i, r)
        for i, r in enumerate(_chain(dockerfile))
        if r.keyword == "RUN" and "pip install" in r.args
    ]
    assert installs
    locked = [i for i, r in installs if "-r constraints/image.txt" in r.args]
    assert len(locked) == 1, "the dependency layer installs the lock"
    assert "constraints/image.txt" in _copied_sources(dockerfile, locked[0])
    for index, run in installs:
        project_copied = _copied_sources(dockerfile, index) & {"fedtune", "pyproject.toml"}
        if project_copied:  # every layer after the code: the project alone, nothing resolved
            assert "--no-deps" in run.args, f"line {run.line} resolves dependencies after the code"
        else:
            assert not re.search(r'"?\.\[', run.args), f"line {run.line} installs the project early"


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_the_ordering_check_catches_the_old_dockerfile() -> None:
    """The Dockerfile before the fix copied the code, then resolved everything in one layer."""
    old = parse_dockerfile(
        "FROM python:3.11-slim AS build\nWORKDIR /src\nCOPY pyproject.toml README.md ./\n"
        'COPY fedtune ./fedtune\nRUN pip install ".[service]"\nFROM python:3.11-slim\n'
    )
    with pytest.raises(AssertionError):
        test_dependencies_install_before_the_code_is_copied(old)
