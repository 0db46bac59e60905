"""The relays that are a sandboxed driver's only way out: TCP in the sandbox, a Unix socket across.

A sandbox with routes (:mod:`fedtune.sandbox_net`) has a network namespace of its own with only
a loopback; its one way out is a folder of Unix sockets bound into it. Two relays, both this
file, run around it:

* ``outer`` (on the host, as the service's user): binds one Unix socket per route in the folder
  it is given, starts the sandbox (bubblewrap) as its child, and relays every connection made to
  a socket to that route's destination (``host:port``: the service's API, the study's MLflow).
  It exits with the sandbox's exit status, having removed the folder; killed, it takes the
  sandbox with it (bubblewrap's ``--die-with-parent``);
* ``inner`` (the sandbox's first command, as the sandbox's user): binds one TCP listener per
  route on the sandbox's loopback (``127.0.0.1:8000``, or the address the sandbox's
  ``/etc/hosts`` gives the destination's name), starts the driver as its child, passes it the
  signals it gets (a clean stop is a SIGINT), relays every connection to the route's socket, and
  exits with the driver's status.

Bytes are copied as they come, in both directions (TLS passes through untouched); each
connection has two threads. Only the standard library is used, and the file is run by path with
``python -I -S``, so that nothing of the environment's (``PYTHONPATH``, ``site-packages``) is
imported, outside the sandbox or in it. Usage::

    python -I -S sandbox_relay.py outer --dir DIR --route NAME=HOST:PORT ... -- ARGV...
    python -I -S sandbox_relay.py inner --route ADDRESS:PORT=SOCKET ... -- ARGV...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

#: how long the outer relay waits for a destination to accept a connection
CONNECT_TIMEOUT_S = 30.0
_CHUNK = 1 << 16
_BACKLOG = 128


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until its end (then half-close ``sink``) or an error (then
    close both ways of both, which ends the other direction's copy too)."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _relay(client: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """One connection: open the other end, copy both ways, close both."""
    with client:
        try:
            upstream = connect()
        except OSError:
            return  # the client sees its connection closed, as a refused one
        with upstream:
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()


def _accept(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Accept on ``listener`` for ever, each connection relayed in a thread of its own."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:  # out of file descriptors or threads: the client retries
            time.sleep(0.1)
            continue
        if client.family != socket.AF_UNIX:  # bytes go on as they come: no Nagle delay
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_relay, args=(client, connect), daemon=True).start()


def _serve(listeners: Sequence[tuple[socket.socket, Callable[[], socket.socket]]]) -> None:
    for listener, connect in listeners:
        threading.Thread(target=_accept, args=(listener, connect), daemon=True).start()


def _tcp_to(host: str, port: int) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    return connect


def _unix_to(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return sock

    return connect


def _run_child(argv: Sequence[str], forward: Sequence[int], drop: Sequence[int] = ()) -> int:
    """Start ``argv``, pass it the signals ``forward`` and swallow ``drop`` (handlers, not
    ``SIG_IGN``, which the child would inherit), wait for it; its exit status (128 + the signal
    that ended it, as a shell reports it)."""
    started: list[subprocess.Popen] = []

    def pass_on(signum: int, _frame: object) -> None:
        for child in started:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    for signum in forward:
        signal.signal(signum, pass_on)
    for signum in drop:
        signal.signal(signum, lambda *_: None)
    started.append(subprocess.Popen(list(argv)))
    code = started[0].wait()
    return 128 - code if code < 0 else code


def _split(text: str, sep: str) -> tuple[str, str]:
    left, found, right = text.rpartition(sep)
    if not found or not left or not right:
        raise SystemExit(f"sandbox_relay: bad route {text!r}")
    return left, right


def outer(directory: str, routes: Sequence[str], argv: Sequence[str]) -> int:
    """The host's side (see the module docstring).

    Args:
        directory: the folder of the sockets (bound into the sandbox); removed at the end.
        routes: ``NAME=HOST:PORT``: a socket named NAME in ``directory`` leads to HOST:PORT.
        argv: the sandbox (bubblewrap's command line).

    Returns:
        The sandbox's exit status.
    """
    os.chdir(directory)  # relative names: a socket's path is limited to 107 bytes
    listeners = []
    for route in routes:
        name, target = _split(route, "=")
        host, port = _split(target, ":")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        listener.bind(name)
        os.chmod(name, 0o666)  # the sandbox's user connects
        listener.listen(_BACKLOG)
        listeners.append((listener, _tcp_to(host.strip("[]"), int(port))))
    _serve(listeners)
    try:  # a clean stop (SIGINT) is the driver's own, sent to it, not to this relay
        return _run_child(argv, (signal.SIGTERM, signal.SIGHUP), drop=(signal.SIGINT,))
    finally:
        shutil.rmtree(os.path.abspath("."), ignore_errors=True)


def inner(routes: Sequence[str], argv: Sequence[str]) -> int:
    """The sandbox's side (see the module docstring).

    Args:
        routes: ``ADDRESS:PORT=SOCKET``: a listener on ADDRESS:PORT of the sandbox's loopback
            leads to the Unix socket SOCKET.
        argv: the driver's command line.

    Returns:
        The driver's exit status.
    """
    listeners = []
    for route in routes:
        target, path = _split(route, "=")
        address, port = _split(target, ":")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, int(port)))
        listener.listen(_BACKLOG)
        listeners.append((listener, _unix_to(path)))
    _serve(listeners)
    return _run_child(argv, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def main(args: Sequence[str]) -> int:
    """``outer`` or ``inner``, as the module docstring shows.

    Args:
        args: the command line after the program's name.

    Returns:
        The exit status of the command it ran (2: a bad command line).
    """
    if "--" not in args:
        print("sandbox_relay: no command after --", file=sys.stderr)
        return 2
    cut = list(args).index("--")
    parser = argparse.ArgumentParser(prog="sandbox_relay")
    parser.add_argument("side", choices=("outer", "inner"))
    parser.add_argument("--dir")
    parser.add_argument("--route", action="append", default=[])
    options = parser.parse_args(args[:cut])
    argv = args[cut + 1 :]
    if not argv:
        print("sandbox_relay: no command after --", file=sys.stderr)
        return 2
    if options.side == "outer":
        return outer(options.dir, options.route, argv)
    return inner(options.route, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
