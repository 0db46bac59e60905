"""Who MLflow's security checks let in: the Host headers and the browser origins it accepts.

``mlflow server`` refuses a request whose ``Host`` header is not on its list (``403 Invalid Host
header``: its guard against DNS rebinding) and a state-changing API request whose ``Origin`` is
not (``403 Cross-origin request blocked``: the UI's ``POST /ajax-api/...``, such as the runs
list). Both lists match the header as the browser sends it, the port included, and
``--allowed-hosts`` *replaces* MLflow's default list (loopback on any port and private
addresses: :data:`MLFLOW_DEFAULT_HOSTS`) rather than adding to it, while loopback origins are
always accepted.

``fedtune mlflow-server`` therefore takes the URLs the members' browsers open
(``--public-url``, :func:`parse_public_url`) and hands MLflow, in :func:`allowed_hosts` and
:func:`cors_origins`, MLflow's defaults plus those URLs' ``host:port`` and origins, plus the
operator's extra Host headers. The service's own connection on loopback keeps working; a name
nobody gave is still refused, and no wildcard is added unless the operator writes one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "MLFLOW_DEFAULT_HOSTS",
    "PublicUrl",
    "allowed_hosts",
    "bind_url",
    "cors_origins",
    "parse_public_url",
]

#: the Host headers ``mlflow server`` accepts when given none
#: (``mlflow.server.security_utils.get_default_allowed_hosts``; a test keeps them equal)
MLFLOW_DEFAULT_HOSTS: tuple[str, ...] = (
    "localhost",
    "127.0.0.1",
    "[::1]",
    "0.0.0.0",
    "localhost:*",
    "127.0.0.1:*",
    "[[]::1]:*",
    "0.0.0.0:*",
    "192.168.*",
    "10.*",
    *(f"172.{i}.*" for i in range(16, 32)),
    "fc00:*",
    "fd00:*",
)
#: names MLflow always lets in as origins, and bind addresses that mean "every address"
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARD = frozenset({"", "0.0.0.0", "::"})
_DEFAULT_PORT = {"http": 80, "https": 443}
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?$")
_USERINFO = re.compile(r"//[^/?#]*@")
_EXAMPLE = "e.g. http://box.lan:5000 or https://mlflow.example.com"


@dataclass(frozen=True)
class PublicUrl:
    """A URL browsers open MLflow at.

    Attributes:
        url: the URL, normalised (lower-case scheme and host, no trailing ``/``).
        hosts: the ``Host`` headers a browser sends for it (``host:port``; both ``host`` and
            ``host:80``/``host:443`` when the port is the scheme's own, which browsers omit).
        origin: the ``Origin`` header of the MLflow UI's requests when opened there.
    """

    url: str
    hosts: tuple[str, ...]
    origin: str


def parse_public_url(value: str) -> PublicUrl:
    """The Host headers and origin of one URL browsers open MLflow at.

    Args:
        value: ``http(s)://host[:port]``, optionally with a trailing ``/``.

    Returns:
        The parsed URL.

    Raises:
        ValueError: not such a URL; the message says why, in one line.
    """
    text = value.strip()
    shown = repr(_USERINFO.sub("//…@", text))  # a password in it is never echoed
    if _USERINFO.search(text):
        raise ValueError(f"{shown} must not hold a user name or password")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{shown} is not a URL ({exc}); {_EXAMPLE}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORT or not parts.netloc:
        raise ValueError(f"{shown} must start with http:// or https:// ({_EXAMPLE})")
    if port == 0:
        raise ValueError(f"{shown}: port 0 is no port browsers can open")
    if parts.path not in ("", "/") or parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError(
            f"{shown} must be the server's root, without a path, query or fragment "
            "(MLflow serves its UI at /)"
        )
    host = _host(parts.hostname or "", shown)
    if port is None or port == _DEFAULT_PORT[scheme]:
        origin = f"{scheme}://{host}"
        return PublicUrl(origin, (host, f"{host}:{_DEFAULT_PORT[scheme]}"), origin)
    origin = f"{scheme}://{host}:{port}"
    return PublicUrl(origin, (f"{host}:{port}",), origin)


def _host(name: str, shown: str) -> str:
    """``name`` as it appears in a Host header (lower case, an IPv6 address in brackets)."""
    if not name.isascii():
        raise ValueError(f"{shown}: write the host name in its ASCII (punycode) form")
    name = name.lower()
    if ":" in name:
        try:
            return f"[{ipaddress.IPv6Address(name).compressed}]"
        except ValueError:
            raise ValueError(f"{shown}: {name!r} is not an IPv6 address") from None
    if not name or len(name) > 253 or not all(_LABEL.match(p) for p in name.split(".")):
        raise ValueError(f"{shown}: {name!r} is not a host name")
    return name


def bind_url(host: str, port: int) -> PublicUrl | None:
    """The address a server bound to ``host`` serves browsers at, when that is not loopback
    (allowed already) or every address (no one name: ``--public-url`` gives those).

    Args:
        host: the bind address.
        port: the port.

    Returns:
        Its URL, Host headers and origin; None for loopback or a wildcard.

    Raises:
        ValueError: ``host`` is no address or host name.
    """
    if host in _WILDCARD or host in _LOOPBACK:
        return None
    shown = f"[{host}]" if ":" in host else host
    try:
        return parse_public_url(f"http://{shown}:{port}")
    except ValueError:
        raise ValueError(f"{host!r} is not an address or a host name") from None


def allowed_hosts(public: Iterable[PublicUrl], extra: Iterable[str] = ()) -> list[str]:
    """The Host headers MLflow accepts: its defaults, the public URLs' and ``extra``.

    Args:
        public: the URLs browsers open MLflow at.
        extra: more Host headers, as MLflow's ``--allowed-hosts`` takes them (``host:port``,
            ``*`` patterns).

    Returns:
        The list for ``--allowed-hosts``; empty when nothing is added (MLflow's defaults).
    """
    added = [h for url in public for h in url.hosts] + [h.strip() for h in extra if h.strip()]
    return _unique([*MLFLOW_DEFAULT_HOSTS, *added]) if added else []


def cors_origins(public: Iterable[PublicUrl], extra: Iterable[str] = ()) -> list[str]:
    """The origins whose API requests MLflow accepts besides loopback's.

    Args:
        public: the URLs browsers open MLflow at.
        extra: more origins, as MLflow's ``--cors-allowed-origins`` takes them.

    Returns:
        The list for ``--cors-allowed-origins``; empty when there is none (loopback only).
    """
    return _unique([u.origin for u in public] + [o.strip() for o in extra if o.strip()])


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
