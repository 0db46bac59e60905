"""A service is closed by default: ``fedtune serve`` without a token makes one, as Jupyter does.

A service started without ``FEDTUNE_API_TOKEN`` (and without an OIDC issuer) used to accept every
request as an admin, and silently ignore the users' tokens. Now:

* by default it uses an admin token of its own, made once and kept in
  ``<FEDTUNE_WORKDIR>/admin-token`` (mode 0600, the service's user only; the same token after a
  restart), and logs the file's path — never the token, since logs travel further than the
  machine. Generating rather than refusing keeps ``fedtune serve`` working on the first try
  while nothing is open; ``export FEDTUNE_TOKEN=$(cat <path>)`` gives the CLI and the SDK the
  token on the same machine;
* ``fedtune serve --insecure-open`` (``FEDTUNE_INSECURE_OPEN=true``) keeps the open service for
  one person on one machine, and only there: it refuses to start bound to anything but loopback,
  or on a database that holds users (their tokens would mean nothing). Every request's log line,
  ``/readyz`` and ``fedtune whoami`` then say that tokens are not checked — and a token that is
  sent anyway is still checked (``api.auth``).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from fedtune.errors import ConfigError

if TYPE_CHECKING:  # annotations only: ``fedtune mlflow-server``'s secret file needs no pydantic
    from .settings import Settings

__all__ = ["OPEN", "admin_token_path", "auth_mode", "closed_by_default", "read_or_make_secret"]

log = logging.getLogger(__name__)

#: how an open service describes itself (``/readyz``, ``whoami``, each request's log line)
OPEN = "open: tokens are not checked"


def admin_token_path(settings: Settings) -> Path:
    """Where a service started without a token keeps the one it made."""
    return Path(settings.workdir).resolve() / "admin-token"


def auth_mode(settings: Settings) -> str:
    """How the API authenticates: ``token``, ``oidc``, ``token+oidc``, or :data:`OPEN`."""
    modes = [m for m, on in (("token", settings.token), ("oidc", settings.oidc_issuer)) if on]
    return "+".join(modes) or OPEN


def closed_by_default(settings: Settings, host: str) -> Settings:
    """The settings ``fedtune serve`` runs with (see the module docstring).

    Args:
        settings: the service's settings.
        host: the address it binds.

    Returns:
        ``settings``, with the admin token of the workdir when none was configured.

    Raises:
        ConfigError: ``--insecure-open`` on a non-loopback address, or on a database that holds
            users (one line, naming ``FEDTUNE_INSECURE_OPEN``).
    """
    if settings.token or settings.oidc_issuer:
        return settings
    if settings.insecure_open:
        if not _loopback(host):
            raise ConfigError(
                "FEDTUNE_INSECURE_OPEN",
                f"an open service binds loopback only; on {host} anyone who reaches it would be "
                "an admin: drop --insecure-open (the service then makes an admin token)",
            )
        users = _users(settings)
        if users:
            raise ConfigError(
                "FEDTUNE_INSECURE_OPEN",
                f"this service holds {users} user(s) with tokens, which an open service would "
                "not check: drop --insecure-open (the service then makes an admin token)",
            )
        log.warning("%s: every caller is an admin (--insecure-open)", OPEN)
        return settings
    path = admin_token_path(settings)
    token = read_or_make_secret(path, "FEDTUNE_API_TOKEN")
    log.warning(
        "no FEDTUNE_API_TOKEN: every /v1 call needs a token; the admin token is in %s "
        "(export FEDTUNE_TOKEN=$(cat %s))",
        path,
        path,
    )
    from pydantic import SecretStr

    return settings.model_copy(update={"api_token": SecretStr(token)})


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _users(settings: Settings) -> int:
    """How many users hold a token that is not revoked (0 when there are no tables yet)."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from fedtune.errors import FedtuneError

    from .db import Database
    from .models import ApiToken

    db = Database(settings.database_url)
    holders = select(func.count(func.distinct(ApiToken.user_name))).where(
        ApiToken.revoked_at.is_(None)
    )
    try:
        with db.session(readonly=True) as session:
            return int(session.scalar(holders) or 0)
    except (SQLAlchemyError, FedtuneError):
        return 0
    finally:
        db.dispose()


def _new_secret() -> str:
    """32 random bytes, URL-safe, that do not start with ``-``.

    A secret an operator pastes after ``--token`` (``fedtune users create ... --token …``) must
    not read as an option: argparse refuses ``--token -x…`` ("expected one argument"), which
    one secret in 64 of plain ``secrets.token_urlsafe`` would start with.

    Returns:
        The secret (43 characters).
    """
    while (secret := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return secret


def read_or_make_secret(path: Path, field: str) -> str:
    """The secret kept in ``path``, made (random, 0600, atomically) when there is none.

    Args:
        path: the file (its folder is made).
        field: the setting the secret stands for, named in a refusal.

    Returns:
        The secret.

    Raises:
        ConfigError: the file holds no usable secret (shorter than 16 characters).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(_new_secret() + "\n")
    token = path.read_text().strip()
    if len(token) < 16:
        raise ConfigError(field, f"{path} holds no usable secret; delete it")
    return token
