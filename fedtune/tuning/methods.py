"""A study of methods: one spec that lists algorithms, expanded into one study per algorithm.

A spec document whose ``algorithm`` is a list — names, or mappings ``{name: ALGORITHM,
search: {...}}`` whose ``search`` overrides the spec's for that algorithm (key by key) — is a
study of methods::

    name: digits-methods
    algorithm: [fedavg, fedprox, {name: scaffold, search: {space: scaffold}}]
    task: {name: digits, clients: 20, seed: 0}
    ...

:func:`expand_methods` turns it into one ordinary spec document per algorithm: named
``<name>-<algorithm>``, with the same task, seed, training settings, objective, sampler and
budget, in one MLflow experiment (``tracking.experiment``, default the study of methods' name),
so the runs sit side by side in the MLflow UI. Each is run as a study of its own, then the
studies are compared (:mod:`fedtune.tuning.analysis.compare`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fedtune.errors import ConfigError, as_mapping
from fedtune.suggest import unknown_key

__all__ = ["expand_methods", "is_methods_study"]

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def is_methods_study(document: Any) -> bool:
    """Whether a spec document lists algorithms.

    Args:
        document: A spec document (the YAML's mapping).

    Returns:
        True when its ``algorithm`` is a list.
    """
    return isinstance(document, Mapping) and isinstance(document.get("algorithm"), list)


@dataclass(frozen=True)
class _Entry:
    """One entry of the ``algorithm`` list: a name, and a search that overrides the study's."""

    name: Any = None
    search: Any = None


def _entry(i: int, entry: Any) -> _Entry:
    where = f"algorithm[{i}]"
    if isinstance(entry, str):
        parsed = _Entry(entry)
    elif isinstance(entry, Mapping):
        unknown = set(entry) - {f.name for f in fields(_Entry)}
        if unknown:
            first = sorted(unknown)[0]
            raise ConfigError(f"{where}.{first}", unknown_key(first, ("name", "search")))
        parsed = _Entry(**entry)
        if parsed.search is not None:
            as_mapping(parsed.search, f"{where}.search")
    else:
        raise ConfigError(where, "must be an algorithm name or {name: ..., search: {...}}")
    if not isinstance(parsed.name, str) or not _NAME.match(parsed.name):
        raise ConfigError(
            f"{where}.name" if isinstance(entry, Mapping) else where, "must name an algorithm"
        )
    return parsed


def expand_methods(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One spec document per algorithm of a study of methods (module docstring).

    Args:
        document: The spec document, ``algorithm`` a list of at least two entries.

    Returns:
        The per-algorithm documents, in the order listed.

    Raises:
        ConfigError: ``algorithm`` is not a list of two or more distinct algorithms, an entry
            is malformed, or the study has no name.
    """
    algorithms = document.get("algorithm")
    if not isinstance(algorithms, list) or len(algorithms) < 2:
        raise ConfigError("algorithm", "a study of methods lists two or more algorithms")
    name = document.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("name", "a study of methods needs a name")
    entries = [_entry(i, e) for i, e in enumerate(algorithms)]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConfigError("algorithm", f"an algorithm is listed twice: {names}")
    tracking = dict(document.get("tracking") or {})
    tracking.setdefault("experiment", name)
    out = []
    for entry in entries:
        one = copy.deepcopy({k: v for k, v in document.items() if k != "algorithm"})
        one.update(
            name=f"{name}-{entry.name}", algorithm=entry.name, tracking=copy.deepcopy(tracking)
        )
        if entry.search is not None:
            given = dict(document.get("search") or {})
            one.update(search=copy.deepcopy({**given, **dict(entry.search)}))
        out.append(one)
    return out
