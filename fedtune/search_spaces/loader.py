"""Load, validate and merge declarative search spaces (YAML files or plain mappings).

A space file::

    description: FedAvg with server momentum β
    algorithms: [fedavgm]          # algorithms this space is the default for
    extends: fedavg                # optional: shipped name(s) or file(s) merged underneath
    parameters:
      client_lr: {type: float, low: 1.0e-3, high: 10.0, log: true, grid: half-decade}
      server_momentum: {type: float, low: 0.0, high: 0.99, when: 'server_opt == "momentum"'}
      patience: {tie: window}      # the paper's W = P = C heuristic

Entries are keyed by parameter name (short name or config path, see ``resolve_path``). Errors
are :class:`~fedtune.errors.ConfigError` with ``field = parameters.<name>.<key>`` and
``source`` = the file. An override (``merge``) updates single entries field by field, adds new
ones, and removes one when given ``null``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fedtune.errors import ConfigError, as_mapping, combine_errors
from fedtune.suggest import closest, did_you_mean, unknown_key
from fedtune.trainers.config import DecayConfig, TrainConfig

from .decl import ParamDecl
from .model import Parameter, SearchSpace, resolve_path
from .params import parse_parameter

__all__ = [
    "SHIPPED_DIR",
    "combine",
    "combine_errors",
    "load_space",
    "merge",
    "parse_space",
    "shipped_spaces",
    "space_for_algorithm",
]

SHIPPED_DIR = Path(__file__).resolve().parent
_TOP_KEYS = ("name", "description", "algorithms", "extends", "parameters")
# (name, declaration, error-field prefix, source)
_Entry = tuple[str, ParamDecl, str, str | None]


def shipped_spaces() -> dict[str, SearchSpace]:
    """Every space shipped in the package, by name (file stem), sorted."""
    return {p.stem: load_space(p) for p in sorted(SHIPPED_DIR.glob("*.yaml"))}


def space_for_algorithm(algorithm: str) -> SearchSpace | None:
    """The shipped space named like ``algorithm``, else the first one that lists it."""
    if (SHIPPED_DIR / f"{algorithm}.yaml").is_file():
        return load_space(algorithm)
    return next((s for s in shipped_spaces().values() if algorithm in s.algorithms), None)


def load_space(
    name_or_path: str | Path, base_dir: str | Path | None = None, *, _stack: tuple = ()
) -> SearchSpace:
    """A shipped space by name (``fedavgm``) or a YAML file (relative to ``base_dir``/cwd)."""
    text = str(name_or_path)
    shipped = SHIPPED_DIR / f"{text}.yaml"
    if "/" not in text and not text.endswith((".yaml", ".yml")) and shipped.is_file():
        path = shipped
    else:
        path = Path(text)
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            stems = [p.stem for p in sorted(SHIPPED_DIR.glob("*.yaml"))]
            raise ConfigError(
                "space",
                f"{text!r} is neither a shipped space ({', '.join(stems)}) nor a file"
                f"{did_you_mean(text, stems)}",
            )
    path = path.resolve()
    if path in _stack:
        raise ConfigError("extends", f"cycle: {' -> '.join(p.stem for p in (*_stack, path))}")
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("<file>", f"cannot read a YAML space: {exc}", str(path)) from None
    stack = (*_stack, path)
    return parse_space(data, name=path.stem, source=str(path), base_dir=path.parent, _stack=stack)


def parse_space(
    data: Any,
    *,
    name: str | None = None,
    source: str | None = None,
    base_dir: str | Path | None = None,
    field: str = "",
    _stack: tuple = (),
) -> SearchSpace:
    """Validate a space mapping (the content of a file, or ``SearchSpace.to_dict()``)."""
    pre = f"{field}." if field else ""
    data = as_mapping(data, field or "<root>", source, what=" (a search space)")
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(f"{pre}{unknown[0]}", unknown_key(unknown[0], _TOP_KEYS), source)
    name = data.get("name", name) or "inline"
    description = data.get("description", "")
    algorithms = data.get("algorithms", [])
    if not isinstance(description, str):
        raise ConfigError(f"{pre}description", "must be a string", source)
    if not isinstance(algorithms, list) or not all(isinstance(a, str) for a in algorithms):
        raise ConfigError(f"{pre}algorithms", "must be a list of algorithm names", source)
    params = data.get("parameters", {})
    params = as_mapping(params, f"{pre}parameters", source, what=" name -> parameter")
    extends = data.get("extends", [])
    extends = [extends] if isinstance(extends, str) else extends
    if not isinstance(extends, list) or not all(isinstance(e, str) for e in extends):
        raise ConfigError(f"{pre}extends", "must be a space name/file or a list of them", source)
    if not params and not extends:
        raise ConfigError(f"{pre}parameters", "a space needs at least one parameter", source)
    bases = []
    for base in extends:
        try:
            bases.append(load_space(base, base_dir, _stack=_stack))
        except ConfigError as exc:
            if exc.source:
                raise
            raise ConfigError(f"{pre}extends", exc.reason, source) from None
    start = combine(bases) if bases else SearchSpace(name, ())
    merged = merge(start, params, field=f"{pre}parameters", source=source)
    return SearchSpace(name, merged.parameters, description, tuple(algorithms), source)


def combine(spaces: Sequence[SearchSpace]) -> SearchSpace:
    """Union of several spaces; a later space's entry overrides an earlier one field by field."""
    out = spaces[0]
    for space in spaces[1:]:
        decls = {p.name: ParamDecl.of(p) for p in space.parameters}
        out = merge(out, decls, field="parameters", source=space.source)
    names = "+".join(s.name for s in spaces)
    algorithms = tuple(dict.fromkeys(a for s in spaces for a in s.algorithms))
    return SearchSpace(names, out.parameters, spaces[0].description, algorithms, spaces[0].source)


def merge(
    space: SearchSpace,
    override: Mapping[str, ParamDecl | Mapping[str, Any] | None] | SearchSpace,
    *,
    field: str = "override",
    source: str | None = None,
) -> SearchSpace:
    """``space`` with ``override`` applied: entries update, add or (``None``) remove parameters.

    Errors in an overriding entry name ``{field}.{name}.<key>``; errors that the override causes
    in an untouched entry (e.g. a condition on a removed parameter) name that entry in its file.
    An entry is a :class:`ParamDecl` or the plain data of one.
    """
    if isinstance(override, SearchSpace):
        override = {p.name: ParamDecl.of(p) for p in override.parameters}
    override = as_mapping(override, field, source, what=" name -> parameter")
    entries: dict[str, _Entry] = {
        p.path: (p.name, ParamDecl.of(p), f"parameters.{p.name}", space.source)
        for p in space.parameters
    }
    seen: set[str] = set()
    unread: list[ConfigError] = []
    for name, raw in override.items():
        path = resolve_path(name) if isinstance(name, str) else None
        if path is None:
            raise ConfigError(f"{field}.{name}", _BAD_NAME + _path_hint(name), source)
        if path in seen:
            raise ConfigError(f"{field}.{name}", f"{path} is given twice", source)
        seen.add(path)
        if raw is None:
            if path not in entries:
                raise ConfigError(
                    f"{field}.{name}",
                    f"not in space {space.name!r}{_suggest(name, space)}; nothing to remove",
                    source,
                )
            del entries[path]
            continue
        try:  # every entry, so that all its problems show at once
            decl = ParamDecl.read(raw, f"{field}.{name}", source)
        except ConfigError as exc:
            unread.append(exc)
            continue
        if path in entries:
            base_name, base, _, _ = entries[path]
            entries[path] = (base_name, base.update(decl), f"{field}.{name}", source)
        elif space.parameters and decl.type is None and decl.tie is None:
            # narrows a parameter the space does not have (a typo?): say which it has
            unread.append(_not_in_space(name, space, f"{field}.{name}", source))
        else:
            entries[path] = (name, decl, f"{field}.{name}", source)
    if unread:
        raise combine_errors(unread)
    params = _parse_entries(list(entries.items()))
    return SearchSpace(space.name, params, space.description, space.algorithms, space.source)


_BAD_NAME = (
    "not a parameter name or config path (a short name, or hparams.<x>, train.<field>, "
    "decay.<field>, task.<x>)"
)


def _names(space: SearchSpace) -> list[str]:
    return [p.name for p in space.parameters]


def _suggest(name: str, space: SearchSpace) -> str:
    """`` (did you mean client_lr?)`` among the space's names and paths, or ``""``."""
    guess = closest(name, _names(space)) or closest(name, [p.path for p in space.parameters])
    return "" if guess is None else f" (did you mean {guess}?)"


def _not_in_space(name: str, space: SearchSpace, field: str, source: str | None) -> ConfigError:
    """An override of a parameter the space lacks, without a ``type`` to add it."""
    return ConfigError(
        field,
        f"not a parameter of the space {space.name!r}{_suggest(name, space)}; its parameters: "
        f"{', '.join(_names(space))} (to add a parameter, give its type)",
        source,
    )


def _path_hint(name: object) -> str:
    """``; did you mean train.rounds?`` for a dotted name with a misspelt section or field."""
    if not isinstance(name, str) or name.count(".") != 1:
        return ""
    section, key = name.split(".")
    fields = {
        "train": [f.name for f in dataclasses.fields(TrainConfig)],
        "decay": [f.name for f in dataclasses.fields(DecayConfig)],
    }
    section = closest(section, ["hparams", "train", "decay", "task"]) or section
    if section in fields:
        key = closest(key, fields[section]) or ""
    guess = f"{section}.{key}" if key else ""
    return f"; did you mean {guess}?" if guess and resolve_path(guess) == guess else ""


def _parse_entries(items: list[tuple[str, _Entry]]) -> tuple[Parameter, ...]:
    names: dict[str, str] = {}
    for path, (name, _, _, _) in items:
        names[name] = path
        names[path] = path
        names.setdefault(path.split(".", 1)[1], path)
    params, errors = [], []
    for path, (n, raw, f, src) in items:  # every entry, so that all conflicts show at once
        try:
            params.append(parse_parameter(n, path, raw, names, f, src))
        except ConfigError as exc:
            errors.append(exc)
    if errors:
        raise combine_errors(errors)
    origin = {path: (f, src) for path, (_, _, f, src) in items}
    return _dependency_order(params, origin)


def _dependency_order(
    params: list[Parameter], origin: Mapping[str, tuple[str, str | None]]
) -> tuple[Parameter, ...]:
    """Stable topological order: file order, except that a parameter waits for its references."""
    done: list[Parameter] = []
    placed: set[str] = set()
    pending = list(params)
    while pending:
        ready = next((p for p in pending if p.depends_on <= placed), None)
        if ready is None:
            p = pending[0]
            cycle = ", ".join(q.name for q in pending)
            key = "tie" if p.tie in {q.path for q in pending} else "when"
            f, src = origin[p.path]
            raise ConfigError(f"{f}.{key}", f"tie/condition cycle among: {cycle}", src)
        done.append(ready)
        placed.add(ready.path)
        pending.remove(ready)
    return tuple(done)
