"""Helpers shared by CLI verbs: YAML loading and ``--set key=value`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fedtune.errors import ConfigError

__all__ = ["load_yaml", "parse_sets"]


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(path), "file not found")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(str(path), f"invalid YAML{where}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "must contain a mapping at the top level")
    return data


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``["hparams.client_lr=0.1", "task.model=cnn"]`` → typed values (YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", f"expected key=value, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(key.strip(), f"cannot parse value {raw!r}") from None
    return out
