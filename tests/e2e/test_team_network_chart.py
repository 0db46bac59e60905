"""The chart's MLflow for a team's browsers: the MLflow container the chart renders with
``mlflow.publicUrl=https://mlflow.box.test``, run as rendered (command, args and env; its volume
mounts are folders of the test, its store SQLite instead of the chart's PostgreSQL) in the box
of a team's network (tests/team_net.py), behind nginx with the configuration the team page shows
(``examples/nginx/fedtune.conf``) standing for the cluster's ingress, and opened over TLS from
the laptop's Chromium with the link the API container's rendered ``FEDTUNE_MLFLOW_PUBLIC_URL``
makes. Before ``mlflow.publicUrl`` reached MLflow's arguments the page said ``Invalid Host
header``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chromium import CHROMIUM
from tests.needs import REPO_ROOT, need
from tests.team_machines import (
    Team,
    box_env,
    box_shell,
    member_sees_the_study,
    other_member_sees_none,
)
from tests.team_net import BOX_NAMES, TeamNet, box_missing, nginx_missing
from tests.tls_ca import make_tls

pytestmark = pytest.mark.slow


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    need("box", box_missing())
    need("chromium", None if CHROMIUM.is_file() else f"{CHROMIUM} is not installed")
    need("nginx", nginx_missing())
    pytest.importorskip("websockets.sync.client")
    net = TeamNet(tmp_path)
    team = Team(net, tmp_path, make_tls(tmp_path / "tls", BOX_NAMES))
    try:
        yield team
    finally:
        team.close()  # the laptop's Chromium
        net.close()


CHART_URL = "https://mlflow.box.test"
#: the run the chart's MLflow gets, logged as a study driver of project vision logs
_LOG_RUNS = """
import json, sys, httpx
from fedtune.service.mlflow_tenancy import MlflowTenancy
url, admin, password = sys.argv[1:4]
tenancy = MlflowTenancy(url, admin, password)
tenancy.sync(["vision", "audio"], {"alice": {"vision": "member"}, "bob": {"audio": "member"}})
logins = {name: tenancy.issue_password(name) for name in ("alice", "bob")}
env = tenancy.driver_env("vision")
with httpx.Client(base_url=url, auth=(env["MLFLOW_TRACKING_USERNAME"],
        env["MLFLOW_TRACKING_PASSWORD"]), headers={"X-MLFLOW-WORKSPACE": "vision"}) as driver:
    def made(route, body):
        answer = driver.post(route, json=body)
        answer.raise_for_status()
        return answer.json()
    exp = made("/api/2.0/mlflow/experiments/create", {"name": "chart"})["experiment_id"]
    parent = made("/api/2.0/mlflow/runs/create", {"experiment_id": exp, "run_name": "chart-study"})
    run = parent["run"]["info"]["run_id"]
    for n in range(2):
        made("/api/2.0/mlflow/runs/create", {"experiment_id": exp, "run_name": f"trial-000{n}",
             "tags": [{"key": "mlflow.parentRunId", "value": run}]})
tenancy.close()
print(json.dumps({"experiment": exp, "run": run, "logins": logins}))
"""


def _render(values: dict) -> list[dict]:
    """The chart rendered offline (tests/deploy/conftest.py's render, without its fixtures)."""
    from tests.deploy.conftest import (
        CHART_DIR,
        HELM_INSTALL_HINT,
        NAMESPACE,
        RELEASE,
        split_manifests,
        with_offline_secrets,
    )

    try:
        import helm_python

        helm_python.helm_sdk_version()
    except Exception as exc:  # not installed, or its libhelm_c does not load
        need("helm", f"helm-python-sdk is unusable ({exc}); {HELM_INSTALL_HINT}")
    with helm_python.Chart.load(CHART_DIR) as chart:
        rendered = chart.render(
            with_offline_secrets(values),
            name=RELEASE,
            namespace=NAMESPACE,
            is_install=True,
            is_upgrade=False,
        )
    return split_manifests(rendered)


def _as_in_the_pod(value: str, mounts: dict[str, Path]) -> str:
    """``value`` with each of the container's mount paths replaced by the folder standing for it
    (``--dir=/tmp/mlflow-server``, ``file:///mlflow/artifacts``)."""
    for mount, folder in mounts.items():
        value = re.sub(rf"(?:^|(?<==)|(?<=file://)){re.escape(mount)}(?=/|$)", str(folder), value)
    return value


def test_the_charts_mlflow_serves_its_public_url_through_a_tls_proxy(team: Team) -> None:
    """MLflow started from the MLflow container the chart renders with ``mlflow.publicUrl``
    (command, args and env as rendered; its volume mounts are folders of the test, its store
    SQLite instead of the chart's PostgreSQL) behind nginx with the page's configuration: the
    link built from the API container's rendered ``FEDTUNE_MLFLOW_PUBLIC_URL`` opens the run,
    its trials and the runs list in the laptop's Chromium over TLS, and shows another project's
    member nothing of it."""
    from fedtune.tuning.mlflow.urls import run_url
    from tests.deploy.conftest import RELEASE, container_env, one
    from tests.deploy.test_pod_commands_run import container_env as pod_env

    manifests = _render({"mlflow": {"publicUrl": CHART_URL}})
    api = one(manifests, "Deployment", f"{RELEASE}-fedtune")["spec"]["template"]["spec"]
    assert container_env(api["containers"][0])["FEDTUNE_MLFLOW_PUBLIC_URL"]["value"] == CHART_URL
    pod = one(manifests, "Deployment", f"{RELEASE}-fedtune-mlflow")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    here = team.root / "chart-mlflow"
    mounts = {m["mountPath"]: here / m["name"] for m in container["volumeMounts"]}
    for folder in mounts.values():
        folder.mkdir(parents=True)
    env = {k: _as_in_the_pod(v, mounts) for k, v in pod_env(container, manifests).items()}
    env["MLFLOW_BACKEND_STORE_URI"] = f"sqlite:///{here / 'mlflow.db'}"
    argv = [_as_in_the_pod(a, mounts) for a in [*container["command"], *container["args"]]]
    assert "--port=5000" in argv and "--host=0.0.0.0" in argv, argv
    cwd = Path(_as_in_the_pod(container["workingDir"], mounts))
    (team.root / "chart-box").mkdir()
    shutil.copy(REPO_ROOT / "examples" / "nginx" / "fedtune.conf", team.root / "chart-box")
    box = box_shell(team, "chart", team.root / "chart-box")
    try:
        team.net.start("box", "chart-mlflow", argv, box_env(team, "chart-mlflow") | env, cwd)
        team.net.wait_http("box", "http://127.0.0.1:5000/health", "chart-mlflow")
        box.run(["cp fedtune.conf /etc/nginx/conf.d/fedtune.conf", "nginx -t -q", "nginx"])
        admin = env["MLFLOW_AUTH_ADMIN_USERNAME"], env["MLFLOW_AUTH_ADMIN_PASSWORD"]
        made = team.net.python("box", _LOG_RUNS, "http://127.0.0.1:5000", *admin, timeout=120)
        link = run_url(CHART_URL, made["experiment"], made["run"], "vision")
        logins = {user: (user, password) for user, password in made["logins"].items()}
        study = member_sees_the_study(team, "chart-alice", link, logins["alice"])
        assert study == "chart-study", study
        other_member_sees_none(team, "chart-bob", link, logins["bob"], study)
    finally:
        box.close()
        team.net.stop_all()
