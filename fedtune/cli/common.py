"""Helpers shared by CLI verbs: YAML loading, ``--set key=value`` overrides, user code options."""

from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

from fedtune.errors import ConfigError

__all__ = [
    "add_code_options",
    "count",
    "load_code_options",
    "load_yaml",
    "parse_sets",
    "resolve_code",
]


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


def count(text: str) -> int:
    """argparse ``type`` for a whole number that may be written in scientific notation.

    ``"1e6"``, ``"1E3"``, ``"2.0"`` and ``"1000"`` are integers; ``"1.5"`` and ``"abc"`` are not.
    Parsed exactly (``Decimal``), so ``"1e20"`` is 10**20, not a rounded float.
    """
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value)


def resolve_code(config: dict[str, Any], base_dir: str | Path) -> dict[str, Any]:
    """``config`` with a relative ``code.path`` made absolute against ``base_dir``."""
    code = config.get("code")
    if isinstance(code, dict) and isinstance(code.get("path"), str):
        path = Path(code["path"])
        if not path.is_absolute():
            config = {**config, "code": {**code, "path": str((Path(base_dir) / path).resolve())}}
    return config


def add_code_options(parser: argparse.ArgumentParser) -> None:
    """``--study FILE`` (its ``code:`` section) or ``--code PATH --module M`` (repeatable)."""
    parser.add_argument("--study", metavar="FILE", help="import the code: section of this study")
    parser.add_argument("--code", metavar="PATH", help="user code directory or wheel to import")
    parser.add_argument(
        "--module", action="append", metavar="M", help="module to import from --code (repeatable)"
    )


def load_code_options(args: argparse.Namespace) -> None:
    """Import the user code named by :func:`add_code_options` (entries get origin ``code``)."""
    from fedtune.trainers.code import load_code

    if args.study:
        data = load_yaml(args.study)
        if data.get("code") is not None:
            try:
                load_code(data["code"], Path(args.study).parent)
            except ConfigError as exc:
                raise exc.with_source(args.study) from None
    if args.code or args.module:
        if not args.module:
            raise ConfigError("--module", "name at least one module to import from --code")
        load_code({"path": args.code, "modules": args.module})
