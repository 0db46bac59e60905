"""A study's user code: ``code: {path: ./my_lab, modules: [my_lab.tasks]}``.

``path`` is a directory (put on ``sys.path``) or a wheel/zip (imported with ``zipimport``),
relative to the study file; ``modules`` are imported in order and register tasks, models and
algorithms through :mod:`fedtune.extend`. ``path`` may be omitted when the modules are already
importable (installed, or shipped to a Ray worker by ``runtime_env``).

:func:`load_code` is idempotent (a module already imported from the same place is not imported
again) and raises :class:`~fedtune.errors.CodeError` naming the field (``code.path``,
``code.modules[i]``) and the ``file:line`` of the failure: a syntax error, an import error, an
exception at import, or an invalid registration (e.g. a hyperparameter declared without bounds).
The service runs it in a subprocess (user code is never imported in the API process).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedtune.errors import CodeError, ConfigError

from .code_spec import CodeSpec, parse_code_spec
from .plugins import Origin, error_location, registering_from

__all__ = ["CodeSpec", "LoadReport", "code_origin", "load_code", "parse_code_spec"]


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_code` imported and what each module registered.

    Attributes:
        path: The mounted directory or wheel (None: the modules were importable).
        modules: The modules imported, in order.
        files: Each module's file (None: not known).
        tasks: The tasks registered.
        models: The models registered.
        algorithms: The algorithms registered.
    """

    path: str | None
    modules: list[str]
    files: dict[str, str | None] = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    algorithms: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Give the report as JSON-ready data."""
        return asdict(self)


def code_origin(spec: CodeSpec) -> Origin:
    return Origin("code", spec.path or ", ".join(spec.modules))


def _registries():
    from .algorithms.registry import REGISTRY as algorithms
    from .models.registry import REGISTRY as models
    from .tasks.registry import REGISTRY as tasks

    return {"tasks": tasks, "models": models, "algorithms": algorithms}


def _mount(path: str | None) -> str | None:
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        raise CodeError("code.path", f"no such directory or wheel: {path}")
    if p.is_file() and p.suffix not in (".whl", ".zip"):
        raise CodeError("code.path", f"must be a directory, a .whl or a .zip, got {path}")
    text = str(p.resolve())
    if text not in sys.path:
        sys.path.insert(0, text)
    importlib.invalidate_caches()
    return text


def _import(module: str, index: int, root: str | None) -> str | None:
    where = f"code.modules[{index}]"
    try:
        mod = importlib.import_module(module)
    except ConfigError as exc:  # an invalid registration inside the module
        location = getattr(exc, "location", None) or error_location(exc, root)
        reason = getattr(exc, "bare_reason", exc.reason)
        raise CodeError(where, f"{module}: {exc.field}: {reason}", location) from exc
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            under = f" under {root}" if root else " (give code.path)"
            raise CodeError(where, f"module {module!r} not found{under}") from None
        raise CodeError(
            where, f"importing {module!r} failed: {exc}", error_location(exc, root)
        ) from exc
    except SyntaxError as exc:
        raise CodeError(
            where, f"syntax error in {module!r}: {exc.msg}", error_location(exc)
        ) from exc
    except Exception as exc:
        raise CodeError(
            where,
            f"importing {module!r} raised {type(exc).__name__}: {exc}",
            error_location(exc, root),
        ) from exc
    file = getattr(mod, "__file__", None)
    _check_under_root(module, where, file, root)
    return file


def _check_under_root(module: str, where: str, file: str | None, root: str | None) -> None:
    """With ``code.path``, the module must come from there: an installed copy of the same
    package (``pip install ./mypkg``, loaded first through its entry points, or earlier on
    ``sys.path``) would otherwise run in the driver while the trials run ``code.path``'s.
    One line naming both places."""
    if root is None or file is None:
        return
    here = Path(file).resolve()
    if here.is_relative_to(root) or str(file).startswith(root.rstrip("/") + "/"):
        return
    top = module.split(".")[0]
    if not ((Path(root) / top).is_dir() or (Path(root) / f"{top}.py").is_file()):
        return  # code.path does not provide it (``os``, an installed dependency): no shadowing
    raise CodeError(
        where,
        f"module {module!r} is imported from {here}, not from code.path {root}: another copy "
        f"of {top!r} (installed, or loaded earlier) shadows the study's code; uninstall it "
        f"(pip uninstall) or leave code.path out to use the installed one",
    )


def load_code(code: CodeSpec | Mapping[str, Any], base_dir: str | Path | None = None) -> LoadReport:
    """Import a study's user code so that its registrations exist; idempotent.

    Args:
        code: The study's ``code`` section: ``path`` (a directory, wheel or zip; optional when
            the modules are importable) and the ``modules`` to import in order.
        base_dir: The directory ``path`` is relative to (None: the working directory).

    Returns:
        What was imported and what each module registered.

    Raises:
        CodeError: A syntax or import error, an exception at import, or an invalid
            registration, naming the field (``code.path``, ``code.modules[i]``) and the
            ``file:line``.
        ConfigError: An invalid ``code`` section.
    """
    spec = parse_code_spec(code).resolved(base_dir)
    registries = _registries()
    for registry in registries.values():  # user code may extend a built-in's name: load first
        registry.all()
    before = {k: r.snapshot() for k, r in registries.items()}
    root = _mount(spec.path)
    files: dict[str, str | None] = {}
    with registering_from(code_origin(spec)):
        for i, module in enumerate(spec.modules):
            files[module] = _import(module, i, root)
    added = {k: sorted(r.snapshot() - before[k]) for k, r in registries.items()}
    origin = code_origin(spec)
    for kind, registry in registries.items():  # re-loading: entries registered the first time
        added[kind] = sorted(set(added[kind]) | set(registry.names_from(origin)))
    return LoadReport(spec.path, list(spec.modules), files, **added)
