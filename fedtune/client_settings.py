"""The settings of a client of the service, in one table: the CLI's options and the docs read it.

Each :class:`ClientSetting` is one ``--option`` of the service-client verbs (``fedtune submit``,
``status``, ...), the environment variables it falls back to, in order, and its default. The
SDK (:class:`fedtune.Client`) takes the same values as arguments and reads no environment.

:func:`check_url` and :func:`check_token` refuse a bad value when a client is made, before any
request, in one line naming the setting it came from (:class:`SettingNames`): a URL without a
scheme or ending in ``/v1``, a token with whitespace, a non-ASCII or a control character
(``FEDTUNE_TOKEN: has a trailing space; paste the token alone``). A token's characters are never
echoed, only what kind of character is wrong and where.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from fedtune.errors import ConfigError
from fedtune.redact import bare_uri

__all__ = [
    "ADMIN_SETTINGS",
    "CLIENT_SETTINGS",
    "ClientSetting",
    "SettingNames",
    "check_token",
    "check_url",
    "setting",
    "shown",
]


@dataclass(frozen=True)
class ClientSetting:
    """One client setting: its option, environment variables, default and meaning.

    Args:
        name: the option's name without dashes (``url`` is ``--url``).
        env: the environment variables read when the option is not given, first set wins.
        default: the value when neither the option nor a variable is set (None: unset).
        help: one line on what it is.
        secret: True when the value must not be printed (a token).
    """

    name: str
    env: tuple[str, ...]
    default: str | None
    help: str
    secret: bool = False

    @property
    def option(self) -> str:
        """The command-line option, e.g. ``--url``."""
        return f"--{self.name.replace('_', '-')}"

    def resolve(self, given: str | None, environ: Mapping[str, str] | None = None) -> str | None:
        """The value in effect.

        Args:
            given: the option's value on the command line (None: not given).
            environ: the environment (default ``os.environ``).

        Returns:
            ``given``, else the first non-empty variable of :attr:`env`, else :attr:`default`.
        """
        if given:
            return given
        environ = os.environ if environ is None else environ
        for variable in self.env:
            if environ.get(variable):
                return environ[variable]
        return self.default

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether one of :attr:`env` is set (not empty).

        Args:
            environ: the environment (default ``os.environ``).

        Returns:
            True when a variable gives the value.
        """
        environ = os.environ if environ is None else environ
        return any(environ.get(variable) for variable in self.env)

    def source(self, given: bool, environ: Mapping[str, str] | None = None) -> str:
        """Where the value in effect comes from, as messages name it.

        Args:
            given: whether the option was on the command line.
            environ: the environment (default ``os.environ``).

        Returns:
            The option (``--token``), else the first variable of :attr:`env` that is set, else
            the first one (the one to set: ``FEDTUNE_URL``).
        """
        if given:
            return self.option
        environ = os.environ if environ is None else environ
        return next((v for v in self.env if environ.get(v)), self.env[0])

    def describe(self) -> str:
        """The help text with where the value comes from, e.g. ``(default: $FEDTUNE_URL, else
        http://127.0.0.1:8000)``.

        Returns:
            The one-line text the CLI's ``--help`` shows for this option.
        """
        sources = [f"${v}" for v in self.env]
        fallback = self.default if self.default is not None else "none"
        return f"{self.help} (default: {', else '.join([*sources, fallback])})"


#: every client setting, in the order ``--help`` shows them
CLIENT_SETTINGS: tuple[ClientSetting, ...] = (
    ClientSetting("url", ("FEDTUNE_URL",), "http://127.0.0.1:8000", "the service's base URL"),
    ClientSetting(
        "token",
        ("FEDTUNE_TOKEN", "FEDTUNE_API_TOKEN"),
        None,
        "bearer token: a user's API token (or the service's own FEDTUNE_API_TOKEN)",
        secret=True,
    ),
    ClientSetting(
        "project",
        ("FEDTUNE_PROJECT",),
        None,
        "project to submit to, or to list the studies of; --project overrides a study file's "
        "project:, $FEDTUNE_PROJECT does not; unset: the service picks your only project",
    ),
)


#: where the administration verbs (``fedtune users``/``projects``) find the service when no
#: ``--url`` is given: its settings file or its database (``fedtune.cli.admin_target``)
ADMIN_SETTINGS: tuple[ClientSetting, ...] = (
    ClientSetting("config", ("FEDTUNE_CONFIG",), None, "the service's settings file (TOML)"),
    ClientSetting("database_url", ("FEDTUNE_DATABASE_URL",), None, "the service's database"),
)


def setting(name: str) -> ClientSetting:
    """The client setting called ``name``.

    Args:
        name: ``url``, ``token`` or ``project``; ``config`` or ``database_url``.

    Returns:
        Its entry of :data:`CLIENT_SETTINGS` or :data:`ADMIN_SETTINGS`.
    """
    for entry in (*CLIENT_SETTINGS, *ADMIN_SETTINGS):
        if entry.name == name:
            return entry
    raise KeyError(name)


# ---------------------------------------------------------------------- checks of the values

_SPACES = {
    " ": "space",
    "\t": "tab",
    "\n": "line break",
    "\r": "carriage return",
    "\u00a0": "non-breaking space",
}


@dataclass(frozen=True)
class SettingNames:
    """What messages call the client's URL and token: where the values came from.

    Args:
        url: the URL's setting (the SDK: ``url``; the CLI: ``FEDTUNE_URL`` or ``--url``).
        token: the token's setting (the SDK: ``token``; the CLI: ``FEDTUNE_TOKEN``, ...).
    """

    url: str = "url"
    token: str = "token"


def shown(url: str) -> str:
    """``url`` as a message may show it: no user, password, query or fragment.

    Args:
        url: a URL.

    Returns:
        ``scheme://host[:port]/path``.
    """
    return bare_uri(url) or "<a URL that cannot be parsed>"


def _kind(ch: str) -> str:
    """Name a character without showing a token's own characters (only a wrong one)."""
    if ch in _SPACES:
        return f"a {_SPACES[ch]}"
    if ch.isspace():
        return f"a space character (U+{ord(ch):04X})"
    if not ch.isascii():
        name = unicodedata.name(ch, "").lower()
        return f"a non-ASCII character (U+{ord(ch):04X}{f', {name}' if name else ''})"
    return f"a control character (U+{ord(ch):04X})"


def check_token(token: str, field: str) -> None:
    """Refuse a token that cannot go into an ``Authorization`` header, naming the setting.

    Args:
        token: the bearer token.
        field: its setting, e.g. ``FEDTUNE_TOKEN``.

    Raises:
        ConfigError: whitespace, a non-ASCII or a control character, or a ``Bearer `` prefix;
            the message says which and where, never the token.
    """
    words = token.split()
    if len(words) > 1 and words[0].lower() == "bearer":
        raise ConfigError(field, "starts with 'Bearer '; give the token alone (it is added)")
    for where, ch in (("trailing", token[-1:]), ("leading", token[:1])):
        if ch and (ch.isspace() or not ch.isprintable()):
            kind = _kind(ch).replace("a ", f"a {where} ", 1)
            raise ConfigError(field, f"has {kind}; paste the token alone")
    for i, ch in enumerate(token, 1):
        if ch.isspace() or not ch.isascii() or not ch.isprintable():
            raise ConfigError(
                field,
                f"contains {_kind(ch)} at character {i} of {len(token)}; a token is printable "
                "ASCII only (was it copied from a formatted page?)",
            )


def check_url(url: str, field: str) -> str:
    """Check the service's base URL and give it without a trailing slash.

    Args:
        url: the URL, e.g. ``http://box:8000``.
        field: its setting, e.g. ``FEDTUNE_URL``.

    Returns:
        The URL, without a trailing ``/``.

    Raises:
        ConfigError: whitespace, no ``http://`` or ``https://`` scheme, no host, or a path
            ending in ``/v1`` (the client adds it).
    """
    if url != url.strip() or any(ch.isspace() for ch in url):
        raise ConfigError(field, f"{shown(url.strip())} has whitespace in it; give the URL alone")
    if "://" not in url:
        guess = shown(f"http://{url}")
        raise ConfigError(field, f"{guess.removeprefix('http://')} has no scheme; use {guess}")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ConfigError(field, f"{shown(url)} is not a URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ConfigError(field, f"{shown(url)}: the scheme must be http:// or https://")
    if not host:
        raise ConfigError(field, f"{shown(url)} names no host")
    if parts.path.rstrip("/").endswith("/v1"):
        root = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/")[:-3], "", ""))
        raise ConfigError(
            field,
            f"{shown(url)} should be the service's root, without /v1 (the client adds it): "
            f"use {shown(root)}",
        )
    import httpx  # here: the CLI's --help reads this module's table without it

    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigError(field, f"{shown(url)} is not a URL ({exc})") from None
    return url.rstrip("/")
