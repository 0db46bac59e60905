"""Names of a package imported from their modules when first used (PEP 562), so that importing
the package, or one of its modules, does not import the others."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module-level ``__getattr__`` for ``names``.

    Args:
        package: The package's ``__name__``.
        names: Each name and the module (relative to the package) that defines it.

    Returns:
        The ``__getattr__``: a name of ``names`` from its module, imported now; any other name
        raises ``AttributeError``.
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(f".{names[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
