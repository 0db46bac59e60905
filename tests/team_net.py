"""A team's network in two network namespaces: the operator's machine ("box") and a member's
laptop, for the tests of what a person uses from another machine (STYLE.md, habit 15).

Built from the cluster in a box's parts (:class:`tests.deploy.netbox.NetBox`): each machine is a
namespace whose ``eth0`` is one end of a veth pair, the other end a port of a bridge in a switch
namespace (``<tag>-sw``) — a LAN with no interface in this machine's namespace, so nothing the
test starts is reachable from anywhere else and nothing it reaches is outside. Addresses are
``10.213.<n>.2`` (laptop) and ``10.213.<n>.3`` (box); each namespace has its own loopback.

Names are what a team's DNS would give: a hosts file (``/etc/netns/<netns>/hosts``, which
``ip netns exec`` binds over ``/etc/hosts``) answers :data:`BOX_NAMES` with the box's address in
both namespaces, and ``localhost`` with 127.0.0.1. The resolver of glibc and Chromium's both read
it; no other file of this machine changes.

Processes are started in a namespace with ``ip netns exec``, each in a session of its own, its
output in ``<root>/<name>.log``; :meth:`TeamNet.close` stops them by session, then ends whatever
is still inside the namespaces (only this test's: the namespaces are its own), then deletes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.deploy.netbox import NetBox, box_missing

__all__ = ["BOX_NAMES", "TeamNet", "box_missing", "nginx_missing", "team_net_tag"]

#: the names the laptop reaches the box by: its host name, and two names an ingress would serve
BOX_NAMES = ("box", "mlflow.box.test", "api.box.test")
#: every server of the box gets this long to answer (a loaded 2-core machine)
START_S = 240


def team_net_tag() -> tuple[str, tuple[int, int]]:
    """A tag (namespace names) and the /24 of one test process's network: unique per process, so
    pytest-xdist workers never share a namespace name.

    Returns:
        (tag, (213, n)): the namespaces are ``<tag>-laptop``, ``<tag>-box``, ``<tag>-sw``.
    """
    pid = os.getpid()
    return f"tn{pid % 10000}", (213, pid % 250)


class TeamNet:
    """The laptop and the box, and the processes this test started in them.

    Args:
        root: a folder for logs.
    """

    def __init__(self, root: Path) -> None:
        tag, octets = team_net_tag()
        self.root = root
        self.net = NetBox(tag, octets)
        self.procs: dict[str, subprocess.Popen] = {}
        try:
            self.net.add_pod("laptop", {})
            self.net.add_pod("box", {})
            self.box_ip = self.net.pods["box"].ip
            self.net.publish_hosts(
                f"127.0.0.1 localhost\n{self.box_ip} {' '.join(BOX_NAMES)}\n"
                f"{self.net.pods['laptop'].ip} laptop\n"
            )
        except BaseException:
            self.net.close()
            raise

    # ---- processes ------------------------------------------------------------------------
    def argv(self, where: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run in ``where``'s namespace (``laptop`` or ``box``)."""
        return self.net.exec_argv(where, [str(a) for a in argv])

    def start(
        self,
        where: str,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
    ) -> subprocess.Popen:
        """Start a long-running process in ``where``, in a session of its own.

        Args:
            where: ``laptop`` or ``box``.
            name: its name (and its log, ``<root>/<name>.log``).
            argv: the command.
            env: its whole environment.
            cwd: its working directory.

        Returns:
            The process.
        """
        with (self.root / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(
                self.argv(where, argv),
                env=dict(env),
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def log(self, name: str, tail: int = 3000) -> str:
        """The last ``tail`` characters of a process's log."""
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def python(self, where: str, code: str, *args: str, timeout: float = 60) -> object:
        """Run ``code`` with this Python in ``where``; the last line it prints, as JSON."""
        done = subprocess.run(
            self.argv(where, [sys.executable, "-c", code, *args]),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def http(
        self,
        where: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        body: Mapping[str, object] | None = None,
    ) -> tuple[int, str]:
        """One request from ``where``: a GET, or a JSON POST of ``body``.

        Returns:
            (status, the first 300 characters of the answer); status 0 when nothing answered.
        """
        code = (
            "import json,sys,urllib.request as u\n"
            "url,headers,body=sys.argv[1],json.loads(sys.argv[2]),json.loads(sys.argv[3])\n"
            "data=None if body is None else json.dumps(body).encode()\n"
            "data and headers.setdefault('Content-Type','application/json')\n"
            "req=u.Request(url,data=data,headers=headers)\n"
            "try:\n r=u.urlopen(req,timeout=10);print(json.dumps([r.status,r.read(300).decode()]))\n"
            "except u.HTTPError as e:\n print(json.dumps([e.code,e.read(300).decode()]))\n"
            "except OSError as e:\n print(json.dumps([0,str(e)]))\n"
        )
        sent = (json.dumps(dict(headers or {})), json.dumps(None if body is None else dict(body)))
        status, answer = self.python(where, code, url, *sent)
        return int(status), str(answer)

    def wait_http(self, where: str, url: str, name: str, timeout: float = START_S) -> None:
        """Until ``url`` answers 200 from ``where`` while process ``name`` runs (asked with
        ``curl``, as the page's blocks ask: a Python per poll cost the busy machine more)."""
        deadline = time.monotonic() + timeout
        ask = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", url]
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            assert proc is None or proc.poll() is None, f"{name} exited:\n{self.log(name)}"
            done = subprocess.run(
                self.argv(where, ask), capture_output=True, text=True, check=False
            )
            if done.stdout.strip() == "200":
                return
            time.sleep(1)
        raise AssertionError(f"{url} not up from the {where} in {timeout} s:\n{self.log(name)}")

    def stop(self, name: str) -> None:
        """SIGTERM a process's session, SIGKILL after 30 s."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop_all(self) -> None:
        """Stop every process started here, then end what is left inside the namespaces (the
        children of a process that made sessions of their own, a script's background jobs)."""
        for name in list(self.procs):
            self.stop(name)
        for where in ("laptop", "box"):
            self.end_namespace(where)

    def end_namespace(self, where: str) -> None:
        """SIGTERM, then SIGKILL, every process inside ``where``'s namespace (this test's)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids(where)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 20
            while pids and time.monotonic() < deadline:
                time.sleep(0.3)
                pids = self.pids(where)
            if not pids:
                return

    def pids(self, where: str) -> list[int]:
        """The processes inside ``where``'s namespace."""
        done = subprocess.run(
            ["ip", "netns", "pids", self.net.pods[where].netns],
            capture_output=True,
            text=True,
            check=False,
        )
        return [int(p) for p in done.stdout.split()]

    def close(self) -> None:
        """Stop everything and delete the namespaces and their hosts files."""
        try:
            self.stop_all()
        finally:
            self.net.close()


def nginx_missing() -> str | None:
    """None when Debian's nginx is installed (its ``/etc/nginx``), else how to install it."""
    import shutil

    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").is_file():
        return "nginx is not installed (apt-get install -y nginx)"
    if not Path("/etc/nginx/nginx.conf").is_file():
        return "/etc/nginx/nginx.conf is missing (Debian's nginx package writes it)"
    return None
