"""Check a study with uploaded code in a *subprocess* (user code never runs in the API process).

``POST /v1/studies`` with ``code.sha256`` extracts the package into a scratch directory and runs

    python -P -m fedtune.service.code_check REQUEST.json RESULT.json

with a time limit (``FEDTUNE_CODE_CHECK_TIMEOUT_S``) and an environment without the service's
secrets (no API token, database URL, code URL key or Ray token). The child imports
``code.modules`` from the package (``fedtune.trainers.code.load_code``: syntax errors, import
errors, exceptions at import and invalid registrations carry the ``file:line`` of the error),
then validates the whole spec as the driver will (``accept_spec``: task, model, algorithm and
search space must be registered), and writes either the accepted document or
``{field, reason, location}``. The parent turns a failure into ``CodeError`` (422 naming the
field and the file:line); a child that runs out of time is killed and answered the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedtune.errors import ConfigError

__all__ = ["CheckedCode", "check_in_subprocess", "main"]

#: variables of the service the child must not see (it runs code the service does not trust)
_PRIVATE = (
    "FEDTUNE_API_TOKEN",
    "FEDTUNE_DATABASE_URL",
    "FEDTUNE_CODE_URL_KEY",
    "RAY_AUTH_TOKEN",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "AWS_SECRET_ACCESS_KEY",
    "PGPASSWORD",
)


def _code_error(field: str, reason: str, location: str | None = None) -> ConfigError:
    try:
        from fedtune.errors import CodeError  # the extension API's error (file:line)
    except ImportError:
        return ConfigError(field, f"{reason} (at {location})" if location else reason)
    return CodeError(field, reason, location)


class CheckedCode(dict):
    """What the child accepted: ``document`` (normalised spec) and the summary fields."""


def check_in_subprocess(
    spec: Mapping[str, Any], package: bytes, *, timeout_s: float, scratch: Path
) -> CheckedCode:
    """Extract ``package``, validate ``spec`` against it in a child process; raise the
    child's error (``CodeError``/``ConfigError``) or return what it accepted."""
    from fedtune.code_package import extract

    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="code-check-", dir=scratch) as tmp:
        root = extract(package, Path(tmp) / "code")
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(json.dumps({"spec": dict(spec), "root": str(root)}))
        env = {k: v for k, v in os.environ.items() if k not in _PRIVATE}
        env.setdefault("OMP_NUM_THREADS", "1")
        argv = [sys.executable, "-P", "-m", "fedtune.service.code_check", str(request), str(result)]
        try:
            proc = subprocess.run(
                argv,
                env=env,
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise _code_error(
                "code.modules", f"importing and checking the code took longer than {timeout_s:g} s"
            ) from None
        if not result.is_file():
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise _code_error("code", f"the code check exited {proc.returncode}: {tail[0][:500]}")
        answer = json.loads(result.read_text())
    if not answer.get("ok"):
        raise _code_error(answer["field"], answer["reason"], answer.get("location"))
    return CheckedCode(answer)


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
        from fedtune.tuning.preflight import preflight
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
    summary = {k: v for k, v in accepted.__dict__.items() if k != "document"}
    return {"ok": True, "document": document, "summary": summary}


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
