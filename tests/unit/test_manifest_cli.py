"""``fedtune manifest STUDY.yaml``: the study's RayJob for review or GitOps,
rendered without a cluster and valid against KubeRay's CRD; bad input is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from fedtune.cli import main
from tests.needs import REPO_ROOT, need
from tests.service.k8s_fake import CRD, rayjob_schema

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
BYO = REPO_ROOT / "examples" / "byo" / "study.yaml"


@pytest.fixture(autouse=True)
def _k8s_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDTUNE_K8S_NAMESPACE", "ml")
    monkeypatch.setenv("FEDTUNE_K8S_IMAGE", "registry.example.com/fedtune:0.1.0")


def _render(capsys, *argv: str) -> dict:
    assert main(["manifest", *argv]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_the_manifest_validates_against_the_crd(capsys) -> None:
    need("crds", None if CRD.is_file() else f"no KubeRay RayJob CRD at {CRD}")
    manifest = _render(capsys, str(QUICKSTART), "--study-id", "0123456789ab")
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)
    assert manifest["metadata"] == {
        **manifest["metadata"],
        "name": "fedtune-0123456789ab-1",
        "namespace": "ml",
    }
    spec = manifest["spec"]
    assert spec["entrypoint"] == "fedtune worker run-study 0123456789ab --attempt 1"
    [group] = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2  # budget.max_concurrent 2, one CPU trial per pod
    assert "runtimeEnvYAML" not in spec


def test_gpu_sizing_and_json_output(tmp_path: Path, capsys) -> None:
    study = yaml.safe_load(QUICKSTART.read_text())
    study["resources"], study["budget"] = (
        {"cpu": 0.5, "gpu": 0.25},
        {"trials": 8, "max_concurrent": 6},
    )
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(study))
    out = tmp_path / "rayjob.json"
    assert main(["manifest", str(path), "--format", "json", "-o", str(out)]) == 0
    manifest = json.loads(out.read_text())
    [group] = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    [container] = group["template"]["spec"]["containers"]
    assert group["replicas"] == 2 and str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert "RayJob fedtune-" in capsys.readouterr().err


def test_user_code_needs_a_code_uri() -> None:
    # a child process: validating the study imports the user's package (its tasks' declared
    # parameters), which must not stay in this process's sys.modules and registries
    fedtune = [str(Path(sys.executable).parent / "fedtune"), "manifest", str(BYO)]
    run = subprocess.run(fedtune, capture_output=True, text=True, timeout=300, check=False)
    err = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(err) == 1 and "--code-uri" in err[0], run.stderr
    run = subprocess.run(
        [*fedtune, "--code-uri", "https://files.example.com/fedlab.zip"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    manifest = yaml.safe_load(run.stdout)
    env = yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])
    assert env["py_modules"] == ["https://files.example.com/fedlab.zip"]


@pytest.mark.parametrize(
    ("argv", "field"),
    [(["--study-id", "nope"], "--study-id"), (["--attempt", "0"], "--attempt")],
)
def test_bad_arguments_are_one_line_exit_2(capsys, argv: list[str], field: str) -> None:
    assert main(["manifest", str(QUICKSTART), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]


def test_a_bad_study_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    study = yaml.safe_load(QUICKSTART.read_text())
    study["budget"]["max_concurrent"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["manifest", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "budget.max_concurrent" in err[0]
