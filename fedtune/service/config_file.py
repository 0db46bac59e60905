"""A team's settings file: ``fedtune serve`` and ``fedtune mlflow-server`` read one TOML file.

    fedtune mlflow-server --config team.toml     # or FEDTUNE_CONFIG=/srv/fedtune/team.toml
    fedtune serve --config team.toml
    fedtune users create dave --project vision --config team.toml

``[mlflow]`` holds ``fedtune mlflow-server``'s options (``port``, ``dir``, ``public_url``, …);
``[serve]`` holds ``fedtune serve``'s ``host``, ``port`` and ``log_level`` and every service
setting under its variable's name without ``FEDTUNE_``, in lower case (``database_url``,
``workdir``, ``backend``, ``mlflow_public_url``; ``fedtune.service.settings``). With an
``[mlflow]`` section, ``fedtune serve`` logs to that server: its URL, one workspace per project,
the admin password from ``<dir>/admin-password`` (which the server makes) and the first
``public_url`` for the links it hands out, unless ``[serve]`` names them itself.

Why TOML and not an env file: one file sets two programs, each in its own section, with types
(a port is a number, ``public_url`` a list) and comments, read by Python's own ``tomllib``;
JupyterHub's operators keep a settings file next to the service the same way. An env file is
one flat namespace that would hand both programs every secret. Secrets are named by a file
(``mlflow_admin_password_file``, ``api_token_file``: any secret setting with ``_file``); one
written inline is refused unless the settings file is readable by its owner only.

Rules: relative paths in the file, and the service's relative defaults (``./fedtune.db``,
``./fedtune-work``, ``./mlflow-server``), are relative to the file's folder, so a ``cd`` changes
nothing; a command-line option wins over an environment variable, which wins over the file,
which wins over the default; an unknown section or key is an error naming it and the closest
known one; a bad value names its key.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtune.errors import ConfigError, as_mapping

__all__ = [
    "CONFIG_ENV",
    "MLFLOW_KEYS",
    "SERVE_OPTIONS",
    "ConfigFile",
    "anchor_sqlite",
    "config_path",
    "load_config",
    "own_url",
]

#: the variable naming the settings file when ``--config`` is not given
CONFIG_ENV = "FEDTUNE_CONFIG"
#: ``[serve]`` keys that are ``fedtune serve``'s options, not service settings
SERVE_OPTIONS = ("host", "port", "log_level")
#: settings that fedtune sets in a study driver's environment, never an operator
INTERNAL = frozenset({"driver_sandbox", "sandboxed", "driver_token"})
#: ``fedtune mlflow-server --dir``'s default (a test checks that the two agree)
MLFLOW_DIR = "mlflow-server"
#: the ``[mlflow]`` keys that a variable overrides (``fedtune mlflow-server`` reads it)
MLFLOW_ENV = {"backend_store_uri": "MLFLOW_BACKEND_STORE_URI"}


@dataclass(frozen=True)
class ConfigFile:
    """A loaded settings file.

    Attributes:
        path: The file as given (errors name it so).
        folder: Its folder, absolute: relative paths are relative to it.
        serve: The ``[serve]`` keys with their values, paths made absolute.
        mlflow: The ``[mlflow]`` keys with their values, paths made absolute.
        sections: The sections the file has.
    """

    path: str
    folder: Path
    serve: Mapping[str, Any] = field(default_factory=dict)
    mlflow: Mapping[str, Any] = field(default_factory=dict)
    sections: frozenset[str] = frozenset()

    def error(self, key: str, reason: str) -> ConfigError:
        """A ``ConfigError`` naming ``key`` of this file.

        Args:
            key: ``[section] name``.
            reason: What is wrong.

        Returns:
            The error.
        """
        return ConfigError(key, reason, self.path)

    def options(self, section: str) -> dict[str, Any]:
        """The command's options the file sets, as ``argparse`` holds them.

        Args:
            section: ``serve`` or ``mlflow``.

        Returns:
            Option's dest -> value (``dir`` a path, ``allowed_hosts`` comma-separated).
        """
        if section == "serve":
            return {k: v for k, v in self.serve.items() if k in SERVE_OPTIONS}
        out = dict(self.mlflow)
        if "allowed_hosts" in out:
            out["allowed_hosts"] = ",".join(out["allowed_hosts"])
        return out


def config_path(given: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The settings file in effect.

    Args:
        given: ``--config`` (None: not given).
        environ: The environment (default ``os.environ``).

    Returns:
        ``given``, else ``$FEDTUNE_CONFIG``, else None.
    """
    from fedtune.client_settings import setting

    return setting("config").resolve(given, environ)  # CONFIG_ENV


def load_config(path: str) -> ConfigFile:
    """Read and check a settings file.

    Args:
        path: The file.

    Returns:
        The file's sections, checked, relative paths made absolute.

    Raises:
        ConfigError: The file cannot be read, is not TOML, has an unknown section or key, a
            value of the wrong type, or a secret inline in a file others can read.
    """
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text())
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path} ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("<file>", f"invalid TOML: {exc}", path) from None
    folder = file.resolve().parent
    for name, value in raw.items():
        if name not in ("serve", "mlflow"):
            if isinstance(value, dict):
                reason = f"unknown section{_closest(name, ('serve', 'mlflow'))}"
                raise ConfigError(f"[{name}]", reason, path)
            reason = "a key outside a section: put it under [serve] or [mlflow]"
            raise ConfigError(name, reason, path)
        as_mapping(value, f"[{name}]", path, what=" of keys (a table)")
    serve = _serve_section(raw.get("serve", {}), folder, path, _private(file))
    mlflow = _mlflow_section(raw.get("mlflow", {}), folder, path)
    return ConfigFile(path, folder, serve, mlflow, frozenset(raw))


def _private(file: Path) -> bool:
    """Whether only its owner may read the file."""
    return not file.stat().st_mode & 0o077


def _serve_section(raw: dict[str, Any], folder: Path, path: str, private: bool) -> dict[str, Any]:
    from pydantic import SecretStr

    from .settings import Settings

    fields = {k: v for k, v in Settings.model_fields.items() if k not in INTERNAL}
    secrets = {k for k, v in fields.items() if SecretStr in getattr(v.annotation, "__args__", ())}
    known = [*SERVE_OPTIONS, *fields, *(f"{k}_file" for k in sorted(secrets))]
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"[serve] {key}", f"unknown key{_closest(key, known)}", path)
        inline = key in secrets or (key == "database_url" and _has_password(value))
        if inline and not private:
            raise ConfigError(
                f"[serve] {key}",
                f"a secret in a file others can read: name a file with {key}_file, or "
                f"`chmod 600 {path}`"
                if key in secrets
                else "a password in a file others can read: `chmod 600` the file, or set "
                "FEDTUNE_DATABASE_URL in the service's environment",
                path,
            )
        out[key] = _resolved(key, value, fields.get(key), folder, path)
    _check_options(out, path)
    return out


def _resolved(key: str, value: Any, info: Any, folder: Path, path: str) -> Any:
    """``value`` with a relative path made relative to ``folder`` (paths, files, SQLite)."""
    kind = str(getattr(info, "annotation", ""))
    if key.endswith("_file") or "Path" in kind:
        if isinstance(value, list):
            return [folder / v if isinstance(v, str) else v for v in value]
        if not isinstance(value, str):
            raise ConfigError(f"[serve] {key}", f"must be a path, got {value!r}", path)
        return folder / value
    if isinstance(value, str) and value.startswith("sqlite"):
        return anchor_sqlite(value, folder)
    return value


def _check_options(serve: dict[str, Any], path: str) -> None:
    """``[serve]``'s ``host``, ``port`` and ``log_level`` are what the options accept."""
    checks = {
        "host": (lambda v: isinstance(v, str) and v != "", "must be an address such as 0.0.0.0"),
        "port": (_port, "must be a port number, 1 to 65535"),
        "log_level": (
            lambda v: v in ("debug", "info", "warning", "error"),
            "must be one of debug, info, warning, error",
        ),
    }
    for key, (ok, reason) in checks.items():
        if key in serve and not ok(serve[key]):
            raise ConfigError(f"[serve] {key}", f"{reason}, got {serve[key]!r}", path)


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _port(value: Any) -> bool:
    return _count(value, 1) and value <= 65535


#: ``[mlflow]`` key -> (check, what it must be); every key is an option of ``mlflow-server``
MLFLOW_KEYS: dict[str, tuple[Any, str]] = {
    "host": (lambda v: isinstance(v, str) and v != "", "an address such as 0.0.0.0"),
    "port": (_port, "a port number, 1 to 65535"),
    "workers": (lambda v: _count(v, 1), "a number of processes, at least 1"),
    "dir": (lambda v: isinstance(v, str), "a folder"),
    "backend_store_uri": (lambda v: isinstance(v, str) and "://" in v, "a database URI"),
    "artifacts_destination": (lambda v: isinstance(v, str), "a folder or a URI"),
    "admin_username": (lambda v: isinstance(v, str) and v != "", "a user name"),
    "cache_seconds": (lambda v: _count(v, 0), "a number of seconds, at least 0"),
    "allowed_hosts": (lambda v: _strings(v), "a list of host names"),
    "public_url": (lambda v: _strings(v) and all(map(_http_url, v)), "a list of http(s) URLs"),
}


def _mlflow_section(raw: dict[str, Any], folder: Path, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in MLFLOW_KEYS:
            raise ConfigError(f"[mlflow] {key}", f"unknown key{_closest(key, MLFLOW_KEYS)}", path)
        if key in ("allowed_hosts", "public_url") and isinstance(value, str):
            value = [value]
        ok, what = MLFLOW_KEYS[key]
        if not ok(value):
            raise ConfigError(f"[mlflow] {key}", f"must be {what}, got {value!r}", path)
        if key == "dir" or (key == "artifacts_destination" and "://" not in value):
            value = folder / value
        elif key == "backend_store_uri":
            value = anchor_sqlite(value, folder)
        out[key] = value
    return out


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def _http_url(value: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _has_password(url: Any) -> bool:
    from urllib.parse import urlsplit

    return isinstance(url, str) and urlsplit(url).password is not None


def _closest(key: str, known: Any) -> str:
    """``; did you mean X?`` for the known key closest to ``key`` (or nothing)."""
    candidates = [str(k) for k in known]
    plain = key.lower().removeprefix("fedtune_")  # a variable's name written as the key
    if plain != key and plain in candidates:
        return f"; did you mean {plain}? (a key is its variable's name in lower case, without FEDTUNE_)"
    found = difflib.get_close_matches(plain, candidates, n=1, cutoff=0.6)
    return f"; did you mean {found[0]}?" if found else ""


def anchor_sqlite(url: str, folder: Path) -> str:
    """A SQLite URL with a relative file made relative to ``folder``.

    Args:
        url: An SQLAlchemy URL (``sqlite:///./fedtune.db``); others are returned as they are.
        folder: The folder a relative file is relative to.

    Returns:
        ``sqlite:////abs/fedtune.db`` (query kept); in-memory and absolute ones unchanged.
    """
    scheme, sep, rest = url.partition(":///")
    if not scheme.startswith("sqlite") or not sep or not rest:
        return url
    file, query, params = rest.partition("?")
    if file.startswith(("/", ":memory:", "file:")):
        return url
    return f"{scheme}:///{os.path.normpath(folder / file)}{query}{params}"


def own_url(host: str, port: int) -> str:
    """The URL this machine's processes reach a server at (a wildcard bind: loopback).

    Args:
        host: The address it binds.
        port: Its port.

    Returns:
        ``http://host:port`` (IPv6 in brackets).
    """
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
