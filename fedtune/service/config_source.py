"""What a settings file (:mod:`.config_file`) sets in the service's settings.

``load_settings(config=...)`` (:mod:`.settings`) builds ``Settings`` with the file as a source
below the environment: :func:`loading` makes the file the one that source reads, and
:func:`settings_values` is what it reads: the ``[serve]`` keys, what an ``[mlflow]`` section
implies for the service (the server it logs to), and the service's relative defaults made
relative to the file's folder; :class:`ConfigFileSource` is that source. A secret named by a
file (:class:`SecretFile`) is read only when no option or variable sets it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from fedtune.errors import ConfigError

from .config_file import MLFLOW_DIR, SERVE_OPTIONS, ConfigFile, anchor_sqlite, own_url

__all__ = [
    "LOADING",
    "ConfigFileSource",
    "Loading",
    "SecretFile",
    "loading",
    "origin",
    "settings_values",
]


@dataclass(frozen=True)
class SecretFile:
    """A secret setting named by a file: read only when no option or variable sets it.

    Attributes:
        path: The file (absolute).
        key: Where the file is named, for errors (``[serve] api_token_file``).
        hint: What makes the file, when it is missing.
    """

    path: Path
    key: str
    hint: str = ""

    def read(self, source: str) -> str:
        """The secret: the file's text without surrounding whitespace.

        Args:
            source: The settings file, for errors.

        Returns:
            The secret.

        Raises:
            ConfigError: The file cannot be read or is empty (naming :attr:`key`).
        """
        try:
            text = self.path.read_text().strip()
        except OSError as exc:
            raise ConfigError(
                self.key, f"cannot read {self.path} ({exc.strerror}){self.hint}", source
            ) from None
        if not text:
            raise ConfigError(self.key, f"{self.path} is empty", source)
        return text


#: the service settings an ``[mlflow]`` section implies, and the keys they come from
_DERIVED_FROM = {
    "mlflow_tracking_uri": "[mlflow] host and port",
    "mlflow_workspaces": "[mlflow]",
    "mlflow_admin_password": "[mlflow] dir",
    "mlflow_admin_username": "[mlflow] admin_username",
    "mlflow_public_url": "[mlflow] public_url",
}


def settings_values(config: ConfigFile, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The service settings a file sets, secrets as :class:`SecretFile`.

    Args:
        config: The file.
        fields: ``Settings.model_fields``.

    Returns:
        Setting -> value: the relative defaults made relative to the file's folder, then what
        ``[mlflow]`` implies, then the ``[serve]`` keys (each later one wins).
    """
    values: dict[str, Any] = {}
    for name, info in fields.items():
        default = info.default
        if isinstance(default, Path) and not default.is_absolute():
            values[name] = config.folder / default
        elif isinstance(default, str) and default.startswith("sqlite"):
            values[name] = anchor_sqlite(default, config.folder)
    values.update(_from_mlflow(config))
    for key, value in config.serve.items():
        if key in SERVE_OPTIONS:
            continue
        if key.endswith("_file") and key not in fields:
            values[key.removesuffix("_file")] = SecretFile(value, f"[serve] {key}")
        else:
            values[key] = value
    return values


def origin(config: ConfigFile, name: str) -> str | None:
    """Where a file sets the service setting ``name``.

    Args:
        config: The file.
        name: A field of :class:`~fedtune.service.settings.Settings`.

    Returns:
        ``[serve] name``, ``[serve] name_file``, the ``[mlflow]`` keys it is made from, or None.
    """
    for key in (name, f"{name}_file"):
        if key in config.serve:
            return f"[serve] {key}"
    return _DERIVED_FROM.get(name) if "mlflow" in config.sections else None


def _from_mlflow(config: ConfigFile) -> dict[str, Any]:
    """What an ``[mlflow]`` section tells ``fedtune serve``: the server it logs to."""
    if "mlflow" not in config.sections:
        return {}
    from .mlflow_server import MlflowServer

    m = config.mlflow
    server = MlflowServer(root=Path(m.get("dir") or config.folder / MLFLOW_DIR))
    values: dict[str, Any] = {
        "mlflow_tracking_uri": own_url(m.get("host") or server.host, m.get("port") or server.port),
        "mlflow_workspaces": True,
        "mlflow_admin_password": SecretFile(
            server.password_path,
            "[mlflow] dir",
            f": start `fedtune mlflow-server --config {config.path}` first (it makes it), or "
            "name the password with [serve] mlflow_admin_password_file",
        ),
    }
    if m.get("admin_username"):
        values["mlflow_admin_username"] = m["admin_username"]
    if m.get("public_url"):
        values["mlflow_public_url"] = m["public_url"][0]
    return values


@dataclass
class Loading:
    """The settings file being loaded into ``Settings``, and the settings it gave.

    Attributes:
        config: The file.
        supplied: The settings whose value came from it.
    """

    config: ConfigFile
    supplied: set[str] = field(default_factory=set)


#: read by the settings' file source while ``load_settings(config=...)`` builds them
LOADING: contextvars.ContextVar[Loading | None] = contextvars.ContextVar(
    "fedtune_config", default=None
)


@contextlib.contextmanager
def loading(config: ConfigFile | None) -> Iterator[Loading | None]:
    """Make ``config`` the file the settings read, for the ``with`` block.

    Args:
        config: The file (None: none).

    Returns:
        A context manager giving the :class:`Loading` record (None without a file).
    """
    record = Loading(config) if config is not None else None
    token = LOADING.set(record)
    try:
        yield record
    finally:
        LOADING.reset(token)


class ConfigFileSource(PydanticBaseSettingsSource):
    """The settings file being loaded (:data:`LOADING`), below the options and
    the environment: it gives only the settings they leave unset, and reads a secret's file only
    then."""

    def __init__(self, settings_cls: type[BaseSettings], *above: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self.above = above

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ gives every value at once

    def __call__(self) -> dict[str, Any]:
        record = LOADING.get()
        if record is None:
            return {}
        fields = self.settings_cls.model_fields
        names = {_env_key(name, info): name for name, info in fields.items()}
        taken = {names.get(key.lower(), key) for source in self.above for key in source()}
        values = {}
        for name, value in settings_values(record.config, fields).items():
            if name not in taken:
                values[name] = (
                    value.read(record.config.path) if isinstance(value, SecretFile) else value
                )
        record.supplied.update(values)
        return values


def _env_key(name: str, info: Any) -> str:
    """The key a source gives a field's value under, lower case: its alias, else its name."""
    alias = info.validation_alias
    return str(getattr(alias, "choices", [alias])[0]).lower() if alias is not None else name
