"""A sandbox's routes (``fedtune.sandbox_net``) and their relays (``fedtune.sandbox_relay``).

The whole path, a hostile package's ``local`` driver and trials in a sandbox whose only way out
is the routes, is ``tests/e2e/test_sandbox_network.py``; here each piece is checked where it can
fail alone: how URLs become routes, and each relay, with real sockets and processes, outside a
sandbox.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedtune.sandbox import Sandbox
from fedtune.sandbox_net import INSIDE_DIR, RELAY, Route, SandboxNet, sweep_stale
from tests.ports import free_port

RELAY_ARGV = [sys.executable, "-I", "-S", str(RELAY)]


def _outer(folder: Path, route: str, *command: str) -> list[str]:
    return [*RELAY_ARGV, "outer", "--dir", str(folder), "--route", route, "--", *command]


def _inner(route: str, *command: str) -> list[str]:
    return [*RELAY_ARGV, "inner", "--route", route, "--", *command]


def test_loopback_addresses_keep_their_address_names_get_one_of_the_loopback(tmp_path) -> None:
    net = SandboxNet.create(
        tmp_path,
        [
            "http://127.0.0.1:8000",
            "http://mlflow.example:5000/prefix",
            "https://mlflow.example:5000",  # the same destination: one route
            "http://127.0.0.2:5000",  # taken: the name above got another address
            "http://localhost:9000",
        ],
    )
    routes = {(r.host, r.port): r.inside for r in net.routes}
    assert routes == {
        ("127.0.0.1", 8000): "127.0.0.1",
        ("mlflow.example", 5000): "127.0.0.3",
        ("127.0.0.2", 5000): "127.0.0.2",
        ("localhost", 9000): "127.0.0.1",
    }
    assert [r.name for r in net.routes] == ["0", "1", "2", "3"]
    hosts = (net.folder / "hosts").read_text().splitlines()
    own = f"127.0.0.1\t{socket.gethostname()}"  # the machine's name, which the sandbox keeps
    assert hosts == ["127.0.0.1\tlocalhost", "127.0.0.3\tmlflow.example", own]
    assert (
        net.inside_url("http://mlflow.example:5000/prefix") == "http://mlflow.example:5000/prefix"
    )
    assert net.inside_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert net.folder.parent == tmp_path and (net.folder.stat().st_mode & 0o777) == 0o755


def test_other_addresses_are_rewritten_to_the_loopback_with_their_login(tmp_path) -> None:
    net = SandboxNet.create(tmp_path, ["https://u:p@10.1.2.3:5000/x?y=1", "http://[::1]:8000"])
    assert net.inside_url("https://u:p@10.1.2.3:5000/x?y=1") == "https://u:p@127.0.0.2:5000/x?y=1"
    assert net.inside_url("http://[::1]:8000") == "http://127.0.0.3:8000"
    assert [arg for arg in net.outer_argv() if "=" in arg] == ["0=10.1.2.3:5000", "1=[::1]:8000"]
    inner = [arg for arg in net.inner_argv() if "=" in arg]
    assert inner == [f"127.0.0.2:5000={INSIDE_DIR}/0", f"127.0.0.3:8000={INSIDE_DIR}/1"]


def test_a_default_port_and_a_bad_url(tmp_path) -> None:
    net = SandboxNet.create(tmp_path, ["https://mlflow.example", "http://api.example"])
    assert [(r.host, r.port) for r in net.routes] == [("mlflow.example", 443), ("api.example", 80)]
    with pytest.raises(ValueError, match="not an http"):
        SandboxNet.create(tmp_path, ["file:///tmp/mlruns"])


def test_a_sandbox_with_the_hosts_network_has_no_routes(tmp_path) -> None:
    net = SandboxNet.create(tmp_path, ["http://127.0.0.1:8000"])
    with pytest.raises(ValueError, match="no routes"):
        Sandbox(network=True, net=net)
    argv = Sandbox(net=net).command(["true"])
    assert argv[: len(net.outer_argv())] == net.outer_argv()  # the outer relay starts it all
    assert "--unshare-net" in argv
    assert argv[-1 - len(net.inner_argv()) : -1] == net.inner_argv()  # then the command
    assert ["--ro-bind", str(net.folder), INSIDE_DIR] == argv[argv.index(INSIDE_DIR) - 2 :][:3]


@contextlib.contextmanager
def _server(family: int, address: object) -> Iterator[tuple[list[bytes], object]]:
    """A server at ``address`` that answers each connection with what it read, upper-cased,
    after the client half-closes; yields what it read, and the address it is bound to."""
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind(address)
    server.listen()
    server.settimeout(0.2)
    heard: list[bytes] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = server.accept()
                with conn:
                    conn.settimeout(10)
                    data = b""
                    while chunk := conn.recv(65536):
                        data += chunk
                    heard.append(data)
                    conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield heard, server.getsockname()
    finally:
        done.set()
        thread.join()
        server.close()


#: a client: connects (TCP host:port, or a Unix path), sends 1 MB, half-closes, prints the
#: length of the answer and whether it is the upper-cased request; then exits 7
CLIENT = """
import socket, sys
target = sys.argv[1]
if target.startswith("/") or target.startswith("."):
    sock = socket.socket(socket.AF_UNIX); sock.connect(target)
else:
    host, port = target.rsplit(":", 1); sock = socket.create_connection((host, int(port)), 10)
payload = b"relayed " * 131072
sock.sendall(payload); sock.shutdown(socket.SHUT_WR)
answer = b""
while chunk := sock.recv(65536):
    answer += chunk
print(len(answer), answer == payload.upper())
sys.exit(7)
"""


def test_the_outer_relay_carries_a_socket_to_its_destination_and_cleans_up(tmp_path) -> None:
    folder = tmp_path / "net"
    folder.mkdir()
    with _server(socket.AF_INET, ("127.0.0.1", 0)) as (heard, (_, port)):
        done = subprocess.run(
            _outer(folder, f"0=127.0.0.1:{port}", sys.executable, "-c", CLIENT, str(folder / "0")),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 7, done.stderr  # the command's own exit status
    assert done.stdout.split() == [str(8 * 131072), "True"]
    assert heard == [b"relayed " * 131072]
    assert not folder.exists()  # its sockets went with it


def test_the_inner_relay_carries_a_tcp_port_to_its_socket(tmp_path) -> None:
    path = str(tmp_path / "0")
    with _server(socket.AF_UNIX, path) as (heard, _):
        port = free_port()
        done = subprocess.run(
            _inner(f"127.0.0.7:{port}={path}", sys.executable, "-c", CLIENT, f"127.0.0.7:{port}"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 7, done.stderr
    assert done.stdout.split() == [str(8 * 131072), "True"]
    assert heard == [b"relayed " * 131072]


#: a driver stand-in: says whether Python's Ctrl-C handler is its SIGINT handler (it is not
#: when SIGINT was inherited ignored), then waits for a SIGINT and exits 3 on it
STOPPABLE = """
import signal, sys, time
try:  # the SIGINT may arrive while print returns: inside the try, so it still exits 3
    print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    sys.exit(3)
"""


def test_a_clean_stop_passes_through_the_inner_relay_and_never_stops_the_outer(tmp_path) -> None:
    """The backend sends SIGINT to the inner relay (the sandbox's command), which passes it on;
    the outer relay ignores it without making its children ignore it."""
    folder = tmp_path / "net"
    folder.mkdir()
    path = str(folder / "0")
    outer = subprocess.Popen(
        _outer(
            folder,
            "0=127.0.0.1:9",
            *_inner(f"127.0.0.7:{free_port()}={path}", sys.executable, "-c", STOPPABLE),
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert outer.stdout.readline().strip() == "True"  # a driver can be stopped by SIGINT
        outer.send_signal(signal.SIGINT)  # the outer relay: nothing happens
        inner = _only_child(outer.pid)
        os.kill(inner, signal.SIGINT)  # the inner relay: passed on, the driver stops
        assert outer.wait(timeout=30) == 3
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()


def test_a_stale_folder_is_swept_and_a_live_one_kept(tmp_path) -> None:
    stale = SandboxNet.made(tmp_path, [Route("127.0.0.1", 9, "127.0.0.1", "0")], {})
    live = SandboxNet.made(tmp_path, [Route("127.0.0.1", 9, "127.0.0.1", "0")], {})
    fresh = SandboxNet.made(tmp_path, [], {})
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale.folder / "0"))  # bound, never listening: refuses, as a dead relay's
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(live.folder / "0"))
    listener.listen()
    old = time.time() - 3600
    for net in (stale, live):
        os.utime(net.folder, (old, old))
    try:
        sweep_stale(tmp_path)
    finally:
        listener.close()
    assert not stale.folder.exists()
    assert live.folder.exists() and fresh.folder.exists()


def _only_child(pid: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = [
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _parent(int(entry.name)) == pid
        ]
        if len(children) == 1:
            return children[0]
        time.sleep(0.1)
    raise AssertionError(f"no single child of {pid}")


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
