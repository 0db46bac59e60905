"""Shared fixtures of the deployment tests: render the Helm chart offline, load the KubeRay CRDs.

The chart is rendered and linted with ``helm-python-sdk`` (import name ``helm_python``), which
binds Helm's own Go SDK (v4) through a bundled ``libhelm_c`` shared library: ``helm template`` /
``helm lint`` semantics without a ``helm`` binary, a cluster or a network. It is part of the
``dev`` extra (``pip install -e '.[dev]'``). Where the package or its native library is missing
the Helm tests skip and say how to install it.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.needs import crd_dir, need

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "fedtune"
EXAMPLES_DIR = REPO_ROOT / "examples" / "helm"
# `shared/` sits beside the checkout (../shared), as in the development and CI layouts
CRD_DIR = crd_dir()
RELEASE = "demo"
NAMESPACE = "ml"
HELM_INSTALL_HINT = (
    "install the dev extra: `pip install -e '.[dev]'` (helm-python-sdk bundles Helm's Go SDK as "
    "libhelm_c, no helm binary needed; on a platform without a wheel set HELM_C_LIB to a built "
    "libhelm_c)"
)

Manifest = dict[str, Any]
Renderer = Callable[..., list[Manifest]]


# libyaml's loader when PyYAML has it: the KubeRay CRDs are megabytes of YAML.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        return yaml.load(handle, Loader=_LOADER) or {}


#: what an offline render needs besides the example files: the chart refuses to invent a password,
#: an API token or a Ray token that `lookup` could not read back
PG_PASSWORD = "offline-render-password-0123456789"
RAY_TOKEN = "offline-render-ray-token-0123456789"
MLFLOW_ADMIN_PASSWORD = "offline-render-mlflow-admin-0123456789"
API_TOKEN = "offline-render-api-token-0123456789"
OFFLINE_SECRETS = {
    "auth": {"apiToken": API_TOKEN},
    "postgresql": {"auth": {"password": PG_PASSWORD}},
    "rayCluster": {"auth": {"token": RAY_TOKEN}},
    "mlflow": {"auth": {"adminPassword": MLFLOW_ADMIN_PASSWORD}},
}


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in (maps recursively, like Helm merges values files)."""
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def with_offline_secrets(values: dict[str, Any]) -> dict[str, Any]:
    return deep_merge(OFFLINE_SECRETS, values)


def scenario_values() -> dict[str, dict[str, Any]]:
    """The value sets every chart-wide check runs on (the issue's four, plus the local backend),
    each with the secrets an offline render must be given."""
    plain = {
        "defaults": {},
        "gpu": load_yaml(EXAMPLES_DIR / "gpu-values.yaml"),
        "external-db": load_yaml(EXAMPLES_DIR / "external-db-values.yaml"),
        "ingress": {
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "tls": [{"secretName": "fedtune-tls", "hosts": ["fedtune.example.com"]}],
            },
            "auth": {"apiToken": "test-token-set-by-the-test"},
        },
        "local": {"backend": "local", "mlflow": {"enabled": False}},
        "raycluster-defaults": {"backend": "ray", "rayCluster": {"enabled": True}},
    }
    return {name: with_offline_secrets(values) for name, values in plain.items()}


SCENARIOS = tuple(scenario_values())


@pytest.fixture(scope="session")
def image_root() -> Iterator[Any]:
    """The built image's root file system (``tests/deploy/image_rootfs.py``): built once per
    session (warm: the code layers only), one working container mounted, removed at the end."""
    from tests.deploy import image_rootfs
    from tests.deploy.pod_sandbox import bwrap_missing

    need("bwrap", bwrap_missing())
    need("image", image_rootfs.missing_reason())
    root = image_rootfs.mount(image_rootfs.build_image())
    try:
        yield root
    finally:
        image_rootfs.unmount(root)


@pytest.fixture(scope="session")
def helm() -> Any:
    """The ``helm_python`` module with its native library loaded, or a skip with the install step."""
    try:
        import helm_python
    except ImportError as exc:
        need("helm", f"helm-python-sdk is not installed ({exc}); {HELM_INSTALL_HINT}")
    try:
        helm_python.helm_sdk_version()
    except Exception as exc:  # the wheel is there but its libhelm_c cannot load
        need("helm", f"libhelm_c could not be loaded ({exc}); {HELM_INSTALL_HINT}")
    return helm_python


@pytest.fixture(scope="session")
def chart(helm: Any) -> Iterator[Any]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def split_manifests(rendered: dict[str, str]) -> list[Manifest]:
    """YAML documents of every rendered template (NOTES.txt excluded), each tagged with its source."""
    manifests = []
    for source, text in sorted(rendered.items()):
        if not source.endswith((".yaml", ".yml")):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                document["__source__"] = source
                manifests.append(document)
    return manifests


@pytest.fixture(scope="session")
def render(chart: Any) -> Renderer:
    """``render(values, name=..., namespace=...) -> [manifest]``: ``helm template`` offline, with
    :data:`OFFLINE_SECRETS` merged under ``values`` unless ``offline_secrets=False``."""

    def _render(
        values: dict[str, Any] | None = None,
        *,
        name: str = RELEASE,
        namespace: str = NAMESPACE,
        offline_secrets: bool = True,
        upgrade: bool = False,
    ) -> list[Manifest]:
        values = copy.deepcopy(values or {})
        if offline_secrets:
            values = with_offline_secrets(values)
        rendered = chart.render(
            values, name=name, namespace=namespace, is_install=not upgrade, is_upgrade=upgrade
        )
        return split_manifests(rendered)

    return _render


@pytest.fixture(scope="session")
def rendered_scenarios(render: Renderer) -> dict[str, list[Manifest]]:
    return {name: render(values) for name, values in scenario_values().items()}


def without_source(manifest: Manifest) -> Manifest:
    return {key: value for key, value in manifest.items() if key != "__source__"}


def find(manifests: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_specs(manifest: Manifest) -> Iterator[tuple[str, Manifest, dict[str, Any]]]:
    """(where, pod metadata, pod spec) of every pod a manifest runs: workloads, Pods, RayClusters."""
    kind = manifest["kind"]
    if kind == "Pod":
        yield "pod", manifest["metadata"], manifest["spec"]
    elif kind in {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}:
        template = manifest["spec"]["template"]
        yield "template", template["metadata"], template["spec"]
    elif kind == "RayCluster":
        head = manifest["spec"]["headGroupSpec"]["template"]
        yield "head", head["metadata"], head["spec"]
        for group in manifest["spec"].get("workerGroupSpecs", []):
            template = group["template"]
            yield f"worker:{group['groupName']}", template["metadata"], template["spec"]


def container_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


# ---- CRD schemas ---------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """Close every object schema that lists properties, as `kubectl --validate=strict` does.

    A real API server prunes unknown fields of custom resources silently; closing the schema turns
    a misspelt field (``minReplica``) into a test failure instead of a silently ignored setting.
    Objects marked ``x-kubernetes-preserve-unknown-fields`` or with ``additionalProperties``
    stay as they are.
    """
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


def crd_schema(kind: str, version: str = "v1") -> dict[str, Any]:
    """openAPIV3Schema of KubeRay's ``kind`` (RayCluster, RayJob), closed by :func:`_strict`."""
    path = CRD_DIR / f"ray.io_{kind.lower()}s.yaml"
    if not path.exists():
        need("crds", f"KubeRay CRD {path} is not available (set FEDTUNE_CRD_DIR)")
    return _crd_schema(path, kind, version)


@functools.cache
def _crd_schema(path: Path, kind: str, version: str) -> dict[str, Any]:
    crd = load_yaml(path)
    assert crd["spec"]["names"]["kind"] == kind
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return _strict(entry["schema"]["openAPIV3Schema"])
    raise AssertionError(f"{path} has no version {version}")


# ---- documented values ---------------------------------------------------------------------


def _docs_gen():
    """``tools/docs_gen.py``, the one parser of the chart's ``# --`` value descriptions."""
    spec = importlib.util.spec_from_file_location("docs_gen", REPO_ROOT / "tools" / "docs_gen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


documented_values = _docs_gen().documented_values


def leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Paths of the leaves of a values tree (lists and empty maps are leaves)."""
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from leaf_paths(value, (*prefix, str(key)))
    else:
        yield prefix
