"""Imports every built-in task module so that each registers itself."""

from __future__ import annotations

import importlib

_MODULES = ("quadratic", "synthetic", "digits", "leaf", "tff", "mixed", "linreg")

for _name in _MODULES:
    try:
        importlib.import_module(f"{__package__}.{_name}")
    except ModuleNotFoundError as exc:  # a task module not written yet
        if exc.name != f"{__package__}.{_name}":
            raise
