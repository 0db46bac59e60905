"""A team across machines: the service and MLflow on a "box", a member on a "laptop", each a
network namespace of its own (tests/team_net.py), nothing on 127.0.0.1 between them.

* MLflow's guards, as a laptop meets them: without ``--public-url`` the box's name is refused
  (``403 Invalid Host header``, the failure every loopback test missed); with it the name is
  accepted, and another Host header or another origin is still refused.
* ``docs/how-to/team-one-machine.md``'s section "On a real network", its blocks as printed, each
  in a terminal on the machine its title names (tests/team_shell.py): the operator restarts both
  servers with the box's name, the member submits with the light client from the laptop, waits,
  and opens the ``mlflow`` link ``fedtune status`` printed in headless Chromium on the laptop (the
  run, its trials under "Child runs", the runs list; no "Request error"), while another
  project's member sees none of it; then the same behind Debian's nginx with TLS (the page's
  ``examples/nginx/fedtune.conf``, a certificate of a CA made here), ``https://api.box.test``
  and ``https://mlflow.box.test``.
* The chart's MLflow, started from the MLflow container the chart renders with
  ``mlflow.publicUrl=https://mlflow.box.test`` (its command, args and env), behind the same
  proxy: the link built from the API container's rendered ``FEDTUNE_MLFLOW_PUBLIC_URL`` opens
  the run in the laptop's Chromium.

What the test does that the page's reader did before the section (the page's earlier
sections, and Debian's nginx package): the project ``vision`` with its member ``alice`` and a
second project ``audio`` with ``bob``, made with the admin verbs; ``quickstart.yaml`` on the
laptop; nginx running with Debian's configuration (the box's ``/etc/nginx``, ``/var/log/nginx``,
``/var/lib/nginx`` and ``/run`` are bind mounts of folders of the test, in a mount namespace of
the box's terminal, so ``cp … /etc/nginx/conf.d/`` and ``nginx -s reload`` act on the box's
copy, not this machine's); the certificate in the box's ``/etc/nginx/tls/`` and the CA's on the
laptop. Screenshots are left in the test's temporary folder.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.benchmarks import load_benchmark
from tests.chromium import CHROMIUM
from tests.needs import REPO_ROOT, need
from tests.team_net import BOX_NAMES, TeamNet, box_missing, nginx_missing
from tests.team_shell import Shell, section_blocks
from tests.tls_ca import TestTls, make_tls

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("team_net")]

PAGE = REPO_ROOT / "docs" / "how-to" / "team-one-machine.md"
SECTION = "On a real network"
DEV_BIN = Path(sys.executable).parent
ADMIN_PASSWORD = "team-net-mlflow-admin-0123456789"
#: what no terminal inherits from the test process (as tests/docs/conftest.py)
DROPPED = ("FEDTUNE_", "MLFLOW_", "RAY_", "VIRTUAL_ENV", "PYTHONPATH", "KUBECONFIG")
#: the folders of the box's own nginx, bind-mounted in its terminal's mount namespace
NGINX_DIRS = ("/etc/nginx", "/var/log/nginx", "/var/lib/nginx", "/run")


@dataclass
class Team:
    net: TeamNet
    root: Path
    light: Path  # the light install's venv
    tls: TestTls


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    need("box", box_missing())
    need("chromium", None if CHROMIUM.is_file() else f"{CHROMIUM} is not installed")
    need("nginx", nginx_missing())
    pytest.importorskip("websockets.sync.client")
    root = tmp_path_factory.mktemp("team-net")
    light = root / "light"
    load_benchmark("light_install.py").build(light)  # from this machine's index, before
    tls = make_tls(root / "tls", BOX_NAMES)
    net = TeamNet(root)
    try:
        yield Team(net, root, light, tls)
    finally:
        net.close()


# ---- the machines' environments -------------------------------------------------------------
def machine_env(home: Path, path: list[Path], **extra: str) -> dict[str, str]:
    """A terminal's variables: this process's without fedtune's, MLflow's and Ray's, a home of
    its own, ``path`` first on ``PATH`` (the development venv only where it is named)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
    system = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != DEV_BIN]
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        PATH=os.pathsep.join([*map(str, path), *system]),
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        NO_COLOR="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env | extra


def box_env(team: Team, name: str) -> dict[str, str]:
    """The box: the development venv (``fedtune[all]``); PYTHONPATH names the checkout under
    test, which selects the code, not the tools."""
    return machine_env(team.root / f"{name}-home", [DEV_BIN], PYTHONPATH=str(REPO_ROOT))


def laptop_env(team: Team, name: str) -> dict[str, str]:
    """The laptop: only the light install on ``PATH``."""
    return machine_env(team.root / f"{name}-home", [team.light / "bin"])


def box_nginx(team: Team, name: str) -> list[Path]:
    """The box's own nginx folders (:data:`NGINX_DIRS`): Debian's configuration as installed,
    the test's certificate in ``tls/``, empty log, state and run folders."""
    made = [team.root / f"{name}-nginx{d.replace('/', '-')}" for d in NGINX_DIRS]
    shutil.copytree("/etc/nginx", made[0], symlinks=True)
    (made[0] / "tls").mkdir()
    shutil.copy(team.tls.cert, made[0] / "tls" / "box.pem")
    shutil.copy(team.tls.key, made[0] / "tls" / "box.key")
    for folder in made[1:]:
        folder.mkdir()
    return made


def box_shell(team: Team, name: str, cwd: Path) -> Shell:
    """The operator's terminal on the box, in a mount namespace where :data:`NGINX_DIRS` are the
    box's own (:func:`box_nginx`)."""
    mounts = " && ".join(f'mount --bind "${n + 1}" {d}' for n, d in enumerate(NGINX_DIRS))
    argv = team.net.argv(
        "box",
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"{mounts} && exec bash --noprofile --norc -s",
            "sh",
            *box_nginx(team, name),
        ],
    )
    return Shell(argv, box_env(team, name), cwd, team.root / f"{name}-box-shell", PAGE.name)


def laptop_shell(team: Team, name: str, cwd: Path) -> Shell:
    """The member's terminal on the laptop."""
    argv = team.net.argv("laptop", ["bash", "--noprofile", "--norc", "-s"])
    return Shell(argv, laptop_env(team, name), cwd, team.root / f"{name}-laptop-shell", PAGE.name)


# ---- the member's browser -------------------------------------------------------------------
def browse(
    team: Team,
    name: str,
    url: str,
    login: tuple[str, str],
    until: list[str],
    timeout: float = 90,
) -> dict:
    """Open ``url`` in Chromium on the laptop, logged in as ``login``; what it showed
    (tests/team_browser.py), kept in ``<root>/<name>.json`` beside its screenshot
    ``<root>/<name>.png``."""
    request = {
        "url": url,
        "user": login[0],
        "password": login[1],
        "profile": str(team.root / f"chromium-{name}"),
        "screenshot": str(team.root / f"{name}.png"),
        "until": until,
        "timeout": timeout,
        "flags": [f"--ignore-certificate-errors-spki-list={team.tls.spki}"],
    }
    env = laptop_env(team, "chromium") | {"PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        team.net.argv("laptop", [sys.executable, "-m", "tests.team_browser", json.dumps(request)]),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout + 120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (team.root / f"{name}.json").write_text(done.stdout)  # beside the screenshot
    return json.loads(done.stdout.strip().splitlines()[-1])


def runs_list(link: str) -> str:
    """The experiment's runs list of a run's link (same server, route and query but the run)."""
    base, _, route = link.partition("#")
    path, _, query = route.partition("?")
    experiment = path.split("/runs/")[0]
    return f"{base}#{experiment}/runs?{query}"


def printed_link(printed: str) -> str:
    """The ``mlflow`` line's link in ``fedtune status``'s output."""
    found = re.search(r"^mlflow\s+(\S+)", printed, re.M)
    assert found, f"no mlflow line in:\n{printed}"
    return found.group(1)


# ---- MLflow's guards from the laptop ----------------------------------------------------------
def _mlflow_server(team: Team, name: str, *flags: str) -> None:
    env = box_env(team, name) | {"MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD}
    argv = ["fedtune", "mlflow-server", "--dir", team.root / name, "--host", "0.0.0.0", *flags]
    team.net.start("box", name, argv, env, team.root)
    team.net.wait_http("box", "http://127.0.0.1:5000/health", name)


def test_mlflow_takes_the_boxs_name_only_as_its_public_url(team: Team) -> None:
    """Without ``--public-url`` MLflow refuses the name the laptop uses (today's loopback-only
    setup); with it, that name and its origin pass, and MLflow's guards still refuse another
    Host header, another port and another origin."""
    admin = "Basic " + base64.b64encode(f"admin:{ADMIN_PASSWORD}".encode()).decode()
    search = "http://box:5000/ajax-api/2.0/mlflow/experiments/search"
    try:
        _mlflow_server(team, "mlflow-plain")
        status, body = team.net.http("laptop", "http://box:5000/")
        assert (status, body) == (
            403,
            "Invalid Host header - possible DNS rebinding attack detected",
        )
        team.net.stop("mlflow-plain")

        _mlflow_server(team, "mlflow-public", "--public-url", "http://box:5000")
        assert team.net.http("laptop", "http://box:5000/")[0] == 401  # past the guard: a login
        asked = {"Authorization": admin, "Origin": "http://box:5000"}
        status, body = team.net.http("laptop", search, asked, {"max_results": 1})
        assert status == 200, body
        for headers in (
            {"Authorization": admin, "Origin": "http://evil.test"},
            {"Authorization": admin, "Origin": "http://box:5001"},
            {"Authorization": admin, "Host": "evil.test:5000"},
            {"Authorization": admin, "Host": "box:5001"},
        ):
            status, body = team.net.http("laptop", search, headers, {"max_results": 1})
            assert status == 403, (headers.keys(), status, body)
    finally:
        team.net.stop_all()


# ---- the page's section, on two machines ----------------------------------------------------
def _token(printed: str) -> str:
    """The token ``fedtune users create`` prints last."""
    return printed.strip().splitlines()[-1].split()[-1]


def _login(folder: Path, name: str) -> tuple[str, str]:
    made = json.loads((folder / name).read_text())
    return made["user"], made["password"]


def _shown(page: dict) -> str:
    """A page's report without its answers' bodies, for a failure message."""
    calls = [f"{method} {path} -> {status}" for method, path, status, _ in page["api"]]
    return f"{page['href']}: settled {page['settled']}, errors {page['errors']}\n" + "\n".join(
        [*calls, page["text"][:1500]]
    )


def _member_sees_the_study(team: Team, name: str, link: str, login: tuple[str, str]) -> str:
    """The member opens ``link``: the run with its two trials under "Child runs", then the
    experiment's runs list with the run and its trials counted; MLflow answered every request of
    both pages (none refused: no "Request error"). Returns the run's (the study's) name."""
    trials = ["trial-0000", "trial-0001"]
    page = browse(team, f"{name}-run", link, login, ["Child runs", *trials])
    study = page["text"].split("\nOverview\n")[0].splitlines()[-1]  # the run's heading
    listed = browse(team, f"{name}-runs", runs_list(link), login, [study, "3 matching runs"])
    for shown in (page, listed):
        assert shown["settled"] and not shown["errors"], _shown(shown)
        assert all(status == 200 for _, _, status, _ in shown["api"]), _shown(shown)
        searched = [body for _, path, _, body in shown["api"] if "/runs/search" in path]
        assert searched and all(t in searched[-1] for t in trials), _shown(shown)
    return study


def _other_member_sees_none(
    team: Team, name: str, link: str, login: tuple[str, str], study: str
) -> None:
    """Another project's member opens the same link and the runs list: logged in as itself,
    MLflow answered the page's questions about the run and the experiment, and neither the
    pages nor any answer holds the study, its trials or its run."""
    run_id = link.split("/runs/")[1].split("?")[0]
    for page_name, url in (("run", link), ("runs", runs_list(link))):
        page = browse(team, f"{name}-{page_name}", url, login, [login[0]], timeout=60)
        assert page["settled"], _shown(page)  # drawn, as the member, every answer in
        asked = [
            (path, body)
            for _, path, _, body in page["api"]
            if "mlflowGetRun" in body or "mlflowGetExperiment" in body or "/runs/search" in path
        ]
        assert asked, _shown(page)  # the run or the experiment was asked for
        for hidden in (study, "trial-0000", run_id):
            assert hidden not in page["text"], (hidden, _shown(page))
            leaked = [path for _, path, _, body in page["api"] if hidden in body]
            assert not leaked, (hidden, leaked)


def test_the_pages_network_section_runs_from_a_laptop(team: Team) -> None:
    _, blocks = section_blocks(PAGE, SECTION)
    box_dir, laptop_dir = team.root / "box", team.root / "laptop"
    shutil.copytree(REPO_ROOT / "examples", box_dir / "examples")
    laptop_dir.mkdir()
    shutil.copy(team.tls.ca, laptop_dir / "team-ca.pem")  # the team's CA, handed out
    box = box_shell(team, "page", box_dir)
    laptop = laptop_shell(team, "page", laptop_dir)
    try:
        # what the page's reader did before (its earlier sections) and Debian's nginx package
        box.run(["nginx", "fedtune db upgrade > /dev/null"])
        tokens = {}
        for user, project in (("alice", "vision"), ("bob", "audio")):
            made = box.run(
                [
                    f"fedtune projects create {project} > /dev/null",
                    f"fedtune users create {user} --project {project}",
                ]
            )
            tokens[user] = _token(made)
        laptop.run([f"alice_token={tokens['alice']}", "fedtune init quickstart > /dev/null"])

        links = []
        for item in blocks:
            shell = box if item.where == "box" else laptop
            printed = shell.run_block(item)
            if item.where != "laptop":
                continue
            if not links:  # the member logged in to MLflow in their first block: bob does too
                laptop.run(
                    [f"FEDTUNE_TOKEN={tokens['bob']} fedtune mlflow-login --json > bob.json"]
                )
            links.append(link := printed_link(printed))
            alice, bob = _login(laptop_dir, "login.json"), _login(laptop_dir, "bob.json")
            study = _member_sees_the_study(team, f"alice-{len(links)}", link, alice)
            assert study.startswith("quickstart-digits-fedavgm"), study
            _other_member_sees_none(team, f"bob-{len(links)}", link, bob, study)
        assert [urllib.parse.urlsplit(u).netloc for u in links] == ["box:5000", "mlflow.box.test"]
    finally:
        box.close()
        laptop.close()
        team.net.stop_all()


# ---- the chart's MLflow behind the proxy ------------------------------------------------------
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
        study = _member_sees_the_study(team, "chart-alice", link, logins["alice"])
        assert study == "chart-study", study
        _other_member_sees_none(team, "chart-bob", link, logins["bob"], study)
    finally:
        box.close()
        team.net.stop_all()
