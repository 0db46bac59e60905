"""A team across machines: the service and MLflow on a "box", a member on a "laptop", each a
network namespace of its own (tests/team_net.py), nothing on 127.0.0.1 between them.

* MLflow's guards, as a laptop meets them: without ``--public-url`` the box's name is refused
  (``403 Invalid Host header``, the failure every loopback test missed); with the name as an
  allowed Host header only, the runs list in the laptop's Chromium says "Request error" (its
  runs search refused as cross-origin); with ``--public-url`` every request of that page is
  answered, and another Host header or another origin is still refused.
* ``docs/how-to/team-one-machine.md``'s section "On a real network", its blocks as printed, each
  in a terminal on the machine its title names (tests/team_shell.py): the operator restarts both
  servers with the box's name, the member submits with the light client from the laptop, waits,
  and opens the ``mlflow`` link ``fedtune status`` printed in headless Chromium on the laptop (the
  run, its trials under "Child runs", the runs list; every request of the UI answered, no
  "Request error"), while another project's member sees none of it; then the same behind
  Debian's nginx with TLS (the page's ``examples/nginx/fedtune.conf``, a certificate of a CA made
  here), ``https://api.box.test`` and ``https://mlflow.box.test``.

What the test does that the page's reader did before the section (the page's earlier
sections, and Debian's nginx package): the project ``vision`` with its member ``alice`` and a
second project ``audio`` with ``bob``, made with the admin verbs; ``quickstart.yaml`` and the
team's CA certificate (``team-ca.pem``) on the laptop; nginx running with Debian's configuration
and the certificate in the box's ``/etc/nginx/tls/`` (tests/team_machines.py). Screenshots and
page reports (``<name>.png``, ``<name>.json``) are left in the test's temporary folder.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.benchmarks import load_benchmark
from tests.chromium import CHROMIUM
from tests.needs import REPO_ROOT, need
from tests.team_machines import (
    SEARCH,
    Team,
    box_env,
    box_shell,
    browse,
    laptop_shell,
    member_sees_the_study,
    other_member_sees_none,
    printed_link,
    shown,
)
from tests.team_net import BOX_NAMES, TeamNet, box_missing, nginx_missing
from tests.team_shell import section_blocks
from tests.tls_ca import make_tls

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("team_net")]

PAGE = REPO_ROOT / "docs" / "how-to" / "team-one-machine.md"
SECTION = "On a real network"
ADMIN_PASSWORD = "team-net-mlflow-admin-0123456789"
#: the default experiment's runs list, as a browser on the laptop opens it
RUNS = "http://box:5000/#/experiments/0/runs?workflowType=machine_learning&workspace=default"


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    need("box", box_missing())
    need("chromium", None if CHROMIUM.is_file() else f"{CHROMIUM} is not installed")
    pytest.importorskip("websockets.sync.client")
    root = tmp_path_factory.mktemp("team-net")
    light = root / "light"
    # a venv without pip of its own (``ensurepip`` cost ~5 CPU-s on a loaded machine; the
    # laptop never runs pip), installed from the package index as a member would
    load_benchmark("light_install.py").build(light, with_pip=False)
    tls = make_tls(root / "tls", BOX_NAMES)
    net = TeamNet(root)
    team = Team(net, root, tls, light)
    try:
        yield team
    finally:
        team.close()  # the laptop's Chromium
        net.close()


# ---- MLflow's guards from the laptop ----------------------------------------------------------
def _mlflow_server(team: Team, name: str, *flags: str) -> None:
    env = box_env(team, name) | {"MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD}
    argv = ["fedtune", "mlflow-server", "--dir", team.root / name, "--host", "0.0.0.0", *flags]
    team.net.start("box", name, argv, env, team.root)
    team.net.wait_http("box", "http://127.0.0.1:5000/health", name)


def test_mlflow_takes_the_boxs_name_and_origin_only_from_its_public_url(team: Team) -> None:
    """What a laptop meets: without ``--public-url`` MLflow refuses the box's name (today's
    loopback-only setup); with the name allowed as a Host header only (``--allowed-hosts
    box:5000``) pages load, but the UI's own requests are refused as cross-origin and the runs
    list says "Request error". With ``--public-url`` the same page gets every answer and MLflow's
    guards still refuse another Host header, another port and another origin: checked on the
    page's own server, started with those flags (:func:`_public_url_guards`, in
    :func:`test_the_pages_network_section_runs_from_a_laptop`), not on a third one here."""
    admin = ("admin", ADMIN_PASSWORD)
    try:
        _mlflow_server(team, "mlflow-plain")
        status, body = team.net.http("laptop", "http://box:5000/")
        assert (status, body) == (
            403,
            "Invalid Host header - possible DNS rebinding attack detected",
        )
        team.net.stop("mlflow-plain")

        _mlflow_server(team, "mlflow-host", "--allowed-hosts", "box:5000")
        page = browse(team, "host-only-runs", RUNS, admin, ["admin", "Request error"])
        refused = [path for _, path, status, _ in page["api"] if status == 403]
        assert "Request error" in page["errors"], shown(page)
        assert any("/runs/search" in path for path in refused), shown(page)
        team.net.stop("mlflow-host")
    finally:
        # the box's servers and whatever is left on the box; the laptop's Chromium stays for
        # the module's next test (:meth:`Team.browser`: a launch fewer)
        for name in list(team.net.procs):
            team.net.stop(name)
        team.net.end_namespace("box")


def _public_url_guards(team: Team, admin: tuple[str, str]) -> None:
    """MLflow started with ``--public-url http://box:5000`` (the page's first block): the runs
    list opened from the laptop gets every answer (no "Request error"), a search from the
    public origin is answered, and another Host header, another port or another origin is
    refused."""
    basic = "Basic " + base64.b64encode(":".join(admin).encode()).decode()
    search = "http://box:5000/ajax-api/2.0/mlflow/experiments/search"
    page = browse(team, "public-url-runs", RUNS, admin, ["admin"], answered=SEARCH)
    answered = [path for _, path, status, _ in page["api"] if status == 200]
    assert page["settled"] and not page["errors"], shown(page)
    assert len(answered) == len(page["api"]), shown(page)
    assert any("/runs/search" in path for path in answered), shown(page)
    asked = {"Authorization": basic, "Origin": "http://box:5000"}
    status, body = team.net.http("laptop", search, asked, {"max_results": 1})
    assert status == 200, body
    for headers in (
        {"Authorization": basic, "Origin": "http://evil.test"},
        {"Authorization": basic, "Origin": "http://box:5001"},
        {"Authorization": basic, "Host": "evil.test:5000"},
        {"Authorization": basic, "Host": "box:5001"},
    ):
        status, body = team.net.http("laptop", search, headers, {"max_results": 1})
        assert status == 403, (headers.keys(), status, body)


# ---- the page's section, on two machines ----------------------------------------------------
#: ``fedtune db upgrade``, the projects ``vision`` and ``audio``, and their members ``alice``
#: and ``bob`` made with ``fedtune users create``, as the page's earlier sections do, in one
#: Python (a ``fedtune`` process each cost the busy machine ~2.5 CPU-s of imports)
_ADMIN_VERBS = (
    "python -c 'import sys; from fedtune.cli import main; "
    "sys.exit(max(main(verb.split()) for verb in sys.argv[1:]))' 'db upgrade' "
    "'projects create vision' 'users create alice --project vision' "
    "'projects create audio' 'users create bob --project audio'"
)


def _token(printed: str, user: str) -> str:
    """The token ``fedtune users create`` printed for ``user`` (the line after its ``token …
    for <user> …; shown once:``)."""
    found = re.search(rf"^token \S+ for {user} .*shown once:\n(\S+)$", printed, re.M)
    assert found, printed
    return found.group(1)


def _login(folder: Path, name: str) -> tuple[str, str]:
    made = json.loads((folder / name).read_text())
    return made["user"], made["password"]


def test_the_pages_network_section_runs_from_a_laptop(team: Team) -> None:
    need("nginx", nginx_missing())
    _, blocks = section_blocks(PAGE, SECTION)
    box_dir, laptop_dir = team.root / "box", team.root / "laptop"
    shutil.copytree(REPO_ROOT / "examples", box_dir / "examples")
    laptop_dir.mkdir()
    shutil.copy(team.tls.ca, laptop_dir / "team-ca.pem")  # the team's CA, handed out
    box = box_shell(team, "page", box_dir, PAGE.name)
    laptop = laptop_shell(team, "page", laptop_dir, PAGE.name)
    try:
        # what the page's reader did before (its earlier sections) and Debian's nginx package;
        # the admin verbs in one process (fedtune.cli.main, as `fedtune` runs them)
        made = box.run(["nginx", _ADMIN_VERBS])
        tokens = {user: _token(made, user) for user in ("alice", "bob")}
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
            study = member_sees_the_study(team, f"alice-{len(links)}", link, alice)
            assert study.startswith("quickstart-digits-fedavgm"), study
            other_member_sees_none(team, f"bob-{len(links)}", link, bob, study)
            if len(links) == 1:  # MLflow as the page's first block started it
                password = (box_dir / "mlflow-server" / "admin-password").read_text().strip()
                _public_url_guards(team, ("admin", password))
        assert [urllib.parse.urlsplit(u).netloc for u in links] == ["box:5000", "mlflow.box.test"]
    finally:
        box.close()
        laptop.close()
        team.net.stop_all()
