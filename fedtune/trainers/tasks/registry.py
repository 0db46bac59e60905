"""Task registry: ``name -> builder(params: Mapping, seed: int) -> Task``.

A builder validates its own parameters (``task.<key>`` in errors) and must be deterministic in
``seed`` (the *data* seed: it fixes the data, the split and nothing about hyperparameters).
Built-in tasks and user tasks (entry point ``fedtune.tasks``, a study's ``code:``) register
through the same :func:`register_task` (see :mod:`fedtune.trainers.plugins`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedtune.errors import CodeError, ConfigError, DataError

from ..plugins import Origin, Registry, error_location

if TYPE_CHECKING:
    from .base import Task

__all__ = [
    "TaskInfo",
    "build_task",
    "check_task_params",
    "register_task",
    "task_names",
    "task_origin",
    "task_parameters",
    "tasks",
]

#: ``builder(params, seed) -> Task``: validates ``params`` (errors name ``task.<key>``) and is
#: deterministic in the data ``seed``
Builder = Callable[[Mapping[str, Any], int], "Task"]


@dataclass(frozen=True)
class TaskInfo:
    name: str
    builder: Builder
    description: str
    #: the frozen dataclass of its parameters (type, default; ``validate(path)`` for ranges):
    #: a spec's unknown or out-of-range ``task.*`` is refused before any trial
    params: type | None = None


def _builtins() -> Iterator[tuple[str, TaskInfo, str]]:
    """The built-in tasks (:mod:`.builtin`: their metadata; a builder's module is imported when
    the task is built)."""
    from . import builtin

    return ((info.name, info, builtin.__name__) for info in builtin.TASKS)


REGISTRY: Registry[TaskInfo] = Registry("task", "task.name", _builtins)


def register_task(
    name: str, description: str = "", params: type | None = None
) -> Callable[[Builder], Builder]:
    """Register a task builder, ``builder(params, seed) -> Task``, as a decorator.

    Args:
        name: The task's name, as a study's ``task.name`` names it.
        description: One line for ``fedtune tasks`` (default: the builder's summary line).
        params: A frozen dataclass declaring the task's parameters (fields with types and
            defaults, an optional ``validate(self, path)``), so that a spec's ``task:`` is
            checked when it is read (None: not checked).

    Returns:
        The decorator; it returns the builder unchanged.

    Raises:
        CodeError: ``name`` is empty or already registered by another module.

    Example:
        ```python
        @register_task("my_lab_digits", "my digits split")
        def build(params, seed):
            ...
        ```
    """

    def deco(builder: Builder) -> Builder:
        doc = description or (builder.__doc__ or "").strip().split("\n")[0]
        REGISTRY.add(name, TaskInfo(name, builder, doc, params))
        return builder

    return deco


def check_task_params(name: str, params: Mapping[str, Any]) -> None:
    """Raise ``ConfigError("task.<key>", …)`` unless ``params`` (a spec's ``task:`` without its
    name) fit the parameters task ``name`` declares; a task that declares none is not checked."""
    from ..typed import from_mapping

    declared = REGISTRY.get(name).params
    if declared is not None:  # ``name`` and ``seed`` are every task's (``TaskConfig``)
        from_mapping(
            declared, {k: v for k, v in params.items() if k not in ("name", "seed")}, "task"
        )


def task_parameters(name: str) -> list[tuple[str, str, Any]]:
    """``(name, type, default)`` of each parameter task ``name`` declares (empty: none)."""
    import dataclasses
    import typing

    declared = REGISTRY.get(name).params
    if declared is None:
        return []
    hints = typing.get_type_hints(declared)
    rows = []
    for f in dataclasses.fields(declared):
        if not f.init:
            continue
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else f.default_factory()
            if f.default_factory is not dataclasses.MISSING
            else "(required)"
        )
        kind = getattr(hints[f.name], "__name__", None) or str(hints[f.name]).replace("typing.", "")
        rows.append((f.name, kind, default))
    return rows


def tasks() -> dict[str, TaskInfo]:
    """List every registered task: built in, from entry points and from loaded code.

    Returns:
        The tasks by name.
    """
    return REGISTRY.all()


def task_names() -> list[str]:
    return sorted(tasks())


def task_origin(name: str) -> Origin:
    """Say where a task was registered.

    Args:
        name: The task's name.

    Returns:
        Its origin (built in, an entry point's distribution or a study's code).

    Raises:
        ConfigError: No task has this name.
    """
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
