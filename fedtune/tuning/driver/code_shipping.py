"""A study's user code shipped to Ray workers through Ray's own ``runtime_env``.

``code: {path: ./my_lab, modules: [my_lab.tasks]}`` names an *import root* (a directory, or a
``.whl``/``.zip``) and the modules that register the study's task, model and algorithm. When the
study's driver starts Ray (embedded) or connects to a cluster (``--ray-address``) it ships that
code with the job's ``runtime_env`` instead of relying on a file system the nodes share:

* a directory is the import root itself; a ``.whl``/``.zip`` is checked and unpacked under
  ``<workdir>/code/<sha256>`` (:mod:`fedtune.code_package`, as the service does);
* ``py_modules`` lists the top-level package (or single-file module) of every entry of
  ``code.modules``; Ray uploads each once (content-addressed) and every node's runtime-env agent
  unpacks it and puts it on the path of that node's workers;
* trials then import ``code.modules`` by name (:func:`worker_spec`: their configurations carry
  ``code: {modules}`` without the driver's ``path``), so a worker never reads the driver's disk.

A driver that uses a Ray the caller already started cannot set the job's ``runtime_env``; its
trials keep importing from ``code.path`` (same machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedtune.code_package import EXCLUDED_NAMES, extract, pack
from fedtune.errors import CodeError

from ..spec import StudySpec

__all__ = ["code_runtime_env", "worker_spec"]


def code_runtime_env(spec: StudySpec, workdir: Path) -> dict[str, Any] | None:
    """``{"py_modules": [...]}`` shipping the study's code, or None (no code, or no path)."""
    code = spec.resolved_code
    if code is None or code.path is None:
        return None  # the modules are installed: the cluster's image must have them
    root = Path(code.path)
    if root.is_file():
        package = pack(root)
        root = extract(package.data, workdir / "code" / package.sha256)
    shipped: dict[str, str] = {}
    for i, module in enumerate(code.modules):
        top = module.split(".")[0]
        if top in shipped:
            continue
        candidates = (root / top, root / f"{top}.py")
        found = next((p for p in candidates if p.is_dir() or p.is_file()), None)
        if found is None:
            raise CodeError(
                f"code.modules[{i}]",
                f"{top!r} is neither a package nor a module at the top of code.path "
                f"{code.path}; only what is there can be shipped to Ray workers",
            )
        shipped[top] = str(found)
    excludes = [*sorted(EXCLUDED_NAMES), "*.pyc", "*.pyo"]  # caches: never shipped
    return {"py_modules": list(shipped.values()), "excludes": excludes}


def worker_spec(spec: StudySpec) -> StudySpec:
    """The spec the trials get when the code is shipped: ``code`` without the driver's path."""
    if spec.code is None or spec.code.path is None:
        return spec
    return spec.model_copy(update={"code": spec.code.model_copy(update={"path": None})})
