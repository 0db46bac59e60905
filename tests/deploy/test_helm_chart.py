"""The Helm chart, rendered offline (Helm 4 Go SDK via helm-python-sdk; see conftest.py).

Scenarios: defaults, the GPU example, the external-database example (existing Secrets), an
ingress with a token, and the local backend. Every rendered core object is validated with
kubernetes-validate in strict mode and every RayCluster/RayJob against KubeRay's CRD schema.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.conftest import (
    CHART_DIR,
    MLFLOW_ADMIN_PASSWORD,
    NAMESPACE,
    PG_PASSWORD,
    RELEASE,
    REPO_ROOT,
    SCENARIOS,
    container_env,
    crd_schema,
    documented_values,
    find,
    leaf_paths,
    one,
    pod_specs,
    scenario_values,
    with_offline_secrets,
    without_source,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate")
from kubernetes_validate.utils import latest_version  # noqa: E402

CHART = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
MIN_KUBE = re.search(r"(\d+\.\d+)", CHART["kubeVersion"]).group(1) + ".0"
KUBE_VERSIONS = (MIN_KUBE, latest_version())
FULLNAME = f"{RELEASE}-fedtune"
RAY_KINDS = {"RayCluster", "RayJob"}
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
BACKEND_SOURCE = CHART_DIR.parents[1] / "fedtune" / "service" / "backends" / "kubernetes.py"
#: CustomObjectsApi method prefix -> RBAC verb
API_VERBS = {
    "create": "create",
    "get": "get",
    "list": "list",
    "delete": "delete",
    "patch": "patch",
    "replace": "update",
}


def rayjob_verbs_the_code_uses() -> list[str]:
    """RBAC verbs of the CustomObjectsApi calls in the kubernetes backend."""
    calls = re.findall(r"\.(\w+?)_namespaced_custom_object(_status)?\b", BACKEND_SOURCE.read_text())
    assert calls, "the kubernetes backend makes no CustomObjectsApi call?"
    assert not [c for c in calls if c[1]], "a status subresource call needs its own rule"
    return sorted({API_VERBS[name] for name, _ in calls})


def api_container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"][0]


def schema_error(chart: Any, helm: Any, values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema(values)
    return str(caught.value)


# ---- helm lint / template / values schema -----------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_is_clean(helm: Any, scenario: str) -> None:
    report = helm.lint(
        CHART_DIR, scenario_values()[scenario], strict=True, kube_version=f"v{KUBE_VERSIONS[-1]}"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], problems


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_values_pass_the_schema_in_helm_and_in_jsonschema(
    chart: Any, scenario: str, rendered_scenarios: dict
) -> None:
    values = scenario_values()[scenario]
    chart.validate_schema(values)
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(chart.merge_values(values))
    assert rendered_scenarios[scenario], "nothing rendered"


@pytest.mark.parametrize(
    ("values", "path", "words"),
    [
        ({"api": {"replicas": -1}}, "/api/replicas", "minimum"),
        ({"backend": "slurm"}, "/backend", "kubernetes"),
        (
            {"rayCluster": {"worker": {"maxReplicas": -2}}},
            "/rayCluster/worker/maxReplicas",
            "minimum",
        ),
        (
            {"rayCluster": {"additionalWorkerGroups": {"big": {"replicas": 1}}}},
            "/rayCluster/additionalWorkerGroups/big",
            "minReplicas",
        ),
        ({"mlflow": {"replicas": -1}}, "/mlflow/replicas", "minimum"),
        ({"mlflow": {"artifacts": {"type": "gcs"}}}, "/mlflow/artifacts/type", "pvc"),
        (
            {"postgresql": {"auth": {"password": "p@ss:w/rd"}}},
            "/postgresql/auth/password",
            "pattern",
        ),
        ({"api": {"replica": 2}}, "/api", "replica"),
        (
            {"kubernetesBackend": {"workerTemplate": {"nodeSelectr": {}}}},
            "/kubernetesBackend/workerTemplate",
            "nodeSelectr",
        ),
    ],
)
def test_schema_rejects_invalid_values_naming_the_field(
    helm: Any, chart: Any, values: dict, path: str, words: str
) -> None:
    message = schema_error(chart, helm, values)
    assert f"'{path}'" in message and words in message, message
    with pytest.raises(helm.HelmValuesError, match=re.escape(path)):
        chart.render(with_offline_secrets(values), name=RELEASE, namespace=NAMESPACE)
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(chart.merge_values(values)))
    assert errors and all(e.json_path.startswith("$" + path.replace("/", ".")) for e in errors)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"backend": "ray"}, "rayCluster.enabled=true or ray.address"),
        ({"postgresql": {"enabled": False}}, "externalDatabase.url is required"),
        (
            {
                "rayCluster": {
                    "enabled": True,
                    "worker": {"minReplicas": 3, "maxReplicas": 2, "replicas": 2},
                }
            },
            "rayCluster.worker: minReplicas (3) must not exceed maxReplicas (2)",
        ),
        ({"postgresql": {"auth": {"existingSecret": "pg"}}}, "set secret.existingSecret too"),
        ({"mlflow": {"artifacts": {"type": "s3"}}}, "mlflow.artifacts.s3.bucket"),
    ],
)
def test_impossible_combinations_fail_with_the_values_named(
    helm: Any, chart: Any, values: dict, needle: str
) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(needle)):
        chart.render(with_offline_secrets(values), name=RELEASE, namespace=NAMESPACE)


# ---- every rendered object is valid --------------------------------------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_core_objects_validate_strictly(
    rendered_scenarios: dict, scenario: str, kube_version: str
) -> None:
    checked = 0
    for manifest in rendered_scenarios[scenario]:
        if manifest["kind"] in RAY_KINDS:
            continue
        try:
            kubernetes_validate.validate(without_source(manifest), kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{manifest['__source__']} {manifest['kind']}: {exc.message} at {list(exc.path)}"
            )
        checked += 1
    assert checked >= 6


@pytest.mark.parametrize("scenario", ["gpu", "defaults-with-raycluster"])
def test_rayclusters_match_the_kuberay_crd(render: Any, scenario: str) -> None:
    values = scenario_values().get(scenario) or {"rayCluster": {"enabled": True}}
    clusters = find(render(values), "RayCluster")
    assert len(clusters) == 1
    jsonschema.Draft7Validator(crd_schema("RayCluster")).validate(without_source(clusters[0]))


def test_strict_crd_schema_catches_a_misspelt_field(render: Any) -> None:
    cluster = without_source(one(render({"rayCluster": {"enabled": True}}), "RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["minReplica"] = 1
    with pytest.raises(jsonschema.ValidationError, match="minReplica"):
        jsonschema.Draft7Validator(crd_schema("RayCluster")).validate(cluster)


def test_worker_template_and_job_settings_make_a_valid_rayjob(render: Any) -> None:
    """Apply FEDTUNE_K8S_* as docs/reference/environment.md documents them to a RayJob; KubeRay's schema accepts it."""
    env = container_env(api_container(render(scenario_values()["gpu"] | {"backend": "kubernetes"})))
    template = json.loads(env["FEDTUNE_K8S_WORKER_TEMPLATE"]["value"])
    assert template["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    container = {
        "name": "ray-worker",
        "image": env["FEDTUNE_K8S_IMAGE"]["value"],
        "envFrom": [{"secretRef": {"name": env["FEDTUNE_K8S_ENV_SECRET"]["value"]}}],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    pod = {
        "serviceAccountName": env["FEDTUNE_K8S_SERVICE_ACCOUNT"]["value"],
        "containers": [container],
    }
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "study-1", "namespace": NAMESPACE},
        "spec": {
            "entrypoint": "fedtune worker run-study 1",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": pod}},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 1,
                        "minReplicas": 0,
                        "maxReplicas": 2,
                        "rayStartParams": {},
                        "template": {"spec": pod | template},
                    }
                ],
            },
        },
    }
    jsonschema.Draft7Validator(crd_schema("RayJob")).validate(rayjob)


# ---- labels, references, services ----------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_and_pod_carries_the_standard_labels(
    rendered_scenarios: dict, scenario: str
) -> None:
    for manifest in rendered_scenarios[scenario]:
        metas = [manifest["metadata"], *(meta for _, meta, _ in pod_specs(manifest))]
        for meta in metas:
            labels = meta.get("labels", {})
            assert all(key in labels for key in STANDARD_LABELS), (manifest["__source__"], labels)
            assert labels["app.kubernetes.io/instance"] == RELEASE
            assert labels["app.kubernetes.io/version"] == CHART["appVersion"]
            assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in labels.values()), labels
        assert len(manifest["metadata"]["name"]) <= 63


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_services_select_pods_and_named_ports(rendered_scenarios: dict, scenario: str) -> None:
    manifests = rendered_scenarios[scenario]
    pods = [(meta["labels"], spec) for m in manifests for _, meta, spec in pod_specs(m)]
    for service in find(manifests, "Service"):
        selector = service["spec"]["selector"]
        matched = [spec for labels, spec in pods if selector.items() <= labels.items()]
        assert matched, f"Service {service['metadata']['name']} selects no pod"
        names = {
            p.get("name")
            for spec in matched
            for c in spec["containers"]
            for p in c.get("ports", [])
        }
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= names


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_referenced_secrets_accounts_and_claims_exist(
    rendered_scenarios: dict, scenario: str
) -> None:
    """Everything a pod references is rendered, or is an existing-Secret name the values give."""
    manifests = rendered_scenarios[scenario]
    values = scenario_values()[scenario]
    external = {values.get(block, {}).get("existingSecret") for block in ("secret", "auth")} | {
        values.get("mlflow", {}).get("artifacts", {}).get("s3", {}).get("existingSecret"),
        values.get("mlflow", {}).get("auth", {}).get("existingSecret"),
    }
    names = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    for manifest in manifests:
        for where, _, spec in pod_specs(manifest):
            if "serviceAccountName" in spec:
                assert ("ServiceAccount", spec["serviceAccountName"]) in names
            for volume in spec.get("volumes", []):
                if "persistentVolumeClaim" in volume:
                    assert (
                        "PersistentVolumeClaim",
                        volume["persistentVolumeClaim"]["claimName"],
                    ) in names
                if "configMap" in volume:
                    assert ("ConfigMap", volume["configMap"]["name"]) in names
            for container in spec["containers"]:
                refs = [
                    e["valueFrom"]["secretKeyRef"]
                    for e in container.get("env", [])
                    if "secretKeyRef" in e.get("valueFrom", {})
                ]
                refs += [e["secretRef"] for e in container.get("envFrom", [])]
                for ref in refs:
                    ok = ("Secret", ref["name"]) in names or ref["name"] in external
                    assert ok, f"{manifest['__source__']} {where}: Secret {ref['name']} missing"


# ---- security, probes, RBAC ----------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_container_runs_hardened(rendered_scenarios: dict, scenario: str) -> None:
    for manifest in rendered_scenarios[scenario]:
        for where, _, spec in pod_specs(manifest):
            pod_ctx = spec["securityContext"]
            assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] > 0, where
            assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}
            mounts_tmp = True
            for container in spec["containers"]:
                ctx = container["securityContext"]
                assert ctx["allowPrivilegeEscalation"] is False, where
                assert ctx["readOnlyRootFilesystem"] is True, where
                assert ctx["capabilities"] == {"drop": ["ALL"]}, where
                assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, where
                assert "resources" in container and container["resources"]["limits"], where
                mounts_tmp &= manifest["kind"] == "Pod" or any(
                    m["mountPath"] == "/tmp" for m in container["volumeMounts"]
                )
            assert mounts_tmp, f"{manifest['__source__']} {where}: no writable /tmp"


def test_api_workdir_is_a_writable_emptydir_and_probes_follow_the_contract(
    rendered_scenarios: dict,
) -> None:
    manifests = rendered_scenarios["defaults"]
    pod = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    workdir = container_env(container)["FEDTUNE_WORKDIR"]["value"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == workdir)
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mount["name"])
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port == {"http": 8000}
    probes = {
        k: container[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes["livenessProbe"] == {"path": "/healthz", "port": "http"}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": "http"}
    assert probes["startupProbe"] == {"path": "/healthz", "port": "http"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rbac_is_namespaced_and_exactly_the_rayjob_verbs(
    rendered_scenarios: dict, scenario: str
) -> None:
    manifests = rendered_scenarios[scenario]
    backend = (scenario_values()[scenario].get("backend")) or "kubernetes"
    assert not find(manifests, "ClusterRole") and not find(manifests, "ClusterRoleBinding")
    pod = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is (backend == "kubernetes")
    if backend != "kubernetes":
        assert not find(manifests, "Role") and not find(manifests, "RoleBinding")
        return
    role = one(manifests, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": rayjob_verbs_the_code_uses()}
    ]
    binding = one(manifests, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]


# ---- secrets -------------------------------------------------------------------------------------

SECRET_KEY = re.compile(r"(password|passwd|token|apikey|secretaccesskey)$", re.IGNORECASE)
CREDENTIAL_URL = re.compile(r"://[^/@\s]+:[^/@\s]+@")


def test_no_default_value_holds_a_secret() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for path in leaf_paths(values):
        value: Any = values
        for key in path:
            value = value[key]
        if SECRET_KEY.search(path[-1]):
            assert value == "", f"{'.'.join(path)} has a default secret"
        if isinstance(value, str):
            assert not CREDENTIAL_URL.search(value), f"{'.'.join(path)} embeds credentials"


def test_role_passwords_derive_from_the_given_password_and_urls_use_them(render: Any) -> None:
    manifests = render({"postgresql": {"auth": {"password": "p" * 24}}})
    secret = one(manifests, "Secret", f"{FULLNAME}-postgresql")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["password"] == "p" * 24
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len({data["password"], data["fedtune-password"], data["mlflow-password"]}) == 3
    env = one(manifests, "Secret", f"{FULLNAME}-env")["stringData"]
    pg = f"{FULLNAME}-postgresql:5432"
    assert env["FEDTUNE_DATABASE_URL"] == (
        f"postgresql+psycopg://fedtune:{data['fedtune-password']}@{pg}/fedtune"
    )
    assert env["MLFLOW_BACKEND_STORE_URI"] == (
        f"postgresql+psycopg://mlflow:{data['mlflow-password']}@{pg}/mlflow"
    )
    again = one(
        render({"postgresql": {"auth": {"password": "p" * 24}}}),
        "Secret",
        secret["metadata"]["name"],
    )
    assert again["data"] == secret["data"], "derived passwords must be stable across renders"


def test_external_database_scenario_renders_no_secret_values(rendered_scenarios: dict) -> None:
    manifests = rendered_scenarios["external-db"]
    assert not [m for m in manifests if "postgresql" in m["metadata"]["name"]]
    assert not [
        s
        for s in find(manifests, "Secret")
        if "helm.sh/hook" not in s["metadata"].get("annotations", {})
    ]
    env = container_env(api_container(manifests))
    assert env["FEDTUNE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "fedtune-connection"
    assert env["FEDTUNE_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "fedtune-api-token",
        "key": "api-token",
    }
    assert env["FEDTUNE_K8S_ENV_SECRET"]["value"] == "fedtune-driver"
    assert env["FEDTUNE_MLFLOW_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "fedtune-mlflow-admin",
        "key": "admin-password",
    }
    mlflow = one(manifests, "Deployment", f"{FULLNAME}-mlflow")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "--artifacts-destination=s3://ml-artifacts/fedtune/mlflow" in mlflow["args"]
    assert (
        container_env(mlflow)["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"]
        == "fedtune-s3"
    )


# ---- the service contract ------------------------------------------------------------------------

#: studyLimits.<value> -> FEDTUNE_<variable>, plus dataRoots
STUDY_LIMITS = {
    "maxTrials": "MAX_TRIALS",
    "maxRounds": "MAX_ROUNDS",
    "maxClients": "MAX_CLIENTS",
    "maxDim": "MAX_DIM",
    "maxConcurrentTrials": "MAX_CONCURRENT_TRIALS",
    "maxLocalSteps": "MAX_LOCAL_STEPS",
    "maxLocalEpochs": "MAX_LOCAL_EPOCHS",
    "maxBatchSize": "MAX_BATCH_SIZE",
    "maxSeed": "MAX_SEED",
    "maxTrialCpu": "MAX_TRIAL_CPU",
    "maxTrialGpu": "MAX_TRIAL_GPU",
    "maxChoices": "MAX_CHOICES",
    "maxSearchParameters": "MAX_SEARCH_PARAMETERS",
    "maxConcurrentValidations": "MAX_CONCURRENT_VALIDATIONS",
    "validationQueue": "VALIDATION_QUEUE",
    "dataRoots": "DATA_ROOTS",
}
CONTRACT_ENV = {
    "common": {
        "FEDTUNE_BACKEND",
        "FEDTUNE_MAX_CONCURRENT_STUDIES",
        "FEDTUNE_WORKDIR",
        "FEDTUNE_DATABASE_URL",
        "MLFLOW_TRACKING_URI",
        "FEDTUNE_MIGRATE_ON_START",
        "FEDTUNE_LEADER_LEASE_S",
        *(f"FEDTUNE_{name}" for name in STUDY_LIMITS.values()),
        "HOME",
    },
    #: drivers on the cluster report to the API (its in-cluster URL), never to the database
    "ray": {"RAY_ADDRESS", "FEDTUNE_PUBLIC_URL"},
    "kubernetes": {
        "FEDTUNE_PUBLIC_URL",
        "FEDTUNE_K8S_NAMESPACE",
        "FEDTUNE_K8S_IMAGE",
        "FEDTUNE_K8S_ENV_SECRET",
        "FEDTUNE_K8S_SERVICE_ACCOUNT",
        "FEDTUNE_K8S_WORKER_TEMPLATE",
        "FEDTUNE_K8S_MEMORY_PER_TRIAL_GI",
        "FEDTUNE_K8S_MEMORY_PER_GPU_GI",
        "FEDTUNE_K8S_SHM_GI",
        "FEDTUNE_K8S_PRE_RUNNING_DEADLINE_SECONDS",
        "FEDTUNE_K8S_RAY_TOKEN_AUTH",
    },
    "local": set(),
    #: with auth on and the chart's MLflow: one MLflow workspace per project
    "mlflow-workspaces": {
        "FEDTUNE_MLFLOW_WORKSPACES",
        "FEDTUNE_MLFLOW_ADMIN_USERNAME",
        "FEDTUNE_MLFLOW_ADMIN_PASSWORD",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "FEDTUNE_MLFLOW_SYNC_S",
        "FEDTUNE_MLFLOW_OIDC_LOGIN_S",
    },
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_api_environment_is_the_contract(rendered_scenarios: dict, scenario: str) -> None:
    values = scenario_values()[scenario]
    backend = values.get("backend", "kubernetes")
    env = container_env(api_container(rendered_scenarios[scenario]))
    token = {"FEDTUNE_API_TOKEN"} if values.get("auth") else set()
    ray_token = (
        {"RAY_AUTH_TOKEN"}
        if backend == "ray" and values.get("rayCluster", {}).get("enabled")
        else set()
    )
    pulls = (
        {"FEDTUNE_K8S_IMAGE_PULL_SECRETS"}
        if backend == "kubernetes" and values.get("imagePullSecrets")
        else set()
    )
    workspaces = (
        CONTRACT_ENV["mlflow-workspaces"]
        if values.get("auth") and values.get("mlflow", {}).get("enabled", True)
        else set()
    )
    assert (
        set(env)
        == CONTRACT_ENV["common"] | CONTRACT_ENV[backend] | token | ray_token | pulls | workspaces
    )
    assert env["FEDTUNE_BACKEND"]["value"] == backend


def test_ray_backend_points_at_the_shared_clusters_head(rendered_scenarios: dict) -> None:
    manifests = rendered_scenarios["gpu"]
    cluster = one(manifests, "RayCluster")
    address = container_env(api_container(manifests))["RAY_ADDRESS"]["value"]
    # KubeRay names the head Service `<RayCluster name>-head-svc`; 8265 is the Ray Jobs API.
    assert address == f"http://{cluster['metadata']['name']}-head-svc.{NAMESPACE}.svc:8265"
    assert len(f"{cluster['metadata']['name']}-head-svc") <= 63


def test_long_release_names_keep_kuberay_service_names_valid(render: Any) -> None:
    manifests = render({"rayCluster": {"enabled": True}}, name="r" * 53)
    assert len(one(manifests, "RayCluster")["metadata"]["name"] + "-head-svc") <= 63


def test_gpu_example_builds_an_autoscaled_gpu_worker_group(rendered_scenarios: dict) -> None:
    spec = one(rendered_scenarios["gpu"], "RayCluster")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"gpu", "cpu"}
    gpu = groups["gpu"]
    assert (gpu["minReplicas"], gpu["replicas"], gpu["maxReplicas"]) == (0, 0, 8)
    pod = gpu["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["automountServiceAccountToken"] is False
    assert (
        "nvidia.com/gpu"
        not in groups["cpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    )
    assert pod["containers"][0]["image"].endswith(":0.1.0-cuda")


def test_disabled_worker_groups_are_left_out(render: Any) -> None:
    spec = one(render({"rayCluster": {"enabled": True}}), "RayCluster")["spec"]
    assert [g["groupName"] for g in spec["workerGroupSpecs"]] == ["gpu"]


def test_local_backend_gets_shared_memory_and_no_mlflow(rendered_scenarios: dict) -> None:
    manifests = rendered_scenarios["local"]
    assert not [m for m in manifests if m["metadata"]["name"].endswith("-mlflow")]
    pod = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in pod["volumes"]
    assert "MLFLOW_TRACKING_URI" not in one(manifests, "Secret", f"{FULLNAME}-env")["stringData"]


def test_mlflow_uses_its_own_postgres_database_and_the_artifact_pvc(
    rendered_scenarios: dict,
) -> None:
    manifests = rendered_scenarios["defaults"]
    deployment = one(manifests, "Deployment", f"{FULLNAME}-mlflow")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # with workspaces (the default: the API is never open) `fedtune mlflow-server` writes the
    # basic-auth settings, then execs its one server process (`fedtune.service.mlflow_run`)
    assert container["command"] == WORKSPACES
    assert (
        container_env(container)["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]["name"]
        == f"{FULLNAME}-env"
    )
    assert "--artifacts-destination=file:///mlflow/artifacts" in container["args"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    init = one(manifests, "ConfigMap")["data"]["01-roles.sh"]
    assert 'CREATE DATABASE :"mlflow_db" OWNER :"mlflow_user";' in init
    uri = one(manifests, "Secret", f"{FULLNAME}-env")["stringData"]["MLFLOW_TRACKING_URI"]
    assert uri == f"http://{FULLNAME}-mlflow.{NAMESPACE}.svc:5000"
    hosts = next(a for a in container["args"] if a.startswith("--allowed-hosts="))
    assert f"{FULLNAME}-mlflow.{NAMESPACE}.*" in hosts.split("=", 1)[1].split(",")


def test_ingress_routes_to_the_api_service(rendered_scenarios: dict) -> None:
    manifests = rendered_scenarios["ingress"]
    ingress = one(manifests, "Ingress")
    service = one(manifests, "Service", FULLNAME)
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": FULLNAME, "port": {"number": service["spec"]["ports"][0]["port"]}}
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"][0]["secretName"] == "fedtune-tls"
    token = one(manifests, "Secret", f"{FULLNAME}-auth")["stringData"]["api-token"]
    assert token == scenario_values()["ingress"]["auth"]["apiToken"]


def test_helm_test_hook_calls_healthz_through_the_service(rendered_scenarios: dict) -> None:
    manifests = rendered_scenarios["defaults"]
    pod = one(manifests, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = one(manifests, "Service", FULLNAME)
    url = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/healthz"
    assert url in pod["spec"]["containers"][0]["args"][0]
    assert pod["spec"]["restartPolicy"] == "Never"


# ---- documentation -------------------------------------------------------------------------------


def test_every_value_is_documented_in_values_yaml_and_the_reference() -> None:
    """Every value has a ``# --`` comment, and the generated reference page (tools/docs_gen.py,
    docs/reference/helm-values.md) lists exactly the documented keys."""
    text = (CHART_DIR / "values.yaml").read_text()
    documented = documented_values(text)
    for path in leaf_paths(yaml.safe_load(text)):
        assert any(path[:n] in documented for n in range(1, len(path) + 1)), (
            f"{'.'.join(path)} undocumented"
        )
    page = (REPO_ROOT / "docs" / "reference" / "helm-values.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+)` \|", page, flags=re.MULTILINE))
    assert rows == {".".join(path) for path in documented}


def test_code_upload_is_off_by_default_and_one_value_turns_it_on(render) -> None:
    from fedtune.service.settings import load_settings

    assert "FEDTUNE_ALLOW_CODE_UPLOAD" not in container_env(api_container(render({})))
    assert load_settings().allow_code_upload is False
    env = container_env(api_container(render({"codeUpload": {"enabled": True}})))
    settings = load_settings(
        allow_code_upload=env["FEDTUNE_ALLOW_CODE_UPLOAD"]["value"],
        public_url=env["FEDTUNE_PUBLIC_URL"]["value"],
        code_sandbox=env["FEDTUNE_CODE_SANDBOX"]["value"],
    )
    assert settings.allow_code_upload is True
    assert settings.code_sandbox == "bwrap"  # the sandbox unless the operator opts out
    assert settings.public_url.startswith("http://") and settings.public_url.endswith(".svc:8000")
    opted_out = render({"codeUpload": {"enabled": True, "sandbox": "none"}})
    assert container_env(api_container(opted_out))["FEDTUNE_CODE_SANDBOX"]["value"] == "none"


def test_oidc_values_reach_the_api_as_settings(render) -> None:
    """``auth.oidc.*`` become the FEDTUNE_OIDC_* settings the API reads."""
    from fedtune.service.oidc import OidcConfig
    from fedtune.service.settings import load_settings

    assert not any(k.startswith("FEDTUNE_OIDC") for k in container_env(api_container(render({}))))
    env = container_env(
        api_container(
            render(
                {
                    "auth": {
                        "oidc": {
                            "issuer": "https://keycloak.example/realms/team",
                            "audience": "fedtune-api",
                            "groupPrefix": "ft-",
                        }
                    }
                }
            )
        )
    )
    settings = load_settings(
        **{
            k.removeprefix("FEDTUNE_").lower(): v["value"]
            for k, v in env.items()
            if k.startswith("FEDTUNE_OIDC_")
        }
    )
    config = OidcConfig.from_settings(settings)
    assert config is not None and config.issuer == "https://keycloak.example/realms/team"
    assert (config.audience, config.group_prefix, config.groups_claim) == (
        "fedtune-api",
        "ft-",
        "groups",
    )


def test_workdir_claim_reaches_the_kubernetes_backend(render) -> None:
    env = container_env(
        api_container(render({"kubernetesBackend": {"workdirClaim": "fedtune-work"}}))
    )
    assert env["FEDTUNE_K8S_WORKDIR_CLAIM"]["value"] == "fedtune-work"
    from fedtune.service.settings import load_settings

    settings = load_settings(
        backend="kubernetes", k8s_workdir_claim=env["FEDTUNE_K8S_WORKDIR_CLAIM"]["value"]
    )
    assert settings.k8s_workdir_claim == "fedtune-work"


def test_study_limits_and_data_roots_reach_the_service_settings(render) -> None:
    """The chart's defaults are the service's defaults; changed values arrive typed."""
    from fedtune.service.settings import load_settings

    def settings_of(values: dict):
        env = container_env(api_container(render(values)))
        return load_settings(
            **{name.lower(): env[f"FEDTUNE_{name}"]["value"] for name in STUDY_LIMITS.values()}
        )

    defaults, fields = load_settings(), [name.lower() for name in STUDY_LIMITS.values()]
    assert {f: getattr(settings_of({}), f) for f in fields} == {
        f: getattr(defaults, f) for f in fields
    }
    custom = settings_of(
        {
            "dataRoots": ["/data/leaf", "/data/tff"],
            "studyLimits": {"maxClients": 5000000, "maxTrialCpu": 0.5},
        }
    )
    assert [str(root) for root in custom.data_roots] == ["/data/leaf", "/data/tff"]
    assert (custom.max_clients, custom.max_trial_cpu) == (5_000_000, 0.5)


#: the MLflow container's command with workspaces (``fedtune/cli/mlflow_server.py``)
WORKSPACES = ["fedtune", "mlflow-server"]


def _mlflow_container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(manifests, "Deployment", f"{FULLNAME}-mlflow")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_mlflow_workspaces_follow_auth_and_keep_the_admin_password_in_a_secret(render) -> None:
    """Auth is always on (a token given, generated, or OIDC): MLflow runs ``--enable-workspaces
    --app-name=fedtune`` with its admin password from a Secret (MLflow and the API read it; no
    ConfigMap and no driver holds it) by default, and ``mlflow.workspaces.enabled: false`` turns
    it off."""
    oidc = render({"auth": {"apiToken": "", "oidc": {"issuer": "https://id.example.com/realms/x"}}})
    assert _mlflow_container(oidc)["command"] == WORKSPACES  # no token, still closed
    assert "FEDTUNE_API_TOKEN" not in container_env(api_container(oidc))
    assert not [s for s in find(oidc, "Secret") if s["metadata"]["name"] == f"{FULLNAME}-auth"]

    manifests = render({"auth": {"apiToken": "test-token-set-by-the-test"}})
    mlflow = _mlflow_container(manifests)
    assert mlflow["command"] == WORKSPACES  # one recipe: the chart's MLflow is the command's
    from fedtune.cli import build_parser

    args = build_parser().parse_args(["mlflow-server", *mlflow["args"]])  # flags it knows
    assert (args.host, args.port, args.cache_seconds, args.admin_username) == (
        "0.0.0.0",
        5000,
        30,
        "admin",
    )
    assert args.dir == Path("/tmp/mlflow-server") and args.backend_store_uri is None  # env only
    secret = one(manifests, "Secret", f"{FULLNAME}-mlflow-auth")
    password = secret["stringData"]["admin-password"]
    assert password == MLFLOW_ADMIN_PASSWORD
    ref = {"name": f"{FULLNAME}-mlflow-auth", "key": "admin-password"}
    assert container_env(mlflow)["MLFLOW_AUTH_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"] == ref
    env = container_env(api_container(manifests))
    assert env["FEDTUNE_MLFLOW_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"] == ref
    assert env["FEDTUNE_MLFLOW_WORKSPACES"]["value"] == "true"
    for manifest in manifests:  # the password is in its Secret only
        if manifest["kind"] != "Secret":
            assert password not in json.dumps(manifest), manifest["metadata"]["name"]
    from fedtune.service.settings import load_settings

    settings = load_settings(
        mlflow_workspaces=env["FEDTUNE_MLFLOW_WORKSPACES"]["value"],
        mlflow_tracking_uri="http://demo-fedtune-mlflow.ml.svc:5000",
        mlflow_admin_password=password,
        mlflow_sync_s=env["FEDTUNE_MLFLOW_SYNC_S"]["value"],
    )
    assert settings.mlflow_workspaces and settings.mlflow_sync_s == 60

    off = render(
        {
            "auth": {"apiToken": "test-token-set-by-the-test"},
            "mlflow": {"workspaces": {"enabled": False}},
        }
    )
    assert _mlflow_container(off)["command"] == ["mlflow"]
    assert "--enable-workspaces" not in _mlflow_container(off)["args"]
    assert "FEDTUNE_MLFLOW_WORKSPACES" not in container_env(api_container(off))


def test_mlflow_admin_password_derives_from_the_postgres_password(render) -> None:
    import hashlib

    values = {"auth": {"apiToken": "test-token-set-by-the-test"}, "mlflow": {"auth": {}}}
    values["mlflow"]["auth"]["adminPassword"] = ""
    secret = one(render(values), "Secret", f"{FULLNAME}-mlflow-auth")
    expected = hashlib.sha256(f"fedtune-mlflow-admin:{PG_PASSWORD}".encode()).hexdigest()[:40]
    assert secret["stringData"]["admin-password"] == expected


def test_mlflow_public_url_is_the_base_of_the_links_the_api_hands_out(render) -> None:
    from fedtune.service.settings import load_settings

    default = container_env(api_container(render({})))
    assert "FEDTUNE_MLFLOW_PUBLIC_URL" not in default
    env = container_env(
        api_container(render({"mlflow": {"publicUrl": "https://mlflow.example.com"}}))
    )
    value = env["FEDTUNE_MLFLOW_PUBLIC_URL"]["value"]
    assert load_settings(mlflow_public_url=value).mlflow_public_url == value


def _mlflow_flag(container: dict[str, Any], name: str) -> list[str] | None:
    found = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"{name}=")]
    assert len(found) <= 1, name
    return found[0].split(",") if found else None


def test_mlflow_public_url_is_a_host_and_origin_mlflow_accepts_beside_its_service_names(render):
    """``mlflow.publicUrl`` (an ingress host): with workspaces, ``fedtune mlflow-server
    --public-url`` as on one machine, so the argv it execs accepts the ingress host with its
    port and its origin, the Service names and allowedHosts still; plain ``mlflow server`` gets
    the same host and origin from the chart's own computation."""
    from fedtune.cli import build_parser
    from fedtune.cli.mlflow_server import make_server
    from fedtune.service.mlflow_access import MLFLOW_DEFAULT_HOSTS, parse_public_url

    service = f"{FULLNAME}-mlflow.{NAMESPACE}.*"
    values = {"mlflow": {"publicUrl": "https://MLflow.example.com/", "allowedHosts": ["box:5000"]}}
    mlflow = _mlflow_container(render(values))
    assert mlflow["command"] == WORKSPACES
    assert "--public-url=https://MLflow.example.com/" in mlflow["args"]
    args = build_parser().parse_args(["mlflow-server", *mlflow["args"]])
    argv = make_server(args, {}).argv("mlflow")  # what the container execs
    hosts = _mlflow_flag({"args": argv}, "--allowed-hosts")
    assert set(MLFLOW_DEFAULT_HOSTS) | {service, "box:5000"} <= set(hosts)
    assert {"mlflow.example.com", "mlflow.example.com:443"} <= set(hosts) and "*" not in hosts
    assert _mlflow_flag({"args": argv}, "--cors-allowed-origins") == ["https://mlflow.example.com"]
    default = _mlflow_container(render({}))
    assert _mlflow_flag(default, "--cors-allowed-origins") is None
    assert not [a for a in default["args"] if a.startswith("--public-url")]

    plain = {"auth": {"apiToken": "test-token-set-by-the-test"}, "mlflow": {}}
    plain["mlflow"]["workspaces"] = {"enabled": False}
    for url in (
        "https://MLflow.example.com/",
        "http://box.test:8080",
        "http://box:80",
        "https://box:443",
        "https://box:8443",
        "http://[fd00::5]:5000",
    ):
        plain["mlflow"]["publicUrl"] = url
        container = _mlflow_container(render(plain))
        assert container["command"] == ["mlflow"]
        public = parse_public_url(url)
        hosts = _mlflow_flag(container, "--allowed-hosts")
        assert service in hosts and set(public.hosts) <= set(hosts), url
        assert len(hosts) == 8 + len(public.hosts)  # the Service names, localhost, the URL's
        assert _mlflow_flag(container, "--cors-allowed-origins") == [public.origin], url


def test_mlflow_public_url_must_be_a_servers_root(helm: Any, chart: Any) -> None:
    for bad in ("https://example.com/mlflow", "mlflow.example.com", "https://u:p@example.com"):
        message = schema_error(chart, helm, {"mlflow": {"publicUrl": bad}})
        assert "'/mlflow/publicUrl'" in message, message
