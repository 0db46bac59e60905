"""The RayJob of a packed study is sized for its trial processes, not its configurations, and
still fits KubeRay's CRD; a pack larger than ``budget.max_concurrent`` is one line, exit 2, from
the verbs that validate a study here (``fedtune manifest``, ``fedtune tune``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fedtune.cli import main
from fedtune.service.backends.base import LaunchRequest
from fedtune.service.backends.k8s_manifest import worker_layout
from tests.needs import REPO_ROOT, need
from tests.service.k8s_fake import CRD, rayjob_schema

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
SID = "0123456789ab"


@pytest.fixture(autouse=True)
def _k8s_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDTUNE_K8S_NAMESPACE", "ml")
    monkeypatch.setenv("FEDTUNE_K8S_IMAGE", "registry.example.com/fedtune:0.1.0")


def _study(tmp_path: Path, resources: dict[str, Any], concurrent: int = 8) -> Path:
    """The quickstart with ``resources`` and ``concurrent`` configurations at once."""
    study = yaml.safe_load(QUICKSTART.read_text())
    study["resources"] = resources
    study["budget"] = {"trials": 16, "max_concurrent": concurrent}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def _worker_group(capsys, path: Path) -> dict[str, Any]:
    assert main(["manifest", str(path), "--study-id", SID]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)
    [group] = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group


@pytest.mark.parametrize(
    ("resources", "replicas", "limits"),
    [
        # 8 configurations in 2 processes of one GPU: 2 one-GPU pods
        ({"cpu": 1, "gpu": 1, "pack": 4}, 2, {"cpu": "1", "nvidia.com/gpu": "1"}),
        # unpacked, as before: a pod per configuration
        ({"cpu": 1, "gpu": 1, "pack": 1}, 8, {"cpu": "1", "nvidia.com/gpu": "1"}),
        # auto may pick one configuration per process: sized as unpacked
        ({"cpu": 1, "gpu": 1, "pack": "auto"}, 8, {"cpu": "1", "nvidia.com/gpu": "1"}),
        # 2 processes of half a GPU share one GPU pod
        ({"cpu": 1, "gpu": 0.5, "pack": 4}, 1, {"cpu": "2", "nvidia.com/gpu": "1"}),
        # CPU processes: one pod each
        ({"cpu": 2, "gpu": 0, "pack": 4}, 2, {"cpu": "2"}),
    ],
)
def test_the_packed_rayjob_has_workers_for_its_processes(
    tmp_path: Path, capsys, resources: dict[str, Any], replicas: int, limits: dict[str, str]
) -> None:
    need("crds", None if CRD.is_file() else f"no KubeRay RayJob CRD at {CRD}")
    group = _worker_group(capsys, _study(tmp_path, resources))
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == replicas
    container = group["template"]["spec"]["containers"][0]
    got = container["resources"]["limits"]
    assert {k: str(got[k]) for k in (*limits, "nvidia.com/gpu") if k in got} == limits
    assert ("num-gpus" in group["rayStartParams"]) == ("nvidia.com/gpu" in limits)


def test_worker_layout_counts_processes_and_a_request_checks_them() -> None:
    packed = LaunchRequest(SID, 1, cpu=1.0, gpu=1.0, max_concurrent=8, processes=2)
    assert worker_layout(packed) == {"replicas": 2, "trials_per_pod": 1, "cpu": 1.0, "gpu": 1}
    assert LaunchRequest(SID, 1, max_concurrent=8).processes == 8  # default: unpacked
    for processes in (-1, 9):
        with pytest.raises(ValueError, match="invalid launch request"):
            LaunchRequest(SID, 1, max_concurrent=8, processes=processes)


def test_manifest_of_a_pack_above_max_concurrent_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    path = _study(tmp_path, {"cpu": 1, "gpu": 1, "pack": 16})
    assert main(["manifest", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "resources.pack" in err[0], err


def test_tune_of_a_pack_above_max_concurrent_is_one_line_exit_2(capsys) -> None:
    """Refused while the study is validated, before Ray starts."""
    argv = ["tune", str(QUICKSTART), "--set", "resources.pack=16"]
    assert main([*argv, "--set", "budget.max_concurrent=8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resources.pack" in err, err
