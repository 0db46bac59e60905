"""The chart's other fedtune containers, run as rendered in their pods (the
harness and its translations: tests/deploy/test_pod_commands_run.py and pod_sandbox.py):
the first-install migration Job (``fedtune db upgrade``), the API's ``wait-for-schema`` init
container and the API itself (``fedtune serve``, until ``/readyz`` answers), and MLflow's
``mlflow db upgrade`` init container — each as UID 10001 on a read-only root with only its
rendered mounts writable, against the real PostgreSQL.

Translated besides the database URLs (throw-away schemas of 127.0.0.1:5432/test, one for
fedtune, one for MLflow): the API's ``--port 8000`` becomes a free port of this machine (the pod
has its own network namespace, this sandbox shares the machine's).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, inspect

from tests.deploy.conftest import RELEASE, one
from tests.deploy.test_pod_commands_run import container_argv, container_env, pod_process
from tests.needs import need
from tests.ports import free_port
from tests.service.helpers import pg_schema, pg_unreachable_reason

pytestmark = [pytest.mark.integration, pytest.mark.image]

FULLNAME = f"{RELEASE}-fedtune"


@pytest.fixture(scope="module", autouse=True)
def _machine() -> None:
    need("postgres", pg_unreachable_reason())


def _pod(manifests: list[dict], kind: str, name: str) -> dict[str, Any]:
    return one(manifests, kind, name)["spec"]["template"]["spec"]


def _run(tmp_path, pod, container, manifests, urls: dict[str, str], root, timeout: float = 300):
    env = container_env(container, manifests)
    assert set(urls) <= set(env), (set(urls), set(env))
    sandbox, full_env, cwd = pod_process(tmp_path, pod, container, env | urls, root)
    return sandbox.run(container_argv(container), env=full_env, cwd=cwd, timeout=timeout)


def test_migration_job_then_the_api_start_in_their_pods(render, tmp_path, image_root) -> None:
    manifests = render({})
    job = _pod(manifests, "Job", f"{FULLNAME}-db-init")
    api = _pod(manifests, "Deployment", FULLNAME)
    with pg_schema() as url:
        urls = {"FEDTUNE_DATABASE_URL": url}
        done = _run(tmp_path / "job", job, job["containers"][0], manifests, urls, image_root)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

        wait = api["initContainers"][0]
        done = _run(tmp_path / "init", api, wait, manifests, urls, image_root, timeout=120)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

        container = api["containers"][0]
        port = free_port()
        assert container["args"][-2:] == ["--port", "8000"]
        served = {**container, "args": [*container["args"][:-1], str(port)]}
        env = container_env(container, manifests) | urls
        sandbox, full_env, cwd = pod_process(tmp_path / "api", api, served, env, image_root)
        log = tmp_path / "api.log"
        process = sandbox.popen(container_argv(served), env=full_env, cwd=cwd, log=log)
        try:
            ready = _wait_ready(f"http://127.0.0.1:{port}/readyz", process, deadline_s=300)
            assert ready, log.read_text()[-3000:]
        finally:
            process.terminate()
            process.wait(timeout=60)


def _wait_ready(url: str, process, deadline_s: float) -> bool:
    """Poll like the readiness probe until 200, the process exits, or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and process.poll() is None:
        try:
            if httpx.get(url, timeout=3).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1)
    return False


def test_mlflow_init_container_migrates_in_its_pod(render, tmp_path, image_root) -> None:
    manifests = render({})
    pod = _pod(manifests, "Deployment", f"{FULLNAME}-mlflow")
    init = pod["initContainers"][0]
    with pg_schema() as url:
        done = _run(tmp_path, pod, init, manifests, {"MLFLOW_BACKEND_STORE_URI": url}, image_root)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        engine = create_engine(url)
        try:
            assert {"experiments", "runs", "alembic_version"} <= set(
                inspect(engine).get_table_names()
            )
        finally:
            engine.dispose()
    assert "mlflow db upgrade" in " ".join(container_argv(init))
