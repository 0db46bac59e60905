"""Running the pods' own commands: the study driver's container as rendered — the
chart's shared RayCluster head (backend ``ray``) and the head of ``rayjob_manifest()`` (backend
``kubernetes``, with the settings the chart gives the API) — run on this machine through a small
study end to end, against the real PostgreSQL (a throw-away schema) and a real ``mlflow server``.

How a pod is run (tests/deploy/pod_sandbox.py): from the BUILT image's root file system
(``localhost/fedtune:<version>``, built by the session with ``deploy/build_image.py``)
under bubblewrap, UID/GID from the pod's ``securityContext`` (10001), no capabilities,
``no_new_privs``, that root read-only, and only the container's rendered ``volumeMounts``
writable (each a fresh directory, as a new emptyDir or PVC with ``fsGroup``). Everything else is
taken from the render: the container's ``env`` (``value``, ``secretKeyRef`` and ``envFrom``
resolved from the rendered Secrets, ``fieldRef`` ``metadata.namespace``), its ``workingDir``
(else the image's ``WorkingDir``), the image's own ``Env``, and the command:

* backend ``ray``: the entrypoint and ``runtime_env`` env vars that ``RayJobsBackend.launch``
  submits (its Jobs API client records them), built from the API container's rendered env;
* backend ``kubernetes``: ``spec.entrypoint`` of ``rayjob_manifest()`` for settings loaded from
  the rendered API container's env; the head pod is that manifest's head template.

Ray's job supervisor runs an entrypoint with ``/bin/sh -c`` in the head container; the test does
the same. Both objects are validated against KubeRay's CRDs (``FEDTUNE_CRD_DIR``, closed
schemas) before their pods run. Translated, and nothing else:

=========================== ====================================================================
rendered                    on this machine
=========================== ====================================================================
``FEDTUNE_DRIVER_URL``      the API's Service URL (``FEDTUNE_PUBLIC_URL``, where drivers redeem
                            their start ticket) -> a real ``fedtune serve`` on 127.0.0.1
                            with the rendered API token, on a throw-away schema of
                            127.0.0.1:5432/test (asserted to be the chart's URL first; no head
                            has a database URL to translate)
``MLFLOW_TRACKING_URI``     ``http://<release>-fedtune-mlflow.<ns>.svc:5000`` -> the test's
                            ``mlflow server`` on 127.0.0.1 (asserted first)
``RAY_ADDRESS``             not set: the driver starts Ray inside the pod (embedded) instead of
                            joining the head's ``ray start`` (not run here)
network                     this machine's (the pods reach 127.0.0.1); the cluster in a box,
                            tests/deploy/test_cluster_box.py, gives each pod its own
=========================== ====================================================================

The control case is the head as it was before the fix — the rendered spec with the
``workdir`` mount removed: the driver stops at start with one line naming FEDTUNE_WORKDIR, and
the study records that line.
"""

from __future__ import annotations

import base64
import copy
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fedtune.service import tickets
from fedtune.service.backends.base import LaunchRequest
from fedtune.service.backends.k8s_manifest import rayjob_manifest
from fedtune.service.backends.ray_jobs import RayJobsBackend
from fedtune.service.db import Database
from fedtune.service.migrate import upgrade_database
from fedtune.service.repository import Repository
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.settings import Settings, load_settings
from fedtune.service.states import StudyState
from tests.deploy.conftest import API_TOKEN, NAMESPACE, RELEASE, crd_schema, one
from tests.deploy.image_rootfs import ImageRoot
from tests.deploy.pod_sandbox import Sandbox
from tests.deploy.test_dockerfile import DOCKERFILE, parse_dockerfile
from tests.integration.conftest import mlflow_server  # noqa: F401  (a real `mlflow server`)
from tests.needs import need
from tests.service.helpers import Server, pg_schema, pg_unreachable_reason, tiny_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.image]

FULLNAME = f"{RELEASE}-fedtune"
#: the test's ``mlflow server`` keeps no workspaces: the chart's MLflow tenancy (on by default, the
#: API never being open) is run by the cluster-in-a-box (tests/deploy/test_cluster_box.py)
NO_WORKSPACES = {"mlflow": {"workspaces": {"enabled": False}}}
RAY_VALUES = {"backend": "ray", "rayCluster": {"enabled": True}, **NO_WORKSPACES}
K8S_VALUES: dict[str, Any] = {**NO_WORKSPACES}  # the chart's default backend: kubernetes


@pytest.fixture(scope="module", autouse=True)
def _machine() -> None:
    need("postgres", pg_unreachable_reason())


@pytest.fixture(scope="module")
def db_url() -> Any:
    """One throw-away schema for the module's tests: each submits a study of its own."""
    with pg_schema() as url:
        yield url


# ---- reading the render --------------------------------------------------------------------


def _secrets(manifests: list[dict]) -> dict[str, dict[str, str]]:
    out = {}
    for secret in (m for m in manifests if m["kind"] == "Secret"):
        data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
        out[secret["metadata"]["name"]] = data | secret.get("stringData", {})
    return out


def container_env(container: dict, manifests: list[dict]) -> dict[str, str]:
    """The container's environment as the kubelet builds it from the rendered objects."""
    secrets, env = _secrets(manifests), {}
    for source in container.get("envFrom", []):
        env |= secrets[source["secretRef"]["name"]]
    for item in container.get("env", []):
        ref = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in ref:
            key_ref = ref["secretKeyRef"]
            value = secrets.get(key_ref["name"], {}).get(key_ref["key"])
            if value is None:
                assert key_ref.get("optional"), f"{item['name']}: {key_ref} is not rendered"
                continue
            env[item["name"]] = value
        elif ref.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = NAMESPACE
        else:
            raise AssertionError(f"unsupported env source {item}")
    return env


def translate(env: dict[str, str], api_url: str, mlflow_url: str) -> dict[str, str]:
    """The two service URLs of the cluster -> this machine's (see the module docstring)."""
    assert "FEDTUNE_DATABASE_URL" not in env  # no driver holds it: it reports to the API
    assert env["FEDTUNE_DRIVER_URL"] == f"http://{FULLNAME}.{NAMESPACE}.svc:8000"
    assert env["FEDTUNE_DRIVER_TICKET"].startswith("ftt_")  # a one-time ticket: no credential
    assert "FEDTUNE_DRIVER_TOKEN" not in env and "MLFLOW_TRACKING_PASSWORD" not in env
    assert env["MLFLOW_TRACKING_URI"] == f"http://{FULLNAME}-mlflow.{NAMESPACE}.svc:5000"
    return env | {"FEDTUNE_DRIVER_URL": api_url, "MLFLOW_TRACKING_URI": mlflow_url}


@pytest.fixture(scope="module")
def api_url(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real ``fedtune serve`` on the module's schema with the rendered API token (its driver
    routes redeem the drivers' start tickets and check the credentials they give); it dispatches
    nothing. One for the module: each test's driver redeems its own study's ticket."""
    tmp_path = tmp_path_factory.mktemp("api")
    server = Server(
        {
            "FEDTUNE_DATABASE_URL": db_url,
            "FEDTUNE_API_TOKEN": API_TOKEN,
            "FEDTUNE_BACKEND": "none",
            "FEDTUNE_WORKDIR": str(tmp_path / "api"),
        },
        tmp_path / "api.log",
    ).start(timeout=120)
    try:
        yield server.url
    finally:
        server.stop()


def api_settings(manifests: list[dict], db_url: str, monkeypatch) -> Settings:
    """The API pod's settings: its rendered environment, read as the service reads it."""
    api = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"][0]
    env = container_env(api, manifests) | {"FEDTUNE_DATABASE_URL": db_url}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings()


# ---- running a pod's container -------------------------------------------------------------


def pod_process(
    tmp_path: Path,
    pod: dict,
    container: dict,
    env: dict[str, str],
    root: ImageRoot,
    seccomp_root: Path | None = None,
) -> tuple[Sandbox, dict[str, str], str]:
    """The sandbox of ``container`` in ``pod`` over the image ``root`` (its user, its writable
    mounts, its ``Localhost`` seccomp profile read from ``seccomp_root``, the node's), the
    process environment (the image's Env, then the container's) and the working directory."""
    security = pod.get("securityContext", {}) | container.get("securityContext", {})
    assert security["readOnlyRootFilesystem"] is True and security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    sandbox = Sandbox(
        tmp_path / container["name"], root, uid=security["runAsUser"], gid=security["runAsGroup"]
    )
    profile = security.get("seccompProfile", {})
    if profile.get("type") == "Localhost":
        assert seccomp_root is not None, f"{container['name']} needs a node's seccomp root"
        sandbox.seccomp = seccomp_root / profile["localhostProfile"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        assert {"emptyDir", "persistentVolumeClaim"} & set(volume), volume
        sandbox.volume(mount["mountPath"], read_only=mount.get("readOnly", False))
    return sandbox, sandbox.env(env), container.get("workingDir") or root.workdir


def container_argv(container: dict) -> list[str]:
    """What the container runtime executes: ``command`` else the image's ENTRYPOINT, followed by
    ``args`` (or, without command and args, the image's CMD)."""
    image = parse_dockerfile(DOCKERFILE.read_text()).final
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    args = container.get("args", image.last("CMD").exec_form())
    return [*image.last("ENTRYPOINT").exec_form(), *args]


def run_container(
    tmp_path: Path,
    pod: dict,
    container: dict,
    env: dict[str, str],
    entrypoint: str,
    root: ImageRoot,
) -> Any:
    """Run ``entrypoint`` as Ray's job supervisor would, inside ``container`` of ``pod``."""
    sandbox, full_env, cwd = pod_process(tmp_path, pod, container, env, root)
    done = sandbox.run(["/bin/sh", "-c", entrypoint], env=full_env, cwd=cwd, timeout=900)
    return done, sandbox


def _study(db_url: str, settings: Settings) -> tuple[Database, str, str]:
    """A submitted study, dispatched as attempt 1 with its start ticket (what the scheduler
    does before launching)."""
    db = Database(db_url)
    upgrade_database(db)
    spec = tiny_spec(name="pod-commands", trials=2, rounds=3)
    sid = submit_study(ServiceContext(db, settings), spec)[0].id
    with db.session() as session:
        Repository(session).transition(sid, StudyState.RUNNING, attempts=1)
        ticket = tickets.issue(session, sid, 1, settings.driver_ticket_ttl_s)
    return db, sid, ticket


def _plain(manifest: dict) -> dict:
    return {key: value for key, value in manifest.items() if key != "__source__"}


class _RecordingJobs:
    """The Jobs API client of RayJobsBackend: records what would be submitted to the head."""

    def submit_job(self, **kwargs: Any) -> str:
        self.submitted = kwargs
        return kwargs["submission_id"]


def ray_head_case(
    render, db_url, api_url, mlflow_url, monkeypatch, sid_of
) -> tuple[dict, dict, dict, str]:
    manifests = render(RAY_VALUES)
    settings = api_settings(manifests, db_url, monkeypatch)
    _db, sid, ticket = sid_of(settings)
    jobs = _RecordingJobs()
    backend = RayJobsBackend(settings, client_factory=lambda address: jobs)
    backend.launch(LaunchRequest(sid, 1, ticket=ticket))
    cluster = one(manifests, "RayCluster")
    jsonschema.Draft7Validator(crd_schema("RayCluster")).validate(_plain(cluster))
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    container = head["containers"][0]
    env = container_env(container, manifests) | jobs.submitted["runtime_env"]["env_vars"]
    return head, container, translate(env, api_url, mlflow_url), jobs.submitted["entrypoint"]


def rayjob_head_case(
    render, db_url, api_url, mlflow_url, monkeypatch, sid_of
) -> tuple[dict, dict, dict, str]:
    manifests = render(K8S_VALUES)
    settings = api_settings(manifests, db_url, monkeypatch)
    _db, sid, ticket = sid_of(settings)
    manifest = rayjob_manifest(LaunchRequest(sid, 1, ticket=ticket), settings)
    jsonschema.Draft7Validator(crd_schema("RayJob")).validate(manifest)
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    container = head["containers"][0]
    env = translate(container_env(container, manifests), api_url, mlflow_url)
    return head, container, env, manifest["spec"]["entrypoint"]


CASES = {"raycluster-head": ray_head_case, "rayjob-head": rayjob_head_case}


@pytest.mark.parametrize("case", CASES)
def test_the_rendered_driver_runs_a_study_end_to_end(
    case,
    render,
    db_url,
    api_url,
    mlflow_server,  # noqa: F811
    monkeypatch,
    tmp_path,
    image_root,
) -> None:
    studies: dict[str, Database] = {}

    def sid_of(settings: Settings) -> tuple[Database, str, str]:
        db, sid, ticket = _study(db_url, settings)
        studies[sid] = db
        return db, sid, ticket

    pod, container, env, entrypoint = CASES[case](
        render, db_url, api_url, mlflow_server, monkeypatch, sid_of
    )
    ((sid, db),) = studies.items()
    assert shlex.split(entrypoint) == ["fedtune", "worker", "run-study", sid, "--attempt", "1"]
    done, sandbox = run_container(tmp_path, pod, container, env, entrypoint, image_root)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    with db.session(readonly=True) as session:
        repo = Repository(session)
        study = repo.require_study(sid)
        trials = repo.list_trials(sid)
    assert study.state == StudyState.SUCCEEDED, study.error
    assert len(trials) == 2 and study.best_trial is not None
    workdir = sandbox.volumes[env["FEDTUNE_WORKDIR"]]
    assert (workdir / "studies" / sid).is_dir()  # the driver's files are on the workdir volume

    from mlflow.tracking import MlflowClient

    runs = MlflowClient(mlflow_server).search_runs([study.mlflow_experiment_id])
    assert study.mlflow_run_id in {run.info.run_id for run in runs} and len(runs) >= 3
    db.dispose()


def test_the_head_before_finding_1_fails_at_start_with_one_line(
    render,
    db_url,
    api_url,
    mlflow_server,  # noqa: F811
    monkeypatch,
    tmp_path,
    image_root,
) -> None:
    """The shared head as rendered before the fix: no workdir volume, /data on the read-only
    root. The driver must stop before any work with one line, recorded as the study's error."""
    studies: dict[str, Database] = {}

    def sid_of(settings: Settings) -> tuple[Database, str, str]:
        db, sid, ticket = _study(db_url, settings)
        studies[sid] = db
        return db, sid, ticket

    pod, container, env, entrypoint = ray_head_case(
        render, db_url, api_url, mlflow_server, monkeypatch, sid_of
    )
    ((sid, db),) = studies.items()
    old = copy.deepcopy(container)
    old["volumeMounts"] = [
        m for m in old["volumeMounts"] if m["mountPath"] != env["FEDTUNE_WORKDIR"]
    ]
    assert len(old["volumeMounts"]) == len(container["volumeMounts"]) - 1
    done, _ = run_container(tmp_path, pod, old, env, entrypoint, image_root)
    assert done.returncode == 2, (done.stdout + done.stderr)[-4000:]
    # one line says what is wrong (other lines are start-up log records, e.g. matplotlib's)
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith(
        "fedtune: error: FEDTUNE_WORKDIR: /data is not writable by uid 10001 "
        "(Read-only file system)"
    ), done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("FEDTUNE_WORKDIR") == 1
    with db.session(readonly=True) as session:
        study = Repository(session).require_study(sid)
    assert study.state == StudyState.FAILED and study.error in error
    db.dispose()
