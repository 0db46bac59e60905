"""One registry per kind (tasks, models, algorithms), filled by built-ins and user code alike.

Every entry remembers where it came from (:class:`Origin`):

* ``builtin``            registered by a module of the ``fedtune`` package;
* ``entry point d==v``   an installed distribution ``d`` (version ``v``) advertising it under the
                         entry-point group ``fedtune.tasks`` / ``fedtune.models`` /
                         ``fedtune.algorithms``;
* ``code PATH``          a study's ``code: {path, modules}`` section (:mod:`.code`);
* ``module M``           any other module that called ``register_*`` after importing fedtune.

Entry points are loaded lazily (``importlib.metadata``), the first time a registry is listed or
asked for a name it does not hold; a built-in lookup never loads them. An entry point names a
module whose import registers entries (``my_lab = my_lab.tasks``) or a zero-argument callable
that registers them (``my_lab = my_lab.plugin:register``). Registering a name twice is an error,
unless the same object (module re-imported) registers it again.

A built-in entry's implementation (a task's builder, a model's factory, a recipe's round) is a
:class:`Deferred`: its module is imported when it is first called, so that listing the
registries and validating a spec (names, parameters, defaults) do not import the engine or torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.metadata
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fedtune.errors import CodeError, ConfigError
from fedtune.suggest import did_you_mean

__all__ = [
    "GROUPS",
    "Deferred",
    "Origin",
    "Registry",
    "caller_location",
    "error_location",
    "registering_from",
]

T = TypeVar("T")

#: entry-point group of each registry kind
GROUPS = {"task": "fedtune.tasks", "model": "fedtune.models", "algorithm": "fedtune.algorithms"}


@dataclass(frozen=True)
class Origin:
    """Where a registry entry came from.

    Args:
        kind: ``builtin``, ``entry_point``, ``code`` (a study's ``code:``) or ``module``.
        detail: Which one: the distribution, the code's path, the module.
    """

    kind: str  # builtin | entry_point | code | module
    detail: str = ""

    def __str__(self) -> str:
        label = {"entry_point": "entry point"}.get(self.kind, self.kind)
        return f"{label} {self.detail}".strip()

    @property
    def is_builtin(self) -> bool:
        """Whether the entry ships with fedtune."""
        return self.kind == "builtin"


class Deferred:
    """A function named by its module and name, imported when it is first called.

    It stands for a built-in implementation in a registry entry whose metadata (names,
    parameters, defaults) must be readable without importing the implementation's module (and
    torch). It carries the function's ``__module__`` and ``__name__``.

    Args:
        module: The module that defines the function.
        name: The function's name in that module.
    """

    def __init__(self, module: str, name: str) -> None:
        self.__module__ = module
        self.__name__ = self.__qualname__ = name
        self._function: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        """Import the function (once).

        Returns:
            The function itself.
        """
        if self._function is None:
            self._function = getattr(importlib.import_module(self.__module__), self.__name__)
        return self._function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Deferred):
            return NotImplemented
        return (self.__module__, self.__name__) == (other.__module__, other.__name__)

    def __hash__(self) -> int:
        return hash((self.__module__, self.__name__))

    def __repr__(self) -> str:
        return f"<deferred {self.__module__}.{self.__name__}>"

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        """Pickled by its name, never by the function it has imported (which may be local)."""
        return Deferred, (self.__module__, self.__name__)


BUILTIN = Origin("builtin")
_CURRENT: contextvars.ContextVar[Origin | None] = contextvars.ContextVar("origin", default=None)


@contextlib.contextmanager
def registering_from(origin: Origin) -> Iterator[None]:
    """Entries registered inside this block are attributed to ``origin``."""
    token = _CURRENT.set(origin)
    try:
        yield
    finally:
        _CURRENT.reset(token)


#: modules that only relay a registration (the registering module is the first frame outside them)
_RELAYS = frozenset(
    {
        __name__,
        "fedtune.extend",
        "fedtune.trainers.tasks.registry",
        "fedtune.trainers.models.registry",
        "fedtune.trainers.algorithms.registry",
        "fedtune.trainers.algorithms.recipe",
        "fedtune.trainers.hparams",
    }
)


def _registering_frame() -> tuple[str, str, int]:
    """(module, file, line) of the first caller outside the registry machinery."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module not in _RELAYS and not module.startswith("importlib"):
            return module, frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return "", "<unknown>", 0


def _registering_module() -> str:
    return _registering_frame()[0]


def _origin_of(module: str) -> Origin:
    current = _CURRENT.get()
    if current is not None:
        return current
    return (
        BUILTIN
        if module == "fedtune" or module.startswith("fedtune.")
        else Origin("module", module)
    )


def error_location(exc: BaseException, prefer: str | None = None) -> str | None:
    """``file:line`` of an exception: a SyntaxError's own position, else the innermost frame
    under ``prefer`` (a directory), else the innermost frame outside fedtune and importlib."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = inspect.getinnerframes(exc.__traceback__, context=0) if exc.__traceback__ else []
    names = [(f.filename, f.lineno) for f in frames]
    if prefer:
        mine = [n for n in names if n[0].startswith(prefer)]
        if mine:
            return f"{mine[-1][0]}:{mine[-1][1]}"
    outside = [n for n in names if "importlib" not in n[0] and "/fedtune/" not in n[0]]
    return f"{outside[-1][0]}:{outside[-1][1]}" if outside else None


def caller_location() -> str:
    """``file:line`` of the code calling a ``register_*`` function."""
    _, file, line = _registering_frame()
    return f"{file}:{line}"


class Registry(Generic[T]):
    """Name -> entry for one kind; ``builtins`` gives the built-in entries, registered the first
    time the registry is used (``(name, entry, module)``: the module is the entry's origin)."""

    def __init__(
        self, kind: str, field: str, builtins: Callable[[], Iterable[tuple[str, T, str]]]
    ) -> None:
        self.kind = kind
        self.group = GROUPS[kind]
        self.field = field
        self._builtins = builtins
        self._builtins_loaded = False
        self._entries: dict[str, T] = {}
        self._origins: dict[str, Origin] = {}
        self._modules: dict[str, str] = {}
        self._eps_loaded = False

    # -- registration -------------------------------------------------------------
    def add(self, name: str, entry: T, module: str | None = None) -> None:
        """Register ``entry`` under ``name``. The registering module (``module``, else the
        caller's) gives the default origin; a second registration from another module raises
        ``CodeError`` (the same module registering again, e.g. re-imported, replaces its entry)."""
        module = module or _registering_module()
        if not isinstance(name, str) or not name:
            raise CodeError(f"{self.kind}.name", "must be a non-empty string", caller_location())
        if name in self._entries and self._modules[name] != module:
            raise CodeError(
                f"{self.kind}.name",
                f"{self.kind} {name!r} is already registered ({self._origins[name]})",
                caller_location(),
            )
        self._entries[name] = entry
        self._origins[name] = _origin_of(module)
        self._modules[name] = module

    def _load_builtins(self) -> None:
        """Register the built-in entries, once."""
        if self._builtins_loaded:
            return
        for name, entry, module in self._builtins():
            self.add(name, entry, module=module)
        self._builtins_loaded = True

    # -- lookup -------------------------------------------------------------------
    def all(self) -> dict[str, T]:
        self._load_builtins()
        self.load_entry_points()
        return dict(self._entries)

    def get(self, name: str) -> T:
        self._load_builtins()
        if name not in self._entries:
            self.load_entry_points()
        if name not in self._entries:
            raise ConfigError(
                self.field,
                f"unknown {self.kind} {name!r}{did_you_mean(name, self._entries)} "
                f"(known: {', '.join(sorted(self._entries))})",
            )
        return self._entries[name]

    def origin(self, name: str) -> Origin:
        self.get(name)
        return self._origins[name]

    def names_from(self, origin: Origin) -> list[str]:
        return sorted(n for n, o in self._origins.items() if o == origin)

    def snapshot(self) -> set[str]:
        return set(self._entries)

    # -- entry points -------------------------------------------------------------
    def load_entry_points(self) -> None:
        if self._eps_loaded:
            return
        self._eps_loaded = True
        for ep in importlib.metadata.entry_points(group=self.group):
            dist = getattr(ep, "dist", None)
            label = f"{dist.name}=={dist.version}" if dist is not None else ep.value
            with registering_from(Origin("entry_point", label)):
                try:
                    obj = ep.load()
                    if callable(obj) and not inspect.ismodule(obj) and not isinstance(obj, type):
                        obj()
                except ConfigError:
                    raise
                except Exception as exc:  # user code: report where it failed
                    raise CodeError(
                        f"entry_points.{self.group}.{ep.name}",
                        f"loading {ep.value!r} ({label}) failed: {type(exc).__name__}: {exc}",
                        error_location(exc),
                    ) from exc
