"""Task registry: ``name -> builder(params: Mapping, seed: int) -> Task``.

A builder validates its own parameters (``task.<key>`` in errors) and must be deterministic in
``seed`` (the *data* seed: it fixes the data, the split and nothing about hyperparameters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fedtune.errors import ConfigError

from .base import Task

__all__ = ["TaskInfo", "build_task", "register_task", "task_names", "tasks"]

Builder = Callable[[Mapping[str, Any], int], Task]


@dataclass(frozen=True)
class TaskInfo:
    name: str
    builder: Builder
    description: str


_TASKS: dict[str, TaskInfo] = {}


def register_task(name: str, description: str) -> Callable[[Builder], Builder]:
    def deco(builder: Builder) -> Builder:
        if name in _TASKS:
            raise ValueError(f"task {name!r} registered twice")
        _TASKS[name] = TaskInfo(name, builder, description)
        return builder

    return deco


def _load_builtin() -> None:
    # importing the modules registers the built-in tasks
    from . import builtin  # noqa: F401


def tasks() -> dict[str, TaskInfo]:
    _load_builtin()
    return dict(_TASKS)


def task_names() -> list[str]:
    return sorted(tasks())


def build_task(name: str, params: Mapping[str, Any], seed: int) -> Task:
    known = tasks()
    if name not in known:
        raise ConfigError("task.name", f"unknown task {name!r} (known: {', '.join(sorted(known))})")
    return known[name].builder(params, seed)
