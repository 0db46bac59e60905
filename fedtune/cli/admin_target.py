"""Where ``fedtune users …`` and ``fedtune projects …`` act: the service's database, or its API.

Both stand behind one contract, :class:`Admin`: the SDK's :class:`fedtune.client.Client` over
the API, ``fedtune.service.admin_db.DatabaseAdmin`` on the database (what the API's routes call
too), so a verb prints the same either way. :func:`admin_for` picks one:

1. ``--url`` or ``--token`` given: the API (``--database-url``/``--config`` too: an error);
2. ``--database-url`` or ``--config`` given, or ``FEDTUNE_DATABASE_URL``/``FEDTUNE_CONFIG`` set:
   the database;
3. ``FEDTUNE_URL``/``FEDTUNE_TOKEN`` set (the client's variables,
   :data:`fedtune.client_settings.CLIENT_SETTINGS`): the API;
4. else the database, ``./fedtune.db``.

A SQLite database that does not exist is never made here: the verb says where it looked and how
to point it at the service's, and exits 2 (``fedtune db upgrade`` makes a database).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from fedtune.client_settings import setting
from fedtune.errors import ConfigError

if TYPE_CHECKING:
    from fedtune.service.config_file import ConfigFile
    from fedtune.wire_models import (
        MembershipOut,
        ProjectDetail,
        ProjectOut,
        TokenOut,
        UserOut,
    )

__all__ = ["Admin", "add_target_options", "admin_for", "over_api"]

#: how to point a verb at the service, said when it finds no database
HOW = (
    "point at the service's with --config FILE (or FEDTUNE_CONFIG), --database-url URL (or "
    "FEDTUNE_DATABASE_URL), or use its API with --url URL --token TOKEN"
)


class Admin(Protocol):
    """The administration both ways: the SDK's method names, arguments and answers."""

    def users(self) -> list[UserOut]: ...

    def create_user(
        self,
        name: str,
        project: str | None = None,
        role: str = "member",
        *,
        admin: bool = False,
        expires_in_days: float | None = None,
    ) -> TokenOut: ...

    def new_token(self, user: str, expires_in_days: float | None = None) -> TokenOut: ...

    def revoke(self, user: str, token_id: str | None = None) -> int: ...

    def set_role(self, user: str, project: str, role: str = "member") -> MembershipOut: ...

    def projects(self) -> list[ProjectOut]: ...

    def project(self, name: str) -> ProjectDetail: ...

    def create_project(self, name: str) -> ProjectOut: ...

    def set_quota(self, name: str, **quota: float | int | None) -> ProjectOut: ...


def add_target_options(p: argparse.ArgumentParser) -> None:
    """``--config``, ``--database-url`` (the database) and ``--url``, ``--token`` (the API)."""
    url, token = setting("url"), setting("token")
    p.add_argument("--database-url", help="SQLAlchemy URL (FEDTUNE_DATABASE_URL)")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="the service's settings file: its database (FEDTUNE_CONFIG)",
    )
    p.add_argument(
        url.option,
        help=f"{url.help}: act through its API, not the database ({', '.join(url.env)})",
    )
    p.add_argument(token.option, help=f"an admin's token for --url ({', '.join(token.env)})")


def over_api(args: argparse.Namespace) -> bool:
    """Whether the verb acts through the API (the module's rules 1 to 4)."""
    from fedtune.service.config_file import config_path

    if args.url or args.token:
        return True
    if args.database_url or args.config:
        return False
    if setting("database_url").is_set() or config_path(None):
        return False
    return setting("url").is_set() or setting("token").is_set()


@contextlib.contextmanager
def admin_for(args: argparse.Namespace) -> Iterator[Admin]:
    """The :class:`Admin` the arguments and the environment name.

    Args:
        args: The verb's arguments (:func:`add_target_options`).

    Returns:
        A context manager giving the SDK's client or the database's admin.

    Raises:
        ConfigError: Both the API and a database named, or no database where it looked.
    """
    if (args.url or args.token) and (args.database_url or args.config):
        raise ConfigError(
            "--url", "give --url/--token (the API) or --database-url/--config, not both"
        )
    if over_api(args):
        from fedtune.client import Client

        url = setting("url").resolve(args.url) or ""
        with Client(url, token=setting("token").resolve(args.token) or None) as client:
            yield client
        return
    with _database_admin(args) as admin:
        yield admin


@contextlib.contextmanager
def _database_admin(args: argparse.Namespace) -> Iterator[Admin]:
    from fedtune.service.admin_db import DatabaseAdmin, sqlite_file
    from fedtune.service.config_file import config_path, load_config
    from fedtune.service.db import Database
    from fedtune.service.migrate import require_current_schema
    from fedtune.service.settings import load_settings

    path = config_path(args.config)
    config = load_config(path) if path else None
    overrides = {"database_url": args.database_url} if args.database_url else {}
    settings = load_settings(config, **overrides)
    file = sqlite_file(settings.database_url)
    if file is not None and not file.exists():
        raise ConfigError(_source(args, config), f"no service database at {file}; {HOW}")
    db = Database(settings.database_url)
    try:
        require_current_schema(db)
        yield DatabaseAdmin(db, settings)
    finally:
        db.dispose()


def _source(args: argparse.Namespace, config: ConfigFile | None) -> str:
    """Where the database URL came from, as the error's field."""
    from fedtune.service.config_source import origin

    if args.database_url:
        return "--database-url"
    if setting("database_url").is_set():
        return "FEDTUNE_DATABASE_URL"
    if config is not None:
        return f"{config.path} {origin(config, 'database_url') or '(its default database)'}"
    return "the default database (./fedtune.db in the working directory)"
