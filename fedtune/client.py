"""The Python SDK: a thin typed client of the fedtune service (only speaks HTTP).

    from fedtune.client import Client

    client = Client("http://127.0.0.1:8000", token=None)
    study = client.submit("examples/study-quadratic.yaml")     # dict, YAML/JSON path or StudySpec
    study = client.submit("study.yaml", code="./my_lab")       # with user code (uploaded, zipped)
    study.wait(progress=True, timeout=600)                     # live progress on stderr
    study.trials(); study.curve(0); study.best(); study.tradeoff(); study.cancel()
    page = client.list_studies(state=["queued", "running"], project="vision", limit=50)
    more = client.list_studies(state=["queued", "running"], project="vision",
                               page_token=page.next_page_token)      # None on the last page
    for s in client.iter_studies(order="asc"): ...                 # every study, page by page

Shape taken from httpx: all I/O goes through one ``httpx.Client`` whose *transport* is
injectable, so tests drive the real app in-process (``fastapi.testclient.TestClient(app)._transport``
or any ``httpx.BaseTransport``). Errors are the service's typed exceptions, rebuilt from the
stable ``code`` of the answer (``fedtune.wire.exception_from_body``; the SDK imports no server
module, so ``pip install fedtune`` is enough):
``ConfigError`` (422, with ``field``), ``StudyNotFoundError`` (404), ``IllegalStateChangeError``
(409), ``UnauthorizedError`` (401), ``ForbiddenError`` (403) …

Connection errors and 5xx answers are retried with exponential backoff (``backoff_s · 2^k``).
That is safe for every call: reads are idempotent, cancelling a cancelled study is a no-op, and
``submit`` sends an ``Idempotency-Key`` (one random key per call, reused by its retries), so a
retried submission never creates a second study. After the
last retry the SDK raises the service's last error (e.g. ``DatabaseUnavailableError``) or,
when nothing answered, ``ServiceUnreachableError``.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO

import httpx

from fedtune.errors import ConfigError, FedtuneError, ServiceUnreachableError
from fedtune.states import StudyState, TrialState
from fedtune.wire import exception_from_body

__all__ = [
    "BestTrial",
    "Client",
    "CurvePoint",
    "Progress",
    "Study",
    "StudyPage",
    "StudyStatus",
    "TradeOff",
    "TrialInfo",
]


#: the SDK packs up to this much; the service refuses above FEDTUNE_MAX_CODE_BYTES (413)
MAX_PACKAGE_BYTES = 1 << 30


def _build(cls: type, data: Mapping[str, Any]) -> Any:
    """A dataclass from a JSON object; keys this SDK version does not know are kept in ``extra``
    (a newer service's fields are never dropped)."""
    names = {f.name for f in fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    return cls(**known, extra={k: v for k, v in data.items() if k not in names})


def _time(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


@dataclass(frozen=True)
class Progress:
    requested: int
    finished: int
    completed: int
    pruned: int
    failed: int
    killed: int
    running: int
    fraction: float
    extra: dict[str, Any] = field(default_factory=dict)  # fields unknown to this SDK


@dataclass(frozen=True)
class BestTrial:
    number: int
    value: float | None
    params: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)  # fields unknown to this SDK


@dataclass(frozen=True)
class StudyStatus:
    id: str
    name: str
    state: StudyState
    algorithm: str
    task: str
    trials_requested: int
    progress: Progress
    best: BestTrial | None
    mlflow: dict[str, Any]
    error: str | None = None
    attempts: int = 0
    backend: str | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    code_sha256: str | None = None
    project: str | None = None
    owner: str | None = None
    priority: int = 0
    queued_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields unknown to this SDK

    @property
    def done(self) -> bool:
        return self.state.terminal

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StudyStatus:
        body = dict(data)
        body["state"] = StudyState(body["state"])
        body["progress"] = _build(Progress, body["progress"])
        body["best"] = _build(BestTrial, body["best"]) if body.get("best") else None
        for key in ("created_at", "updated_at", "started_at", "finished_at", "heartbeat_at"):
            body[key] = _time(body.get(key))
        return _build(cls, body)


@dataclass(frozen=True)
class TrialInfo:
    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None
    outcome: str | None
    last_round: int
    mlflow_run_id: str | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields unknown to this SDK

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialInfo:
        body = dict(data, state=TrialState(data["state"]))
        body["started_at"], body["finished_at"] = (
            _time(data.get("started_at")), _time(data.get("finished_at")),
        )  # fmt: skip
        return _build(cls, body)


@dataclass(frozen=True)
class CurvePoint:
    round: int
    metrics: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)  # fields unknown to this SDK


@dataclass(frozen=True)
class TradeOff:
    """Pareto set (trial numbers) and lower envelope of a study (∞ is ``None``); once the study
    has ended, exactly MLflow's ``tradeoff/tradeoff.json``."""

    metric: str
    targets: list[float | None]
    pareto_target: float | None
    pareto: list[int]
    envelope: list[dict[str, Any]]
    trials: list[dict[str, Any]]
    regime_changes: list[dict[str, Any]]
    last_rounds: int = 10
    smooth_window: int = 5
    notes: dict[str, str] = field(default_factory=dict)
    start_loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields unknown to this SDK


@dataclass(frozen=True)
class StudyPage:
    """One page of ``GET /v1/studies``: summaries (no progress, best or MLflow links) and the
    token of the next page (None on the last)."""

    items: list[StudyStatus]
    total: int | None
    limit: int
    offset: int
    next_page_token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields unknown to this SDK

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StudyPage:
        items = [StudyStatus.from_json(_with_defaults(s)) for s in data["items"]]
        return _build(cls, {**data, "items": items})


#: one state, several, or None (all)
States = StudyState | str | Sequence[StudyState | str] | None


class Client:
    """A client of one fedtune service (``url``), authenticated by ``token`` when given."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers["User-Agent"] = "fedtune-sdk"
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self.retries, self.backoff_s, self._sleep = retries, backoff_s, sleep

    # ---------------------------------------------------------------- plumbing

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API call with retries; the decoded JSON answer or a typed exception."""
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                answer = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                last = exc
                continue
            if answer.is_server_error:
                last = exception_from_body(answer.status_code, _decode(answer))
                continue
            if answer.is_error:
                raise exception_from_body(answer.status_code, _decode(answer))
            return _decode(answer)
        if isinstance(last, FedtuneError):
            raise last  # the service answered, with an error, every time
        raise ServiceUnreachableError(
            f"{method} {path}: no answer after {self.retries + 1} attempts ({last})"
        ) from last

    # ---------------------------------------------------------------- studies

    def submit(
        self, spec: Any, *, code: str | Path | None = None, idempotency_key: str | None = None
    ) -> Study:
        """Submit a study (dict, path of a YAML/JSON file, or an object with ``to_dict()``).

        User code — ``code`` (a directory or wheel), else the spec's ``code.path`` (relative to
        the spec file) — is packed, uploaded (:meth:`upload_code`) and named by its digest:
        the spec goes out as ``code: {sha256, modules}``.
        """
        body = _spec_body(spec)
        base = Path(spec).parent if isinstance(spec, str | Path) else Path.cwd()
        section = body.get("code")
        if code is not None or (isinstance(section, Mapping) and section.get("path")):
            modules = section.get("modules") if isinstance(section, Mapping) else None
            if not modules:
                raise ConfigError(
                    "code.modules", "name the modules to import: code: {modules: [...]}"
                )
            path = Path(code) if code is not None else base / str(section["path"])
            project = body.get("project") or "default"  # the package is the project's
            body["code"] = {"sha256": self.upload_code(path, project=project),
                            "modules": list(modules)}  # fmt: skip
        key = idempotency_key or uuid.uuid4().hex
        data = self.request("POST", "/v1/studies", json=body, headers={"Idempotency-Key": key})
        return Study(self, data["id"])

    def upload_code(self, path: str | Path, project: str = "default") -> str:
        """Pack a directory (or take a wheel/zip) and upload it for ``project``; its SHA-256.
        Identical code is stored once by the service, so uploading again is cheap and safe to
        retry; a package belongs to the projects that uploaded it."""
        from fedtune.code_package import pack

        package = pack(path, max_bytes=MAX_PACKAGE_BYTES)  # the service applies its own limit
        answer = self.request("POST", "/v1/code", content=package.data, params={"project": project},
                              headers={"Content-Type": "application/zip"})  # fmt: skip
        if answer.get("sha256") != package.sha256:
            raise ConfigError("code", "the service stored a different digest than was sent")
        return package.sha256

    def study(self, study_id: str) -> Study:
        return Study(self, study_id)

    def studies(
        self, state: StudyState | str | None = None, limit: int = 50, offset: int = 0,
        project: str | None = None,
    ) -> list[StudyStatus]:
        """The studies this caller may read (of ``project`` only, when given), newest first:
        one page by offset. :meth:`list_studies` and :meth:`iter_studies` page by token."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        params.update(_list_filters(state, project))
        page = self.request("GET", "/v1/studies", params=params)
        return [StudyStatus.from_json(_with_defaults(s)) for s in page["items"]]

    def list_studies(
        self, state: States = None, project: str | None = None, *, limit: int = 50,
        page_token: str | None = None, order: str = "desc", include_total: bool | None = None,
    ) -> StudyPage:
        """One page of the studies this caller may read: in one of ``state`` (one or several),
        of ``project``, by creation time (``order`` ``desc``: newest first, or ``asc``).
        Pass the answer's ``next_page_token`` as ``page_token`` for the next page (same filters
        and order); it is None on the last page. ``total`` is counted on a first page, or
        when ``include_total``."""
        params: dict[str, Any] = {"limit": limit, "order": order, **_list_filters(state, project)}
        if page_token is not None:
            params["page_token"] = page_token
        if include_total is not None:
            params["include_total"] = "true" if include_total else "false"
        return StudyPage.from_json(self.request("GET", "/v1/studies", params=params))

    def iter_studies(
        self, state: States = None, project: str | None = None, *, order: str = "desc",
        page_size: int = 100,
    ) -> Iterator[StudyStatus]:
        """Every study matching the filters, one page (``page_size``) fetched at a time by
        following ``next_page_token``; no study twice, none skipped while others are submitted."""
        token: str | None = None
        while True:
            page = self.list_studies(state, project, limit=page_size, page_token=token,
                                     order=order, include_total=False)  # fmt: skip
            yield from page.items
            token = page.next_page_token
            if token is None:
                return

    # ---------------------------------------------------------------- discovery

    def algorithms(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/algorithms")

    def tasks(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/tasks")

    def search_spaces(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/search-spaces")

    # ---------------------------------------------------------------- identity (issue 20)

    def whoami(self) -> dict[str, Any]:
        """``{name, admin, projects: {project: role}, via}`` of this client's token."""
        return self.request("GET", "/v1/whoami")

    def users(self) -> list[dict[str, Any]]:
        """Every user with roles and live token ids (admins only)."""
        return self.request("GET", "/v1/users")

    def create_user(self, name: str, project: str | None = None, role: str = "member", *,
                    admin: bool = False, expires_in_days: float | None = None) -> dict[str, Any]:  # fmt: skip
        """A new user and its first token (``token``: shown once). Admins only."""
        body = {"name": name, "project": project, "role": role, "admin": admin,
                "expires_in_days": expires_in_days}  # fmt: skip
        return self.request("POST", "/v1/users", json=body)

    def new_token(self, user: str, expires_in_days: float | None = None) -> dict[str, Any]:
        """Another token for ``user`` (rotation; a user may make its own)."""
        return self.request("POST", f"/v1/users/{user}/tokens",
                            json={"expires_in_days": expires_in_days})  # fmt: skip

    def revoke(self, user: str, token_id: str | None = None) -> int:
        """Revoke ``user``'s tokens (or one); how many were live. Admins only."""
        return self.request("POST", f"/v1/users/{user}/revoke", json={"token_id": token_id})[
            "revoked"
        ]

    def set_role(self, user: str, project: str, role: str = "member") -> dict[str, Any]:
        return self.request("PUT", f"/v1/users/{user}/projects/{project}", json={"role": role})

    def projects(self) -> list[dict[str, Any]]:
        """The projects this caller belongs to (an admin: all), with quotas."""
        return self.request("GET", "/v1/projects")

    def project(self, name: str) -> dict[str, Any]:
        """A project's quota and usage now."""
        return self.request("GET", f"/v1/projects/{name}")

    def create_project(self, name: str) -> dict[str, Any]:
        return self.request("POST", "/v1/projects", json={"name": name})

    def set_quota(self, name: str, **quota: float | int | None) -> dict[str, Any]:
        """``gpus``, ``trials``, ``studies``, ``weight``, ``max_priority`` (None: unlimited)."""
        return self.request("PUT", f"/v1/projects/{name}/quota", json=quota)


def _list_filters(state: States, project: str | None) -> dict[str, Any]:
    """Query parameters of a list: ``state`` repeated once per state."""
    params: dict[str, Any] = {}
    if state is not None:
        many = [state] if isinstance(state, str | StudyState) else list(state)
        known = {str(s) for s in StudyState}
        wrong = [str(s) for s in many if str(s) not in known]
        if wrong:
            raise ConfigError("state", f"no study state {wrong[0]!r}; one of {sorted(known)}")
        params["state"] = [str(s) for s in many]
    if project is not None:
        params["project"] = project
    return params


def _with_defaults(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A list item has no progress/best/mlflow: fill neutral values."""
    zero = {k: 0 for k in ("finished", "completed", "pruned", "failed", "killed", "running")}
    progress = {"requested": summary.get("trials_requested", 0), **zero, "fraction": 0.0}
    return {"progress": progress, "best": None, "mlflow": {}, **summary}


def _decode(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return {"error": {"code": "", "message": answer.text[:500] or answer.reason_phrase}}


def _spec_body(spec: Any) -> dict[str, Any]:
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, str | Path):
        path = Path(spec)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError("<file>", f"cannot read the study spec: {exc}", str(path)) from None
        import yaml

        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        if not isinstance(data, Mapping):
            raise ConfigError("<root>", "a study spec is a mapping", str(path))
        return dict(data)
    if hasattr(spec, "to_dict"):
        return dict(spec.to_dict())
    raise ConfigError("spec", f"expected a mapping, a file path or a StudySpec, got {type(spec)}")


class Study:
    """Handle on one study of the service."""

    def __init__(self, client: Client, study_id: str) -> None:
        self.client, self.id = client, study_id

    def __repr__(self) -> str:
        return f"Study({self.id!r})"

    def _get(self, suffix: str = "", **kwargs: Any) -> Any:
        return self.client.request("GET", f"/v1/studies/{self.id}{suffix}", **kwargs)

    def status(self) -> StudyStatus:
        return StudyStatus.from_json(self._get())

    def wait(
        self,
        progress: bool = True,
        timeout: float | None = None,
        *,
        poll_s: float = 1.0,
        stream: TextIO | None = None,
    ) -> StudyStatus:
        """Poll until the study finishes; ``TimeoutError`` after ``timeout`` seconds."""
        stream = stream or sys.stderr
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = ""
        while True:
            status = self.status()
            if progress:
                line = _progress_line(status)
                if line != shown:
                    print(line, file=stream, flush=True)
                    shown = line
            if status.done:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"study {self.id} still {status.state} after {timeout} s")
            time.sleep(poll_s)

    def trials(self, state: TrialState | str | None = None) -> list[TrialInfo]:
        params = {"state": str(TrialState(state))} if state is not None else None
        return [TrialInfo.from_json(t) for t in self._get("/trials", params=params)]

    def curve(self, number: int) -> list[CurvePoint]:
        body = self._get(f"/trials/{int(number)}/curve")
        return [_build(CurvePoint, p) for p in body["rounds"]]

    def tradeoff(self) -> TradeOff:
        return _build(TradeOff, self._get("/tradeoff"))

    frontier = tradeoff

    def best(self) -> BestTrial | None:
        return self.status().best

    def cancel(self) -> StudyStatus:
        return StudyStatus.from_json(self.client.request("POST", f"/v1/studies/{self.id}/cancel"))


def _progress_line(status: StudyStatus) -> str:
    p, best = status.progress, ""
    if status.best is not None and status.best.value is not None:
        best = f", best {status.best.value:.6g} (trial {status.best.number})"
    return (
        f"study {status.name} [{status.id}] {status.state}: {p.finished}/{p.requested} trials "
        f"finished, {p.running} running{best}"
    )
