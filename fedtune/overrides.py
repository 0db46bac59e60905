"""Dotted-path overrides of a YAML document (``hparams.client_lr``), shared by the engine and
the CLI's ``--set``; pure Python, so the light install has it too."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fedtune.errors import ConfigError, as_mapping

__all__ = ["apply_overrides"]


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``data`` with each dotted-path override set.

    Args:
        data: The document (a study or trial configuration).
        overrides: ``{"hparams.client_lr": 0.1, "budget.trials": 8}``; a missing parent is
            created, and ``task: digits`` is read as ``task: {name: digits}``.

    Returns:
        The new document; ``data`` is left unchanged.

    Raises:
        ConfigError: A key with an empty part, or one whose parent is not a mapping (the
            error's field names that parent).
    """
    out = copy.deepcopy(dict(data))
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if not all(parts):
            raise ConfigError(dotted, "is not a dotted key (empty part)")
        node: dict[str, Any] = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif isinstance(child, str) and part == "task":
                child = node[part] = {"name": child}
            else:
                as_mapping(child, ".".join(parts[: i + 1]), what=f" to set {dotted} in it")
            node = child
        node[parts[-1]] = value
    return out
