"""``fedtune mlflow-server``: MLflow's tracking server with a workspace per project and logins.

The server a team's ``fedtune serve`` logs to (``FEDTUNE_MLFLOW_WORKSPACES``), run as the Helm
chart runs it (``fedtune.service.mlflow_server``): ``mlflow db upgrade``, then ``mlflow server
--enable-workspaces --app-name fedtune`` with basic auth, no permission by default, and an admin
password from ``MLFLOW_AUTH_ADMIN_PASSWORD`` or made once in ``<dir>/admin-password``. It prints
how to start the service against it, then becomes the server (Ctrl-C stops it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .config_option import add_config_option, apply_config

__all__ = ["register"]

#: ``mlflow db upgrade`` of the store in ``MLFLOW_BACKEND_STORE_URI`` (never on a command line)
_UPGRADE = (
    "import os; from mlflow.db import upgrade; "
    "upgrade.main([os.environ['MLFLOW_BACKEND_STORE_URI']], standalone_mode=False)"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mlflow-server",
        help="run MLflow's tracking server with a workspace per project and logins",
        description="Run MLflow's tracking server as fedtune's service needs it (one workspace "
        "per project, basic-auth logins, no permission by default), as the Helm chart does.",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=Path("mlflow-server"),
        help="its folder: the default stores, auth config and admin password "
        "(default ./mlflow-server)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--backend-store-uri",
        help="tracking and auth store, e.g. postgresql://… (MLFLOW_BACKEND_STORE_URI; default "
        "sqlite in --dir)",
    )
    p.add_argument(
        "--artifacts-destination", help="where artifacts are kept (default DIR/artifacts)"
    )
    p.add_argument("--admin-username", default="admin", help="the admin user (default admin)")
    p.add_argument(
        "--cache-seconds",
        type=int,
        default=30,
        help="how long a revoked login or changed role may still be honoured (default 30)",
    )
    p.add_argument(
        "--allowed-hosts",
        help="comma-separated Host headers to accept (default: localhost and private addresses)",
    )
    add_config_option(p, "mlflow")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fedtune.errors import ConfigError
    from fedtune.service.child_env import mlflow_server_env
    from fedtune.service.mlflow_server import MlflowServer

    from .serve import own_url, require_free_port

    apply_config(args)  # what no option gives: the settings file's [mlflow], else the default
    for name, least in (("port", 1), ("workers", 1), ("cache_seconds", 0)):
        if getattr(args, name) < least:
            flag = f"--{name.replace('_', '-')}"
            raise ConfigError(flag, f"must be at least {least}, got {getattr(args, name)}")
    environ = mlflow_server_env()
    server = MlflowServer(
        root=args.dir,
        host=args.host,
        port=args.port,
        workers=args.workers,
        backend_store_uri=args.backend_store_uri or environ.get("MLFLOW_BACKEND_STORE_URI"),
        artifacts_destination=args.artifacts_destination,
        admin_username=args.admin_username,
        cache_seconds=args.cache_seconds,
        allowed_hosts=tuple(h for h in (args.allowed_hosts or "").split(",") if h),
    )
    require_free_port(args.host, args.port, "another MLflow server?")
    mlflow = Path(sys.executable).with_name("mlflow")
    mlflow_bin = str(mlflow) if mlflow.exists() else shutil.which("mlflow")
    if mlflow_bin is None:
        raise ConfigError("mlflow", "the mlflow command is not installed next to fedtune")
    password = server.prepare(environ)
    env = server.env(password, environ)
    upgrade = subprocess.run(
        [sys.executable, "-c", _UPGRADE], env=env, capture_output=True, text=True, check=False
    )
    if upgrade.returncode != 0:
        last = (upgrade.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError("--backend-store-uri", f"mlflow db upgrade failed: {last}")
    url = own_url(args.host, args.port)
    given = "MLFLOW_AUTH_ADMIN_PASSWORD" in environ
    where = "$MLFLOW_AUTH_ADMIN_PASSWORD" if given else f"$(cat {server.password_path})"
    user = (
        ""
        if args.admin_username == "admin"
        else f"FEDTUNE_MLFLOW_ADMIN_USERNAME={args.admin_username} "
    )
    print(
        f"MLflow at {url}, one workspace per project; admin {args.admin_username!r}, "
        f"password in {'MLFLOW_AUTH_ADMIN_PASSWORD' if given else server.password_path}.\n"
        "Start the service against it with:\n"
        f"  MLFLOW_TRACKING_URI={url} FEDTUNE_MLFLOW_WORKSPACES=true \\\n"
        f"  {user}FEDTUNE_MLFLOW_ADMIN_PASSWORD={where} fedtune serve",
        flush=True,
    )
    os.execve(mlflow_bin, server.argv(mlflow_bin), env)
    return 0  # not reached
