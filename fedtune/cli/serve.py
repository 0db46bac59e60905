"""``fedtune serve``: run the service (API + scheduler) with uvicorn.

Embedded defaults: SQLite ``./fedtune.db``, backend ``local`` (drivers are child processes with
embedded Ray that report to this server with a credential of their study's, not to its
database), and, without ``FEDTUNE_API_TOKEN``, an admin token kept in
``<workdir>/admin-token`` (``fedtune.service.admin_token``; ``--insecure-open`` for an open
service on loopback). Every option overrides its ``FEDTUNE_*`` variable, which overrides a
settings file's ``[serve]`` and ``[mlflow]`` sections (``--config FILE`` or ``FEDTUNE_CONFIG``:
``fedtune.service.config_file``); the rest comes from the environment
(``fedtune.service.settings``). On a database whose projects have MLflow workspaces it refuses
to start without an MLflow server (``fedtune.service.mlflow_records``). One process: the
scheduler runs inside it. Its start, to the end of the app's lifespan start, runs with Python's
cyclic garbage collector paused (``fedtune.tuning.common.start_gc``).
"""

from __future__ import annotations

import argparse
import logging

from fedtune.service.config_file import own_url

from .config_option import add_config_option, apply_config

__all__ = ["own_url", "register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the tuning service (REST API + scheduler)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--database-url", help="SQLAlchemy URL (FEDTUNE_DATABASE_URL)")
    p.add_argument(
        "--backend",
        choices=["local", "ray", "kubernetes", "none"],
        help="where study drivers run: local (children of this process; trials in them or on an embedded Ray), ray "
        "(jobs on RAY_ADDRESS), kubernetes (a KubeRay RayJob per study), none (accept only) "
        "(FEDTUNE_BACKEND, default local)",
    )
    p.add_argument("--workdir", help="studies' working directory (FEDTUNE_WORKDIR)")
    p.add_argument(
        "--max-concurrent-studies",
        type=int,
        help="studies whose drivers run at once; the others wait, queued "
        "(FEDTUNE_MAX_CONCURRENT_STUDIES, default 2)",
    )
    p.add_argument(
        "--insecure-open",
        action="store_true",
        help="without FEDTUNE_API_TOKEN, accept every request as an admin instead of making an "
        "admin token (loopback only, no users; FEDTUNE_INSECURE_OPEN)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info)",
    )
    add_config_option(p, "serve")
    p.set_defaults(func=run, start_gc=True)  # paused until the app's lifespan has started


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from fedtune.service.admin_token import closed_by_default
    from fedtune.service.api import create_app
    from fedtune.service.mlflow_records import require_mlflow_for_workspaces
    from fedtune.service.settings import load_settings

    config = apply_config(args)
    overrides = {
        "database_url": args.database_url,
        "backend": args.backend,
        "workdir": args.workdir,
        "max_concurrent_studies": args.max_concurrent_studies,
        "insecure_open": True if args.insecure_open else None,
    }
    settings = load_settings(config, **{k: v for k, v in overrides.items() if v is not None})
    require_free_port(args.host, args.port)  # before the database, the scheduler's lock
    if settings.backend == "local" and settings.driver_url is None:
        # local drivers report to this server, not to its database (service.driver_link)
        settings = settings.model_copy(update={"driver_url": own_url(args.host, args.port)})
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if config is not None:
        logging.getLogger(__name__).info("settings file %s", config.path)
    if not settings.migrate_on_start:  # fail here with one line, not in uvicorn's lifespan
        from fedtune.service.db import Database
        from fedtune.service.migrate import require_current_schema

        db = Database(settings.database_url)
        try:
            require_current_schema(db)
        finally:
            db.dispose()
    require_mlflow_for_workspaces(settings)  # MLflow links and logins stay what they were
    settings = closed_by_default(settings, args.host)  # an admin token, unless told otherwise
    app = create_app(settings)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, workers=1)
    return 0


def require_free_port(host: str, port: int, who: str = "another fedtune serve?") -> None:
    """Refuse, in one line, an address another process listens on.

    uvicorn would find it only after the application started (the database opened, the
    scheduler's lock taken), and then print its own traceback-like lines and exit 3.

    Args:
        host: the bind address.
        port: the port.
        who: a guess at who listens there, for the message.

    Raises:
        ConfigError: the address is in use (or cannot be bound here).
    """
    import socket

    from fedtune.errors import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            why = "is in use" if exc.errno == 98 else f"cannot be bound ({exc.strerror})"
            raise ConfigError(
                "--port",
                f"{host}:{port} {why}: another process ({who}) listens there; "
                "stop it, or pick another port with --port",
            ) from None
