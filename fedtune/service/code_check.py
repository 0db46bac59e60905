"""Check a study with uploaded code in a *sandbox* (user code never runs in the API process).

``POST /v1/studies`` with ``code.sha256`` extracts the package into a scratch directory and runs

    python -P -m fedtune.service.code_check /sandbox/request.json /sandbox/out/result.json

in a bubblewrap sandbox (:mod:`fedtune.sandbox`: its own PID namespace, no network, the package
and the Python environment read-only, a private ``/tmp``, limits on CPU time, memory, file size
and processes; ``FEDTUNE_CODE_SANDBOX=none`` is the operator's opt-out) with a wall-clock limit
(``FEDTUNE_CODE_CHECK_TIMEOUT_S``) and the environment of :func:`.child_env.child_env`
(``code-check``: no variable of the service's but the locale and thread counts). The child imports
``code.modules`` from the package (``fedtune.trainers.code.load_code``: syntax errors, import
errors, exceptions at import and invalid registrations carry the ``file:line`` of the error),
validates the whole spec as the driver will (``accept_spec``: task, model, algorithm and search
space must be registered), builds the task and model once, and writes either the accepted
document or ``{field, reason, location}``.

The parent trusts nothing it reads back: the document is parsed again, the service's rules are
applied to it again, and its summary (name, project, priority, budget, resources) must be the
submission's; the summary the service stores is computed here, not taken from the child. A
failure becomes ``CodeError`` (422 naming the field and the file:line); a sandbox that runs out of
time, CPU or memory is killed with everything it started and answered the same way.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from fedtune.errors import ConfigError
from fedtune.sandbox import Limits, Sandbox, SandboxMode, prepare_for_sandbox, sandbox_uid

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["SANDBOX_ROOT", "accepted_answer", "check_in_sandbox", "main"]

#: where the package, the request and the answer are inside the sandbox
SANDBOX_ROOT = "/sandbox"
#: the summary fields the child's document must keep from the submission
_SUMMARY = ("name", "project", "priority", "experiment", "algorithm")
#: how a sandbox killed by a limit is told to the submitter
_SIGNALS = {
    signal.SIGXCPU: "used more CPU time than the code check allows",
    signal.SIGXFSZ: "wrote a file larger than the code check allows",
    signal.SIGKILL: "was killed (its memory, CPU time or processes ran out)",
}


def _code_error(field: str, reason: str, location: str | None = None) -> ConfigError:
    try:
        from fedtune.errors import CodeError  # the extension API's error (file:line)
    except ImportError:
        return ConfigError(field, f"{reason} (at {location})" if location else reason)
    return CodeError(field, reason, location)


def check_in_sandbox(spec: Mapping[str, Any], package: bytes, settings: Settings) -> Any:
    """Extract ``package`` and validate ``spec`` against it in a sandboxed child.

    Args:
        spec: the submitted spec, its ``code`` as ``{modules}``.
        package: the uploaded package (a zip).
        settings: the service's settings (sandbox mode, limits, time limit, workdir).

    Returns:
        The ``AcceptedSpec`` of the child's document, its summary computed here.

    Raises:
        ConfigError: the code or the spec was refused (``CodeError`` with ``file:line``), the
            check ran out of time or resources, or its answer is not the submitted spec.
    """
    from fedtune.code_package import extract

    from .child_env import ChildKind, child_env

    scratch = Path(settings.workdir).resolve() / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    timeout_s = settings.code_check_timeout_s
    with tempfile.TemporaryDirectory(prefix="code-check-", dir=scratch) as tmp:
        root = extract(package, Path(tmp) / "code")
        out = Path(tmp) / "out"
        out.mkdir()
        request = Path(tmp) / "request.json"
        env = child_env(settings, ChildKind.CODE_CHECK)
        if settings.code_sandbox == SandboxMode.NONE:
            inside_root, inside_out, inside_request = str(root), out, request
        else:
            inside_root = str(
                PurePosixPath(SANDBOX_ROOT, "code", root.relative_to(Path(tmp) / "code"))
            )
            inside_out, inside_request = Path(f"{SANDBOX_ROOT}/out"), f"{SANDBOX_ROOT}/request.json"
        request.write_text(json.dumps({"spec": dict(spec), "root": inside_root}))
        argv = [sys.executable, "-P", "-m", "fedtune.service.code_check"]
        argv += [str(inside_request), str(inside_out / "result.json")]
        try:
            proc = _run(argv, settings, env, tmp=Path(tmp), out=out, timeout_s=timeout_s)
        except subprocess.TimeoutExpired:
            raise _code_error(
                "code.modules", f"importing and checking the code took longer than {timeout_s:g} s"
            ) from None
        answer = _read_answer(out / "result.json", proc)
    if not answer.get("ok"):
        raise _code_error(
            str(answer.get("field") or "code"),
            str(answer.get("reason") or "refused"),
            answer.get("location") if isinstance(answer.get("location"), str) else None,
        )
    return accepted_answer(spec, answer.get("document"), settings)


def _run(
    argv: list[str],
    settings: Settings,
    env: dict[str, str],
    *,
    tmp: Path,
    out: Path,
    timeout_s: float,
) -> subprocess.CompletedProcess:
    """The check's child, sandboxed unless the operator opted out."""
    if settings.code_sandbox == SandboxMode.NONE:
        return subprocess.run(
            argv,
            env={**env, "PATH": "/usr/bin:/bin"},
            cwd=tmp,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    uid = sandbox_uid()
    prepare_for_sandbox(tmp / "code")
    prepare_for_sandbox(out, writable=True, uid=uid)
    prepare_for_sandbox(tmp / "request.json")
    box = Sandbox(
        read_only={tmp / "code": f"{SANDBOX_ROOT}/code", tmp / "request.json": argv[-2]},
        writable={out: f"{SANDBOX_ROOT}/out"},
        env=env,
        limits=Limits(
            cpu_s=max(1, int(timeout_s) + 1),
            memory_bytes=settings.code_sandbox_memory_mib << 20,
            processes=settings.code_sandbox_processes,
        ),
        uid=uid,
    )
    return box.run(argv, timeout_s=timeout_s)


def _read_answer(path: Path, proc: subprocess.CompletedProcess) -> dict[str, Any]:
    """The child's answer, or why there is none (a limit, a crash)."""
    if proc.returncode < 0 and -proc.returncode in _SIGNALS:
        raise _code_error("code", f"the code check {_SIGNALS[-proc.returncode]}")
    try:
        answer = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        answer = None
    if not isinstance(answer, dict):
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise _code_error("code", f"the code check exited {proc.returncode}: {tail[0][:500]}")
    return answer


def accepted_answer(spec: Mapping[str, Any], document: Any, settings: Settings) -> Any:
    """The child's document, checked again here: the service's rules, and the submission's
    summary unchanged (the child ran user code, so its answer is a claim, not a fact).

    Args:
        spec: the submitted spec, its ``code`` as ``{modules}``.
        document: the document a check answered (fresh, or a passed one remembered:
            :mod:`.code_check_cache`).
        settings: the service's settings (its rules).

    Returns:
        The ``AcceptedSpec`` of ``document``, its summary the submission's.

    Raises:
        ConfigError: ``document`` breaks a rule, or is not the submitted study.
    """
    from .specs import accepted_from, parse_spec, service_rules

    if not isinstance(document, dict):
        raise _code_error("code", "the code check answered no study document")
    submitted = accepted_from(parse_spec(spec), dict(spec))
    parsed = parse_spec(document)
    service_rules(parsed, settings)
    accepted = accepted_from(parsed, document)
    for name in (*_SUMMARY, "task", "trials", "max_concurrent", "cpu", "gpu", "pack"):
        if getattr(accepted, name) != getattr(submitted, name):
            raise _code_error(
                "code", f"the code check answered a study whose {name} is not the submitted one"
            )
    return accepted


# ---------------------------------------------------------------------- the child


def _location(exc: BaseException, root: str) -> str | None:
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(root)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def _load(code: dict[str, Any], root: str) -> None:
    try:
        from fedtune.trainers.code import load_code
    except ImportError:  # no extension API in this version: import the modules plainly
        import importlib

        sys.path.insert(0, root)
        for i, module in enumerate(code["modules"]):
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise _code_error(
                    f"code.modules[{i}]",
                    f"importing {module!r} raised {type(exc).__name__}: {exc}",
                    _location(exc, root),
                ) from exc
        return
    load_code(code)


def _check_task_registered(name: str, modules: list[str]) -> None:
    """The spec's task must exist once the code is imported (tasks are built lazily)."""
    from fedtune.trainers.tasks import task_names

    known = task_names()
    if name not in known:
        raise ConfigError(
            "task.name",
            f"unknown task {name!r}: {', '.join(modules)} registered no task of that name "
            f"(known: {', '.join(known)})",
        )


def _build_once(data: dict[str, Any]) -> None:
    """The task and model built once, as a trial would: a builder that
    raises is a 422 at submission, not a study whose every trial fails."""
    try:
        from fedtune.tuning.driver.preflight import preflight
    except ImportError:  # an older engine: its trials find out
        return
    from fedtune.tuning.spec import StudySpec

    preflight(StudySpec.from_dict(data))


def _relative(text: str | None, root: str) -> str | None:
    """Paths under the check's scratch copy (deleted when it ends) as the package names them:
    ``mypkg/methods.py:22``."""
    if text is None:
        return None
    root = root.rstrip("/")
    return text.replace(root + "/", "").replace(root, "the uploaded package")


def _check(spec: dict[str, Any], root: str) -> dict[str, Any]:
    from fedtune.service.specs import accept_spec
    from fedtune.tuning.spec import StudySpec

    modules = list((spec.get("code") or {}).get("modules") or [])
    data = {**spec, "code": {"path": root, "modules": modules}}
    if "code" not in StudySpec.model_fields:  # the spec has no code section: import here
        _load(data.pop("code"), root)
    accepted = accept_spec(data, rules=False)  # the parent applied service_rules
    _check_task_registered(accepted.task, modules)
    _build_once(data)
    document = dict(accepted.document)
    document["code"] = {"modules": modules}  # the scratch path means nothing later
    return {"ok": True, "document": document}


def main(argv: list[str] | None = None) -> int:
    request_path, result_path = (argv or sys.argv[1:])[:2]
    request = json.loads(Path(request_path).read_text())
    root = request["root"]
    try:
        answer = _check(request["spec"], root)
    except ConfigError as exc:
        reason = getattr(exc, "bare_reason", exc.reason)
        answer = {
            "ok": False,
            "field": exc.field,
            "reason": reason,
            "location": getattr(exc, "location", None) or _location(exc, root),
        }
    except BaseException as exc:  # anything user code raises outside load_code's net
        answer = {
            "ok": False,
            "field": "code",
            "reason": f"{type(exc).__name__}: {exc}",
            "location": _location(exc, root),
        }
    if not answer["ok"]:
        answer["reason"] = _relative(str(answer["reason"]), root)
        answer["location"] = _relative(answer["location"], root)
    Path(result_path).write_text(json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
