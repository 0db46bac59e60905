"""Helpers shared by CLI verbs: YAML loading, ``--set key=value`` overrides, user code options."""

from __future__ import annotations

import argparse
import math
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

from fedtune.errors import ConfigError, as_mapping

__all__ = [
    "EXTRAS",
    "VERB_EXTRAS",
    "add_code_options",
    "add_set_option",
    "apply_sets",
    "count",
    "load_code_options",
    "load_yaml",
    "missing_extra",
    "parse_sets",
    "resolve_code",
]

_ENGINE = ("torch", "numpy", "scipy", "sklearn", "tqdm", "h5py", "matplotlib")

#: what each extra of the distribution adds that a verb imports: a verb of :data:`VERB_EXTRAS`
#: whose modules are not all installed stops at once with one line naming the extra
EXTRAS: dict[str, tuple[str, ...]] = {
    "engine": _ENGINE,
    "tune": (*_ENGINE, "optuna", "ray", "mlflow"),
    "service": (
        *_ENGINE,
        "optuna",
        "ray",
        "mlflow",
        "fastapi",
        "uvicorn",
        "sqlalchemy",
        "alembic",
        "pydantic_settings",
        "flask_wtf",
    ),
}

#: every module an extra installs that fedtune imports (a module missing at run time that is not
#: one of these is the user's own, reported as it is)
_OPTIONAL_MODULES = frozenset(
    {m for modules in EXTRAS.values() for m in modules}
    | {"cmaes", "psycopg", "prometheus_client", "kubernetes", "starlette", "pandas", "pyarrow"}
)

#: the extra each verb needs beyond the light install (httpx, pydantic, pyyaml: the SDK and the
#: service-client verbs, which are absent here); the verb's name is the first word after fedtune
VERB_EXTRAS: dict[str, str] = {
    "tune": "tune",
    "train": "engine",
    "spaces": "engine",
    "tasks": "engine",
    "algorithms": "engine",
    "frontier": "engine",
    "reproduce": "engine",
    "manifest": "service",
    "serve": "service",
    "mlflow-server": "service",
    "worker": "service",
    "db": "service",
    "users": "service",
    "projects": "service",
}


def figure(value: Any) -> str:
    """A value as every output shows it: a float to 4 significant digits (``inf`` for ∞),
    ``-`` for none, anything else as it prints.

    Args:
        value: a number, None or another value.

    Returns:
        The text.
    """
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return "-" if value is None else str(value)


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an ``s`` unless ``n`` is 1 (``1 trial``, ``2 trials``).

    Args:
        n: the count.
        word: the singular.

    Returns:
        The text.
    """
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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
    return dict(as_mapping(data, str(path), what=" at the top level"))


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


def missing_extra(verb: str | None, missing: str | None = None) -> str | None:
    """The one-line error for a verb that cannot run in this install, or None if it can.

    Args:
        verb: the verb (``tune``); a verb of no extra (the service's client) always can.
        missing: a module found missing while the verb ran (``ModuleNotFoundError.name``);
            None: check the verb's extra before running it (``importlib.util.find_spec``, no
            import).

    Returns:
        ``'fedtune tune' needs the tune extra (torch is not installed): pip install
        'fedtune[tune]'``, or None.
    """
    import importlib.util

    extra = VERB_EXTRAS.get(verb or "")
    if extra is None:
        return None
    if missing is None:
        missing = next((m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None), None)
    elif missing.partition(".")[0] not in _OPTIONAL_MODULES:
        return None  # something else is missing (a user module): its own traceback says what
    if missing is None:
        return None
    return (
        f"'fedtune {verb}' needs the {extra} extra ({missing.partition('.')[0]} is not "
        f"installed): pip install 'fedtune[{extra}]'"
    )


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable): override a field of the study file by dotted path."""
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a field by dotted path, e.g. hparams.client_lr=0.05 or budget.trials=8 "
        "(repeatable; the value is read as YAML)",
    )


def apply_sets(data: dict[str, Any], items: list[str] | None) -> dict[str, Any]:
    """``data`` with the ``--set key=value`` overrides of ``items`` applied (a deep copy).

    Args:
        data: the loaded YAML document.
        items: ``["hparams.client_lr=0.1", "budget.trials=8"]`` (None: none).

    Returns:
        A copy with each dotted key set; a key whose parent is not a mapping is a
        ``ConfigError`` naming that key (``task: digits`` is read as ``task: {name: digits}``).
    """
    from fedtune.overrides import apply_overrides

    sets = parse_sets(items)
    return apply_overrides(data, sets) if sets else data


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


def quiet_libraries() -> None:
    """Keep Optuna's and MLflow's INFO lines off a study's terminal."""
    import logging

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # mlflow's first import sets its "mlflow" logger back to INFO, and the tracker may be made
    # (creating its database tables) before that import: quiet the children it logs through too
    for name in ("mlflow", "mlflow.store.db.utils", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
