"""The process ``fedtune mlflow-server`` becomes: the store prepared, then MLflow's app served.

``fedtune mlflow-server`` checks its options, writes the server's folder (auth config, admin
password) and ``exec``\\ s ``python -m fedtune.service.mlflow_run`` with the server's
environment (:meth:`.mlflow_server.MlflowServer.env`: nothing else of the caller's) and the
options ``mlflow server`` would get (:meth:`.mlflow_server.MlflowServer.options`). This process
then does, in one interpreter, what three did before (a prepare step, ``mlflow server``, and the
``uvicorn`` process it spawned, each importing MLflow's server: about 3 CPU-s apiece):

1. the variables ``mlflow server`` gives its uvicorn worker (:func:`worker_env`, MLflow 3.17's
   ``mlflow.cli.server`` and ``mlflow.server._run_server``; a test compares them with MLflow's
   own), set before anything imports ``mlflow.server``, which reads them at import;
2. ``mlflow db upgrade`` of the store (the chart's init container), then MLflow's login store
   made (tables, admin) once, before any worker: a failure is one line and exit 2, as before,
   and their output is kept out of the server's log. A new SQLite store starts as a copy of
   the migrated empty store fedtune keeps per MLflow version when a study on this machine made
   it (:mod:`fedtune.tuning.mlflow.sqlite_template`): the upgrade then has nothing to do;
3. the banner, then the stores opened as ``mlflow server`` opens them (exit 1 on an error);
4. ``uvicorn.run`` of fedtune's app (the ``mlflow.app`` entry point ``fedtune``) with MLflow's
   log config: in this process for one worker, else uvicorn's supervisor here and its worker
   processes. No job runner: ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`` as before.

Steps 2–3 run with Python's cyclic garbage collector paused
(``fedtune.tuning.common.start_gc.collected``): they import MLflow's server, some 350,000
objects that all stay alive, and the collector, which starts a pass every 700 new objects and
walks every older object at each full pass, spent 0.75–0.97 CPU-s of a 4.3–5.6 CPU-s start in
844 passes (measured with ``gc.callbacks`` on a loaded 2-CPU machine). MLflow's server is
imported first (:data:`SERVER_MODULES`, :func:`import_server`) and every object then alive
frozen (``gc.freeze``, as fedtune's other processes do at the end of their start:
``start_gc.resume``); one collection at the end then frees what the steps left behind (~6,300
objects in cycles, mostly the upgrade's migration scripts) in 0.01 CPU-s instead of the 0.22–0.35
CPU-s of a full collection that walked the imports' ~530,000 objects as well, which the
collector's passes while uvicorn serves do not walk either, nor the interpreter's three full
collections when the server stops (0.8–0.9 CPU-s of a Ctrl-C before, 0.1 now: a start, one
request and a stop went from 3.0–3.2 to 1.9–2.0 CPU-s of the server's process). What the
imports themselves left in cycles (~3,700 objects) stays frozen with them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence

from fedtune.tuning.common import start_gc

__all__ = [
    "APP",
    "BANNER_VARIABLE",
    "DEFAULT_ARTIFACT_ROOT",
    "SERVER_MODULES",
    "import_server",
    "main",
    "parse_options",
    "prepare_store",
    "security_notice",
    "start",
    "worker_env",
]

#: fedtune's app, as MLflow resolves ``--app-name fedtune`` (pyproject's ``mlflow.app`` entry)
APP = "fedtune.service.mlflow_app:create_app"
#: ``--serve-artifacts`` without ``--default-artifact-root``: MLflow's artifact proxy URI
DEFAULT_ARTIFACT_ROOT = "mlflow-artifacts:/"
#: what the start imports (the upgrade, the login store, the stores, uvicorn): imported, then
#: frozen, before the start's steps (:func:`import_server`)
SERVER_MODULES = (
    "mlflow.db",
    "mlflow.server.auth",
    "mlflow.server.handlers",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "mlflow.tracing.trace_rollup_service",
    "uvicorn",
)
#: the banner ``fedtune mlflow-server`` prints once the store is ready (removed from the
#: environment before MLflow starts)
BANNER_VARIABLE = "_FEDTUNE_MLFLOW_BANNER"


def parse_options(argv: Sequence[str]) -> argparse.Namespace:
    """The ``mlflow server`` options ``fedtune mlflow-server`` passes (``MlflowServer.options``).

    Args:
        argv: the options.

    Returns:
        host, port, workers, artifacts_destination, allowed_hosts, cors_allowed_origins.
    """
    p = argparse.ArgumentParser(prog="python -m fedtune.service.mlflow_run")
    p.add_argument("--enable-workspaces", action="store_true", required=True)
    p.add_argument("--app-name", choices=["fedtune"], required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--serve-artifacts", action="store_true", required=True)
    p.add_argument("--artifacts-destination", required=True)
    p.add_argument("--allowed-hosts")
    p.add_argument("--cors-allowed-origins")
    return p.parse_args(argv)


def worker_env(options: argparse.Namespace, store_uri: str) -> dict[str, str]:
    """What ``mlflow server --enable-workspaces --app-name fedtune --serve-artifacts`` with these
    options puts in its uvicorn worker's environment besides the caller's.

    Args:
        options: :func:`parse_options`' result.
        store_uri: the tracking, registry and auth store (``MLFLOW_BACKEND_STORE_URI``).

    Returns:
        Variable -> value.
    """
    env = {
        "MLFLOW_ENABLE_WORKSPACES": "true",
        "_MLFLOW_SERVER_FILE_STORE": store_uri,
        "_MLFLOW_SERVER_REGISTRY_STORE": store_uri,
        "_MLFLOW_SERVER_ARTIFACT_ROOT": DEFAULT_ARTIFACT_ROOT,
        "_MLFLOW_SERVER_SERVE_ARTIFACTS": "true",
        "_MLFLOW_SERVER_ARTIFACT_DESTINATION": options.artifacts_destination,
        "_MLFLOW_SERVER_BOOT_ID": uuid.uuid4().hex,
        "_MLFLOW_IN_JOB_EXECUTOR": "false",
        "_MLFLOW_SGI_NAME": "uvicorn",
        # the command's defaults: --x-frame-options, --secrets-cache-ttl, --secrets-cache-max-size
        "MLFLOW_SERVER_X_FRAME_OPTIONS": "SAMEORIGIN",
        "MLFLOW_SERVER_SECRETS_CACHE_TTL": "60",
        "MLFLOW_SERVER_SECRETS_CACHE_MAX_SIZE": "1000",
        # what opening the stores sets (``mlflow.set_tracking_uri``, ``set_registry_uri``)
        "MLFLOW_TRACKING_URI": store_uri,
        "MLFLOW_REGISTRY_URI": store_uri,
        # the login store is made here before any worker (as MLflow does for its own
        # basic-auth app): each worker then only opens it
        "_MLFLOW_AUTH_ADMIN_BOOTSTRAPPED": "true",
    }
    if options.allowed_hosts:
        env["MLFLOW_SERVER_ALLOWED_HOSTS"] = options.allowed_hosts
    if options.cors_allowed_origins:
        env["MLFLOW_SERVER_CORS_ALLOWED_ORIGINS"] = options.cors_allowed_origins
    return env


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Standard output and error (the file descriptors: Python's, logging's and C's writes)
    into a scratch file while the block runs, as the separate prepare step's were."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 1)
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def import_server() -> bool:
    """Import MLflow's server (:data:`SERVER_MODULES`, their output kept out of the server's
    log as the steps' is), then freeze every object alive (``gc.freeze``): the collection that
    ends the start then walks only what its steps added (the upgrade's migration scripts), not
    the ~530,000 objects of the imports, and neither do the collector's later passes.

    Returns:
        Whether they were imported and frozen; False when one failed to import (nothing frozen:
        the step that needs it imports it again and says why it failed).
    """
    with _quiet():
        try:
            for name in SERVER_MODULES:
                importlib.import_module(name)
        except Exception:
            return False
    gc.freeze()
    return True


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def prepare_store(store_uri: str) -> str | None:
    """``mlflow db upgrade`` of the store, then its login store (tables, admin) made once.

    Args:
        store_uri: the store.

    Returns:
        None, or the one line that says which step failed and why.
    """
    with _quiet():
        try:
            from fedtune.tuning.mlflow.sqlite_template import seed_sqlite_store

            # a new SQLite store: a copy of what the migrations make (the template a study made)
            seed_sqlite_store(store_uri, default_experiment=False)
            from mlflow.db import upgrade

            upgrade.main([store_uri], standalone_mode=False)
        except Exception as exc:
            return f"mlflow db upgrade failed: {_one_line(exc)}"
        try:
            from mlflow.server.auth import bootstrap_admin_user

            bootstrap_admin_user()
        except Exception as exc:
            return f"its login store failed: {_one_line(exc)}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Prepare the store and serve MLflow (the module docstring), in this process's environment
    (the server's: its store in ``MLFLOW_BACKEND_STORE_URI``).

    Args:
        argv: the ``mlflow server`` options (default: this process's arguments).

    Returns:
        The exit code: 0 once the server stopped, 1 when its stores did not open, 2 when the
        store's upgrade or its login store failed (one line on stderr).
    """
    options = parse_options(sys.argv[1:] if argv is None else argv)
    failed = start(options)
    if failed is not None:
        return failed
    _run_uvicorn(options)
    return 0


def start(options: argparse.Namespace) -> int | None:
    """Steps 1–3 of the module docstring, in this process's environment, with the collector
    paused, MLflow's server imported and frozen first (:func:`import_server`), and one
    collection of what the steps left at the end.

    Args:
        options: :func:`parse_options`' result.

    Returns:
        None once the stores are open, else the exit code: 1 when they did not open, 2 when
        the store's upgrade or its login store failed (one line on stderr).
    """
    banner = os.environ.pop(BANNER_VARIABLE, "")
    store_uri = os.environ["MLFLOW_BACKEND_STORE_URI"]
    os.environ.update(worker_env(options, store_uri))  # before any import of mlflow.server
    with start_gc.collected():
        import_server()
        failed = prepare_store(store_uri)
        if failed is None and banner:
            print(banner, flush=True)
        opened = failed is None and _open_stores(options, store_uri)
    if failed is not None:
        from fedtune.redact import scrub_text

        print(f"fedtune: error: --backend-store-uri: {scrub_text(failed)}", file=sys.stderr)
        return 2
    return None if opened else 1


def security_notice(options: argparse.Namespace) -> str:
    """The line ``mlflow server`` prints about its Host and origin checks.

    Args:
        options: :func:`parse_options`' result.

    Returns:
        The line.
    """
    if not options.allowed_hosts and not options.cors_allowed_origins:
        return (
            "[MLflow] Security middleware enabled with default settings (localhost-only). "
            "To allow connections from other hosts, use --host 0.0.0.0 and configure "
            "--allowed-hosts and --cors-allowed-origins."
        )
    parts = ["[MLflow] Security middleware enabled"]
    for what, value in (
        ("Allowed hosts", options.allowed_hosts),
        ("CORS origins", options.cors_allowed_origins),
    ):
        if value:
            items = value.split(",")
            shown = items[:3] + ([f"and {len(items) - 3} more"] if len(items) > 3 else [])
            parts.append(f"{what}: {', '.join(shown)}")
    return ". ".join(parts) + "."


def _open_stores(options: argparse.Namespace, store_uri: str) -> bool:
    """Open the stores as ``mlflow server`` does (False, logged as it logs it, when they do
    not open), then print its security notice and check the trace rollup's settings."""
    import logging

    from mlflow.server.handlers import initialize_backend_stores
    from mlflow.tracing.trace_rollup_service import validate_sql_trace_rollup_startup

    try:
        initialize_backend_stores(store_uri, store_uri, DEFAULT_ARTIFACT_ROOT)
    except Exception as exc:
        logging.getLogger("mlflow.server").error("Error initializing backend store")
        logging.getLogger("mlflow.server").exception(exc)
        return False
    print(security_notice(options), file=sys.stderr, flush=True)
    validate_sql_trace_rollup_startup(store_uri)
    return True


def _run_uvicorn(options: argparse.Namespace) -> None:
    """Run uvicorn with fedtune's app and MLflow's log config until it is stopped."""
    import uvicorn
    from mlflow.server import _UVICORN_LOG_CONFIG

    uvicorn.run(
        APP,
        factory=True,
        host=options.host,
        port=options.port,
        workers=options.workers,
        log_config=str(_UVICORN_LOG_CONFIG),
    )


if __name__ == "__main__":
    sys.exit(main())
