"""Bearer JWTs from an OIDC identity provider, against a local issuer.

The test is the identity provider: it makes an RSA key, serves the discovery document and the
JWKS over real HTTP on a free port, and signs tokens with google-auth's signer. The service
(FastAPI app, the real middleware) verifies them: a valid token → 200 with the user and projects
its ``groups`` claim names; wrong audience, expired, wrong signature, unknown key id, ``alg:
none``, another issuer → 401 each.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient
from google.auth import crypt, jwt

from fedtune.service.api.app import create_app
from tests.ports import free_port

from .helpers import FakeBackend


def _b64(n: int) -> str:
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class Issuer:
    """A local OpenID provider: discovery + JWKS over HTTP, and a token signer."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/realms/team"
        numbers = self.key.public_key().public_numbers()
        jwks = {
            "keys": [
                {
                    "kty": "RSA",
                    "kid": "k1",
                    "use": "sig",
                    "alg": "RS256",
                    "n": _b64(numbers.n),
                    "e": _b64(numbers.e),
                }
            ]
        }
        docs = {
            "/realms/team/.well-known/openid-configuration": {
                "issuer": self.url,
                "jwks_uri": f"{self.url}/certs",
            },
            "/realms/team/certs": jwks,
        }
        self.hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(inner) -> None:
                self.hits.append(inner.path)
                body = json.dumps(docs.get(inner.path, {})).encode()
                inner.send_response(200 if inner.path in docs else 404)
                inner.send_header("Content-Type", "application/json")
                inner.end_headers()
                inner.wfile.write(body)

            def log_message(inner, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(
        self,
        *,
        key=None,
        kid: str = "k1",
        aud: str = "fedtune",
        iss: str | None = None,
        exp_in: float = 300,
        groups=("fedtune:vision", "fedtune:audio:viewer"),
        nbf_in: object = None,
    ) -> str:
        pem = (key or self.key).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        signer = crypt.RSASigner.from_string(pem, key_id=kid)
        now = int(time.time())
        payload = {
            "iss": iss or self.url,
            "aud": aud,
            "sub": "u-123",
            "preferred_username": "alice",
            "groups": list(groups),
            "iat": now - 10,
            "exp": now + int(exp_in),
        }
        if isinstance(nbf_in, (int, float)):
            payload["nbf"] = now + int(nbf_in)
        elif nbf_in is not None:
            payload["nbf"] = nbf_in
        return jwt.encode(signer, payload).decode()

    def unsigned(self) -> str:
        part = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
        now = int(time.time())
        return (
            f"{part({'alg': 'none', 'typ': 'JWT', 'kid': 'k1'})}."
            f"{part({'iss': self.url, 'aud': 'fedtune', 'preferred_username': 'mallory', 'groups': ['fedtune:admins'], 'iat': now, 'exp': now + 300})}."
        )


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    it = Issuer()
    yield it
    it.server.shutdown()
    it.server.server_close()


@pytest.fixture
def client(issuer: Issuer, make_settings) -> Iterator[TestClient]:
    settings = make_settings(oidc_issuer=issuer.url, oidc_audience="fedtune")
    with TestClient(create_app(settings, backend=FakeBackend(), schedule=False)) as tc:
        yield tc


def _whoami(client: TestClient, token: str):
    return client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})


def test_a_valid_token_names_the_user_and_its_projects(client, issuer) -> None:
    r = _whoami(client, issuer.token())
    assert r.status_code == 200, r.text
    assert r.json() == {
        "name": "alice",
        "admin": False,
        "via": "oidc",
        "projects": {"vision": "member", "audio": "viewer"},
    }
    assert "/realms/team/.well-known/openid-configuration" in issuer.hits  # discovered
    admin = _whoami(client, issuer.token(groups=["fedtune:admins"])).json()
    assert admin["admin"] is True


@pytest.mark.parametrize(
    "case",
    [
        "wrong audience",
        "expired",
        "wrong signature",
        "unknown key id",
        "alg none",
        "another issuer",
        "garbage",
        "not yet valid",
        "nbf not a number",
    ],
)
def test_a_bad_token_is_401(client, issuer, case) -> None:
    token = {
        "wrong audience": lambda: issuer.token(aud="someone-else"),
        "expired": lambda: issuer.token(exp_in=-600),
        "wrong signature": lambda: issuer.token(key=issuer.other),  # kid k1, another key
        "unknown key id": lambda: issuer.token(key=issuer.other, kid="k9"),
        "alg none": issuer.unsigned,
        "another issuer": lambda: issuer.token(iss="http://127.0.0.1:1/evil"),
        "garbage": lambda: "eyJhbGciOiJSUzI1NiJ9.e30.AAAA",
        "not yet valid": lambda: issuer.token(nbf_in=3600),  # nbf an hour ahead
        "nbf not a number": lambda: issuer.token(nbf_in="soon"),
    }[case]()
    r = _whoami(client, token)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "invalid_token"
    assert token not in r.text


def test_nbf_within_the_clock_skew_is_accepted(client, issuer) -> None:
    """``nbf`` gets the same leeway as ``exp``/``iat``: a few seconds ahead, or past, is fine."""
    assert _whoami(client, issuer.token(nbf_in=10)).status_code == 200
    assert _whoami(client, issuer.token(nbf_in=-60)).status_code == 200
    assert _whoami(client, issuer.token(nbf_in=120)).status_code == 401  # past the 30 s skew


def test_oidc_users_see_only_their_projects(client, issuer) -> None:
    """The JWT's groups are the caller's projects for authorization, as a token user's roles."""
    from fedtune.service import identity

    db = client.app.state.runtime.db
    with db.session() as s:
        identity.create_project(s, "vision")
        identity.create_project(s, "secret")
    headers = {"Authorization": f"Bearer {issuer.token()}"}
    assert client.get("/v1/projects/vision", headers=headers).status_code == 200
    assert client.get("/v1/projects/secret", headers=headers).status_code == 404
    assert client.get("/v1/users", headers=headers).status_code == 403
