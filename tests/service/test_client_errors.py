"""Client errors that help and never leak (issue 59, requirement 5).

Every error path of the SDK and of the CLI's client verbs, with a SENTINEL token: the token
never shows in a message, a traceback or stderr; a setting that cannot work fails at once in one
line naming it (``FEDTUNE_TOKEN: has a trailing space; paste the token alone``); configuration
errors are not retried (counted on a tiny real HTTP server); a service that does not answer is
named by its URL. The servers here are real: ``http.server`` in a thread (plain, or TLS with a
certificate made here) and the fedtune app.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import ssl
import subprocess
import threading
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from fedtune.client import Client
from fedtune.errors import (
    ConfigError,
    DatabaseUnavailableError,
    FedtuneError,
    ForbiddenError,
    InvalidTokenError,
    ServiceUnreachableError,
    StudyNotFoundError,
    UnauthorizedError,
)
from fedtune.service.api import create_app
from tests.ports import free_port

from .conftest import TOKEN
from .helpers import PYTHON, REPO, FakeBackend

#: a well-formed fedtune token (ftk_<id>_<secret>) that no error may show, whole or in part
SENTINEL = "ftk_5e471e1fab1e_SENTINEL" + "x" * 35
#: what must never appear
SECRET = "SENTINEL"
HTML = b"<!doctype html><html><head><title>MLflow</title></head><body>MLflow</body></html>"

Answer = tuple[int, dict[str, str], bytes]


def _json(status: int, body: Any, **headers: str) -> Answer:
    return status, {"Content-Type": "application/json", **headers}, json.dumps(body).encode()


def _fedtune(status: int, code: str, message: str, **headers: str) -> Answer:
    return _json(status, {"error": {"code": code, "message": message, "field": None}}, **headers)


class Tiny:
    """A tiny real HTTP(S) server in a thread: ``respond(method, path, headers)`` answers each
    request; ``requests`` counts the requests it answered."""

    def __init__(
        self, respond: Callable[[str, str, dict[str, str]], Answer], tls: ssl.SSLContext | None
    ) -> None:
        self.requests: list[tuple[str, str]] = []
        tiny = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                tiny.requests.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, headers, body = respond(self.command, self.path, dict(self.headers))
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture(scope="module")
def tls_context(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    """A server context with a self-signed certificate for 127.0.0.1, made here."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    return context


@pytest.fixture
def tiny(tls_context: ssl.SSLContext) -> Iterator[Callable[..., Tiny]]:
    servers: list[Tiny] = []

    def start(respond: Callable[..., Answer], tls: bool = False) -> Tiny:
        servers.append(Tiny(respond, tls_context if tls else None))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def sleeps() -> list[float]:
    return []


def _sdk(url: str, sleeps: list[float], token: str | None = SENTINEL, **kw: Any) -> Client:
    return Client(url, token=token, sleep=sleeps.append, **kw)


def _shown(exc: BaseException) -> str:
    """Everything an uncaught exception prints: its text and its whole traceback, chained."""
    return str(exc) + "".join(traceback.format_exception(exc))


def _raised(call: Callable[[], Any], kind: type[BaseException] = FedtuneError) -> BaseException:
    with pytest.raises(kind) as err:
        call()
    shown = _shown(err.value)
    assert SECRET not in shown, shown
    return err.value


def _cli(*argv: str, url: str, token: str | None = SENTINEL, **env: str):
    """``fedtune <argv>`` in a subprocess, the settings in its environment."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FEDTUNE_")}
    environ.update(FEDTUNE_URL=url, PYTHONPATH=str(REPO), **env)
    if token is not None:
        environ["FEDTUNE_TOKEN"] = token
    out = subprocess.run(
        [PYTHON, "-m", "fedtune.cli", *argv],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert SECRET not in out.stdout + out.stderr, out.stderr
    return out


def _one_line(out: subprocess.CompletedProcess, code: int) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1, out.stderr
    assert lines[0].startswith("fedtune: error: ")
    return lines[0]


# ---------------------------------------------------------------- the token and the URL


@pytest.mark.parametrize(
    ("token", "words"),
    [
        (SENTINEL + " ", "token: has a trailing space; paste the token alone"),
        ("\t" + SENTINEL, "token: has a leading tab; paste the token alone"),
        (SENTINEL + "\n", "token: has a trailing line break"),
        (SENTINEL[:20] + " " + SENTINEL[20:], "token: contains a space at character 21 of"),
        (SENTINEL[:30] + "\u2019" + SENTINEL[30:], "a non-ASCII character (U+2019"),
        (SENTINEL[:30] + "\x07" + SENTINEL[30:], "a control character (U+0007)"),
        ("Bearer " + SENTINEL, "token: starts with 'Bearer '; give the token alone"),
    ],
)
def test_a_token_that_cannot_be_sent_fails_at_once(tiny, sleeps, token, words) -> None:
    server = tiny(lambda *_: _json(200, {"name": "x"}))
    error = _raised(lambda: _sdk(server.url, sleeps, token=token), ConfigError)
    assert words in str(error) and error.field == "token"
    assert server.requests == [] and sleeps == []  # nothing sent, nothing retried


def test_the_cli_names_the_token_setting_in_one_line(tiny) -> None:
    server = tiny(lambda *_: _json(200, {"name": "x"}))
    line = _one_line(_cli("whoami", url=server.url, token=SENTINEL + " "), 2)
    assert line == "fedtune: error: FEDTUNE_TOKEN: has a trailing space; paste the token alone"
    line = _one_line(_cli("whoami", url=server.url, token=SENTINEL[:9] + "é" + SENTINEL[9:]), 2)
    assert line.startswith("fedtune: error: FEDTUNE_TOKEN: contains a non-ASCII character")
    given = _cli("whoami", "--token", SENTINEL + " ", url=server.url, token=None)
    assert _one_line(given, 2).startswith("fedtune: error: --token: has a trailing space")
    assert server.requests == []


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("box:8000", "url: box:8000 has no scheme; use http://box:8000"),
        ("127.0.0.1:8000", "url: 127.0.0.1:8000 has no scheme; use http://127.0.0.1:8000"),
        (
            "http://box:8000/v1",
            "url: http://box:8000/v1 should be the service's root, without /v1 (the client adds "
            "it): use http://box:8000",
        ),
        ("ftp://box:8000", "the scheme must be http:// or https://"),
        ("http://box:8000 ", "has whitespace in it"),
    ],
)
def test_a_url_that_cannot_work_fails_at_once(sleeps, url, words) -> None:
    error = _raised(lambda: _sdk(url, sleeps), ConfigError)
    assert str(error) == words or words in str(error)


def test_the_cli_refuses_a_url_without_a_scheme_in_one_line() -> None:
    line = _one_line(_cli("status", "0123456789ab", url="box:8000"), 2)
    assert line == "fedtune: error: FEDTUNE_URL: box:8000 has no scheme; use http://box:8000"


# ---------------------------------------------------------------- nothing answers


def test_an_unreachable_service_is_named_by_its_url(sleeps) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    error = _raised(lambda: _sdk(url, sleeps).whoami(), ServiceUnreachableError)
    assert str(error) == (
        f"no answer from {url} after 5 attempts: connection refused — is `fedtune serve` "
        "running there? (url)"
    )
    assert sleeps == [0.5, 1.0, 2.0, 4.0]  # a connection error is retried
    assert error.__cause__ is None and error.__context__ is None


def test_the_cli_names_the_unreachable_url_and_its_setting() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = _one_line(_cli("whoami", url=url), 1)
    assert line == (
        f"fedtune: error: no answer from {url} after 5 attempts: connection refused — is "
        "`fedtune serve` running there? (FEDTUNE_URL)"
    )


# ---------------------------------------------------------------- a wrong service answers


def test_an_html_page_is_not_a_fedtune_service_and_is_not_retried(tiny, sleeps) -> None:
    mlflow = tiny(lambda *_: (200, {"Content-Type": "text/html; charset=utf-8"}, HTML))
    error = _raised(lambda: _sdk(mlflow.url, sleeps).whoami(), ConfigError)
    assert str(error) == (
        f"url: this is not a fedtune service: {mlflow.url} answered GET /v1/whoami with an HTML "
        "page — is url the MLflow URL?"
    )
    assert len(mlflow.requests) == 1 and sleeps == []
    line = _one_line(_cli("whoami", url=mlflow.url), 2)
    assert "FEDTUNE_URL: this is not a fedtune service" in line and "MLflow URL?" in line
    assert len(mlflow.requests) == 2  # one request for the CLI too


def test_a_404_of_a_route_every_service_has_names_the_root(tiny, sleeps, make_settings) -> None:
    other = tiny(lambda *_: _json(404, {"detail": "Not Found"}))
    error = _raised(lambda: _sdk(other.url, sleeps).whoami(), ConfigError)
    assert str(error) == (
        f"url: {other.url}/v1/whoami not found: url should be the service's root, without /v1"
    )
    assert len(other.requests) == 1 and sleeps == []
    # the real service behind a URL with a path it does not serve
    app = create_app(make_settings(api_token=TOKEN), backend=FakeBackend(), schedule=False)
    with TestClient(app) as tc:
        prefixed = _sdk("http://testserver/fedtune", sleeps, token=TOKEN, transport=tc._transport)
        error = _raised(prefixed.whoami, ConfigError)
        assert "http://testserver/fedtune/v1/whoami not found" in str(error)
        served = _sdk("http://testserver", sleeps, token=TOKEN, transport=tc._transport)
        _raised(served.study("0123456789ab").status, StudyNotFoundError)  # a 404 of its own
    assert sleeps == []


def test_another_services_json_is_not_fedtune(tiny, sleeps) -> None:
    other = tiny(lambda *_: _json(401, {"message": "log in first"}))
    error = _raised(lambda: _sdk(other.url, sleeps).whoami(), ConfigError)
    assert str(error).startswith(f"url: this is not a fedtune service: {other.url} answered")
    assert "HTTP 401 (application/json)" in str(error) and sleeps == []


def test_tls_to_a_plain_http_server_is_not_retried(tiny, sleeps) -> None:
    plain = tiny(lambda *_: _json(200, {"name": "x"}))
    https = plain.url.replace("http://", "https://")
    error = _raised(lambda: _sdk(https, sleeps).whoami(), ConfigError)
    assert str(error).startswith(f"url: {https} does not speak TLS")
    assert str(error).endswith(f"the service speaks plain HTTP? try {plain.url}")
    assert plain.requests == [] and sleeps == []


def test_plain_http_to_a_tls_server_is_not_retried(tiny, sleeps) -> None:
    tls = tiny(lambda *_: _json(200, {"name": "x"}), tls=True)
    http = tls.url.replace("https://", "http://")
    error = _raised(lambda: _sdk(http, sleeps).whoami(), ConfigError)
    assert str(error) == f"url: {http} speaks TLS, not plain HTTP: try {tls.url}"
    assert tls.requests == [] and sleeps == []
    line = _one_line(_cli("whoami", url=http), 2)
    assert line == f"fedtune: error: FEDTUNE_URL: {http} speaks TLS, not plain HTTP: try {tls.url}"


def test_a_certificate_this_machine_does_not_trust_is_said(tiny, sleeps) -> None:
    tls = tiny(lambda *_: _json(200, {"name": "x"}), tls=True)
    error = _raised(lambda: _sdk(tls.url, sleeps).whoami(), ConfigError)
    assert "presented a certificate this machine does not trust" in str(error)
    assert "SSL_CERT_FILE" in str(error) and sleeps == []


# ---------------------------------------------------------------- the service refuses


def test_401_names_the_token_setting_and_never_the_token(make_settings, sleeps) -> None:
    app = create_app(make_settings(api_token=TOKEN), backend=FakeBackend(), schedule=False)
    with TestClient(app) as tc:
        wrong = _sdk("http://testserver", sleeps, transport=tc._transport)
        error = _raised(wrong.whoami, InvalidTokenError)
        assert str(error).endswith("— check token (for http://testserver)")
        anonymous = _sdk("http://testserver", sleeps, token=None, transport=tc._transport)
        error = _raised(anonymous.whoami, UnauthorizedError)
        assert str(error).endswith("— set token (for http://testserver)")
    assert sleeps == []


def _echo(status: int, code: str) -> Callable[..., Answer]:
    """Answers whose message quotes the request's Authorization header (a careless server)."""

    def respond(method: str, path: str, headers: dict[str, str]) -> Answer:
        said = f"refused: Authorization: {headers.get('Authorization')}; token={SENTINEL}"
        return _fedtune(status, code, said, **({"Retry-After": "1"} if status == 503 else {}))

    return respond


def test_a_server_that_echoes_the_token_is_masked(tiny, sleeps) -> None:
    server = tiny(_echo(403, "forbidden"))
    error = _raised(lambda: _sdk(server.url, sleeps).whoami(), ForbiddenError)
    assert str(error).startswith("refused: Authorization: Bearer ***")
    line = _one_line(_cli("whoami", url=server.url), 1)
    assert "refused" in line


def test_5xx_is_retried_then_named_by_the_url(tiny, sleeps) -> None:
    server = tiny(_echo(503, "database_unavailable"))
    error = _raised(lambda: _sdk(server.url, sleeps).whoami(), DatabaseUnavailableError)
    assert str(error).endswith(f"({server.url}, HTTP 503 to 5 attempts)")
    assert len(server.requests) == 5
    assert sleeps == [1.0, 1.0, 2.0, 4.0]  # backoff, or Retry-After when longer


def test_a_proxy_error_page_is_retried_then_said(tiny, sleeps) -> None:
    proxy = tiny(lambda *_: (502, {"Content-Type": "text/html"}, b"<html>Bad Gateway</html>"))
    error = _raised(lambda: _sdk(proxy.url, sleeps).whoami(), ServiceUnreachableError)
    assert str(error).startswith(f"no answer from {proxy.url} after 5 attempts: HTTP 502 from")
    assert len(proxy.requests) == 5


def test_429_is_retried_after_its_delay(tiny, sleeps) -> None:
    answers = [_fedtune(429, "busy", "slow down", **{"Retry-After": "3"}), _json(200, {})]
    server = tiny(lambda *_: answers.pop(0) if len(answers) > 1 else answers[0])
    assert _sdk(server.url, sleeps).request("GET", "/v1/whoami") == {}
    assert sleeps == [3.0] and len(server.requests) == 2


def test_an_httpx_error_quoting_the_header_is_masked_and_unchained(sleeps) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.LocalProtocolError(f"Illegal header value b'Bearer {SENTINEL} '")

    sdk = _sdk("http://box:8000", sleeps, transport=httpx.MockTransport(refuse))
    error = _raised(sdk.whoami, ConfigError)
    assert "Illegal header value b'Bearer ***" in str(error) and sleeps == []
    assert error.__cause__ is None and error.__context__ is None


def test_a_password_the_service_handed_over_is_masked_later(tiny, sleeps) -> None:
    password = "pw-SENTINEL-0123456789"

    def respond(method: str, path: str, headers: dict[str, str]) -> Answer:
        if path.endswith("/mlflow-login"):
            return _json(200, {"user": "ada", "workspaces": ["vision"], "password": password})
        return _fedtune(409, "conflict", f"the login {password} is in use")

    sdk = _sdk(tiny(respond).url, sleeps)
    assert sdk.mlflow_login("ada").password == password  # shown once, to its caller
    error = _raised(lambda: sdk.request("GET", "/v1/projects"))
    assert str(error) == "the login *** is in use"


def test_a_submission_still_being_checked_is_retried_after_its_delay(tiny, sleeps) -> None:
    busy = _fedtune(409, "submission_in_progress", "still being checked", **{"Retry-After": "5"})
    answers = [busy, _json(201, {"id": "0123456789ab"})]
    server = tiny(lambda *_: answers.pop(0) if len(answers) > 1 else answers[0])
    sdk = _sdk(server.url, sleeps)
    assert sdk.submit({"name": "s"}).id == "0123456789ab"
    assert sleeps == [5.0] and len(server.requests) == 2
    other = tiny(lambda *_: _fedtune(409, "idempotency_key_reused", "another body"))
    _raised(lambda: _sdk(other.url, sleeps).submit({"name": "s"}))
    assert len(other.requests) == 1  # a reused key is not retried
