"""A new local MLflow SQLite store starts as a copy of an empty one (start-up).

MLflow creates a SQLite tracking store by running every Alembic migration of its history
(~70 of them: 8–11 s measured on 2 loaded CPUs), once the largest fixed cost of a study after
Ray's start.
The result is always the same empty schema plus the ``Default`` experiment, so it is built once
per MLflow version (by MLflow itself, through ``MlflowClient``) into a cache file

    <cache>/mlflow-<mlflow version>-empty.db      cache = $FEDTUNE_CACHE_DIR,
                                                  else $XDG_CACHE_HOME/fedtune, else ~/.cache/fedtune

and a study's new ``mlflow.db`` is a copy of it (:func:`seed_sqlite_store`), with the
``Default`` experiment's artifact location and times set as MLflow would have set them in this
process (``<cwd>/mlruns/0``, now). MLflow then finds all its tables and verifies the schema
version as for any existing store: a template that does not match the installed MLflow fails
loudly there, never silently. Only a file that does not exist yet is created (``os.link`` of a
complete temporary copy: never a partial file, never over another process's store); when the
cache cannot be written, MLflow creates the store itself as before. ``fedtune mlflow-server``'s
new SQLite store is a copy too when the template exists (a study on this machine made it),
without the ``Default`` experiment: what ``mlflow db upgrade`` makes, which it then runs on it
(:mod:`fedtune.service.mlflow_run`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from .. import env
from ..common.sqlite_commits import sqlite_path

__all__ = ["cache_dir", "seed_sqlite_store", "template_path"]

log = logging.getLogger(__name__)


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where fedtune keeps files it can rebuild (module docstring).

    Args:
        environ: the environment (default: this process's, read by :func:`.env.cache_dir`).

    Returns:
        The directory (not created).
    """
    return env.cache_dir(environ)


def template_path(cache: Path | None = None) -> Path:
    import mlflow

    return (cache or cache_dir()) / f"mlflow-{mlflow.__version__}-empty.db"


def _snapshot(src: Path, dst: Path) -> None:
    """A consistent copy of SQLite database ``src`` at ``dst`` (SQLite's backup API)."""
    with (
        contextlib.closing(sqlite3.connect(src)) as a,
        contextlib.closing(sqlite3.connect(dst)) as b,
    ):
        a.backup(b)


def _build_template(template: Path) -> None:
    """Let MLflow create an empty store, then publish it atomically as ``template``."""
    from mlflow import MlflowClient

    template.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=template.parent, prefix=".build-") as tmp:
        scratch = Path(tmp) / "mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{scratch}").search_experiments(max_results=1)
        ready = Path(tmp) / "template.db"
        _snapshot(scratch, ready)
        os.replace(ready, template)


def seed_sqlite_store(
    uri: str, cache: Path | None = None, *, default_experiment: bool = True
) -> bool:
    """Create the SQLite store of ``uri`` as a copy of the cached empty store; True if it did.

    Does nothing (False) for other URIs, an existing file, or a cache that cannot be written.

    Args:
        uri: the store's URI.
        cache: the template's folder (default: :func:`cache_dir`).
        default_experiment: keep the ``Default`` experiment, as this process's MLflow client
            would have made it; False: none, the store as ``mlflow db upgrade`` leaves it (a
            tracking server then makes it with its own artifact root), and only from a template
            that exists: a tracking server's environment (workspaces on) is not the one to
            build it in (MLflow's client refuses a store without a workspace there).

    Returns:
        Whether it created the store.
    """
    path = sqlite_path(uri)
    if path is None or path.exists():
        return False
    try:
        template = template_path(cache)
        if not template.is_file():
            if not default_experiment:
                return False
            _build_template(template)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.seed")
        _snapshot(template, tmp)
        if default_experiment:
            _as_new(tmp)
        else:
            _without_default(tmp)
        try:
            os.link(tmp, path)  # fails if the store appeared meanwhile: keep that one
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True
    except (OSError, sqlite3.Error) as exc:
        log.info("MLflow store template not used (%s): MLflow creates %s", exc, path)
        return False


def _as_new(db: Path) -> None:
    """The ``Default`` experiment as MLflow would create it here and now."""
    now = int(time.time() * 1000)
    location = os.path.join(os.path.abspath("mlruns"), "0")
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, "
            "last_update_time = ? WHERE experiment_id = 0",
            (location, now, now),
        )


def _without_default(db: Path) -> None:
    """No ``Default`` experiment: the store as ``mlflow db upgrade`` makes it."""
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("DELETE FROM experiments WHERE experiment_id = 0")
