"""Settings from the environment (placeholder secrets refused) and the error table."""

from __future__ import annotations

import pytest

from fedtune import errors as base
from fedtune.errors import ConfigError
from fedtune.service import errors as svc
from fedtune.service.settings import BackendKind, load_settings
from fedtune.service.states import TRANSITIONS, StudyState, can_transition


def test_environment_names_of_the_contract(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    env = {
        "FEDTUNE_DATABASE_URL": "postgresql+psycopg://u:s3cret-pw@db:5432/fedtune",
        "FEDTUNE_API_TOKEN": "a" * 32,
        "FEDTUNE_BACKEND": "kubernetes",
        "FEDTUNE_MAX_CONCURRENT_STUDIES": "7",
        "FEDTUNE_WORKDIR": str(tmp_path),
        "RAY_ADDRESS": "http://ray:8265",
        "RAY_AUTH_TOKEN": "r" * 64,
        "MLFLOW_TRACKING_URI": "http://mlflow:5000",
        "FEDTUNE_K8S_NAMESPACE": "ml",
        "FEDTUNE_K8S_IMAGE": "ghcr.io/org/fedtune:0.1.0-cuda",
        "FEDTUNE_K8S_ENV_SECRET": "demo-fedtune-env",
        "FEDTUNE_K8S_SERVICE_ACCOUNT": "demo-fedtune-job",
        "FEDTUNE_K8S_WORKER_TEMPLATE": '{"nodeSelector": {"gpu": "true"}, "tolerations": []}',
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = load_settings()
    assert s.backend == BackendKind.KUBERNETES and s.max_concurrent_studies == 7
    assert s.token == "a" * 32 and "a" * 32 not in repr(s)  # SecretStr: never printed
    assert s.ray_address == "http://ray:8265" and s.mlflow_tracking_uri == "http://mlflow:5000"
    assert s.ray_auth_token.get_secret_value() == "r" * 64 and "r" * 64 not in repr(s)
    assert s.k8s_worker_template == {"nodeSelector": {"gpu": "true"}, "tolerations": []}
    assert s.k8s_env_secret == "demo-fedtune-env" and s.workdir == tmp_path


def test_defaults_are_a_laptop_service(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("FEDTUNE_DATABASE_URL", "FEDTUNE_API_TOKEN", "FEDTUNE_BACKEND", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    s = load_settings()
    assert s.database_url == "sqlite:///./fedtune.db" and s.backend == BackendKind.LOCAL
    assert s.token is None
    assert load_settings(api_token="").token is None  # the chart's "no token"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"api_token": "changethis"}, "FEDTUNE_API_TOKEN"),
        ({"api_token": "short"}, "FEDTUNE_API_TOKEN"),
        ({"database_url": "postgresql+psycopg://u:changethis@db/x"}, "FEDTUNE_DATABASE_URL"),
        ({"k8s_image": "fedtune; rm -rf /"}, "FEDTUNE_K8S_IMAGE"),
        ({"k8s_image": "$(curl evil)"}, "FEDTUNE_K8S_IMAGE"),
        ({"k8s_namespace": "Bad_NS"}, "FEDTUNE_K8S_NAMESPACE"),
        ({"k8s_env_secret": "x y"}, "FEDTUNE_K8S_ENV_SECRET"),
        ({"k8s_worker_template": {"containers": []}}, "FEDTUNE_K8S_WORKER_TEMPLATE"),
        ({"max_concurrent_studies": 0}, "FEDTUNE_MAX_CONCURRENT_STUDIES"),
        ({"backend": "slurm"}, "FEDTUNE_BACKEND"),
        ({"ray_address": 5}, "RAY_ADDRESS"),
    ],
)
def test_refused_settings_name_the_variable(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(**overrides)
    assert err.value.field == field


def test_every_error_class_has_one_status_and_code() -> None:
    classes = list(
        dict.fromkeys(  # the service module re-exports the tree of fedtune.errors
            getattr(mod, name)
            for mod in (base, svc)
            for name in mod.__all__
            if isinstance(getattr(mod, name), type) and issubclass(getattr(mod, name), Exception)
        )
    )
    codes = [svc.ERROR_TABLE[c][1] for c in classes]
    assert set(classes) <= set(svc.ERROR_TABLE) and len(set(codes)) == len(codes)
    assert all(c.code == svc.ERROR_TABLE[c][1] for c in classes)
    assert svc.status_and_code(svc.StudyNotFoundError("x")) == (404, "study_not_found")
    assert svc.status_and_code(KeyError("x")) == (500, "internal_error")


@pytest.mark.parametrize(
    "exc",
    [
        ConfigError("budget.trials", "must be >= 1"),
        svc.StudyNotFoundError("no study"),
        svc.IllegalStateChangeError("already succeeded"),
        svc.IdempotencyKeyReusedError("other body"),
        svc.UnauthorizedError("token"),
        svc.ForbiddenError("token"),
        svc.DatabaseUnavailableError("down"),
        base.BackendError("ray down"),
        base.TransientError("connection reset"),
        base.RayStartError("Ray did not start (embedded) after 3 attempt(s): TimeoutError: ..."),
    ],
)
def test_the_sdk_rebuilds_the_typed_exception(exc: Exception) -> None:
    status, code = svc.status_and_code(exc)
    rebuilt = svc.exception_from_body(status, svc.error_body(exc))
    assert type(rebuilt) is type(exc) and rebuilt.code == code and rebuilt.status == status
    if isinstance(exc, ConfigError):
        assert rebuilt.field == "budget.trials" and rebuilt.reason == "must be >= 1"


def test_unknown_codes_fall_back_on_the_status() -> None:
    assert type(svc.exception_from_body(404, {"error": {"code": "new"}})) is base.NotFoundError
    assert type(svc.exception_from_body(422, "not json")) is ConfigError
    assert type(svc.exception_from_body(418, {})) is base.FedtuneError
    assert type(svc.exception_from_body(503, {})) is base.TransientError  # "try again later"


def test_transient_errors_answer_503_with_their_own_codes() -> None:
    assert svc.status_and_code(base.RayStartError("x")) == (503, "ray_start_failed")
    assert svc.status_and_code(base.TransientError("x")) == (503, "transient_backend_error")
    assert issubclass(base.RayStartError, base.TransientError)
    assert issubclass(base.TransientError, base.BackendError)


def test_internal_errors_do_not_leak_details() -> None:
    body = svc.error_body(ValueError("password=hunter2"))
    assert body == {
        "error": {"code": "internal_error", "message": "internal server error", "field": None}
    }


def test_state_machine() -> None:
    assert can_transition(StudyState.QUEUED, StudyState.RUNNING)
    assert can_transition(StudyState.RUNNING, StudyState.QUEUED)  # re-dispatch
    assert not any(TRANSITIONS[s] for s in StudyState if s.terminal)
    assert not can_transition(StudyState.QUEUED, StudyState.SUCCEEDED)
