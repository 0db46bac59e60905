"""A member installs the light client from the service: ``make dist`` builds the wheel
(``tools/client_wheel.py``), a real ``fedtune serve`` hands it out at ``/client/`` without a
token, and pip in a fresh ``python3 -m venv`` installs it from there (by its URL, and with
``--find-links``), its dependencies from pip's own index; the installed client then talks to the
service. Only the wheels of the folder are served, by exact name: no other file of the folder,
and nothing outside it, whatever the path says."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from fedtune import __version__
from fedtune.service import client_wheel
from fedtune.service.api import create_app

from .conftest import TOKEN
from .helpers import REPO, Server

pytestmark = pytest.mark.slow

WHEEL = f"fedtune-{__version__}-py3-none-any.whl"
SECRET = "a-file-beside-the-wheels-0123456789"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel as ``make dist`` builds it, beside files that must never be served."""
    out = tmp_path_factory.mktemp("client") / "dist"
    built = subprocess.run(
        [sys.executable, str(REPO / "tools" / "client_wheel.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    assert Path(built.stdout.strip()) == out / WHEEL
    (out / "notes.txt").write_text(SECRET)
    (out / "sub").mkdir()
    (out / "sub" / "other-1.0-py3-none-any.whl").write_text(SECRET)
    (out.parent / "secret.whl").write_text(SECRET)  # outside the folder
    return out


@pytest.fixture(scope="module")
def server(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("serve")
    env = {
        "FEDTUNE_DATABASE_URL": f"sqlite:///{tmp / 'fedtune.db'}",
        "FEDTUNE_WORKDIR": str(tmp / "work"),
        "FEDTUNE_BACKEND": "none",
        "FEDTUNE_API_TOKEN": TOKEN,
        "FEDTUNE_CLIENT_WHEEL_DIR": str(dist),
    }
    s = Server(env, tmp / "serve.log").start(timeout=120)
    try:
        yield s
    finally:
        s.stop()


def _raw_get(url: str, path: str) -> tuple[int, bytes]:
    """``GET path`` sent byte for byte (httpx would resolve ``..`` before sending it)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_the_index_lists_the_wheel_and_how_to_install_it_without_a_token(
    server: Server, dist: Path
) -> None:
    digest = hashlib.sha256((dist / WHEEL).read_bytes()).hexdigest()
    page = httpx.get(f"{server.url}/client/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'href="{WHEEL}#sha256={digest}"' in page.text
    assert f"pip install {server.url}/client/{WHEEL}" in page.text
    assert f"pip install --find-links {server.url}/client/ fedtune" in page.text
    assert SECRET not in page.text and "notes.txt" not in page.text and "other-1.0" not in page.text
    root = httpx.get(f"{server.url}/client/simple/", timeout=30)
    assert root.status_code == 200 and 'href="fedtune/"' in root.text
    project = httpx.get(f"{server.url}/client/simple/fedtune/", timeout=30)
    assert f'href="../../{WHEEL}#sha256={digest}"' in project.text
    got = httpx.get(f"{server.url}/client/{WHEEL}", timeout=30)
    assert got.status_code == 200 and got.content == (dist / WHEEL).read_bytes()


@pytest.mark.parametrize(
    "path",
    [
        "/client/notes.txt",
        "/client/sub/other-1.0-py3-none-any.whl",
        "/client/sub%2Fother-1.0-py3-none-any.whl",
        "/client/../secret.whl",
        "/client/..%2Fsecret.whl",
        "/client/%2e%2e%2fsecret.whl",
        "/client/%2e%2e/secret.whl",
        "/client/....//secret.whl",
        f"/client/{WHEEL.upper()}",
        f"/client/{WHEEL}%00.txt",
        "/client/simple/other/",
        "/client/simple/../../secret.whl",
    ],
)
def test_nothing_but_the_wheels_is_served(server: Server, path: str) -> None:
    status, body = _raw_get(server.url, path)
    assert status in (400, 404), (path, status)
    assert SECRET.encode() not in body


def test_without_a_wheel_every_route_says_how_to_build_one(make_settings, tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    app = create_app(make_settings(api_token=TOKEN, client_wheel_dir=str(empty)), backend=None)
    with TestClient(app) as client:
        for path in ("/client/", "/client/simple/", "/client/simple/fedtune/", f"/client/{WHEEL}"):
            answer = client.get(path)
            assert answer.status_code == 404, path
            message = answer.json()["error"]["message"]
            assert "make dist" in message and "FEDTUNE_CLIENT_WHEEL_DIR" in message
            assert str(empty) not in message  # the folder is logged, never answered


def test_the_folder_defaults_to_the_image_then_the_checkout(
    make_settings, tmp_path, monkeypatch
) -> None:
    settings = make_settings()
    monkeypatch.setattr(client_wheel, "IMAGE_DIR", tmp_path / "absent")
    assert client_wheel.wheel_dir(settings) == REPO / "dist"
    monkeypatch.setattr(client_wheel, "IMAGE_DIR", tmp_path)
    assert client_wheel.wheel_dir(settings) == tmp_path
    given = make_settings(client_wheel_dir=str(tmp_path / "given"))
    assert client_wheel.wheel_dir(given) == tmp_path / "given"


def _venv_run(venv: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command of the laptop's venv, with nothing of this checkout on its path."""
    laptop = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=600,
        env=env if env is not None else laptop,
    )


def test_pip_installs_the_client_from_the_service(server: Server, tmp_path: Path) -> None:
    """Both documented forms, in a fresh venv with pip's configured index for the
    dependencies; then the installed client reaches the service."""
    venv = tmp_path / "laptop"
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=300)
    pip = ("python", "-m", "pip", "--disable-pip-version-check")
    by_url = _venv_run(venv, *pip, "install", f"{server.url}/client/{WHEEL}")
    assert by_url.returncode == 0, by_url.stderr[-3000:]
    helped = _venv_run(venv, "fedtune", "--help")
    assert helped.returncode == 0 and "the service's client:" in helped.stdout
    env = {"FEDTUNE_URL": server.url, "FEDTUNE_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"}
    me = _venv_run(venv, "fedtune", "whoami", env=env)
    assert me.returncode == 0 and me.stdout.startswith("admin (admin) via bootstrap"), me.stderr
    assert _venv_run(venv, *pip, "uninstall", "--yes", "fedtune").returncode == 0
    before = len(server.log.read_text())
    linked = _venv_run(
        venv, *pip, "install", "--find-links", f"{server.url}/client/", f"fedtune=={__version__}"
    )
    assert linked.returncode == 0, linked.stderr[-3000:]
    shown = _venv_run(venv, *pip, "list", "--format", "json")
    installed = {p["name"].lower(): p["version"] for p in json.loads(shown.stdout)}
    assert installed["fedtune"] == __version__
    assert not {"torch", "ray", "mlflow", "optuna"} & set(installed)  # the light install
    served = server.log.read_text()[before:]  # the wheel came from the service, its page first
    assert "GET /client/ " in served and f"GET /client/{WHEEL}" in served


def test_the_image_ships_the_wheel_where_the_service_looks() -> None:
    """The image's final stage copies the build stage's wheel (the one it installs) to
    ``client_wheel.IMAGE_DIR``, where ``fedtune serve`` finds it without a setting."""
    from tests.deploy.test_dockerfile import parse_dockerfile

    dockerfile = parse_dockerfile((REPO / "Dockerfile").read_text())
    built = " ".join(i.args for i in dockerfile.stage("build").all("RUN"))
    assert "pip wheel" in built and "--no-deps" in built and "--wheel-dir /wheels" in built
    copies = [c for c in dockerfile.final.all("COPY") if c.args.split()[0] == "/wheels/"]
    assert [(c.flags["from"], c.args.split()[-1]) for c in copies] == [
        ("build", f"{client_wheel.IMAGE_DIR}/")
    ]
