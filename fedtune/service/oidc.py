"""Bearer JWTs from an OpenID Connect identity provider (Keycloak, Dex, Google).

With ``FEDTUNE_OIDC_ISSUER`` set, a bearer token that is a JWT is verified against the issuer's
signing keys — its JWKS, found through ``<issuer>/.well-known/openid-configuration`` (or
``FEDTUNE_OIDC_JWKS_URL``), cached for :data:`KEYS_TTL_S` and fetched again, at most every
:data:`REFETCH_MIN_S`, when a token names a key id the cache lacks (key rotation). The checks —
signature (RS256/ES256 only: ``alg: none`` and HMAC are refused), ``exp``, ``iat`` and ``nbf``,
``aud`` = ``FEDTUNE_OIDC_AUDIENCE``, ``iss`` = the issuer — are google-auth's
(``google.auth.jwt.decode``, already a dependency through the Kubernetes client), with the JWKs
turned into public keys by ``cryptography``: no hand-written crypto. google-auth does not check
``nbf``, so :func:`_check_not_before` does, with the same clock skew as ``exp`` and ``iat``.

Claims map to the caller: the user name from ``FEDTUNE_OIDC_USER_CLAIM`` (default
``preferred_username``, falling back to ``sub``), projects from the list claim
``FEDTUNE_OIDC_GROUPS_CLAIM`` (default ``groups``): a group ``<prefix><project>`` (prefix
``FEDTUNE_OIDC_GROUP_PREFIX``, default ``fedtune:``) makes the user a member of the project,
``<prefix><project>:viewer`` a viewer, and ``FEDTUNE_OIDC_ADMIN_GROUP`` (default
``fedtune:admins``) an admin. Any failure authenticates nobody (the API answers 401).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .access import Principal

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["KEYS_TTL_S", "OidcConfig", "OidcVerifier", "looks_like_jwt"]

log = logging.getLogger(__name__)
KEYS_TTL_S = 300.0
REFETCH_MIN_S = 10.0
ALGORITHMS = ("RS256", "ES256")


@dataclass(frozen=True)
class OidcConfig:
    issuer: str
    audience: str
    jwks_url: str | None = None
    user_claim: str = "preferred_username"
    groups_claim: str = "groups"
    group_prefix: str = "fedtune:"
    admin_group: str = "fedtune:admins"
    clock_skew_s: int = 30

    @classmethod
    def from_settings(cls, settings: Settings) -> OidcConfig | None:
        if not getattr(settings, "oidc_issuer", None):
            return None
        return cls(
            issuer=settings.oidc_issuer.rstrip("/"),
            audience=settings.oidc_audience or "fedtune",
            jwks_url=settings.oidc_jwks_url,
            user_claim=settings.oidc_user_claim,
            groups_claim=settings.oidc_groups_claim,
            group_prefix=settings.oidc_group_prefix,
            admin_group=settings.oidc_admin_group,
        )


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("eyJ")


def _b64int(value: str) -> int:
    return int.from_bytes(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)), "big")


def _pem(jwk: dict[str, Any]) -> bytes | None:
    """A JWK's public key as PEM (RSA and P-256 EC keys; anything else: None)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if jwk.get("kty") == "RSA":
        key = rsa.RSAPublicNumbers(_b64int(jwk["e"]), _b64int(jwk["n"])).public_key()
    elif jwk.get("kty") == "EC" and jwk.get("crv") == "P-256":
        key = ec.EllipticCurvePublicNumbers(
            _b64int(jwk["x"]), _b64int(jwk["y"]), ec.SECP256R1()
        ).public_key()
    else:
        return None
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


class OidcVerifier:
    """Verify an issuer's JWTs (see the module docstring); :meth:`principal` or None."""

    def __init__(self, config: OidcConfig, fetch=None) -> None:
        self.config = config
        self._fetch = fetch or _get_json
        self._keys: dict[str, bytes] = {}
        self._fetched = 0.0
        self._lock = threading.Lock()

    def _jwks_url(self) -> str:
        if self.config.jwks_url:
            return self.config.jwks_url
        discovery = self._fetch(f"{self.config.issuer}/.well-known/openid-configuration")
        return str(discovery["jwks_uri"])

    def _refresh(self, force: bool) -> None:
        now = time.monotonic()
        with self._lock:
            stale = now - self._fetched > KEYS_TTL_S
            if not (stale or (force and now - self._fetched > REFETCH_MIN_S)):
                return
            keys = {}
            for jwk in self._fetch(self._jwks_url()).get("keys", []):
                pem = _pem(jwk) if jwk.get("use", "sig") == "sig" else None
                if pem is not None and jwk.get("kid"):
                    keys[str(jwk["kid"])] = pem
            self._keys, self._fetched = keys, now

    def claims(self, token: str) -> dict[str, Any]:
        """The verified claims of ``token``; raises on any failure."""
        from google.auth import jwt

        header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
        if header.get("alg") not in ALGORITHMS:
            raise ValueError(f"algorithm {header.get('alg')!r} not accepted")
        kid = str(header.get("kid") or "")
        self._refresh(force=kid not in self._keys)
        if kid not in self._keys:
            raise ValueError(f"unknown key id {kid!r}")
        claims = jwt.decode(
            token,
            certs={kid: self._keys[kid]},
            audience=self.config.audience,
            clock_skew_in_seconds=self.config.clock_skew_s,
        )
        if str(claims.get("iss", "")).rstrip("/") != self.config.issuer:
            raise ValueError(f"issuer {claims.get('iss')!r} is not {self.config.issuer!r}")
        _check_not_before(claims, self.config.clock_skew_s)
        return claims

    def principal(self, token: str) -> Principal | None:
        try:
            claims = self.claims(token)
        except Exception as exc:  # a bad token authenticates nobody; never log the token
            log.info("OIDC token refused: %s", type(exc).__name__)
            return None
        name = claims.get(self.config.user_claim) or claims.get("sub")
        if not isinstance(name, str) or not name:
            return None
        groups = claims.get(self.config.groups_claim) or []
        groups = [g for g in groups if isinstance(g, str)] if isinstance(groups, list) else []
        roles: dict[str, str] = {}
        prefix = self.config.group_prefix
        for group in groups:
            if not group.startswith(prefix) or group == self.config.admin_group:
                continue
            project, _, role = group[len(prefix) :].partition(":")
            if role == "viewer":
                roles.setdefault(project, "viewer")
            elif not role:
                roles[project] = "member"
        return Principal(name, admin=self.config.admin_group in groups, roles=roles, via="oidc")


def _check_not_before(claims: dict[str, Any], skew_s: float, now: float | None = None) -> None:
    """Refuse a token used before its ``nbf`` (RFC 7519 section 4.1.5), allowing ``skew_s``.

    google-auth checks ``exp`` and ``iat`` but not ``nbf``; the same clock skew applies here.

    Args:
        claims: The token's decoded claims.
        skew_s: Seconds of clock difference tolerated, as for ``exp`` and ``iat``.
        now: The current time (seconds since the epoch); the system clock when None.

    Returns:
        None; raises ValueError when ``nbf`` is not a number or lies ahead by more than the skew.
    """
    if "nbf" not in claims:
        return
    nbf = claims["nbf"]
    if isinstance(nbf, bool) or not isinstance(nbf, (int, float)):
        raise ValueError("nbf is not a NumericDate")
    if (time.time() if now is None else now) + skew_s < nbf:
        raise ValueError("token not yet valid (nbf)")


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())
