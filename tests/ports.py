"""Free TCP ports for the servers the tests start, one policy for all.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from its *ephemeral* range
(``net.ipv4.ip_local_port_range``, 32768–60999 by default) — the range every outgoing connection
of the machine also draws its local port from. Between choosing such a port and the server's
own ``bind`` any connection (a Ray worker to its GCS, a pytest worker to PostgreSQL, Chromium)
can take it: CI lost a run to ``ray start --head`` finding its dashboard port "already occupied"
(stop 69). The ports here are drawn at random from *below* the ephemeral range, where no outgoing
connection ever lands, and each is checked by binding it on every address; two pytest workers
drawing the same port of some thousands in the same second is the remaining (tiny) chance, which
the retries of the start-ups (``tests/ray_start.py``) cover by drawing again.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterable
from pathlib import Path

__all__ = ["free_block", "free_port", "free_ports", "quiet_range"]

#: the lowest port drawn (under it: well-known and registered services a machine may run)
LOWEST = 20_000
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_RANDOM = random.SystemRandom()  # not the tests' seeded ``random``: workers must differ


def quiet_range() -> range:
    """The ports no outgoing connection of this machine is given: outside the ephemeral range.

    Returns:
        below the ephemeral range (from :data:`LOWEST`) when that leaves 1,000 ports or more,
        else above it; an empty range when neither does (then the kernel chooses).
    """
    try:
        low, high = (int(x) for x in _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    below, above = range(LOWEST, low), range(high + 1, 65536)
    return max(below, above, key=len) if max(len(below), len(above)) >= 1000 else range(0)


def _bound(stack: contextlib.ExitStack, port: int) -> int | None:
    """Bind ``port`` on every address (kept until ``stack`` closes); its number, or None."""
    sock = stack.enter_context(socket.socket())
    try:
        sock.bind(("", port))
    except OSError:
        return None
    return sock.getsockname()[1]


def free_ports(n: int, exclude: Iterable[int] = ()) -> list[int]:
    """``n`` distinct free ports, none of ``exclude``, from :func:`quiet_range`.

    Every socket stays bound until all are chosen, so no port is handed out twice (two
    ``free_port()`` calls could: CI once gave Ray's runtime-env agent and its metrics exporter
    the same port).

    Args:
        n: how many ports.
        exclude: ports not to return (those of a server chosen earlier).

    Returns:
        the ports, free when this returns.
    """
    taken = set(exclude)
    pool = quiet_range()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        tries = 0
        while len(ports) < n:
            tries += 1
            # a quiet port while some are left to try; the kernel's choice otherwise
            guess = _RANDOM.choice(pool) if pool and tries <= 200 * n else 0
            if guess in taken:
                continue
            port = _bound(stack, guess)
            if port is not None and port not in taken:
                taken.add(port)
                ports.append(port)
        return ports


def free_port() -> int:
    """One free port (:func:`free_ports`)."""
    return free_ports(1)[0]


def free_block(n: int, exclude: Iterable[int] = ()) -> range:
    """``n`` consecutive free ports, none of ``exclude``, from :func:`quiet_range`: a range a
    server takes ports from later (Ray's ``--min-worker-port``/``--max-worker-port``), so that
    no port drawn by :func:`free_ports` with it in ``exclude`` lands inside it.

    Args:
        n: how many ports.
        exclude: ports the range must not hold.

    Returns:
        the ports, each free when this returns.

    Raises:
        RuntimeError: no such range was found in 200 tries.
    """
    taken, pool = set(exclude), quiet_range()
    for _ in range(200):
        if len(pool) <= n:
            break
        start = _RANDOM.choice(pool[: len(pool) - n])
        block = range(start, start + n)
        if taken.intersection(block):
            continue
        with contextlib.ExitStack() as stack:
            if all(_bound(stack, port) == port for port in block):
                return block
    raise RuntimeError(f"no {n} consecutive free ports in {pool}")
