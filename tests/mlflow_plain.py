"""``mlflow server`` in one process: the tests' plain MLflow servers (``mlflow_server_process``).

``mlflow server --backend-store-uri URI --host H --port P --workers N [--serve-artifacts
--artifacts-destination D]`` is two processes that each import MLflow's server (2.4-3.9 and
3.0-9.7 CPU-s apiece in a CI-form run's census): the command opens the stores, then starts
``python -m uvicorn mlflow.server.fastapi_app:app`` with the variables it computed and waits.
``python -m tests.mlflow_plain`` with the same options does the same in one interpreter, as
``fedtune.service.mlflow_run`` does for ``fedtune mlflow-server``:

1. the variables MLflow's command gives its uvicorn worker (:func:`worker_env`;
   ``tests/integration/test_mlflow_plain.py`` compares them with MLflow's own), set before
   anything imports ``mlflow.server``, which reads them at import (its security middleware);
2. the stores opened as the command opens them (a new SQLite store first a copy of fedtune's
   migrated empty store when one exists: ``fedtune.tuning.mlflow.sqlite_template``, without
   the ``Default`` experiment, which the server then makes as on a new store), its security
   notice, the trace rollup's check;
3. ``uvicorn.run`` of the same app with MLflow's log config, address and workers.

Steps 1-2 run with Python's cyclic collector paused; what they import (:data:`SERVER_MODULES`)
is frozen first (``gc.freeze``), and one collection at the end walks only what opening the
stores left, as in ``mlflow_run``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from fedtune.service import mlflow_run

#: the app ``mlflow server`` serves with uvicorn (no ``--app-name``)
APP = "mlflow.server.fastapi_app:app"
#: what the process imports before it freezes them: the stores' modules, uvicorn, and the app
#: itself (last: imported here for one worker only; more are processes uvicorn starts)
SERVER_MODULES = (
    "mlflow.server.handlers",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "mlflow.tracing.trace_rollup_service",
    "uvicorn",
    "mlflow.server.fastapi_app",
)
#: ``--serve-artifacts`` (on by default) without ``--default-artifact-root``
DEFAULT_ARTIFACT_ROOT = mlflow_run.DEFAULT_ARTIFACT_ROOT
#: ``--artifacts-destination``'s default
DEFAULT_ARTIFACTS_DESTINATION = "./mlartifacts"
#: what ``mlflow server`` prints about its Host and origin checks (no --allowed-hosts, no
#: --cors-allowed-origins)
SECURITY_NOTICE = mlflow_run.security_notice(
    argparse.Namespace(allowed_hosts=None, cors_allowed_origins=None)
)


def parse_options(argv: Sequence[str]) -> argparse.Namespace:
    """The ``mlflow server`` options the tests pass.

    Args:
        argv: the options.

    Returns:
        backend_store_uri, host, port, workers, artifacts_destination.
    """
    p = argparse.ArgumentParser(prog="python -m tests.mlflow_plain")
    p.add_argument("--backend-store-uri", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--serve-artifacts", action="store_true")
    p.add_argument("--artifacts-destination", default=DEFAULT_ARTIFACTS_DESTINATION)
    # neither Host nor origin list: what ``mlflow_run.worker_env`` reads of them
    p.set_defaults(allowed_hosts=None, cors_allowed_origins=None)
    return p.parse_args(argv)


def worker_env(options: argparse.Namespace) -> dict[str, str]:
    """What ``mlflow server`` with these options puts in its uvicorn worker's environment
    besides the caller's (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: no job runner).

    Args:
        options: :func:`parse_options`' result.

    Returns:
        Variable -> value.
    """
    # fedtune's server's worker (``mlflow_run.worker_env``) without its workspaces and
    # login store: ``mlflow server`` with neither ``--enable-workspaces`` nor an auth app
    env = mlflow_run.worker_env(options, options.backend_store_uri)
    env["MLFLOW_ENABLE_WORKSPACES"] = "false"
    del env["_MLFLOW_AUTH_ADMIN_BOOTSTRAPPED"]
    return env


def open_stores(store: str) -> None:
    """Step 2 of the module docstring (an error propagates: the server exits, as MLflow's
    command does when its stores do not open).

    Args:
        store: the tracking and registry store.
    """
    from mlflow.server.handlers import initialize_backend_stores
    from mlflow.tracing.trace_rollup_service import validate_sql_trace_rollup_startup

    from fedtune.tuning.mlflow.sqlite_template import seed_sqlite_store

    seed_sqlite_store(store, default_experiment=False)
    initialize_backend_stores(store, store, DEFAULT_ARTIFACT_ROOT)
    print(SECURITY_NOTICE, file=sys.stderr, flush=True)
    validate_sql_trace_rollup_startup(store)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve MLflow as ``mlflow server`` with these options would (the module docstring).

    Args:
        argv: the options (default: this process's arguments).

    Returns:
        0 once the server stopped.
    """
    options = parse_options(sys.argv[1:] if argv is None else argv)
    os.environ.update(worker_env(options))  # before any import of mlflow.server
    gc.disable()
    try:
        for name in SERVER_MODULES[: None if options.workers == 1 else -1]:
            importlib.import_module(name)
        gc.freeze()  # the collection below walks only what opening the stores left
        open_stores(options.backend_store_uri)
        gc.collect()
    finally:
        gc.enable()
    import uvicorn
    from mlflow.server import _UVICORN_LOG_CONFIG

    uvicorn.run(
        APP,
        host=options.host,
        port=options.port,
        workers=options.workers,
        log_config=str(_UVICORN_LOG_CONFIG),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
