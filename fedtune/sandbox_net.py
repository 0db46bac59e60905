"""A sandbox's network: nothing but routes to named services, through Unix sockets.

A sandbox (:mod:`fedtune.sandbox`) has a network namespace of its own whose only interface is a
loopback (bubblewrap's ``--unshare-net`` brings it up: a study's Ray runs there). Given routes,
its one way out is a folder of Unix sockets bound into it read-only, at :data:`INSIDE_DIR`, with
a relay at each end (:mod:`fedtune.sandbox_relay`): inside, a TCP listener per route on the
loopback; outside, the socket's relay to the route's destination. Nothing else of the host's
network is there: no port of its loopback (PostgreSQL, Redis, the others), no other address, no
name server, no abstract Unix socket (those belong to a network namespace).

A destination is named by a URL (``http(s)://host:port``) and reached inside as the URL says,
so that its ``Host`` header and TLS name stay the same:

* a loopback address (``127.0.0.1:8000``): the same address and port inside;
* a name (``mlflow.example:5000``, ``localhost``): the sandbox's own ``/etc/hosts`` gives it an
  address of the loopback (``127.0.0.2``, … ; ``localhost`` is ``127.0.0.1``), and the relay
  listens there on the same port;
* any other address (``10.0.0.5:5000``, ``[::1]:8000``): the URL is rewritten to an address of
  the loopback (:meth:`SandboxNet.inside_url`), the same port.

Why Unix sockets and not ``pasta``/``slirp4netns`` port forwards: docs/explanation/threat-model.md.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

__all__ = ["INSIDE_DIR", "Route", "SandboxNet", "network_missing", "sweep_stale"]

#: where a sandbox finds its routes' sockets
INSIDE_DIR = "/run/fedtune-net"
#: the relays' program, run by path (the same path inside: fedtune's folder is bound there)
RELAY = Path(__file__).resolve().with_name("sandbox_relay.py")
#: the system's certificates a sandbox with routes keeps (a destination may be https)
CERTIFICATES = ("/etc/ssl", "/etc/ca-certificates", "/etc/pki")
#: a folder of a relay that ended without removing it is removed after this long
STALE_AFTER_S = 60.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Route:
    """One way out of a sandbox.

    Attributes:
        host: the destination as the host reaches it (a name or an address).
        port: its port.
        inside: the address of the sandbox's loopback the route listens on, the same port.
        name: its socket's file name in the folder.
    """

    host: str
    port: int
    inside: str
    name: str


@dataclass(frozen=True)
class SandboxNet:
    """A sandbox's routes, and the host folder of their sockets and its ``/etc/hosts``.

    Attributes:
        folder: the host folder the outer relay binds its sockets in (bound read-only inside
            at :data:`INSIDE_DIR`); the relay removes it when the sandbox ends.
        routes: the routes, each destination once.
        names: host name -> the loopback address ``/etc/hosts`` gives it inside.
    """

    folder: Path
    routes: tuple[Route, ...]
    names: tuple[tuple[str, str], ...]

    @classmethod
    def create(cls, parent: Path, urls: Iterable[str]) -> SandboxNet:
        """Routes to the destinations of ``urls``, in a fresh folder under ``parent``.

        Args:
            parent: where the folder is made (a folder of the service's, never a sandbox's).
            urls: ``http(s)://`` URLs (the API, the MLflow tracking server).

        Returns:
            The network; its folder holds the sandbox's ``hosts`` file.

        Raises:
            ValueError: a URL that is not ``http(s)://host[:port]``.
        """
        wanted = list(dict.fromkeys(_destination(url) for url in urls))
        free = _free_loopback({host for host, _ in wanted if _loopback_v4(host)})
        names: dict[str, str] = {"localhost": "127.0.0.1"}
        routes = []
        for host, port in wanted:
            if _loopback_v4(host):
                inside = host
            elif _is_address(host):
                inside = next(free)
            else:
                if host not in names:
                    names[host] = next(free)
                inside = names[host]
            routes.append(Route(host, port, inside, str(len(routes))))
        # the machine's own name (a sandbox keeps it) is the sandbox's loopback, unless it names
        # a route: Ray and others look it up, and there is no name server to ask
        names.setdefault(socket.gethostname(), "127.0.0.1")
        return cls.made(parent, routes, names)

    @classmethod
    def made(cls, parent: Path, routes: Iterable[Route], names: Mapping[str, str]) -> SandboxNet:
        """``routes`` as given, in a fresh folder under ``parent`` (:meth:`create` plans them).

        Args:
            parent: where the folder is made.
            routes: the routes.
            names: host name -> loopback address, the sandbox's ``/etc/hosts``.

        Returns:
            The network; its folder holds the sandbox's ``hosts`` file.
        """
        parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="net-", dir=parent))
        folder.chmod(0o755)  # the sandbox's user enters it (the sockets are 0666)
        hosts = folder / "hosts"
        hosts.write_text("".join(f"{address}\t{name}\n" for name, address in names.items()))
        hosts.chmod(0o644)
        return cls(folder, tuple(routes), tuple(names.items()))

    def inside_url(self, url: str) -> str:
        """``url`` as the sandbox reaches it: the same, unless its host is an address not of
        the loopback, which becomes its route's.

        Args:
            url: one of the URLs the network was made for.

        Returns:
            The URL to give the sandbox.
        """
        host, port = _destination(url)
        route = next(r for r in self.routes if (r.host, r.port) == (host, port))
        if not _is_address(host) or route.inside == host:
            return url
        parts = urlsplit(url)
        netloc = f"{parts.netloc.rpartition('@')[0]}@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{route.inside}:{port}"))

    def binds(self) -> list[tuple[str, str, str]]:
        """The sandbox's mounts for the network: (bubblewrap option, host path, path inside)."""
        out = [("--ro-bind", str(self.folder), INSIDE_DIR)]
        out.append(("--ro-bind", str(self.folder / "hosts"), "/etc/hosts"))
        return out + [("--ro-bind-try", path, path) for path in CERTIFICATES]

    def outer_argv(self) -> list[str]:
        """The outer relay's command line, to which the sandbox's own is appended."""
        argv = [sys.executable, "-I", "-S", str(RELAY), "outer", "--dir", str(self.folder)]
        for route in self.routes:
            argv += ["--route", f"{route.name}={_bracketed(route.host)}:{route.port}"]
        return [*argv, "--"]

    def inner_argv(self) -> list[str]:
        """The inner relay's command line (the sandbox's first command), then the command's."""
        argv = [sys.executable, "-I", "-S", str(RELAY), "inner"]
        for route in self.routes:
            argv += ["--route", f"{route.inside}:{route.port}={INSIDE_DIR}/{route.name}"]
        return [*argv, "--"]


def _destination(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"not an http(s)://host[:port] URL: {parts.scheme}://{parts.hostname}")
    return parts.hostname, parts.port or _DEFAULT_PORTS[parts.scheme]


def _free_loopback(used: set[str]) -> Iterator[str]:
    """Addresses of the loopback, from ``127.0.0.2`` on, none of ``used``."""
    for n in range(2, 1 << 24):
        address = str(ipaddress.ip_address("127.0.0.0") + n)
        if address not in used:
            yield address
    raise ValueError("no free address on the loopback")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _loopback_v4(host: str) -> bool:
    return _is_address(host) and ipaddress.ip_address(host) in ipaddress.ip_network("127.0.0.0/8")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def sweep_stale(parent: Path) -> None:
    """Remove the folders under ``parent`` of relays that ended without removing theirs (killed
    with SIGKILL): older than :data:`STALE_AFTER_S`, and no socket of theirs answers.

    Args:
        parent: the folder :meth:`SandboxNet.create` was given.
    """
    with contextlib.suppress(FileNotFoundError):
        for folder in parent.iterdir():
            with contextlib.suppress(OSError):
                fresh = time.time() - folder.stat().st_mtime < STALE_AFTER_S
                if folder.is_dir() and not fresh and not any(map(_answers, folder.iterdir())):
                    shutil.rmtree(folder, ignore_errors=True)


def _answers(path: Path) -> bool:
    if not path.is_socket():
        return False
    folder = os.open(path.parent, os.O_PATH)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            # through its folder's descriptor: a socket's path is limited to 107 bytes
            sock.connect(f"/proc/self/fd/{folder}/{path.name}")
    except OSError:
        return False
    finally:
        os.close(folder)
    return True


def network_missing() -> str | None:
    """Why a sandbox's routes do not work here, or None when they do (probed once a process).

    A sandbox with one route (to a server of this process's) must get that server's answer
    through the relays, and must not reach another port this process listens on.

    Returns:
        One line saying what failed.
    """
    return _probe_network()


@functools.cache
def _probe_network() -> str | None:
    from .sandbox import Sandbox

    with _listening() as allowed, _listening() as forbidden, tempfile.TemporaryDirectory() as tmp:
        # inside at another address than outside: in the host's own network (no namespace of
        # its own) the inner relay still starts, and the check sees the forbidden port answer
        route = Route("127.0.0.1", allowed, "127.0.0.2", "0")
        net = SandboxNet.made(Path(tmp), [route], {"localhost": "127.0.0.1"})
        check = (
            "import socket\n"
            f"with socket.create_connection(('127.0.0.2', {allowed}), 10) as sock:\n"
            "    print(sock.recv(2).decode())\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {forbidden}), 10).close()\n"
            "    print('reached')\n"
            "except OSError:\n"
            "    print('refused')\n"
        )
        probe = Sandbox(env={"PATH": "/usr/bin:/bin"}, net=net)
        try:
            done = probe.run([sys.executable, "-I", "-S", "-c", check], timeout_s=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"its relay cannot start here: {exc}"
    answer = done.stdout.decode(errors="replace").split()
    if answer == ["ok", "refused"]:
        return None
    if answer == ["ok", "reached"]:
        return "a sandbox reached a port of the host's loopback: its network is not its own"
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return f"its relay does not work here ({lines[-1] if lines else f'exit {done.returncode}'})"


@contextlib.contextmanager
def _listening() -> Iterator[int]:
    """A TCP server on a free port of 127.0.0.1 that answers ``ok`` to each connection."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # shut down: the probe is over
                return
            with conn:
                conn.sendall(b"ok")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        thread.join()
        server.close()
