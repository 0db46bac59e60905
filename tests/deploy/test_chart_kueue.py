"""The chart's Kueue objects (off by default) validate against Kueue's CRDs.

``kueue.enabled`` renders a ResourceFlavor and, per project, a ClusterQueue (one cohort, nominal
quotas, a fair-sharing weight) and a LocalQueue in the release namespace, and tells the API to
hand its RayJobs to them (``FEDTUNE_K8S_KUEUE``: labelled with the LocalQueue, created
suspended). Every object is checked against the ``openAPIV3Schema`` of Kueue's CRD (closed, as
``kubectl --validate=strict``), as the RayJobs are against KubeRay's.
"""

from __future__ import annotations

import jsonschema
import pytest

from fedtune.service.settings import load_settings
from tests.deploy.conftest import NAMESPACE, RELEASE, container_env, find, one
from tests.needs import need
from tests.service.k8s_fake import KUEUE_CRDS, kueue_schema

FULLNAME = f"{RELEASE}-fedtune"
PLURAL = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
}
VALUES = {
    "kueue": {
        "enabled": True,
        "flavorNodeLabels": {"gpu-type": "a100"},
        "projects": {
            "vision": {"cpu": "64", "memory": "256Gi", "gpus": 8, "weight": 2},
            "audio": {"cpu": 16, "memory": "64Gi", "gpus": 2},
        },
    }
}


@pytest.fixture(autouse=True)
def _kueue_crds() -> None:
    need("crds", None if KUEUE_CRDS.is_dir() else f"Kueue CRDs {KUEUE_CRDS} are not available")


def test_off_by_default(render) -> None:
    manifests = render({})
    assert not [m for m in manifests if m["apiVersion"].startswith("kueue.x-k8s.io")]
    env = container_env(
        one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"][0]
    )
    assert "FEDTUNE_K8S_KUEUE" not in env


def test_the_kueue_objects_validate_against_kueues_crds(render) -> None:
    manifests = render(VALUES)
    kueue = [m for m in manifests if m["apiVersion"].startswith("kueue.x-k8s.io")]
    assert sorted((m["kind"], m["metadata"]["name"]) for m in kueue) == [
        ("ClusterQueue", "fedtune-audio"),
        ("ClusterQueue", "fedtune-default"),
        ("ClusterQueue", "fedtune-vision"),
        ("LocalQueue", "fedtune-audio"),
        ("LocalQueue", "fedtune-default"),
        ("LocalQueue", "fedtune-vision"),
        ("ResourceFlavor", "fedtune-flavor"),
    ]  # the chart's default project, and two more
    for obj in kueue:
        version = obj["apiVersion"].split("/")[1]
        sent = {k: v for k, v in obj.items() if k != "__source__"}  # the renderer's note
        jsonschema.Draft7Validator(kueue_schema(PLURAL[obj["kind"]], version)).validate(sent)
    vision = one(manifests, "ClusterQueue", "fedtune-vision")["spec"]
    assert vision["cohortName"] == "fedtune" and vision["fairSharing"]["weight"] == "2"
    quotas = {
        r["name"]: r["nominalQuota"] for r in vision["resourceGroups"][0]["flavors"][0]["resources"]
    }
    assert quotas == {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8"}
    local = one(manifests, "LocalQueue", "fedtune-vision")
    assert local["metadata"]["namespace"] == NAMESPACE
    assert local["spec"]["clusterQueue"] == "fedtune-vision"
    env = container_env(
        one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"][0]
    )
    settings = load_settings(
        backend="kubernetes",
        k8s_kueue=env["FEDTUNE_K8S_KUEUE"]["value"],
        k8s_kueue_queue_prefix=env["FEDTUNE_K8S_KUEUE_QUEUE_PREFIX"]["value"],
    )
    assert settings.k8s_kueue is True and settings.k8s_kueue_queue_prefix == "fedtune-"
    assert find(manifests, "ResourceFlavor")[0]["spec"]["nodeLabels"] == {"gpu-type": "a100"}


def test_kueue_needs_the_kubernetes_backend(render) -> None:
    with pytest.raises(Exception, match=r"kueue\.enabled needs backend=kubernetes"):
        render({**VALUES, "backend": "local"})


def test_the_role_may_read_kueues_workloads_exactly_as_the_code_does(render) -> None:
    """The API reads the Workload of a held RayJob (``backends/kueue.py``): its Role gets
    exactly the verbs of those calls, and only with Kueue on."""
    import re
    from pathlib import Path

    from fedtune.service.backends import kueue

    source = Path(kueue.__file__).read_text()
    verbs = {"list": "list", "get": "get"}
    used = sorted({verbs[v] for v in re.findall(r"\.(\w+?)_namespaced_custom_object\b", source)})
    rule = {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": used}
    assert rule in one(render(VALUES), "Role")["rules"]
    assert rule not in one(render({}), "Role")["rules"]
