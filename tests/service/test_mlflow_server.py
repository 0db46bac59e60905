"""``fedtune mlflow-server``'s recipe: what MLflow is started with (the server itself runs in
``tests/integration/test_mlflow_tenancy.py`` and the e2e tenancy tests)."""

from __future__ import annotations

import configparser
import socket
import stat
import subprocess
import sys

from fedtune.service.child_env import mlflow_server_env
from fedtune.service.mlflow_server import MlflowServer

SECRETS = {
    "FEDTUNE_API_TOKEN": "service-token",
    "FEDTUNE_MLFLOW_ADMIN_PASSWORD": "other",
    "MLFLOW_TRACKING_PASSWORD": "a-login",
    "MLFLOW_WORKSPACE": "team",
}


def test_the_server_runs_closed_with_workspaces_and_the_store_off_its_command_line(tmp_path):
    server = MlflowServer(tmp_path / "m", port=5123, backend_store_uri="postgresql://u:p%40ss@db/m")
    ini = configparser.ConfigParser()
    ini.read_string(server.auth_ini())
    assert ini["mlflow"]["default_permission"] == "NO_PERMISSIONS"
    assert ini["mlflow"]["grant_default_workspace_access"] == "false"
    assert ini["mlflow"]["database_uri"] == "postgresql://u:p%40ss@db/m"  # % survives the ini
    argv = server.argv("mlflow")
    assert {"--enable-workspaces", "--app-name=fedtune", "--port=5123"} <= set(argv)
    assert not any("p%40ss" in arg for arg in argv)  # the store's password: env only
    kept = mlflow_server_env({"PATH": "/usr/bin", "AWS_ACCESS_KEY_ID": "k", **SECRETS})
    assert kept == {"PATH": "/usr/bin", "AWS_ACCESS_KEY_ID": "k"}  # an allowlist
    env = server.env("pw-0123456789abcdef", kept)
    assert env["MLFLOW_BACKEND_STORE_URI"] == "postgresql://u:p%40ss@db/m"
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == "pw-0123456789abcdef"
    assert env["MLFLOW_RBAC_SEED_DEFAULT_ROLES"] == "false" and env["PATH"] == "/usr/bin"
    assert not set(SECRETS) & set(env)  # none of the caller's fedtune settings or logins


def test_a_password_is_made_once_and_kept_private_unless_one_is_given(tmp_path):
    server = MlflowServer(tmp_path / "m")
    made = server.prepare({})
    assert len(made) >= 32 and server.prepare({}) == made  # the same after a restart
    assert stat.S_IMODE(server.password_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "m" / "auth.ini").stat().st_mode) == 0o600
    given = MlflowServer(tmp_path / "g")
    assert given.prepare({"MLFLOW_AUTH_ADMIN_PASSWORD": "from-the-env-0123"}) == "from-the-env-0123"
    assert not given.password_path.exists()


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cli = [sys.executable, "-m", "fedtune.cli", "mlflow-server", "--dir", str(tmp_path / "m")]
        out = subprocess.run([*cli, "--port", str(port)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"fedtune: error: --port: 127.0.0.1:{port} is in use: another process (another MLflow "
        "server?) listens there; stop it, or pick another port with --port"
    ]
    assert not (tmp_path / "m").exists()  # refused before anything was made
