"""A study driver's user code: the uploaded package, found again wherever the driver runs.

A study submitted with code (``fedtune submit --code``, ``Client.submit(code=…)``) is stored as
``code: {modules}`` plus the package's digest in ``studies.code_sha256``; the package itself is a
row of ``code_packages`` in the service database (durable: a restarted service, a re-dispatched
driver or a fresh pod reads it from there, not from any file system).

:func:`with_study_code` gives the driver the spec it can load:

* the Ray job the driver runs in ships code itself — a RayJob's ``runtime_env`` (``py_modules``
  = the study's package URL, which Ray hands the driver in ``RAY_JOB_CONFIG_JSON_ENV_VAR``) put
  the modules on the driver's and every worker's path: the spec is used as stored (no
  ``path``, so trials on other nodes import them the same way);
* otherwise (the local and the ``ray`` backend) the package, fetched through the driver's link
  (the service's API with the study's credential, or the database) and checked against its
  digest, is extracted once per digest under
  ``<FEDTUNE_WORKDIR>/code/<sha256>`` and named as ``code.path``; ``run_study`` ships it from
  there to every trial through Ray's ``runtime_env`` (``fedtune.tuning.driver.code_shipping``). This
  holds even when modules of the same names are installed where the driver runs (an older
  version in the cluster's image): ``code.path`` comes first on the driver's ``sys.path`` and
  ``py_modules`` first on the workers' ``PYTHONPATH``, so the study runs the code of its
  ``code_sha256``, never whatever happens to be importable.

A digest with no stored package (deleted by hand) is a ``ConfigError`` naming ``code.sha256``.
The driver logs where the package went (``code package <sha256> unpacked from the database to
<dir>``): under the ``ray`` backend that is the Ray job's log, on the head.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedtune.errors import ConfigError

from .driver_link import DriverLink
from .settings import Settings

__all__ = ["code_dir", "with_study_code"]

log = logging.getLogger(__name__)


def code_dir(settings: Settings, sha256: str) -> Path:
    """Where the package ``sha256`` is extracted for drivers on this machine."""
    return Path(settings.workdir).resolve() / "code" / sha256


def _shipped_by_the_job() -> bool:
    """The Ray job this driver runs in has ``py_modules`` of its own (a RayJob's runtime_env)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")  # set by Ray's job supervisor
    if not raw:
        return False
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return False
    return bool(isinstance(runtime_env, dict) and runtime_env.get("py_modules"))


def _importable(modules: list[str]) -> bool:
    try:
        return all(importlib.util.find_spec(m.split(".")[0]) is not None for m in modules)
    except (ImportError, ValueError):
        return False


def with_study_code(
    link: DriverLink, settings: Settings, document: Mapping[str, Any], sha256: str | None
) -> dict[str, Any]:
    """``document`` whose ``code`` section the driver can import (see the module docstring)."""
    document = dict(document)
    code = document.get("code")
    if not sha256 or not isinstance(code, Mapping) or code.get("path"):
        return document
    modules = list(code.get("modules") or [])
    if _shipped_by_the_job() and _importable(modules):
        return document
    package = link.package()
    if package is None:
        raise ConfigError("code.sha256", f"the study's code package {sha256} is not stored")
    from fedtune.code_package import extract, sha256_of

    if sha256_of(package) != sha256:
        raise ConfigError("code.sha256", f"the package received is not {sha256}")

    root = extract(package, code_dir(settings, sha256), max_bytes=settings.max_code_bytes)
    log.info("code package %s unpacked from the service to %s", sha256, root)
    document["code"] = {**code, "path": str(root)}
    return document
