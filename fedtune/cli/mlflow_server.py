"""``fedtune mlflow-server``: MLflow's tracking server with a workspace per project and logins.

The server a team's ``fedtune serve`` logs to (``FEDTUNE_MLFLOW_WORKSPACES``), run as the Helm
chart runs it (``fedtune.service.mlflow_server``): ``mlflow db upgrade``, then what ``mlflow server
--enable-workspaces --app-name fedtune`` runs, with basic auth, no permission by default, and an
admin password from ``MLFLOW_AUTH_ADMIN_PASSWORD`` or made once in ``<dir>/admin-password``. It
writes the server's folder, then becomes the server (``exec``: :mod:`fedtune.service.mlflow_run`,
one process that upgrades the store, prints how to start the service against it and serves;
Ctrl-C stops it).

MLflow refuses a ``Host`` header or a browser origin it was not given (its guards against DNS
rebinding and cross-site requests); ``--public-url`` names the address the members' browsers
open, which it then accepts besides loopback (:mod:`fedtune.service.mlflow_access`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .config_option import add_config_option, apply_config

if TYPE_CHECKING:
    from fedtune.service.mlflow_access import PublicUrl
    from fedtune.service.mlflow_server import MlflowServer

__all__ = ["banner", "make_server", "public_urls", "register"]


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
        "--public-url",
        action="append",
        default=[],
        metavar="URL",
        help="a URL the members' browsers open MLflow at, e.g. http://box.lan:5000 or "
        "https://mlflow.example.com (repeat it or give a comma-separated list): MLflow accepts "
        "its host:port and its origin for the UI's requests, besides loopback; the first is the "
        "service's FEDTUNE_MLFLOW_PUBLIC_URL",
    )
    p.add_argument(
        "--allowed-hosts",
        metavar="HOST:PORT,...",
        help="comma-separated extra Host headers to accept, each as browsers send it, with its "
        "port (box.lan:5000; a bare name matches ports 80 and 443 only; MLflow's * patterns "
        "work), added to loopback, private addresses and --public-url's; "
        "MLFLOW_SERVER_ALLOWED_HOSTS and MLFLOW_SERVER_CORS_ALLOWED_ORIGINS add to them too",
    )
    add_config_option(p, "mlflow")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fedtune.errors import ConfigError
    from fedtune.service.child_env import mlflow_server_env
    from fedtune.service.mlflow_run import BANNER_VARIABLE

    from .serve import require_free_port

    apply_config(args)  # what no option gives: the settings file's [mlflow], else the default
    for name, least in (("port", 1), ("workers", 1), ("cache_seconds", 0)):
        if getattr(args, name) < least:
            flag = f"--{name.replace('_', '-')}"
            raise ConfigError(flag, f"must be at least {least}, got {getattr(args, name)}")
    environ = mlflow_server_env()
    server = make_server(args, environ)
    require_free_port(args.host, args.port, "another MLflow server?")
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError("mlflow", "MLflow is not installed next to fedtune")
    password = server.prepare(environ)
    env = server.env(password, environ)
    env[BANNER_VARIABLE] = banner(server, given="MLFLOW_AUTH_ADMIN_PASSWORD" in environ)
    # -P: the working directory is not put on sys.path (an mlflow.py there is not imported)
    python = [sys.executable, "-P", "-m", "fedtune.service.mlflow_run"]
    os.execve(sys.executable, [*python, *server.options()], env)
    return 0  # not reached


def make_server(args: argparse.Namespace, environ: Mapping[str, str]) -> MlflowServer:
    """The server the options describe.

    Args:
        args: the parsed options.
        environ: the caller's environment: ``MLFLOW_BACKEND_STORE_URI``, and
            ``MLFLOW_SERVER_ALLOWED_HOSTS`` and ``MLFLOW_SERVER_CORS_ALLOWED_ORIGINS``, which
            add to the Host headers and origins MLflow accepts.

    Returns:
        The server.

    Raises:
        ConfigError: a bad ``--public-url`` or ``--host``.
    """
    from fedtune.errors import ConfigError
    from fedtune.service.mlflow_access import bind_url
    from fedtune.service.mlflow_server import MlflowServer

    try:
        bind_url(args.host, args.port)  # the bind address, served to browsers unless loopback
    except ValueError as exc:
        raise ConfigError("--host", str(exc)) from None
    return MlflowServer(
        root=args.dir,
        host=args.host,
        port=args.port,
        workers=args.workers,
        backend_store_uri=args.backend_store_uri or environ.get("MLFLOW_BACKEND_STORE_URI"),
        artifacts_destination=args.artifacts_destination,
        admin_username=args.admin_username,
        cache_seconds=args.cache_seconds,
        allowed_hosts=(
            *_items(args.allowed_hosts),
            *_items(environ.get("MLFLOW_SERVER_ALLOWED_HOSTS")),
        ),
        public_urls=public_urls(args.public_url),
        cors_allowed_origins=_items(environ.get("MLFLOW_SERVER_CORS_ALLOWED_ORIGINS")),
    )


def public_urls(values: list[str]) -> tuple[PublicUrl, ...]:
    """``--public-url``'s values (each one URL or a comma-separated list), parsed.

    Args:
        values: the option's values.

    Returns:
        The URLs, each once, in the order given.

    Raises:
        ConfigError: one is not an http(s) URL of a server's root.
    """
    from fedtune.errors import ConfigError
    from fedtune.service.mlflow_access import parse_public_url

    try:
        parsed = [parse_public_url(item) for value in values for item in _items(value)]
    except ValueError as exc:
        raise ConfigError("--public-url", str(exc)) from None
    return tuple(dict.fromkeys(parsed))


def banner(server: MlflowServer, *, given: bool) -> str:
    """What the command prints before it becomes the server: the addresses MLflow serves and
    how to start ``fedtune serve`` against it.

    Args:
        server: the server.
        given: the admin password came from ``MLFLOW_AUTH_ADMIN_PASSWORD``.

    Returns:
        The text (several lines).
    """
    from .serve import own_url

    local = own_url(server.host, server.port)
    served = [url.url for url in server.served]
    wildcard = server.host in ("0.0.0.0", "::", "")
    if local in served:
        at = ", ".join(served)
    elif served:
        at = f"{', '.join(served)} and {local} (this machine)"
    elif wildcard:
        at = f"{local} (this machine; other machines' browsers need --public-url)"
    else:
        at = local
    where = "$MLFLOW_AUTH_ADMIN_PASSWORD" if given else f"$(cat {server.password_path})"
    user = server.admin_username
    login = "" if user == "admin" else f"FEDTUNE_MLFLOW_ADMIN_USERNAME={user} "
    links = (
        f"  FEDTUNE_MLFLOW_PUBLIC_URL={server.public_urls[0].url} \\\n"
        if server.public_urls
        else ""
    )
    return (
        f"MLflow at {at}, one workspace per project; admin {user!r}, "
        f"password in {'MLFLOW_AUTH_ADMIN_PASSWORD' if given else server.password_path}.\n"
        "Start the service against it with:\n"
        f"  MLFLOW_TRACKING_URI={local} FEDTUNE_MLFLOW_WORKSPACES=true \\\n"
        f"{links}"
        f"  {login}FEDTUNE_MLFLOW_ADMIN_PASSWORD={where} fedtune serve"
    )


def _items(value: str | None) -> tuple[str, ...]:
    """A comma-separated list's non-empty items."""
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())
