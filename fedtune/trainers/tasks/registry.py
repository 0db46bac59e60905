"""Task registry: ``name -> builder(params: Mapping, seed: int) -> Task``.

A builder validates its own parameters (``task.<key>`` in errors) and must be deterministic in
``seed`` (the *data* seed: it fixes the data, the split and nothing about hyperparameters).
Built-in tasks and user tasks (entry point ``fedtune.tasks``, a study's ``code:``) register
through the same :func:`register_task` (see :mod:`fedtune.trainers.plugins`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fedtune.errors import CodeError, ConfigError, DataError

from ..plugins import Origin, Registry, error_location
from .base import Task

__all__ = ["TaskInfo", "build_task", "register_task", "task_names", "task_origin", "tasks"]

#: ``builder(params, seed) -> Task``: validates ``params`` (errors name ``task.<key>``) and is
#: deterministic in the data ``seed``
Builder = Callable[[Mapping[str, Any], int], Task]


@dataclass(frozen=True)
class TaskInfo:
    name: str
    builder: Builder
    description: str


def _load_builtin() -> None:
    # importing the modules registers the built-in tasks
    from . import builtin  # noqa: F401


REGISTRY: Registry[TaskInfo] = Registry("task", "task.name", _load_builtin)


def register_task(name: str, description: str = "") -> Callable[[Builder], Builder]:
    """Decorator: register ``builder(params, seed) -> Task`` as task ``name``."""

    def deco(builder: Builder) -> Builder:
        doc = description or (builder.__doc__ or "").strip().split("\n")[0]
        REGISTRY.add(name, TaskInfo(name, builder, doc))
        return builder

    return deco


def tasks() -> dict[str, TaskInfo]:
    return REGISTRY.all()


def task_names() -> list[str]:
    return sorted(tasks())


def task_origin(name: str) -> Origin:
    return REGISTRY.origin(name)


def build_task(name: str, params: Mapping[str, Any], seed: int) -> Task:
    """Build task ``name``. A *user* builder (entry point or ``code:``) that raises anything but
    ``ConfigError``/``DataError`` becomes ``CodeError("task.name", …)`` naming the task, the
    exception and the builder's ``file:line`` — the one line a failed trial reports."""
    info = REGISTRY.get(name)
    try:
        return info.builder(params, seed)
    except (ConfigError, DataError):
        raise
    except Exception as exc:
        origin = REGISTRY.origin(name)
        if origin.is_builtin:
            raise
        prefer = origin.detail if origin.kind == "code" else None
        raise CodeError(
            "task.name",
            f"the builder of task {name!r} ({origin}) raised {type(exc).__name__}: {exc}",
            error_location(exc, prefer),
        ) from exc
