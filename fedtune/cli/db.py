"""``fedtune db upgrade``: bring the service database to the schema this fedtune needs.

Applies the Alembic migrations shipped in the package (idempotent; on PostgreSQL an advisory
lock serialises concurrent runs) and prints the revision reached. The Helm chart runs it as a
pre-install/pre-upgrade hook Job, and its API pods start with ``FEDTUNE_MIGRATE_ON_START=false``
so they refuse an old schema instead of migrating while another pod still serves.
``fedtune db current`` prints the database's revision and the one this fedtune needs (exit 1 when
they differ). Each finds the database as ``fedtune serve`` does: ``--database-url``, else
``FEDTUNE_DATABASE_URL``, else the settings file's (``--config FILE`` or ``FEDTUNE_CONFIG``).
``fedtune db mlflow-workspaces --mlflow-db URL`` moves the experiments of existing
studies into their projects' MLflow workspaces (``fedtune.service.mlflow_migrate``).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="service database schema (Alembic migrations)")
    verbs = p.add_subparsers(dest="db_verb", metavar="VERB")
    for name, func, text in (
        ("upgrade", _upgrade, "apply the migrations up to this fedtune's revision"),
        ("current", _current, "print the database's revision and the one this fedtune needs"),
    ):
        verb = verbs.add_parser(name, help=text)
        _database_options(verb)
        verb.set_defaults(func=func)
    verb = verbs.add_parser(
        "mlflow-workspaces",
        help="move existing studies' experiments into their projects' MLflow workspaces "
        "(`mlflow db move-resources`; stop MLflow and back its database up first)",
    )
    _database_options(verb)
    verb.add_argument(
        "--mlflow-db", required=True, help="SQLAlchemy URL of MLflow's tracking database"
    )
    verb.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    verb.set_defaults(func=_mlflow_workspaces)


def _database_options(verb: argparse.ArgumentParser) -> None:
    verb.add_argument("--database-url", help="SQLAlchemy URL (FEDTUNE_DATABASE_URL)")
    verb.add_argument(
        "--config",
        metavar="FILE",
        help="the service's settings file: its database (FEDTUNE_CONFIG)",
    )


def _database(args: argparse.Namespace) -> Any:
    from fedtune.service.config_file import config_path, load_config
    from fedtune.service.db import Database
    from fedtune.service.settings import load_settings

    path = config_path(args.config)
    overrides = {"database_url": args.database_url} if args.database_url else {}
    return Database(load_settings(load_config(path) if path else None, **overrides).database_url)


def _upgrade(args: argparse.Namespace) -> int:
    from fedtune.service.migrate import upgrade_database

    db = _database(args)
    try:
        print(f"database at revision {upgrade_database(db)} ({db.dialect})")
    finally:
        db.dispose()
    return 0


def _current(args: argparse.Namespace) -> int:
    from fedtune.service.migrate import current_revision, head_revision

    db = _database(args)
    try:
        current, head = current_revision(db.engine), head_revision()
    finally:
        db.dispose()
    print(f"database {current or 'empty'}, fedtune needs {head}")
    return 0 if current == head else 1


def _mlflow_workspaces(args: argparse.Namespace) -> int:
    from fedtune.service.mlflow_migrate import migrate_experiments

    db = _database(args)
    try:
        with db.session(readonly=True) as session:
            migrate_experiments(session, args.mlflow_db, dry_run=args.dry_run)
    finally:
        db.dispose()
    return 0
