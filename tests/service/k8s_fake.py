"""A local stand-in for the Kubernetes API server, for the RayJob custom resource only.

It behaves as the API server does for the calls the kubernetes backend makes: bearer-token
authentication (401), ``POST/GET/LIST/DELETE /apis/ray.io/v1/namespaces/<ns>/rayjobs[/<name>]``,
bodies validated against KubeRay's CRD ``openAPIV3Schema`` (422 ``Invalid``), ``409
AlreadyExists`` on a second create, ``404 NotFound``, delete preconditions on ``uid`` (409), and
``Status`` objects for errors. Objects get a ``uid``, ``resourceVersion`` and
``creationTimestamp``; tests play the operator with :meth:`FakeKubeApi.set_status`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.needs import crd_dir

# `shared/` sits beside the checkout (../shared), as in the development and CI layouts
CRD = crd_dir() / "ray.io_rayjobs.yaml"
_PATH = re.compile(r"^/apis/ray\.io/v1/namespaces/([a-z0-9-]+)/rayjobs(?:/([a-z0-9.-]+))?$")
_WORKLOADS = re.compile(r"^/apis/kueue\.x-k8s\.io/v1beta2/namespaces/([a-z0-9-]+)/workloads$")
KUEUE_CRDS = crd_dir().parent / "kueue-crds"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _strict(schema: Any) -> Any:
    """Close object schemas (kubectl --validate=strict), so misspelt fields fail."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def rayjob_schema() -> dict[str, Any]:
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return _strict(version["schema"]["openAPIV3Schema"])


@functools.cache
def kueue_schema(plural: str, version: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one of Kueue's CRDs (closed, as :func:`rayjob_schema`)."""
    path = KUEUE_CRDS / f"kueue.x-k8s.io_{plural}.yaml"
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    found = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return _strict(found["schema"]["openAPIV3Schema"])


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubeApi:
    def __init__(self, token: str = "fake-kube-token") -> None:
        self.token = token
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.workloads: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._version = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, verb: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                api.requests.append((verb, path))
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    self._send(401, _status(401, "Unauthorized", "Unauthorized"))
                    return
                workloads = _WORKLOADS.match(path)
                if workloads and verb == "GET":  # Kueue's Workloads: list by label selector
                    query = dict(
                        p.split("=", 1) for p in self.path.partition("?")[2].split("&") if "=" in p
                    )
                    self._send(
                        200, api.list_workloads(workloads.group(1), query.get("labelSelector", ""))
                    )
                    return
                match = _PATH.match(path)
                if not match:
                    self._send(404, _status(404, "NotFound", f"the server could not find {path}"))
                    return
                body = json.loads(raw) if raw else None
                self._send(*api.handle(verb, match.group(1), match.group(2), body))

            def do_POST(self) -> None:
                self._handle("POST")

            def do_GET(self) -> None:
                self._handle("GET")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, directory: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fedtune", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fedtune"}}],
        }
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    # ------------------------------------------------------------ the operator's side

    def set_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        with self._lock:
            self.objects[(namespace, name)]["status"] = status

    def set_spec(self, namespace: str, name: str, **fields: Any) -> None:
        """Change a RayJob's spec as a controller does (Kueue unsuspends what it admits)."""
        with self._lock:
            self.objects[(namespace, name)]["spec"].update(fields)

    def put_workload(self, workload: dict[str, Any]) -> None:
        """Kueue's side: the Workload it makes for a job, validated against Kueue's CRD."""
        jsonschema.Draft7Validator(kueue_schema("workloads", "v1beta2")).validate(workload)
        with self._lock:
            self.workloads.append(workload)

    def list_workloads(self, namespace: str, selector: str) -> dict[str, Any]:
        from urllib.parse import unquote

        key, _, value = unquote(selector).partition("=")
        items = [
            w
            for w in self.workloads
            if w["metadata"].get("namespace") == namespace
            and (not key or w["metadata"].get("labels", {}).get(key) == value)
        ]
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadList",
            "items": items,
            "metadata": {},
        }

    # ------------------------------------------------------------ the API server's side

    def handle(self, verb: str, ns: str, name: str | None, body: Any) -> tuple[int, dict]:
        with self._lock:
            if verb == "POST" and name is None:
                return self._create(ns, body)
            if verb == "GET" and name is None:
                items = [o for (n, _), o in sorted(self.objects.items()) if n == ns]
                return 200, {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayJobList",
                    "items": items,
                    "metadata": {"resourceVersion": str(self._version)},
                }
            if name is None:
                return 405, _status(405, "MethodNotAllowed", f"{verb} on a collection")
            obj = self.objects.get((ns, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'rayjobs.ray.io "{name}" not found')
            if verb == "GET":
                return 200, obj
            if verb == "DELETE":
                wanted = ((body or {}).get("preconditions") or {}).get("uid")
                if wanted and wanted != obj["metadata"]["uid"]:
                    return 409, _status(409, "Conflict", "Precondition failed: UID in precondition")
                del self.objects[(ns, name)]
                return 200, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Success",
                    "details": {"name": name, "uid": obj["metadata"]["uid"]},
                }
            return 405, _status(405, "MethodNotAllowed", verb)

    def _create(self, ns: str, body: Any) -> tuple[int, dict]:
        if not isinstance(body, dict) or body.get("kind") != "RayJob":
            return 400, _status(400, "BadRequest", "expected a RayJob")
        meta = body.get("metadata") or {}
        name = meta.get("name", "")
        if meta.get("namespace", ns) != ns:
            return 400, _status(400, "BadRequest", "the namespace of the object does not match")
        if not _NAME.match(name) or len(name) > 47:  # KubeRay: RayJob names of at most 47
            return 422, _status(422, "Invalid", f"metadata.name {name!r} is invalid")
        try:
            jsonschema.Draft7Validator(rayjob_schema()).validate(body)
        except jsonschema.ValidationError as exc:
            path = ".".join(str(p) for p in exc.absolute_path)
            return 422, _status(
                422, "Invalid", f"RayJob.ray.io {name!r} is invalid: {path}: {exc.message}"
            )
        if (ns, name) in self.objects:
            return 409, _status(409, "AlreadyExists", f'rayjobs.ray.io "{name}" already exists')
        self._version += 1
        obj = json.loads(json.dumps(body))
        obj["metadata"] = {
            **meta,
            "namespace": ns,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(self._version),
            "generation": 1,
            "creationTimestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        self.objects[(ns, name)] = obj
        return 201, obj
