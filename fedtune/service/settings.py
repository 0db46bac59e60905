"""Service settings: environment → one typed, frozen object (docs/development/style.md
habits 3 and 7).

Every setting is read from the environment exactly here (``FEDTUNE_*``, plus ``RAY_ADDRESS`` and
``MLFLOW_TRACKING_URI`` under their usual names), and from a settings file's ``[serve]`` section
below the environment (``load_settings(config=...)``, :mod:`.config_file`): an option wins over a
variable, a variable over the file, the file over the default. Like full-stack-fastapi-template's
config, it refuses placeholder secrets ("changethis", short tokens) instead of starting insecurely.
"""

from __future__ import annotations

import enum
import os
import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from fedtune.errors import ConfigError
from fedtune.sandbox import SandboxMode

from .config_file import ConfigFile
from .config_source import ConfigFileSource, loading, origin

__all__ = [
    "PLACEHOLDER_SECRETS",
    "BackendKind",
    "Settings",
    "database_url_from_env",
    "load_settings",
]

#: values that are never accepted as a token or a database password
PLACEHOLDER_SECRETS = frozenset(
    {"changethis", "changeme", "change-me", "secret", "password", "token", "admin", "test", "xxx"}
)
MIN_TOKEN_LENGTH = 16
#: pod-spec fields the worker template may set (the Helm chart's contract)
WORKER_TEMPLATE_KEYS = frozenset(
    {"nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName"}
)
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: registry/repository[:tag][@digest] — no spaces, quotes or shell metacharacters
_IMAGE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)


class BackendKind(enum.StrEnum):
    LOCAL = "local"  # driver = child process of the service, embedded Ray
    RAY = "ray"  # driver = a Ray Jobs API job on RAY_ADDRESS
    KUBERNETES = "kubernetes"  # driver = entrypoint of a KubeRay RayJob per study
    NONE = "none"  # accept studies, never dispatch them (API-only replica, benchmarks)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FEDTUNE_", frozen=True, extra="ignore", validate_by_name=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        below = ConfigFileSource(settings_cls, init_settings, env_settings)
        return init_settings, env_settings, dotenv_settings, file_secret_settings, below

    #: SQLAlchemy URL of the service's database (studies, trials, users, projects): SQLite on one
    #: machine, PostgreSQL (``postgresql+psycopg://…``) for several replicas; a placeholder
    #: password is refused
    database_url: str = "sqlite:///./fedtune.db"
    #: the bootstrap admin's bearer token. Set (or with an OIDC issuer), every ``/v1`` call needs
    #: a bearer token: this one, a user's API token or an OIDC JWT; unset and no issuer, the API
    #: is open and every caller an admin. At least 16 characters, no whitespace, no placeholder
    api_token: SecretStr | None = None
    #: the scrape token of ``/metrics``: a scrape that sends it (``Authorization: Bearer …``)
    #: also gets the per-project series (``fedtune_project_*``, which name every project); one
    #: without a token gets the series that name no project, one with another token 401. Unset:
    #: no scrape sees project names. At least 16 characters, no whitespace, no placeholder
    metrics_token: SecretStr | None = None
    #: with no ``FEDTUNE_API_TOKEN`` and no OIDC issuer, leave the API open (every caller an
    #: admin) instead of using the token ``fedtune serve`` keeps in ``<workdir>/admin-token``:
    #: only on loopback and with no users in the database (``fedtune serve --insecure-open``)
    insecure_open: bool = False
    #: where study drivers run: ``local`` (a child process of the service; its trials in it or on an embedded Ray),
    #: ``ray`` (a Ray Jobs API job on ``RAY_ADDRESS``), ``kubernetes`` (a KubeRay RayJob per
    #: study), ``none`` (studies are accepted and stay queued)
    backend: BackendKind = BackendKind.LOCAL
    #: studies whose drivers run at once; the others wait, queued
    max_concurrent_studies: int = Field(2, ge=1, le=10_000)
    #: run every study's trials as Ray Tune trial processes (``fedtune tune --ray``). Unset, a
    #: ``local`` driver trains a study whose trials fit its own process there, without Ray
    #: (one configuration at a time on the CPU, one pack of all of them, or a pack the cost
    #: estimate places there: ``fedtune.tuning.driver.placement``); a driver given a Ray
    #: cluster (``ray``, ``kubernetes``) always runs its trials through Ray
    trials_through_ray: bool = False
    #: OpenID Connect (``fedtune.service.oidc``): bearer JWTs of this issuer authenticate users
    oidc_issuer: str | None = None
    #: the ``aud`` the JWTs must carry; unset: ``fedtune``
    oidc_audience: str | None = None
    #: URL of the issuer's signing keys (JWKS); unset: the ``jwks_uri`` of its
    #: ``/.well-known/openid-configuration``
    oidc_jwks_url: str | None = None
    #: JWT claim holding the user name (``sub`` when the token lacks it)
    oidc_user_claim: str = "preferred_username"
    #: JWT list claim of the user's groups: ``<prefix><project>`` makes the user a member of the
    #: project, ``<prefix><project>:viewer`` a viewer
    oidc_groups_claim: str = "groups"
    #: prefix of the groups that name fedtune projects (other groups are ignored)
    oidc_group_prefix: str = "fedtune:"
    #: group whose members are fedtune admins
    oidc_admin_group: str = "fedtune:admins"
    #: PostgreSQL: the scheduler leader's lease (``fedtune.service.leader``); a replica takes
    #: over within this long after the leader stops renewing it
    leader_lease_s: float = Field(10.0, ge=2, le=600)
    #: GPUs the studies may reserve together (``local``/``ray``); None: not limited here
    cluster_gpus: float | None = Field(None, ge=0)
    #: the sliding window of the fair share of GPU-seconds between projects (``.admission``)
    fair_share_window_s: float = Field(3600.0, gt=0, le=30 * 86400)
    #: the service's working directory (must be writable; created if missing): each study's Optuna
    #: storage, Ray results and artifacts (``studies/<id>``), uploaded code (``code/``), local
    #: drivers' logs (``logs/``); on RayJob heads a relative one becomes ``/data``
    workdir: Path = Path("./fedtune-work")
    #: Ray's own variable: the Jobs API (dashboard) address, ``http://host:8265``, of the Ray
    #: cluster that backend ``ray`` submits study drivers to; required by that backend
    ray_address: str | None = Field(None, validation_alias=AliasChoices("RAY_ADDRESS"))
    #: Ray's own variable: the token of a Ray cluster with token authentication
    ray_auth_token: SecretStr | None = Field(None, validation_alias=AliasChoices("RAY_AUTH_TOKEN"))
    #: MLflow's own variable: the tracking server studies log to; unset: each study logs to a
    #: SQLite store in its workdir, ``<FEDTUNE_WORKDIR>/studies/<id>/mlflow.db``
    mlflow_tracking_uri: str | None = Field(
        None, validation_alias=AliasChoices("MLFLOW_TRACKING_URI")
    )
    #: one MLflow workspace per project (``fedtune.service.mlflow_tenancy``): the tracking
    #: server runs ``mlflow server --enable-workspaces --app-name fedtune``; the service keeps
    #: its workspaces, users and roles in step with fedtune's and each study driver logs into its
    #: project's workspace with that workspace's driver credential. Needs an http(s)
    #: ``MLFLOW_TRACKING_URI`` and ``FEDTUNE_MLFLOW_ADMIN_PASSWORD``. Unset on a database whose
    #: projects have workspaces, ``fedtune serve`` refuses to start; ``false`` starts it without
    #: MLflow on purpose (``fedtune.service.mlflow_records``)
    mlflow_workspaces: bool = False
    #: the MLflow UI as members open it (an ingress, a port-forward), for the links the service
    #: hands out (``run_url``, ``ui_url``); unset: the tracking URI when it is http(s)
    mlflow_public_url: str | None = None
    #: the MLflow server's admin user (its basic-auth ``admin_username``)
    mlflow_admin_username: str = "admin"
    #: the MLflow server's admin password: the service alone holds it (drivers get a credential
    #: derived from it for their own workspace only)
    mlflow_admin_password: SecretStr | None = None
    #: seconds between two syncs of MLflow's users and roles with fedtune's: a revoked user or a
    #: changed role lasts at most this long in MLflow (a project's workspace is made at once)
    mlflow_sync_s: float = Field(60.0, ge=5, le=86400)
    #: the longest an OIDC user's MLflow login lasts (fedtune keeps no OIDC users: their logins
    #: are dropped every this many seconds and asked for again, which reads their groups anew)
    mlflow_oidc_login_s: float = Field(28800.0, ge=60, le=30 * 86400)
    #: namespace in which backend ``kubernetes`` creates, reads and deletes its RayJobs
    k8s_namespace: str = "default"
    #: image of every RayJob pod (head, workers, submitter); it must have the service's Ray
    #: version, which the RayJob declares as its ``rayVersion``
    k8s_image: str = "fedtune:0.1.0"
    #: Secret whose keys ``FEDTUNE_DATABASE_URL`` and (optional) ``MLFLOW_TRACKING_URI`` reach
    #: the RayJob head (the study driver) only; unset: the head gets neither
    k8s_env_secret: str | None = None
    #: ServiceAccount of every RayJob pod (no pod mounts its token); unset: the namespace's
    #: ``default``
    k8s_service_account: str | None = None
    #: PVC mounted at the workdir of RayJob head pods, so a re-dispatched study finds its Optuna
    #: storage (ReadWriteMany, or ReadWriteOnce on a single node); unset = ephemeral workdir
    k8s_workdir_claim: str | None = None
    #: JSON object of pod-spec fields set on every RayJob worker pod; only ``nodeSelector``,
    #: ``tolerations``, ``affinity``, ``priorityClassName`` and ``runtimeClassName``
    k8s_worker_template: dict[str, Any] = Field(default_factory=dict)
    #: seconds after a RayJob finished before KubeRay deletes its Ray cluster
    #: (``ttlSecondsAfterFinished``) and the service deletes the RayJob; 0: at once
    k8s_ttl_seconds_after_finished: int = Field(300, ge=0)
    #: a study's wall-clock limit in seconds (the RayJob's ``activeDeadlineSeconds``): KubeRay
    #: fails a RayJob still running this long after it started (``DeadlineExceeded``)
    k8s_active_deadline_seconds: int = Field(7 * 24 * 3600, ge=60)
    #: a RayJob not Running this long after it started fails (PreRunningDeadlineExceeded):
    #: image pull errors, unschedulable pods (KubeRay >= 1.6; older operators ignore it)
    k8s_pre_running_deadline_seconds: int = Field(1800, ge=60)
    #: Secrets (kubernetes.io/dockerconfigjson) for pulling the image, on every RayJob pod
    k8s_image_pull_secrets: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: memory of a Ray worker pod: max(trials × per-trial, GPUs × per-GPU) + /dev/shm
    k8s_memory_per_trial_gi: float = Field(4.0, gt=0, le=4096)
    #: memory of a Ray worker pod per GPU, in GiB (see ``FEDTUNE_K8S_MEMORY_PER_TRIAL_GI``)
    k8s_memory_per_gpu_gi: float = Field(16.0, ge=8, le=4096)
    #: size of /dev/shm (an emptyDir in memory, charged to the pod's memory) of every Ray pod;
    #: Ray's object store is sized to fit in it
    k8s_shm_gi: float = Field(2.0, ge=0.25, le=1024)
    #: KubeRay ``authOptions.mode: token`` (Ray token authentication on the dashboard/Jobs API)
    k8s_ray_token_auth: bool = True
    #: hand RayJobs to Kueue: each carries ``kueue.x-k8s.io/queue-name`` (the project's queue:
    #: its ``queue_name``, else this prefix + the project) and is created suspended
    k8s_kueue: bool = False
    #: with ``FEDTUNE_K8S_KUEUE``, the LocalQueue of a project without a ``queue_name`` is
    #: this prefix + the project's name
    k8s_kueue_queue_prefix: str = "fedtune-"
    #: largest request body the API accepts, in bytes (larger: 413); code uploads
    #: (``/v1/code``) are bounded by ``FEDTUNE_MAX_CODE_BYTES`` instead
    max_request_bytes: int = Field(1 << 20, ge=1024)
    #: seconds between the scheduler's ticks (dispatch queued studies, poll running drivers,
    #: delete finished RayJobs); a cancellation wakes it at once
    scheduler_interval_s: float = Field(1.0, gt=0, le=300)
    #: attempts to run one study: a study whose driver is gone (crashed, pod lost, a transient
    #: error) is re-queued and resumes until it has had this many, then fails
    max_dispatch_attempts: int = Field(3, ge=1, le=100)
    #: a study whose driver hit a transient error (Ray did not start, a connection lost) goes
    #: back in the queue after ``retry_backoff_s · 2^(attempt−1)`` seconds (``service.faults``)
    retry_backoff_s: float = Field(5.0, ge=0, le=3600)
    #: seconds between a study driver's heartbeats (the study's ``heartbeat_at``); at each one a
    #: driver whose study was cancelled or re-dispatched stops
    heartbeat_s: float = Field(5.0, gt=0, le=600)
    #: apply migrations when the service starts (laptop default); false = refuse an old schema
    #: and leave migrating to ``fedtune db upgrade`` (the Helm chart's hook Job)
    migrate_on_start: bool = True
    #: accept studies with a ``code:`` package (uploaded user code runs with the driver's and the
    #: workers' rights: an operator decision, off by default)
    allow_code_upload: bool = False
    #: largest code package, in bytes: a bigger upload gets 413, and a package may unpack to at
    #: most 8 times this
    max_code_bytes: int = Field(16 * 1024**2, ge=1024, le=1 << 30)
    #: time limit of the subprocess that imports uploaded code at submission
    code_check_timeout_s: float = Field(60.0, gt=0, le=3600)
    #: how uploaded code is isolated (``fedtune.sandbox``, ``docs/explanation/threat-model.md``):
    #: ``bwrap`` (bubblewrap: own PID namespace, own network (none for the code check; a
    #: ``local`` driver's reaches the API and MLflow only), read-only mounts, limits; with code
    #: upload on and no working bubblewrap, or no working route, the service refuses to start)
    #: or ``none`` (the operator's explicit opt-out: user code runs as the service's user,
    #: which ``/readyz`` and the log say)
    code_sandbox: SandboxMode = SandboxMode.BWRAP
    #: address space of each sandboxed process, in MiB (``RLIMIT_AS``: an allocation past it fails)
    code_sandbox_memory_mib: int = Field(4096, ge=256, le=1 << 20)
    #: processes the sandbox's user may run at once (``RLIMIT_NPROC``: a fork past it fails)
    code_sandbox_processes: int = Field(64, ge=4, le=100_000)
    #: private memory of each process of a sandboxed study driver (uploaded code), its local
    #: Ray and trials, in MiB (``RLIMIT_DATA``: heap and anonymous mappings, not shared memory
    #: or reserved address space; an allocation past it fails); 0: no bound
    study_sandbox_memory_mib: int = Field(8192, ge=0, le=1 << 30)
    #: processes and threads a sandboxed study driver, its local Ray and trials may run at once
    #: (``RLIMIT_NPROC``: a fork past it fails; Ray's raylet, GCS and workers are many threads)
    study_sandbox_processes: int = Field(8192, ge=256, le=1 << 22)
    #: the longest a study may run after its dispatch, in seconds, whatever its budget: the
    #: scheduler then fails it and stops its driver, on every backend (an endless loop in
    #: uploaded code ends there); 0: no bound
    study_deadline_s: int = Field(7 * 24 * 3600, ge=0)
    #: what a study with ``budget.time`` may run beyond that budget before the same
    #: stop (its start, its last rounds, its report), in seconds
    study_deadline_grace_s: int = Field(900, ge=0)
    #: set by the service in a Ray job's environment (backend ``ray``) for a study with uploaded
    #: code: its driver re-runs itself in this sandbox on the shared head
    #: (``fedtune.service.head_sandbox``); never an operator's setting
    driver_sandbox: SandboxMode | None = None
    #: set inside a sandboxed driver: it checks that what it writes is inside its sandbox
    sandboxed: bool = False
    #: the folder whose ``*.whl`` files ``GET /client/…`` hands out: the light client's wheel,
    #: built by ``make dist`` (``pip install http://<service>/client/<wheel>``); unset: the
    #: image's ``/opt/fedtune/client`` when it exists, else ``dist/`` of the source checkout
    client_wheel_dir: Path | None = None
    #: the service's URL as RayJobs reach it (the kubernetes backend's code ``working_dir`` URI)
    public_url: str | None = None
    #: the URL study drivers report to (``/v1/driver``, with a per-study credential) instead of
    #: writing the database: ``fedtune serve`` sets its own loopback URL for the ``local``
    #: backend; unset, ``ray`` and ``kubernetes`` drivers use ``FEDTUNE_PUBLIC_URL``, and without
    #: either a driver is given the database URL (``fedtune.service.driver_link``)
    driver_url: str | None = None
    #: a study driver's one-time start ticket for ``FEDTUNE_DRIVER_URL``: the backend sets it in
    #: the driver's environment, never an operator; the driver exchanges it, once, for its
    #: study's credential and its project's MLflow login (``fedtune.service.tickets``)
    driver_ticket: SecretStr | None = None
    #: seconds a driver's start ticket stays redeemable after its dispatch: raise it where a
    #: driver may take longer to start (a RayJob's pods pulling a large image, a Kueue queue)
    driver_ticket_ttl_s: int = Field(900, ge=60, le=7 * 24 * 3600)
    #: set by a driver for the driver it re-runs in a sandbox on a shared Ray head: that one
    #: reads its credentials from its standard input, never from its environment
    driver_credentials_on_stdin: bool = False
    #: key of the per-study code download credentials (default: derived from the API token, else
    #: a random key kept in ``<workdir>/code-url.key``)
    code_url_key: SecretStr | None = None
    # ---- what one study may ask for (typo guards; each refusal is a 422 naming the field)
    #: directories task data paths (``task.train_path``, ``task.path``, …) must lie under, after
    #: resolving symlinks and ``..``; empty = studies cannot name data files (comma-separated)
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    #: most trials of one study (``budget.trials``)
    max_trials: int = Field(100_000, ge=1, le=10**9)
    #: most rounds of a trial (``train.rounds``, ``train.eval_every``), also as searched bounds
    max_rounds: int = Field(100_000, ge=1, le=10**9)
    max_clients: int = Field(1_000_000, ge=1, le=10**9)  # task.clients, train.clients_per_round
    max_dim: int = Field(100_000, ge=1, le=10**9)  # task.dim
    max_local_steps: int = Field(100_000, ge=1, le=10**9)  # train.local_steps
    max_local_epochs: int = Field(10_000, ge=1, le=10**9)  # train.local_epochs
    max_batch_size: int = Field(1_000_000, ge=1, le=10**9)  # train.batch_size
    #: ``seed`` and ``task.seed`` (2**32 − 1: every RNG the engine seeds takes it)
    max_seed: int = Field(2**32 - 1, ge=0, le=2**63 - 1)
    max_concurrent_trials: int = Field(256, ge=1, le=100_000)  # budget.max_concurrent
    max_trial_cpu: float = Field(256.0, gt=0, le=100_000)  # resources.cpu
    max_trial_gpu: float = Field(16.0, ge=0, le=10_000)  # resources.gpu
    #: choices (and grid values) of one searched parameter
    max_choices: int = Field(1000, ge=1, le=100_000)
    #: searched parameters per spec (``search.parameters`` + ``search.override``)
    max_search_parameters: int = Field(64, ge=1, le=10_000)
    #: submissions validated at once, in a pool of their own (see ``FEDTUNE_VALIDATION_QUEUE``)
    max_concurrent_validations: int = Field(2, ge=1, le=64)
    #: submissions waiting for a validation slot; one more gets 503 ``busy``; 0: none wait
    validation_queue: int = Field(64, ge=0, le=10_000)

    @field_validator(
        "api_token",
        "metrics_token",
        "ray_address",
        "ray_auth_token",
        "mlflow_tracking_uri",
        "k8s_env_secret",
        "k8s_service_account",
        "k8s_workdir_claim",
        "public_url",
        "driver_url",
        "driver_ticket",
        "client_wheel_dir",
        "code_url_key",
        "mlflow_admin_password",
        mode="before",
    )
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value in ("", None) else value

    @field_validator("api_token", "metrics_token")
    @classmethod
    def _refuse_placeholder_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        raw = value.get_secret_value()
        if raw.strip().lower() in PLACEHOLDER_SECRETS or len(raw) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"refusing a placeholder or short token; use at least {MIN_TOKEN_LENGTH} "
                "random characters (e.g. `openssl rand -hex 32`)"
            )
        if any(ch.isspace() for ch in raw):
            raise ValueError("must not contain whitespace")
        return value

    @field_validator("database_url")
    @classmethod
    def _refuse_placeholder_password(cls, value: str) -> str:
        password = urlsplit(value).password
        if password is not None and password.lower() in PLACEHOLDER_SECRETS:
            raise ValueError("the database password is a placeholder; set a real one")
        if "://" not in value:
            raise ValueError("must be an SQLAlchemy URL such as sqlite:///./fedtune.db")
        return value

    @field_validator("public_url", "driver_url", "mlflow_public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise ValueError("must be an http(s) URL such as http://fedtune.fedtune.svc:8000")
        return value.rstrip("/")

    @field_validator("k8s_namespace", "k8s_env_secret", "k8s_service_account", "k8s_workdir_claim")
    @classmethod
    def _dns1123(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 253 or not _DNS1123.match(value)):
            raise ValueError("must be a DNS-1123 name (lower-case letters, digits, '-', '.')")
        return value

    @field_validator("k8s_image_pull_secrets", "data_roots", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("k8s_image_pull_secrets")
    @classmethod
    def _dns1123_list(cls, value: list[str]) -> list[str]:
        for name in value:
            cls._dns1123(name)
        return value

    @field_validator("data_roots")
    @classmethod
    def _absolute_roots(cls, value: list[Path]) -> list[Path]:
        for root in value:
            if not root.is_absolute():
                raise ValueError(f"{str(root)!r} is not an absolute directory")
        return [Path(os.path.realpath(root)) for root in value]

    @field_validator("k8s_image")
    @classmethod
    def _image(cls, value: str) -> str:
        if len(value) > 512 or not _IMAGE.match(value):
            raise ValueError("must be an image reference such as registry/fedtune:0.1.0")
        return value

    @field_validator("k8s_worker_template")
    @classmethod
    def _worker_template(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - WORKER_TEMPLATE_KEYS)
        if unknown:
            allowed = ", ".join(sorted(WORKER_TEMPLATE_KEYS))
            raise ValueError(f"unknown keys {unknown}; allowed: {allowed}")
        return value

    @field_validator("mlflow_admin_password")
    @classmethod
    def _refuse_placeholder_mlflow_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value().strip().lower() in PLACEHOLDER_SECRETS:
            raise ValueError("the MLflow admin password is a placeholder; set a real one")
        return value

    @model_validator(mode="after")
    def _workspaces_need_a_server(self) -> Settings:
        if not self.mlflow_workspaces:
            return self
        uri = self.mlflow_tracking_uri or ""
        if not uri.startswith(("http://", "https://")):
            raise ValueError(
                "FEDTUNE_MLFLOW_WORKSPACES needs an http(s) MLFLOW_TRACKING_URI (a tracking "
                "server started with --enable-workspaces --app-name fedtune)"
            )
        if self.mlflow_admin_password is None:
            raise ValueError("FEDTUNE_MLFLOW_WORKSPACES needs FEDTUNE_MLFLOW_ADMIN_PASSWORD")
        return self

    @property
    def token(self) -> str | None:
        return self.api_token.get_secret_value() if self.api_token else None

    @property
    def study_sandbox_data_bytes(self) -> int | None:
        """``study_sandbox_memory_mib`` in bytes (``RLIMIT_DATA``); None: no bound."""
        return (self.study_sandbox_memory_mib << 20) or None

    @property
    def max_configuration_rounds(self) -> int:
        """The largest ``budget.configuration_rounds``: ``max_trials`` trials of ``max_rounds``."""
        return self.max_trials * self.max_rounds

    def study_trials(self, budget_trials: int | None) -> int:
        """The trials a study runs at most.

        Args:
            budget_trials: Its ``budget.trials`` (None: a budget in compute without one).

        Returns:
            ``budget_trials``, else ``max_trials``.
        """
        return budget_trials if budget_trials is not None else self.max_trials

    def study_deadline(self, budget_time_s: float | None) -> tuple[float, str] | None:
        """How long a study may run after its dispatch, and what sets that.

        Args:
            budget_time_s: the study's ``budget.time`` in seconds, or None.

        Returns:
            ``(seconds, why)``: ``study_deadline_s``, or ``budget_time_s +
            study_deadline_grace_s`` when that is sooner; None when neither bounds it.
        """
        limits = []
        if self.study_deadline_s:
            limits.append((float(self.study_deadline_s), "FEDTUNE_STUDY_DEADLINE_S"))
        if budget_time_s is not None:
            grace = self.study_deadline_grace_s
            why = f"budget.time {budget_time_s:g} s + FEDTUNE_STUDY_DEADLINE_GRACE_S {grace} s"
            limits.append((float(budget_time_s) + grace, why))
        return min(limits, key=lambda limit: limit[0]) if limits else None

    @property
    def drivers_report_to(self) -> str | None:
        """The URL drivers report to: ``driver_url``, else (a cluster backend) ``public_url``."""
        if self.driver_url:
            return self.driver_url
        cluster = self.backend in (BackendKind.RAY, BackendKind.KUBERNETES)
        return self.public_url if cluster else None


_ENV_NAMES = {
    "ray_address": "RAY_ADDRESS",
    "ray_auth_token": "RAY_AUTH_TOKEN",
    "mlflow_tracking_uri": "MLFLOW_TRACKING_URI",
}


def load_settings(config: ConfigFile | None = None, **overrides: Any) -> Settings:
    """Settings from the options, the environment and a settings file, in that order.

    Args:
        config: The settings file (``--config``, ``FEDTUNE_CONFIG``; None: none).
        **overrides: The command line's options, by setting.

    Returns:
        The settings.

    Raises:
        ConfigError: A bad value, naming its variable, or its key in ``config``.
    """
    with loading(config) as record:
        try:
            return Settings(**overrides)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else "settings"
            name = next((n for n, v in _ENV_NAMES.items() if v == name), name)
            reason = first["msg"].removeprefix("Value error, ")
            if record is not None and name in record.supplied and name not in overrides:
                key = origin(record.config, name) or name
                raise record.config.error(key, reason) from None
            env = _ENV_NAMES.get(name, f"FEDTUNE_{name.upper()}")
            raise ConfigError(env, reason) from None


def database_url_from_env() -> str | None:
    """``FEDTUNE_DATABASE_URL`` as set, before any default.

    A study driver, which must not fall back to the default SQLite file, and Alembic's
    environment tell "unset" apart with it.

    Returns:
        The variable's value, or None when it is unset.
    """
    return os.environ.get("FEDTUNE_DATABASE_URL")
