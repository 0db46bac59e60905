"""The settings of a client of the service, in one table: the CLI's options and the docs read it.

Each :class:`ClientSetting` is one ``--option`` of the service-client verbs (``fedtune submit``,
``status``, ...), the environment variables it falls back to, in order, and its default. The
SDK (:class:`fedtune.Client`) takes the same values as arguments and reads no environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CLIENT_SETTINGS", "ClientSetting", "setting"]


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


def setting(name: str) -> ClientSetting:
    """The client setting called ``name``.

    Args:
        name: ``url``, ``token`` or ``project``.

    Returns:
        Its entry of :data:`CLIENT_SETTINGS`.
    """
    for entry in CLIENT_SETTINGS:
        if entry.name == name:
            return entry
    raise KeyError(name)
