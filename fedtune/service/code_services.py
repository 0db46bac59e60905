"""Service functions for user code: upload a package, accept a study that uses one, serve it.

* :func:`upload_code` (``POST /v1/code``): check the zip (``fedtune.code_package.check_package``:
  size, paths inside the root, no links) and store it under its SHA-256 — identical code is
  stored once; answers the digest;
* :func:`accept_code_study`: a submitted spec whose ``code`` names an uploaded package
  (``code: {sha256, modules}``) is validated by a sandboxed child that imports it
  (:mod:`.code_check`, :mod:`fedtune.sandbox`); the stored document keeps ``code: {modules}`` and the study row the
  digest (``studies.code_sha256``), next to the study in the same database; a check that
  passed is remembered per project, package and spec (:mod:`.code_check_cache`), so the same
  study submitted again is not checked again (a refused one is, every time);
* :func:`study_code_zip` (``GET /v1/studies/{id}/code.zip?token=…``): the package of one study
  for its RayJob, authorised by the per-study credential of :mod:`.code_url`.

Nothing is accepted unless the operator enabled uploads (``FEDTUNE_ALLOW_CODE_UPLOAD``): what
uploaded code can reach on each backend is ``docs/explanation/threat-model.md``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedtune.code_package import check_package, sha256_of, wrap_single_top_level
from fedtune.errors import ConfigError, ConflictError, as_mapping
from fedtune.sandbox import SandboxMode, sandbox_missing
from fedtune.suggest import unknown_key
from fedtune.wire_models import CodeOut

from .code_check import accepted_answer, check_in_sandbox
from .code_url import code_url_key, verify_code_token
from .errors import CodeUploadDisabledError, StudyNotFoundError
from .models import DEFAULT_PROJECT
from .repository import Repository
from .settings import BackendKind
from .specs import AcceptedSpec, parse_spec, service_rules

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "CodeOut",
    "accept_code_study",
    "code_sandbox_state",
    "require_code_sandbox",
    "study_code_zip",
    "upload_code",
]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
log = logging.getLogger(__name__)


def _enabled(ctx: Any) -> None:
    if not ctx.settings.allow_code_upload:
        raise CodeUploadDisabledError(
            "this service does not accept user code (the operator sets FEDTUNE_ALLOW_CODE_UPLOAD"
            "=true, Helm value codeUpload.enabled); uploaded code runs with the driver's rights"
        )


def require_code_sandbox(settings: Settings) -> None:
    """Refuse to start a service that would run uploaded code unsandboxed without being told to.

    Args:
        settings: the service's settings.

    Raises:
        ConfigError: code upload is on, ``FEDTUNE_CODE_SANDBOX`` is not ``none`` and no sandbox
            can be made here, or (``local`` backend) a sandboxed driver's routes to the API and
            MLflow do not work here (one line: what is missing, and the two ways out).
    """
    if not settings.allow_code_upload or settings.code_sandbox == SandboxMode.NONE:
        return
    missing = sandbox_missing()
    if missing is not None:
        raise ConfigError(
            "FEDTUNE_CODE_SANDBOX",
            f"code upload is on but no sandbox can be made: {missing}; install bubblewrap, "
            "or set FEDTUNE_CODE_SANDBOX=none to run uploaded code as the service's own user",
        )
    from fedtune.sandbox_net import network_missing  # a local driver's only way out

    net = network_missing() if settings.backend == BackendKind.LOCAL else None
    if net is not None:
        raise ConfigError(
            "FEDTUNE_CODE_SANDBOX",
            f"code upload is on but a local driver's sandbox cannot be given a network of its "
            f"own that reaches only the API and MLflow: {net}; bubblewrap must make network "
            "namespaces here, or set FEDTUNE_CODE_SANDBOX=none to run uploaded code as the "
            "service's own user",
        )


def code_sandbox_state(settings: Settings) -> str | None:
    """How uploaded code is isolated, as ``/readyz`` and the start-up log say it.

    Args:
        settings: the service's settings.

    Returns:
        None with code upload off; else ``bwrap``, or a ``none: …`` warning.
    """
    if not settings.allow_code_upload:
        return None
    if settings.code_sandbox == SandboxMode.NONE:
        return "none: uploaded code runs unsandboxed, as the service's own user"
    return str(settings.code_sandbox)


def upload_code(ctx: Any, data: bytes, project: str = DEFAULT_PROJECT) -> CodeOut:
    """Store a code package (content-addressed) for ``project``; ``created`` is False for code
    that project uploaded before. The bytes are stored once whoever uploads them, but a package
    belongs to the projects that uploaded it: another project's study cannot name it by its
    digest — it uploads it too (``created`` True for it, nothing is copied)."""
    _enabled(ctx)
    check_package(data, max_bytes=ctx.settings.max_code_bytes, field="code")
    digest = sha256_of(data)
    for _ in range(2):  # a concurrent upload of the same code may win the insert: once more
        try:
            with ctx.db.session() as session:
                repo = Repository(session)
                created = not repo.owns_code_package(digest, project)
                repo.put_code_package(digest, data)
                repo.own_code_package(digest, project)
            break
        except ConflictError:
            created = False
    bound = ctx.settings.code_check_timeout_s
    return CodeOut(sha256=digest, size=len(data), created=created, check_timeout_s=bound)


def code_reference(code: Any) -> tuple[str, list[Any]]:
    """``(sha256, modules)`` of a submitted ``code`` section; the service never reads a path."""
    code = as_mapping(code, "code", what=" {sha256, modules}")
    if code.get("path") is not None:
        raise ConfigError(
            "code.path",
            "the service does not read files of its own disk; upload the package "
            "(fedtune submit --code DIR, Client.submit(spec, code=DIR))",
        )
    unknown = sorted(set(code) - {"sha256", "modules", "path"})
    if unknown:
        raise ConfigError(f"code.{unknown[0]}", unknown_key(unknown[0], ("sha256", "modules")))
    digest = code.get("sha256")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise ConfigError("code.sha256", "must be the 64 hex digits of an uploaded package")
    modules = code.get("modules")
    if not isinstance(modules, list) or not modules:
        raise ConfigError("code.modules", "must list the modules to import")
    return digest, modules


def accept_code_study(
    ctx: Any, body: Mapping[str, Any], project: str = DEFAULT_PROJECT
) -> tuple[AcceptedSpec, str]:
    """Validate a spec with uploaded code in a sandbox; ``(accepted, sha256)``. The package
    must have been uploaded for the study's ``project`` (else it is unknown, as no package)."""
    _enabled(ctx)
    digest, modules = code_reference(body["code"])
    spec = {**body, "code": {"modules": modules}}
    service_rules(parse_spec(spec), ctx.settings)
    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        package = repo.get_code_package(digest) if repo.owns_code_package(digest, project) else None
    if package is None:
        raise ConfigError(
            "code.sha256", "no uploaded package has this digest; upload it first (POST /v1/code)"
        )
    passed = getattr(ctx, "passed_checks", None)
    key = passed.key(project, digest, spec, ctx.settings) if passed is not None else ""
    document = passed.get(key) if passed is not None else None
    if document is not None:  # this code and spec passed here before: its answer, checked again
        log.info(
            "code check of package %s for a study of project %s: passed before",
            digest[:12],
            project,
        )
        return accepted_answer(spec, document, ctx.settings), digest
    log.info(
        "code check of package %s for a study of project %s: started (at most %g s)",
        digest[:12],
        project,
        ctx.settings.code_check_timeout_s,
    )
    accepted = check_in_sandbox(spec, package, ctx.settings)  # raises unless it passed
    if passed is not None:
        passed.put(key, accepted.document)
    return accepted, digest


def study_code_zip(ctx: Any, study_id: str, token: str) -> bytes:
    """The package of ``study_id`` wrapped for Ray's remote ``working_dir`` (one top folder)."""
    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        study = repo.get_study(study_id)
        digest = study.code_sha256 if study is not None else None
        package = repo.get_code_package(digest) if digest else None
    if package is None:
        raise StudyNotFoundError(f"no study {study_id!r} with a code package")
    if not verify_code_token(code_url_key(ctx.settings), study_id, digest, token):
        # as for a study without code: a wrong credential tells nothing (no existence oracle)
        raise StudyNotFoundError(f"no study {study_id!r} with a code package")
    return wrap_single_top_level(package)
