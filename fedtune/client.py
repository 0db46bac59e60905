"""The Python SDK: a thin typed client of the fedtune service (only speaks HTTP).

    from fedtune.client import Client

    client = Client("http://127.0.0.1:8000", token=None)
    study = client.submit("examples/quickstart.yaml")          # dict, YAML/JSON path or StudySpec
    study = client.submit("study.yaml", code="./my_lab")       # with user code (uploaded, zipped)
    study = client.submit("study.yaml", project="vision")      # over the spec's project:
    study.wait(progress=True, timeout=600)                     # live progress on stderr
    study.trials(); study.curve(0); study.best(); study.tradeoff(); study.cancel()
    fedavg, fedprox = client.submit_methods("methods.yaml")      # algorithm: [fedavg, fedprox]
    client.compare([fedavg.id, fedprox.id], record=True)       # envelopes, matched budgets
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

Connection errors, timeouts, 5xx and 429 answers are retried with exponential backoff
(``backoff_s · 2^k``, or the answer's ``Retry-After`` when longer). That is safe for every call:
reads are idempotent, cancelling a cancelled study is a no-op, and ``submit`` sends an
``Idempotency-Key`` (one random key per call, reused by its retries), so a retried submission
never creates a second study, and one that arrives while the first is still being checked waits
for that check's answer (``docs/explanation/idempotency.md``). A submission waits for its answer
at least as long as the service's check of uploaded code may take (:data:`SUBMIT_MARGIN_S` more
than the bound the service announces on upload, else than :data:`CHECK_BOUND_S`). After the last
retry the SDK raises the service's last error (e.g. ``DatabaseUnavailableError``) or, when
nothing answered, ``ServiceUnreachableError`` naming the URL it tried.

Configuration errors are never retried and say what to change, in one line naming the setting
(:mod:`fedtune.client_errors`): a URL without a scheme or ending in ``/v1``, a token with
whitespace or a non-ASCII character (refused when the client is made), TLS against a plain-HTTP
server and the reverse, an HTML page (``FEDTUNE_URL`` is the MLflow UI's?), a 404 of a route every
service has. No error the client raises shows its token, an ``Authorization`` header or a
password it received: every message passes :func:`fedtune.redact.mask`, and none chains an
``httpx`` error.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from fedtune.client_http import ServiceHttp
from fedtune.client_settings import SettingNames, shown
from fedtune.client_study import Study, StudyOfMethods, StudyStatus, TrialInfo
from fedtune.errors import ConfigError, as_mapping
from fedtune.results import Comparison, TradeOff
from fedtune.states import StudyState
from fedtune.wire_models import (
    AlgorithmOut,
    BestTrial,
    CurvePoint,
    Identity,
    MembershipOut,
    MethodGroupOut,
    MlflowLinks,
    MlflowLoginOut,
    Progress,
    ProjectDetail,
    ProjectOut,
    Revoked,
    SearchSpaceOut,
    StudyOut,
    StudyPage,
    TaskOut,
    TokenOut,
    UserOut,
)

__all__ = [
    "BestTrial",
    "Client",
    "Comparison",
    "CurvePoint",
    "MethodGroup",
    "MlflowLinks",
    "Progress",
    "Study",
    "StudyOfMethods",
    "StudyOut",
    "StudyPage",
    "StudyStatus",
    "TradeOff",
    "TrialInfo",
]


#: the SDK packs up to this much; the service refuses above FEDTUNE_MAX_CODE_BYTES (413)
MAX_PACKAGE_BYTES = 1 << 30
#: the bound of the service's check of uploaded code assumed until the service tells its own
#: (``FEDTUNE_CODE_CHECK_TIMEOUT_S``' default; an upload's answer carries the service's)
CHECK_BOUND_S = 60.0
#: how much longer than that bound a submission waits for its answer (the check's start, the
#: service's own margin, the network)
SUBMIT_MARGIN_S = 30.0


#: the SDK's name of a study of methods' answer (:mod:`fedtune.wire_models`, shared with the
#: service; a study's answers' names, ``StudyStatus`` and ``TrialInfo``, are in
#: :mod:`fedtune.client_study`)
MethodGroup = MethodGroupOut


#: one state, several, or None (all)
States = StudyState | str | Sequence[StudyState | str] | None


class Client:
    """A client of one fedtune service.

    Args:
        url: The service's base URL (its root: the client adds ``/v1``).
        token: A bearer token (None: send none).
        transport: The ``httpx`` transport to use (tests pass an in-process app's).
        timeout: Seconds to wait for each answer (a submission waits longer: module docstring).
        retries: How many times a connection error, a timeout, a 5xx or a 429 is retried.
        backoff_s: The first retry's delay; it doubles with each retry.
        sleep: The function that waits between retries.
        names: What error messages call the URL and the token (the CLI: the variable or option
            each came from, e.g. ``FEDTUNE_URL``).

    Raises:
        ConfigError: ``url`` or ``token`` cannot work (no scheme, ``/v1`` at the end, a token
            with whitespace or a non-ASCII character), naming the setting, never the token.

    Example:
        ```python
        with Client("http://127.0.0.1:8000", token="...") as client:
            study = client.submit("examples/quickstart.yaml")
            print(study.wait().state, study.best())
        ```
    """

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
        names: SettingNames | None = None,
    ) -> None:
        self.http = ServiceHttp(
            url,
            token,
            transport=transport,
            timeout=timeout,
            retries=retries,
            backoff_s=backoff_s,
            sleep=sleep,
            names=names,
        )
        #: the bound of the service's check of uploaded code (its own, once an upload told it)
        self.check_bound_s = CHECK_BOUND_S

    # ---------------------------------------------------------------- plumbing

    def close(self) -> None:
        """Close the client's HTTP connections."""
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({shown(self.http.url)!r})"

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Make one API call (:meth:`fedtune.client_http.ServiceHttp.request`: retries, and
        errors that name the setting to change and never show a credential).

        Args:
            method: The HTTP method.
            path: The route, e.g. ``/v1/studies``.
            **kwargs: Passed on to ``httpx.Client.request`` (``json``, ``params``, ``headers``,
                ``timeout`` …).

        Returns:
            The decoded JSON answer.
        """
        return self.http.request(method, path, **kwargs)

    # ---------------------------------------------------------------- studies

    def submit(
        self,
        spec: Any,
        *,
        code: str | Path | None = None,
        project: str | None = None,
        idempotency_key: str | None = None,
    ) -> Study:
        """Submit a study, uploading its user code first when it has some.

        Args:
            spec: A mapping, the path of a YAML/JSON file, or an object with ``to_dict()``.
            code: User code to upload, a directory or wheel (default: the spec's ``code.path``,
                relative to the spec file); the spec goes out naming it by its SHA-256.
            project: The project to submit to, over the spec's ``project:``; neither: the
                service's choice (your only project; an admin's: ``default``).
            idempotency_key: The request's key (default: a new random one, reused by retries).

        Returns:
            The handle of the new study (or of the one this key created before).

        Raises:
            ConfigError: The spec cannot be read, or has code without ``code.modules``; the
                service refused it (422, naming the field).
            FedtuneError: Any other error answer of the service.
        """
        body = _spec_body(spec)
        if project is not None:
            body["project"] = project
        base = Path(spec).parent if isinstance(spec, str | Path) else Path.cwd()
        section = body.get("code")
        if code is not None or (isinstance(section, Mapping) and section.get("path")):
            modules = section.get("modules") if isinstance(section, Mapping) else None
            if not modules:
                raise ConfigError(
                    "code.modules", "name the modules to import: code: {modules: [...]}"
                )
            path = Path(code) if code is not None else base / str(section["path"])
            # the package is the project's; None: the project the service picks for the study
            body["code"] = {
                "sha256": self.upload_code(path, project=body.get("project")),
                "modules": list(modules),
            }
        return Study(self, self._submission("/v1/studies", body, idempotency_key)["id"])

    def _submission(self, path: str, body: dict[str, Any], key: str | None) -> Any:
        """POST a submission with its Idempotency-Key (a new one: None), waiting for its answer
        as long as the service's check may take (:meth:`submit_timeout`)."""
        headers = {"Idempotency-Key": key or uuid.uuid4().hex}
        return self.request("POST", path, json=body, headers=headers, timeout=self.submit_timeout())

    def submit_timeout(self) -> httpx.Timeout:
        """The answer timeout of a submission: it covers the service's check of uploaded code.

        Returns:
            The client's timeout, but at least :data:`SUBMIT_MARGIN_S` more than the check's
            bound (the service's, as its last upload's answer said; else :data:`CHECK_BOUND_S`)
            for reading the answer, so that no retry goes out while the check runs.
        """
        read = max(self.http.timeout, self.check_bound_s + SUBMIT_MARGIN_S)
        return httpx.Timeout(self.http.timeout, read=read)

    def upload_code(self, path: str | Path, project: str | None = None) -> str:
        """Pack a directory (or take a wheel or zip) and upload it; safe to repeat.

        Args:
            path: A directory, wheel or zip.
            project: The project it is for (None: the one a submission without ``project:``
                goes to).

        Returns:
            The package's SHA-256, as the service stored it.

        Raises:
            ConfigError: The code cannot be packed, or the service stored another digest.
            FedtuneError: An error answer of the service (e.g. 403: uploads are disabled).
        """
        from fedtune.code_package import pack

        package = pack(path, max_bytes=MAX_PACKAGE_BYTES)  # the service applies its own limit
        params = {} if project is None else {"project": project}
        answer = self.request(
            "POST",
            "/v1/code",
            content=package.data,
            params=params,
            headers={"Content-Type": "application/zip"},
        )
        if answer.get("sha256") != package.sha256:
            raise ConfigError("code", "the service stored a different digest than was sent")
        bound = answer.get("check_timeout_s")
        if isinstance(bound, int | float) and bound > 0:
            self.check_bound_s = float(bound)  # the service's own bound (older ones say none)
        return package.sha256

    def study(self, study_id: str) -> Study:
        """Get the handle of an existing study (no request is made).

        Args:
            study_id: The study's id.

        Returns:
            The study's handle.
        """
        return Study(self, study_id)

    def compare(
        self, study_ids: Sequence[str], force: bool = False, record: bool = False
    ) -> Comparison:
        """Compare studies on one task (the service's ``GET /v1/compare``).

        Args:
            study_ids: Two or more study ids, each readable by this client.
            force: Compare them even when their task, data or objective differ.
            record: Also record the comparison as an MLflow run linked with the studies' parent
                runs (``POST /v1/compare``; needs the right to change every study); the run is
                the answer's ``mlflow``.

        Returns:
            Their lower envelopes, budget curves, Pareto sets, predictions and each one's best
            configuration at matched budgets.

        Raises:
            StudyNotFoundError: A study does not exist or is not this client's to read.
            ConfigError: Fewer than two studies, or studies that are not comparable and no
                ``force`` (the message names the differences).
        """
        params = {"studies": ",".join(study_ids), "force": str(bool(force)).lower()}
        method = "POST" if record else "GET"
        return Comparison.from_json(self.request(method, "/v1/compare", params=params))

    def submit_methods(
        self, spec: Any, *, project: str | None = None, idempotency_key: str | None = None
    ) -> list[Study]:
        """Submit a study of methods: one study per algorithm the spec's ``algorithm`` lists.

        Args:
            spec: A mapping, the path of a YAML/JSON file, or an object with ``to_dict()``;
                its ``algorithm`` lists names or ``{name: ..., search: {...}}``.
            project: The project to submit to, over the spec's ``project:``.
            idempotency_key: The request's key (default: a new random one, reused by retries).

        Returns:
            The new studies' handles, in the order the algorithms are listed; its ``group`` is
            the study of methods' id (:meth:`method_group`: the recorded comparison).

        Raises:
            ConfigError: The list or an algorithm's spec is invalid (no study is created).
        """
        body = _spec_body(spec)
        if project is not None:
            body["project"] = project
        data = self._submission("/v1/methods", body, idempotency_key)
        return StudyOfMethods([Study(self, s["id"]) for s in data["studies"]], data["group"])

    def method_group(self, group_id: str) -> MethodGroup:
        """Read a study of methods: its studies' states and, once all have ended, the MLflow
        run of their comparison (recorded by the service).

        Args:
            group_id: The id :meth:`submit_methods` returned (its ``group``).

        Returns:
            The group; ``comparison`` is None until the service has recorded it.

        Raises:
            NotFoundError: No such study of methods, or not this client's to read.
        """
        return MethodGroup.from_json(self.request("GET", f"/v1/methods/{group_id}"))

    def studies(
        self,
        state: StudyState | str | None = None,
        limit: int = 50,
        offset: int = 0,
        project: str | None = None,
    ) -> list[StudyOut]:
        """List one page, by offset, of the studies this caller may read, newest first.

        :meth:`list_studies` and :meth:`iter_studies` page by token instead.

        Args:
            state: Only studies in this state (None: all).
            limit: The page's size.
            offset: How many studies to skip.
            project: Only this project's studies (None: all the caller may read).

        Returns:
            The studies as summaries (:meth:`Study.status` has the details).

        Raises:
            ConfigError: ``state`` is no study state.
        """
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        params.update(_list_filters(state, project))
        page = self.request("GET", "/v1/studies", params=params)
        return StudyPage.from_json(page).items

    def list_studies(
        self,
        state: States = None,
        project: str | None = None,
        *,
        limit: int = 50,
        page_token: str | None = None,
        order: str = "desc",
        include_total: bool | None = None,
    ) -> StudyPage:
        """List one page of the studies this caller may read, by creation time.

        Args:
            state: Only studies in this state or these states (None: all).
            project: Only this project's studies (None: all the caller may read).
            limit: The page's size.
            page_token: The previous page's ``next_page_token`` (None: the first page); keep
                the same filters and order.
            order: ``desc`` (newest first) or ``asc``.
            include_total: Count ``total`` (None: on a first page only).

        Returns:
            The page; its ``next_page_token`` is None on the last page.

        Raises:
            ConfigError: ``state`` names no study state.
        """
        params: dict[str, Any] = {"limit": limit, "order": order, **_list_filters(state, project)}
        if page_token is not None:
            params["page_token"] = page_token
        if include_total is not None:
            params["include_total"] = "true" if include_total else "false"
        return StudyPage.from_json(self.request("GET", "/v1/studies", params=params))

    def iter_studies(
        self,
        state: States = None,
        project: str | None = None,
        *,
        order: str = "desc",
        page_size: int = 100,
    ) -> Iterator[StudyOut]:
        """Iterate over every matching study, fetching one page at a time.

        No study comes twice and none is skipped while others are submitted.

        Args:
            state: Only studies in this state or these states (None: all).
            project: Only this project's studies (None: all the caller may read).
            order: ``desc`` (newest first) or ``asc``.
            page_size: How many studies each request fetches.

        Yields:
            The studies, as summaries.

        Raises:
            ConfigError: ``state`` names no study state.
        """
        token: str | None = None
        while True:
            page = self.list_studies(
                state, project, limit=page_size, page_token=token, order=order, include_total=False
            )
            yield from page.items
            token = page.next_page_token
            if token is None:
                return

    # ---------------------------------------------------------------- discovery

    def algorithms(self) -> list[AlgorithmOut]:
        """List the algorithms the service offers.

        Returns:
            One object per algorithm, as ``GET /v1/algorithms`` answers.
        """
        return [AlgorithmOut.from_json(a) for a in self.request("GET", "/v1/algorithms")]

    def tasks(self) -> list[TaskOut]:
        """List the tasks the service offers.

        Returns:
            One object per task, as ``GET /v1/tasks`` answers.
        """
        return [TaskOut.from_json(t) for t in self.request("GET", "/v1/tasks")]

    def search_spaces(self) -> list[SearchSpaceOut]:
        """List the search spaces the service ships.

        Returns:
            One object per space, as ``GET /v1/search-spaces`` answers.
        """
        return [SearchSpaceOut.from_json(s) for s in self.request("GET", "/v1/search-spaces")]

    # ---------------------------------------------------------------- identity

    def whoami(self) -> Identity:
        """Say who this client's token authenticates.

        Returns:
            Its ``name``, ``admin``, ``projects`` (role per project) and ``via``.
        """
        return Identity.from_json(self.request("GET", "/v1/whoami"))

    def mlflow_login(self, user: str | None = None) -> MlflowLoginOut:
        """Make a new password of an MLflow UI login (the old one stops working).

        Args:
            user: whose login (default: this token's user; another user's: admins only).

        Returns:
            ``user``, ``workspaces``, ``password``: log into the MLflow UI as ``user`` with
            ``password`` (shown once: fedtune does not store it), in one of ``workspaces``.

        Raises:
            NotFoundError: the service keeps no MLflow workspaces (its MLflow has no logins).
        """
        name = user or self.whoami().name
        path = f"/v1/users/{quote(name, safe='')}/mlflow-login"
        answer = self.request("POST", path)
        if isinstance(answer, Mapping) and isinstance(answer.get("password"), str):
            self.http.keep_secret(answer["password"])  # no later error shows it
        return MlflowLoginOut.from_json(answer)

    def users(self) -> list[UserOut]:
        """List every user with its roles and live token ids (admins only).

        Returns:
            One object per user.
        """
        return [UserOut.from_json(u) for u in self.request("GET", "/v1/users")]

    def create_user(
        self,
        name: str,
        project: str | None = None,
        role: str = "member",
        *,
        admin: bool = False,
        expires_in_days: float | None = None,
    ) -> TokenOut:
        """Create a user and its first token (admins only).

        Args:
            name: The user's name.
            project: A project to make it a member of (None: none).
            role: Its role in ``project``.
            admin: Whether the user is an administrator.
            expires_in_days: The token's lifetime (None: it does not expire).

        Returns:
            The user, with its ``token`` (shown this once only).
        """
        body = {
            "name": name,
            "project": project,
            "role": role,
            "admin": admin,
            "expires_in_days": expires_in_days,
        }
        return TokenOut.from_json(self.request("POST", "/v1/users", json=body))

    def new_token(self, user: str, expires_in_days: float | None = None) -> TokenOut:
        """Create another token for ``user``, e.g. to rotate (a user may make its own).

        Args:
            user: The user's name.
            expires_in_days: The token's lifetime (None: it does not expire).

        Returns:
            The new token and its id.
        """
        body = {"expires_in_days": expires_in_days}
        return TokenOut.from_json(self.request("POST", f"/v1/users/{user}/tokens", json=body))

    def revoke(self, user: str, token_id: str | None = None) -> int:
        """Revoke all of ``user``'s tokens, or one (admins only).

        Args:
            user: The user's name.
            token_id: The one token to revoke (None: all of them).

        Returns:
            How many live tokens were revoked.
        """
        body = {"token_id": token_id}
        return Revoked.from_json(
            self.request("POST", f"/v1/users/{user}/revoke", json=body)
        ).revoked

    def set_role(self, user: str, project: str, role: str = "member") -> MembershipOut:
        """Give ``user`` a role in ``project``.

        Args:
            user: The user's name.
            project: The project's name.
            role: The role, e.g. ``member`` or ``viewer``.

        Returns:
            The user's membership as the service stored it.
        """
        path = f"/v1/users/{user}/projects/{project}"
        return MembershipOut.from_json(self.request("PUT", path, json={"role": role}))

    def projects(self) -> list[ProjectOut]:
        """List the projects this caller belongs to (an admin: all), with their quotas.

        Returns:
            One object per project.
        """
        return [ProjectOut.from_json(p) for p in self.request("GET", "/v1/projects")]

    def project(self, name: str) -> ProjectDetail:
        """Get a project's quota and its usage now.

        Args:
            name: The project's name.

        Returns:
            The project, its quota and usage.
        """
        return ProjectDetail.from_json(self.request("GET", f"/v1/projects/{name}"))

    def create_project(self, name: str) -> ProjectOut:
        """Create a project.

        Args:
            name: The project's name.

        Returns:
            The new project.
        """
        return ProjectOut.from_json(self.request("POST", "/v1/projects", json={"name": name}))

    def set_quota(self, name: str, **quota: float | int | None) -> ProjectOut:
        """Set a project's quota.

        Args:
            name: The project's name.
            **quota: Any of ``gpus``, ``trials``, ``studies``, ``gpu_hours``, ``weight`` and
                ``max_priority`` (None: unlimited).

        Returns:
            The project with its new quota.
        """
        return ProjectOut.from_json(self.request("PUT", f"/v1/projects/{name}/quota", json=quota))


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
        return dict(as_mapping(data, "<root>", str(path), what=" (a study spec)"))
    if hasattr(spec, "to_dict"):
        return dict(spec.to_dict())
    raise ConfigError("spec", f"expected a mapping, a file path or a StudySpec, got {type(spec)}")
