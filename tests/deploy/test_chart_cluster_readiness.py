"""A deployment that survives a real KubeRay GPU cluster, chart side: one test (or group) per
finding of that review, each on the rendered chart. Every one of these failed on the chart before.

Pod Security: every pod of every value set is checked with tests/pss_restricted.py, an
implementation of all Baseline + Restricted controls as published, plus the autoscaler sidecar
KubeRay injects into the head from ``autoscalerOptions``.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from fedtune.service.settings import MIN_TOKEN_LENGTH, load_settings
from tests import pss_restricted
from tests.deploy.conftest import (
    NAMESPACE,
    OFFLINE_SECRETS,
    PG_PASSWORD,
    RAY_TOKEN,
    RELEASE,
    SCENARIOS,
    container_env,
    find,
    one,
    pod_specs,
    scenario_values,
    with_offline_secrets,
)

FULLNAME = f"{RELEASE}-fedtune"
RAY = {"backend": "ray", "rayCluster": {"enabled": True}}
MORE_VALUE_SETS = {
    "pull-secrets": {"imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}]},
    "head-pvc": {
        **RAY,
        "rayCluster": {"enabled": True, "head": {"workdir": {"existingClaim": "w"}}},
    },
    "no-netpol-no-pdb": {
        "networkPolicy": {"enabled": False},
        "api": {"podDisruptionBudget": {"enabled": False}},
        "mlflow": {"podDisruptionBudget": {"enabled": False}},
    },
}


def all_value_sets() -> dict[str, dict[str, Any]]:
    return scenario_values() | {k: with_offline_secrets(v) for k, v in MORE_VALUE_SETS.items()}


@pytest.fixture(scope="module")
def rendered_all(render) -> dict[str, list[dict[str, Any]]]:
    return {name: render(values) for name, values in all_value_sets().items()}


def pods(manifests: list[dict[str, Any]]) -> list[tuple[str, dict, dict]]:
    return [
        (f"{m['kind']}/{m['metadata']['name']} {where}", meta, spec)
        for m in manifests
        for where, meta, spec in pod_specs(m)
    ]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def head_of(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return one(manifests, "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]


def api_pod(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]


# ---- a writable workdir for drivers on the shared Ray head -----------------------------------


@pytest.mark.parametrize(
    ("scenario", "kind"), [("gpu", "emptyDir"), ("head-pvc", "persistentVolumeClaim")]
)
def test_ray_head_driver_workdir_is_a_writable_volume(rendered_all, scenario, kind) -> None:
    head = head_of(rendered_all[scenario])
    container = head["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    workdir = container_env(container)["FEDTUNE_WORKDIR"]["value"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == workdir)
    assert mount["name"] == "workdir" and not mount.get("readOnly")
    volume = next(v for v in head["volumes"] if v["name"] == "workdir")
    assert kind in volume
    # the pod's fsGroup makes a new volume writable by the image's user
    assert head["securityContext"]["fsGroup"] == head["securityContext"]["runAsUser"] == 10001


# ---- private registries ---------------------------------------------------------------------


def test_every_pod_and_the_rayjob_account_pull_with_the_secrets(rendered_all) -> None:
    manifests = rendered_all["pull-secrets"]
    expected = [{"name": "regcred"}, {"name": "mirror"}]
    for where, _, spec in pods(manifests):
        assert spec.get("imagePullSecrets") == expected, where
    account = one(manifests, "ServiceAccount", f"{FULLNAME}-job")
    assert account["imagePullSecrets"] == expected
    env = container_env(api_pod(manifests)["containers"][0])
    assert env["FEDTUNE_K8S_SERVICE_ACCOUNT"]["value"] == account["metadata"]["name"]
    assert env["FEDTUNE_K8S_IMAGE_PULL_SECRETS"]["value"] == "regcred,mirror"


# ---- secrets, roles, network, Ray auth -------------------------------------------------------


def _secret_refs(container: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


@pytest.mark.parametrize("scenario", [*SCENARIOS, *MORE_VALUE_SETS])
def test_no_pod_gets_a_whole_secret_and_ray_workers_get_no_credentials(
    rendered_all, scenario
) -> None:
    for where, _, spec in pods(rendered_all[scenario]):
        for container in containers(spec):
            assert "envFrom" not in container, f"{where}: envFrom hands over a whole Secret"
    for cluster in find(rendered_all[scenario], "RayCluster"):
        env_secret = f"{FULLNAME}-env"
        head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        # no database URL: drivers on the head report to the API with their study's token
        assert _secret_refs(head) == {(env_secret, "MLFLOW_TRACKING_URI")}
        for group in cluster["spec"]["workerGroupSpecs"]:
            for container in group["template"]["spec"]["containers"]:
                assert not _secret_refs(container), group["groupName"]
                assert not [e for e in container.get("env", []) if "DATABASE" in e["name"]]


def test_rayjob_drivers_get_a_secret_with_only_what_they_use(rendered_all) -> None:
    manifests = rendered_all["defaults"]
    name = container_env(api_pod(manifests)["containers"][0])["FEDTUNE_K8S_ENV_SECRET"]["value"]
    driver = one(manifests, "Secret", name)
    assert set(driver["stringData"]) == {"MLFLOW_TRACKING_URI"}  # no database URL
    full = one(manifests, "Secret", f"{FULLNAME}-env")["stringData"]
    assert driver["stringData"]["MLFLOW_TRACKING_URI"] == full["MLFLOW_TRACKING_URI"]


def test_fedtune_and_mlflow_use_separate_non_superuser_roles(rendered_all) -> None:
    from sqlalchemy.engine import make_url

    manifests = rendered_all["defaults"]
    env = one(manifests, "Secret", f"{FULLNAME}-env")["stringData"]
    fedtune = make_url(env["FEDTUNE_DATABASE_URL"])
    mlflow = make_url(env["MLFLOW_BACKEND_STORE_URI"])
    assert fedtune.username == "fedtune" and mlflow.username == "mlflow"
    assert fedtune.database != mlflow.database
    assert PG_PASSWORD not in (fedtune.password, mlflow.password)
    pg = one(manifests, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    pg_env = container_env(pg)
    assert pg_env["POSTGRES_USER"]["value"] == "postgres"
    assert "POSTGRES_DB" not in pg_env  # no database owned by the superuser for fedtune
    # only the PostgreSQL pod references the superuser password
    for where, _, spec in pods(manifests):
        for container in containers(spec):
            for secret, key in _secret_refs(container):
                if secret == f"{FULLNAME}-postgresql" and key == "password":
                    assert where.startswith("StatefulSet/"), where


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels + matchExpressions)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, vals = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in vals,
            "NotIn": key not in labels or labels[key] not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _admitted(
    policy: dict[str, Any], labels: dict[str, str], port: int | str, namespace: str | None = None
) -> bool:
    """Does ``policy`` let a pod with ``labels`` reach ``port`` of its pods? The pod is in the
    policy's namespace, or in ``namespace`` (labelled ``kubernetes.io/metadata.name``)."""
    ns_labels = {"kubernetes.io/metadata.name": namespace} if namespace else None
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        peers = rule.get("from")
        if peers is None or any(_peer_admits(peer, labels, ns_labels) for peer in peers):
            return True
    return False


def _peer_admits(peer: dict[str, Any], labels: dict[str, str], ns_labels) -> bool:
    """NetworkPolicyPeer semantics: podSelector alone = the policy's namespace; with a
    namespaceSelector, pods (all, or those the podSelector selects) of the selected namespaces."""
    if "namespaceSelector" not in peer:
        return ns_labels is None and "podSelector" in peer and _selects(peer["podSelector"], labels)
    if ns_labels is None or not _selects(peer["namespaceSelector"], ns_labels):
        return False
    return "podSelector" not in peer or _selects(peer["podSelector"], labels)


def _labels_of(manifests, component: str) -> dict[str, str]:
    for _, meta, _ in pods(manifests):
        if meta["labels"].get("app.kubernetes.io/component") == component:
            return meta["labels"]
    raise AssertionError(component)


def test_network_policies_admit_only_fedtune_pods_to_postgresql_and_the_api_to_ray(
    rendered_all,
) -> None:
    manifests = rendered_all["raycluster-defaults"]
    policies = {p["metadata"]["name"]: p for p in find(manifests, "NetworkPolicy")}
    pg = policies[f"{FULLNAME}-postgresql"]
    assert _selects(pg["spec"]["podSelector"], _labels_of(manifests, "postgresql"))
    for component in ("api", "mlflow"):
        assert _admitted(pg, _labels_of(manifests, component), "postgresql"), component
    # no Ray pod: drivers report to the API with their study's token
    assert not _admitted(pg, _labels_of(manifests, "ray-head"), "postgresql")
    worker = _labels_of(manifests, "ray-worker") | {
        "ray.io/cluster": f"{FULLNAME}-ray",
        "ray.io/node-type": "worker",
    }
    assert not _admitted(pg, worker, "postgresql")
    assert not _admitted(pg, {"app": "something-else"}, "postgresql")
    # nor a RayJob's pods (labels from rayjob_manifest + KubeRay's node type)
    study = {
        "app.kubernetes.io/name": "fedtune",
        "app.kubernetes.io/component": "study",
        "app.kubernetes.io/managed-by": "fedtune",
    }
    assert not _admitted(pg, study | {"ray.io/node-type": "head"}, "postgresql")
    assert not _admitted(pg, study | {"ray.io/node-type": "worker"}, "postgresql")

    ray = policies[f"{FULLNAME}-ray"]
    head = _labels_of(manifests, "ray-head") | {"ray.io/cluster": f"{FULLNAME}-ray"}
    assert _selects(ray["spec"]["podSelector"], head)
    assert _admitted(ray, _labels_of(manifests, "api"), 8265)
    assert not _admitted(ray, _labels_of(manifests, "api"), 10001)
    assert not _admitted(ray, _labels_of(manifests, "mlflow"), 8265)
    assert _admitted(ray, worker, 6379)  # the cluster's own pods talk freely
    assert not find(rendered_all["no-netpol-no-pdb"], "NetworkPolicy")


def test_rayjob_heads_admit_their_own_pods_and_no_other_job(render, tmp_path) -> None:
    """Finding 3: the Jobs API of a RayJob's head (8265) is reached by the RayJob's own pods
    (KubeRay's submitter carries rayjob_manifest's labels) and networkPolicy.rayDashboardFrom;
    before, any Job pod of the namespace (`batch.kubernetes.io/job-name` exists) was admitted."""
    from fedtune.service.backends.base import LaunchRequest
    from fedtune.service.backends.k8s_manifest import rayjob_manifest

    operator = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay"}}}]
    manifests = render({"networkPolicy": {"rayDashboardFrom": operator}})
    policy = one(manifests, "NetworkPolicy", f"{FULLNAME}-rayjobs")
    settings = load_settings(
        backend="kubernetes",
        k8s_namespace=NAMESPACE,
        k8s_image="i:1",
        database_url=f"sqlite:///{tmp_path / 'x.db'}",
    )
    job = rayjob_manifest(LaunchRequest("0123456789ab", 1), settings)["spec"]
    head = job["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert _selects(policy["spec"]["podSelector"], head | {"ray.io/node-type": "head"})
    submitter = job["submitterPodTemplate"]["metadata"]["labels"] | {
        "batch.kubernetes.io/job-name": "fedtune-0123456789ab-1"
    }
    assert _admitted(policy, submitter, 8265)
    assert not _admitted(policy, {"batch.kubernetes.io/job-name": "nightly-backup"}, 8265)
    assert not _admitted(policy, _labels_of(manifests, "mlflow"), 8265)
    assert any(
        rule.get("ports") == [{"port": 8265, "protocol": "TCP"}] and operator[0] in rule["from"]
        for rule in policy["spec"]["ingress"]
    )


OPERATOR = {"app.kubernetes.io/name": "kuberay-operator"}


def test_the_kuberay_operator_reaches_rayjob_dashboards_by_default(render, helm) -> None:
    """With the old default (rayDashboardFrom: []) the RayJob policy admitted 8265 only
    from the study's own pods, so KubeRay's RayJob controller could not poll GetJobInfo and no
    RayJob would report completion on a policy-enforcing CNI. Now the operator's namespace (and
    pods) are admitted on 8265 by default, and nothing else of that namespace is."""
    policy = one(render({}), "NetworkPolicy", f"{FULLNAME}-rayjobs")
    assert _admitted(policy, OPERATOR, 8265, namespace="kuberay-system")
    assert not _admitted(policy, OPERATOR, 6379, namespace="kuberay-system")  # only 8265
    assert not _admitted(policy, {"app": "other"}, 8265, namespace="kuberay-system")
    assert not _admitted(policy, OPERATOR, 8265, namespace="elsewhere")
    moved = one(
        render({"networkPolicy": {"kuberayOperator": {"namespace": "ray-system"}}}),
        "NetworkPolicy",
        f"{FULLNAME}-rayjobs",
    )
    assert _admitted(moved, OPERATOR, 8265, namespace="ray-system")
    with pytest.raises(
        helm.HelmError, match=r"networkPolicy\.kuberayOperator\.namespace is required"
    ):
        render({"networkPolicy": {"kuberayOperator": {"namespace": ""}}})


SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def test_only_the_autoscaler_sidecar_gets_a_kubernetes_api_token(render) -> None:
    """Found in this audit: the head pod opts out of token automounting (drivers and
    user code run there), but KubeRay's autoscaler sidecar must call the Kubernetes API, so the
    chart's default (autoscaling on) could never scale. A projected token reaches the autoscaler
    alone, through autoscalerOptions.volumeMounts; the ray-head container mounts none."""
    cluster = one(render(RAY), "RayCluster")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["automountServiceAccountToken"] is False
    mounts = [
        m for m in cluster["spec"]["autoscalerOptions"]["volumeMounts"] if m["mountPath"] == SA_PATH
    ]
    assert len(mounts) == 1 and mounts[0]["readOnly"] is True
    volume = next(v for v in head["volumes"] if v["name"] == mounts[0]["name"])
    sources = {key for source in volume["projected"]["sources"] for key in source}
    assert sources == {"serviceAccountToken", "configMap", "downwardAPI"}
    for container in head["containers"]:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] != volume["name"] and not mount["mountPath"].startswith(SA_PATH)
    values = {**RAY, "rayCluster": {"enabled": True, "enableInTreeAutoscaling": False}}
    off = one(render(values), "RayCluster")
    assert "autoscalerOptions" not in off["spec"]
    assert volume["name"] not in {
        v["name"] for v in off["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    }


def test_shared_raycluster_uses_ray_token_auth_and_the_api_sends_the_token(render) -> None:
    manifests = render(RAY)
    cluster = one(manifests, "RayCluster")
    auth = cluster["spec"]["authOptions"]
    assert auth["mode"] == "token"
    secret = one(manifests, "Secret", auth["secretName"])
    assert base64.b64decode(secret["data"]["auth_token"]).decode() == RAY_TOKEN
    ref = container_env(api_pod(manifests)["containers"][0])["RAY_AUTH_TOKEN"]["valueFrom"]
    assert ref["secretKeyRef"] == {"name": auth["secretName"], "key": "auth_token"}
    assert cluster["spec"]["rayVersion"] >= "2.52.0"  # Ray's token auth
    off = one(
        render({**RAY, "rayCluster": {"enabled": True, "auth": {"enabled": False}}}), "RayCluster"
    )
    assert "authOptions" not in off["spec"]


# ---- one scheduler, migrations in a hook Job --------------------------------------------------


def test_one_api_pod_recreates_and_several_roll_with_one_scheduler_leader(
    helm, chart, render, rendered_all
) -> None:
    """``api.replicas >= 2`` renders a RollingUpdate (the scheduler leads by
    a PostgreSQL lease, ``FEDTUNE_LEADER_LEASE_S``); backend local or SQLite are refused."""
    deployment = one(rendered_all["defaults"], "Deployment", FULLNAME)
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    chart.validate_schema({"api": {"replicas": 3}})
    several = one(render({"api": {"replicas": 3, "leaderLeaseSeconds": 6}}), "Deployment", FULLNAME)
    assert several["spec"]["replicas"] == 3
    assert several["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    env = container_env(api_pod([several])["containers"][0])
    assert env["FEDTUNE_LEADER_LEASE_S"]["value"] == "6"
    with pytest.raises(Exception, match="backend ray or kubernetes"):
        render({"api": {"replicas": 2}, "backend": "local"})
    with pytest.raises(Exception, match="needs PostgreSQL"):
        render(
            {
                "api": {"replicas": 2},
                "postgresql": {"enabled": False},
                "externalDatabase": {
                    "url": "sqlite:////data/fedtune.db",
                    "mlflowUrl": "sqlite:////data/mlflow.db",
                },
            }
        )


@pytest.mark.parametrize(
    ("values", "upgrade", "suffix", "hook"),
    [
        ({}, False, "db-init", None),
        ({}, True, "db-upgrade", "pre-install,pre-upgrade"),
        (scenario_values()["external-db"], False, "db-upgrade", "pre-install,pre-upgrade"),
    ],
)
def test_migrations_run_once_in_a_job_before_the_api(render, values, upgrade, suffix, hook) -> None:
    from fedtune.cli import build_parser

    manifests = render(values, upgrade=upgrade)
    job = one(manifests, "Job", f"{FULLNAME}-{suffix}")
    assert job["metadata"].get("annotations", {}).get("helm.sh/hook") == hook
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container  # the image's ENTRYPOINT `fedtune`
    args = build_parser().parse_args(container["args"])
    assert container["args"] == ["db", "upgrade"] and args.func.__name__ == "_upgrade"
    names = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    secret = container_env(container)["FEDTUNE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"]
    assert ("Secret", secret) in names or secret == values.get("secret", {}).get("existingSecret")
    if hook and ("Secret", secret) in names:  # a hook must not need a Secret created after it
        assert one(manifests, "Secret", secret)["metadata"]["annotations"]["helm.sh/hook"] == hook
    api = api_pod(manifests)
    env = container_env(api["containers"][0])
    settings = load_settings(migrate_on_start=env["FEDTUNE_MIGRATE_ON_START"]["value"])
    assert settings.migrate_on_start is False
    wait = api["initContainers"][0]
    assert "fedtune db current" in wait["command"][-1]


# ---- MLflow pinned and migrated before it starts --------------------------------------------


def test_mlflow_is_pinned_and_migrated_by_an_init_container(rendered_all) -> None:
    import tomllib

    from tests.deploy.conftest import REPO_ROOT

    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    pins = [
        d for d in pyproject["project"]["optional-dependencies"]["tune"] if d.startswith("mlflow")
    ]
    assert len(pins) == 1 and re.fullmatch(r"mlflow==[0-9.]+", pins[0].replace(" ", "")), pins
    pod = one(rendered_all["defaults"], "Deployment", f"{FULLNAME}-mlflow")["spec"]["template"][
        "spec"
    ]
    init = pod["initContainers"][0]
    assert "mlflow db upgrade" in " ".join(init["command"])
    assert (
        container_env(init)["MLFLOW_BACKEND_STORE_URI"]
        == container_env(pod["containers"][0])["MLFLOW_BACKEND_STORE_URI"]
    )


# ---- Pod Security "restricted" for every pod ------------------------------------------------


def _with_autoscaler(manifest: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster as KubeRay runs it: the autoscaler sidecar joins the head pod."""
    import copy

    if manifest["kind"] != "RayCluster" or not manifest["spec"].get("enableInTreeAutoscaling"):
        return manifest
    out = copy.deepcopy(manifest)
    options = out["spec"].get("autoscalerOptions", {})
    sidecar = {
        "name": "autoscaler",
        "securityContext": options.get("securityContext", {}),
        "volumeMounts": options.get("volumeMounts", []),
    }
    out["spec"]["headGroupSpec"]["template"]["spec"]["containers"].append(sidecar)
    return out


@pytest.mark.parametrize("scenario", [*SCENARIOS, *MORE_VALUE_SETS])
def test_every_rendered_pod_meets_pod_security_restricted(rendered_all, scenario) -> None:
    checked = 0
    for manifest in rendered_all[scenario]:
        problems = pss_restricted.object_violations(_with_autoscaler(manifest), "restricted")
        assert not problems, problems
        checked += len(pss_restricted.pod_specs(manifest))
        for _, spec in pss_restricted.pod_specs(manifest):
            assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    assert checked >= 4


def test_the_checker_sees_what_the_old_chart_missed() -> None:
    pod = {
        "securityContext": {"runAsNonRoot": True},
        "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False}}],
    }
    lines = pss_restricted.violations(pod)
    assert any("seccomp" in line for line in lines) and any("capabilit" in line for line in lines)


# ---- memory per GPU and /dev/shm -------------------------------------------------------------


def test_every_ray_pod_has_an_in_memory_dev_shm(rendered_all) -> None:
    for manifest in find(rendered_all["gpu"], "RayCluster"):
        for where, _, spec in pod_specs(manifest):
            mount = next(
                m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"
            )
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            assert volume["emptyDir"]["medium"] == "Memory" and volume["emptyDir"]["sizeLimit"], (
                where
            )


def test_gpu_workers_need_8gi_per_gpu_plus_shm(helm, chart) -> None:
    values = with_offline_secrets(
        {
            **RAY,
            "rayCluster": {
                "enabled": True,
                "worker": {
                    "resources": {"limits": {"cpu": "4", "memory": "12Gi", "nvidia.com/gpu": 2}},
                    "shmSize": "2Gi",
                },
            },
        }
    )
    with pytest.raises(
        helm.HelmError,
        match=r"rayCluster\.worker\.resources\.limits\.memory \(12Gi\) must be at least 8Gi per GPU",
    ):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    values["rayCluster"]["worker"]["resources"]["limits"]["memory"] = "18Gi"
    chart.render(values, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(helm.HelmValuesError, match="/kubernetesBackend/memoryPerGpuGi"):
        chart.validate_schema({"kubernetesBackend": {"memoryPerGpuGi": 4}})


def test_memory_settings_reach_the_kubernetes_backend(rendered_all) -> None:
    env = container_env(api_pod(rendered_all["defaults"])["containers"][0])
    settings = {
        k: v["value"] for k, v in env.items() if k.startswith("FEDTUNE_K8S_") and "value" in v
    }
    assert float(settings["FEDTUNE_K8S_MEMORY_PER_GPU_GI"]) >= 8
    assert float(settings["FEDTUNE_K8S_SHM_GI"]) > 0


# ---- the GPU example runs GPU pods on the CUDA build ------------------------------------------


def test_gpu_example_selects_the_cuda_image_wherever_gpus_are_used(rendered_all) -> None:
    manifests = rendered_all["gpu"]
    for group in one(manifests, "RayCluster")["spec"]["workerGroupSpecs"]:
        container = group["template"]["spec"]["containers"][0]
        if container["resources"].get("limits", {}).get("nvidia.com/gpu"):
            assert container["image"].endswith("-cuda"), group["groupName"]
    env = container_env(api_pod(manifests)["containers"][0])
    assert env.get("FEDTUNE_K8S_IMAGE") is None  # backend ray; the kubernetes variant below
    values = scenario_values()["gpu"] | {"backend": "kubernetes"}
    from tests.deploy.conftest import EXAMPLES_DIR, load_yaml

    assert load_yaml(EXAMPLES_DIR / "gpu-values.yaml")["kubernetesBackend"]["image"][
        "tag"
    ].endswith("-cuda")
    assert values["kubernetesBackend"]["image"]["tag"].endswith("-cuda")


# ---- extended resources are limits only -------------------------------------------------------


def test_gpu_requests_are_refused_and_rendered_gpus_are_limits_only(
    helm, chart, rendered_all
) -> None:
    with pytest.raises(helm.HelmValuesError, match=r"/rayCluster/worker/resources/requests"):
        chart.validate_schema(
            {"rayCluster": {"worker": {"resources": {"requests": {"nvidia.com/gpu": 1}}}}}
        )
    for scenario, manifests in rendered_all.items():
        for where, _, spec in pods(manifests):
            for container in containers(spec):
                resources = container.get("resources", {})
                limits, requests = resources.get("limits", {}), resources.get("requests", {})
                for name in {*limits, *requests} - {"cpu", "memory", "ephemeral-storage"}:
                    assert name not in requests or requests[name] == limits.get(name), (
                        scenario,
                        where,
                    )


# ---- no password invented by an offline render ------------------------------------------------


@pytest.mark.parametrize("upgrade", [False, True])
def test_offline_render_without_a_password_fails_with_the_fix(helm, render, upgrade) -> None:
    with pytest.raises(
        helm.HelmError, match=r"postgresql\.auth\.password .* is required.*helm template"
    ):
        render({}, offline_secrets=False, upgrade=upgrade)
    with pytest.raises(helm.HelmError, match=r"rayCluster\.auth\.token .* is required"):
        render(
            {**RAY, "postgresql": OFFLINE_SECRETS["postgresql"], "auth": OFFLINE_SECRETS["auth"]},
            offline_secrets=False,
            upgrade=upgrade,
        )
    # the API's token: never open, so generated on install, which an offline render cannot do
    with pytest.raises(helm.HelmError, match=r"auth\.apiToken \(or auth\.existingSecret, or "):
        render(
            {"postgresql": OFFLINE_SECRETS["postgresql"], "mlflow": OFFLINE_SECRETS["mlflow"]},
            offline_secrets=False,
            upgrade=upgrade,
        )
    # an existing Secret needs no generated value
    render(scenario_values()["external-db"], offline_secrets=False, upgrade=upgrade)


def test_an_explicit_password_renders_the_same_secrets_every_time(render) -> None:
    first, second = (
        {
            s["metadata"]["name"]: s.get("data", s.get("stringData"))
            for s in find(render({}), "Secret")
        }
        for _ in range(2)
    )
    assert first == second


# ---- PDBs, token length, GPU resources, names -------------------------------------------------


def test_api_and_mlflow_have_disruption_budgets_selecting_their_pods(rendered_all) -> None:
    manifests = rendered_all["defaults"]
    budgets = find(manifests, "PodDisruptionBudget")
    assert {b["metadata"]["name"] for b in budgets} == {FULLNAME, f"{FULLNAME}-mlflow"}
    for budget in budgets:
        matched = [
            w
            for w, meta, _ in pods(manifests)
            if _selects(budget["spec"]["selector"], meta["labels"])
        ]
        assert len(matched) == 1, (budget["metadata"]["name"], matched)
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert not find(rendered_all["no-netpol-no-pdb"], "PodDisruptionBudget")


@pytest.mark.parametrize(
    "token", ["x" * (MIN_TOKEN_LENGTH - 1), "changethis", "has white space 0123456789"]
)
def test_a_token_the_service_would_refuse_fails_the_render(helm, chart, token) -> None:
    with pytest.raises(ValueError):
        load_settings(api_token=token)
    with pytest.raises(helm.HelmError, match=r"auth\.apiToken: use at least 16"):
        chart.render(
            with_offline_secrets({"auth": {"apiToken": token}}), name=RELEASE, namespace=NAMESPACE
        )
    assert MIN_TOKEN_LENGTH == 16  # the message quotes the service's minimum


@pytest.mark.parametrize(
    ("group", "needle"),
    [
        ({"resources": None}, "rayCluster.worker.resources.limits: cpu and memory are required"),
        (
            {"resources": {"limits": {"memory": None}}},
            "cpu and memory are required",
        ),
    ],
)
def test_worker_groups_without_cpu_and_memory_limits_are_refused(
    helm, chart, group, needle
) -> None:
    values = with_offline_secrets({**RAY, "rayCluster": {"enabled": True, "worker": group}})
    with pytest.raises(helm.HelmError, match=re.escape(needle)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_long_release_names_never_collide_after_truncation(render) -> None:
    base = "r" * 45
    first, second = render(RAY, name=base + "a"), render(RAY, name=base + "b")
    names = lambda ms: {(m["kind"], m["metadata"]["name"]) for m in ms}  # noqa: E731
    assert not names(first) & names(second)
    for manifests in (first, second):
        assert len(names(manifests)) == len(manifests), "two objects of one kind share a name"
        for _, name in names(manifests):
            assert len(name) <= 63
        assert len(one(manifests, "RayCluster")["metadata"]["name"] + "-head-svc") <= 63


@pytest.mark.parametrize("scenario", [*SCENARIOS, *MORE_VALUE_SETS])
def test_object_names_are_unique_per_kind(rendered_all, scenario) -> None:
    seen = [(m["kind"], m["metadata"]["name"]) for m in rendered_all[scenario]]
    assert len(seen) == len(set(seen))
