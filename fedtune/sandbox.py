"""Run a command of fedtune's over user code in a bubblewrap sandbox.

A sandboxed process sees a root file system that holds only ``/usr`` (with the usual ``/bin``,
``/lib`` links), the few files of ``/etc`` a dynamically linked Python needs (and, with the
host's network, those of name resolution and certificates), the Python environment fedtune runs
in, and the paths the caller names, all read-only except the ones it names writable; a fresh
``/proc`` of its own PID namespace (no process of the service is visible, so no
``/proc/<pid>/environ``), a minimal ``/dev``, a size-bounded tmpfs at ``/tmp``, a network
namespace of its own with only a loopback (nothing of the host's network; given routes,
:mod:`fedtune.sandbox_net` relays it to the services they name and to nothing else), an
environment of exactly the variables it is given, and resource limits (CPU seconds, address
space, file size, processes). It runs as an unprivileged user: where the service runs as root,
``setpriv`` drops to a user of the sandbox's own (:func:`sandbox_uid`) inside the sandbox (so
``RLIMIT_NPROC`` holds, for it alone: the kernel does not apply it to root, and counts a user's
processes machine-wide); otherwise a user namespace maps the service's own user onto
``SANDBOX_UID`` (``nobody``), and the namespace's count is its own. When the caller dies or
kills the sandbox, every process in it dies (``--die-with-parent``: the PID namespace's first
process goes, and the kernel ends the rest).

Why bubblewrap, and what it isolates on each backend: ``docs/explanation/threat-model.md``.
"""

from __future__ import annotations

import enum
import functools
import os
import secrets
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sandbox_net import SandboxNet

__all__ = [
    "SANDBOX_UID",
    "Limits",
    "Sandbox",
    "SandboxMode",
    "give_to_sandbox",
    "home_inside",
    "prepare_for_sandbox",
    "python_paths",
    "sandbox_missing",
    "sandbox_uid",
]

#: the user (and group) sandboxed code runs as where the service does not run as root (a user
#: namespace maps the service's user onto it): ``nobody``
SANDBOX_UID = 65534
#: where the service runs as root, each sandbox runs as a user of its own, drawn at random from
#: ``[SANDBOX_UID_BASE, SANDBOX_UID_BASE + SANDBOX_UID_COUNT)`` (ids no account should use):
#: ``RLIMIT_NPROC`` counts every process and thread of a user on the machine, so sandboxes that
#: shared one user would share their bound, and one fork bomb, or a study's Ray with its hundreds
#: of threads, would leave the others (another member's code check) no process at all
SANDBOX_UID_BASE = 0x70000000
SANDBOX_UID_COUNT = 1 << 24


def sandbox_uid() -> int:
    """The user (and group) a new sandbox runs as.

    Returns:
        ``SANDBOX_UID`` unless the service runs as root; then a fresh id of the range above.
    """
    if os.geteuid() != 0:
        return SANDBOX_UID
    return SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_COUNT)


#: top-level paths that are links into /usr on a merged-/usr system, or directories to bind
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: files of /etc a dynamically linked Python needs (nothing else of /etc is visible)
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf")
#: what a sandbox with the host's network also needs of /etc: name resolution (a cluster's
#: Service names, an /etc/hosts a pod was given) and the system's certificates
_NETWORK_ETC = (
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
)


class SandboxMode(enum.StrEnum):
    """``FEDTUNE_CODE_SANDBOX``: how user code is isolated."""

    BWRAP = "bwrap"  # bubblewrap (the default): the service refuses to start without it
    NONE = "none"  # the operator's explicit opt-out: user code runs as the service's user


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox (each a ``setrlimit`` limit of every process in it).

    Attributes:
        cpu_s: CPU seconds of one process (``RLIMIT_CPU``; SIGXCPU, then SIGKILL); None: no
            limit (a study driver, which runs for hours).
        memory_bytes: address space of one process (``RLIMIT_AS``; allocations fail); None: no
            limit (Ray reserves far more address space than it uses).
        data_bytes: private writable memory of one process (``RLIMIT_DATA``: its heap and
            anonymous mappings, not reserved address space or shared memory; allocations
            fail); None: no limit.
        file_bytes: size of one written file (``RLIMIT_FSIZE``; SIGXFSZ); None: no limit.
        processes: processes of the sandbox's user (``RLIMIT_NPROC``; fork fails).
        tmp_bytes: size of the private ``/tmp`` (a tmpfs, charged to memory).
        shm_bytes: size of a writable ``/dev/shm`` (a tmpfs: Ray's object store); 0: none.
    """

    cpu_s: int | None = 120
    memory_bytes: int | None = 4 << 30
    file_bytes: int | None = 64 << 20
    processes: int = 64
    tmp_bytes: int = 256 << 20
    shm_bytes: int = 0
    data_bytes: int | None = None

    @classmethod
    def long_running(
        cls, processes: int, tmp_bytes: int, shm_bytes: int, data_bytes: int | None
    ) -> Limits:
        """The limits of a sandbox that runs for hours (a study driver, its Ray and trials).

        No bound on CPU time, address space (Ray reserves far more than it uses) or file size;
        the private memory of each process, the processes and threads of its user, and the
        sizes of its ``/tmp`` and ``/dev/shm``.

        Args:
            processes: ``RLIMIT_NPROC``.
            tmp_bytes: the size of its ``/tmp``.
            shm_bytes: the size of its ``/dev/shm``.
            data_bytes: ``RLIMIT_DATA`` of each process; None: no limit.

        Returns:
            The limits.
        """
        return cls(None, None, None, processes, tmp_bytes, shm_bytes, data_bytes)


@dataclass(frozen=True)
class Sandbox:
    """One sandbox: what it may read and write, its environment and its limits.

    Attributes:
        read_only: host path -> path inside, mounted read-only.
        writable: host path -> path inside, mounted writable.
        env: the whole environment of the sandboxed command: start :meth:`command` with it as
            bubblewrap's own environment (never on the command line, which every user of the
            machine can read), as :meth:`run` does.
        limits: its resource limits.
        cwd: its working directory, inside.
        network: keep the host's network (a command that must reach a cluster: a Ray head's
            driver); else the sandbox has a network namespace of its own with only a loopback.
        net: the only services a sandbox without the host's network reaches
            (:mod:`fedtune.sandbox_net`): its command runs under its inner relay, and the whole
            sandbox under its outer relay (the command's process is then the great-grandchild
            of the one started, not the grandchild).
        private: path inside -> size in bytes of a private, writable tmpfs there (mounted
            before ``writable``, which may lie inside it).
        new_session: start the command in a session of its own (no terminal to inject into);
            False keeps it in the caller's process group, for a caller that signals the group.
        same_user: run as the caller's own user (a user namespace that maps it onto itself,
            every capability dropped) instead of ``SANDBOX_UID``: for a command that must talk
            to the caller's own sockets (a shared Ray node's raylet); ``RLIMIT_NPROC`` then
            does not hold for a caller that is root.
        needs_proc: the command cannot run without a ``/proc`` (a Ray driver reads its own
            process there): where no ``/proc`` of its own can be mounted (a container that masks
            ``/proc``: a Kubernetes pod), it shares the caller's PID namespace and sees the
            caller's ``/proc``, read-only, instead of having none.
        uid: the user (and group) it runs as, unless ``same_user``: one of its own
            (:func:`sandbox_uid`); give it what it writes with :func:`prepare_for_sandbox` or
            :func:`give_to_sandbox` and this id.
    """

    read_only: Mapping[Path, str] = field(default_factory=dict)
    writable: Mapping[Path, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    cwd: str = "/tmp"
    network: bool = False
    private: Mapping[str, int] = field(default_factory=dict)
    new_session: bool = True
    same_user: bool = False
    needs_proc: bool = False
    uid: int = field(default_factory=sandbox_uid)
    net: SandboxNet | None = None

    def __post_init__(self) -> None:
        if self.network and self.net is not None:
            raise ValueError("a sandbox with the host's network has no routes of its own")

    def command(
        self, argv: Sequence[str], *, bwrap: str | None = None, proc: bool | None = None
    ) -> list[str]:
        """``argv`` wrapped to run in this sandbox.

        Args:
            argv: the command, with paths as the sandbox sees them.
            bwrap: the bubblewrap executable (default: ``bwrap`` on ``PATH``).
            proc: mount a ``/proc`` of the sandbox's own PID namespace (default: when the
                probe could; a container whose ``/proc`` is masked allows none, and the sandbox
                then has no ``/proc`` at all).

        Returns:
            The argv to start.
        """
        proc = _probe()[1] if proc is None else proc
        root = os.geteuid() == 0
        out = [bwrap or shutil.which("bwrap") or "bwrap", "--die-with-parent"]
        if self.new_session:
            out.append("--new-session")
        shared_pid = self.needs_proc and not proc  # the caller's processes, read-only
        out += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        out += [] if shared_pid else ["--unshare-pid"]
        if not self.network:
            out.append("--unshare-net")
        if self.same_user:  # a user namespace that maps the caller onto itself
            out += ["--unshare-user", "--uid", str(os.geteuid()), "--gid", str(os.getegid())]
            out += ["--cap-drop", "ALL"]
        elif not root:  # a user namespace maps the service's user onto the sandbox's
            out += ["--unshare-user", "--uid", str(self.uid), "--gid", str(self.uid)]
            out += ["--cap-drop", "ALL"]
        out += ["--ro-bind", "/usr", "/usr"]
        for path in _SYSTEM_DIRS:
            if os.path.islink(path):
                out += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                out += ["--ro-bind", path, path]
        out += ["--perms", "0755", "--dir", "/etc"]  # not 0700: the sandbox's user reads it
        for path in _ETC_FILES + (_NETWORK_ETC if self.network else ()):
            out += ["--ro-bind-try", path, path]
        binds = [("--ro-bind", str(host), str(host)) for host in python_paths(self.env)]
        binds += self.net.binds() if self.net is not None else []
        binds += [("--ro-bind", str(host), inside) for host, inside in self.read_only.items()]
        binds += [("--bind", str(host), inside) for host, inside in self.writable.items()]
        if proc:
            out += ["--proc", "/proc"]
        elif shared_pid:
            out += ["--ro-bind", "/proc", "/proc"]
        out += ["--dev", "/dev"]
        out += ["--perms", "1777", "--size", str(self.limits.tmp_bytes), "--tmpfs", "/tmp"]
        if self.limits.shm_bytes:
            out += ["--perms", "1777", "--size", str(self.limits.shm_bytes), "--tmpfs", "/dev/shm"]
        # the folders above each mount point, made here (not with the host's modes: /root is
        # 0700) after the tmpfs they may lie in, and before what is mounted on them
        for parent in _ancestors(self.private):
            out += ["--perms", "0755", "--dir", parent]
        for inside, size in self.private.items():
            out += ["--perms", "1777", "--size", str(size), "--tmpfs", inside]
        for parent in _ancestors(inside for _, _, inside in binds):
            if parent not in ("/tmp", *self.private):
                out += ["--perms", "0755", "--dir", parent]
        for kind, host, inside in binds:
            out += [kind, host, inside]
        out += ["--chdir", self.cwd, "--"]  # the environment is bwrap's own: ``env`` (not argv)
        if root and not self.same_user:  # drop to its user inside: RLIMIT_NPROC then holds
            out += [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        limits = self.limits
        out += [
            "prlimit",
            f"--cpu={_limit(limits.cpu_s)}",
            f"--as={_limit(limits.memory_bytes)}",
            f"--data={_limit(limits.data_bytes)}",
            f"--fsize={_limit(limits.file_bytes)}",
            f"--nproc={limits.processes}",
            "--core=0",
            "--",
        ]
        if self.net is None:
            return out + list(argv)
        return self.net.outer_argv() + out + self.net.inner_argv() + list(argv)

    def run(
        self, argv: Sequence[str], *, timeout_s: float, input_bytes: bytes | None = None
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` in the sandbox; kill the whole sandbox at ``timeout_s``.

        Args:
            argv: the command, with paths as the sandbox sees them.
            timeout_s: wall-clock limit.
            input_bytes: its standard input (default: none).

        Returns:
            The finished process (stdout and stderr captured).

        Raises:
            subprocess.TimeoutExpired: it ran past ``timeout_s`` (it is killed, with everything
                it started).
        """
        return subprocess.run(
            self.command(argv),
            input=input_bytes,
            stdin=None if input_bytes is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
            env=dict(self.env),
        )


def home_inside() -> dict[str, str]:
    """The variables that keep a sandboxed driver's home, caches and temporary files in its
    private ``/tmp``, and find this Python first.

    Returns:
        Variable -> value.
    """
    return {
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "XDG_CACHE_HOME": "/tmp/.cache",
        "MPLCONFIGDIR": "/tmp",
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
    }


def _limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def prepare_for_sandbox(path: Path, *, writable: bool = False, uid: int = SANDBOX_UID) -> None:
    """Make ``path`` (a tree the service made) usable by the sandbox's user.

    A tree the service (as root) made with private modes cannot be read by ``SANDBOX_UID``:
    directories become 0755 and files 0644; a writable directory is given to that user. Run as
    another user, the user namespace maps the service's user onto it and nothing changes.

    Args:
        path: a directory or file of the service's (a package's copy, a scratch folder).
        writable: the sandbox writes into ``path`` itself.
        uid: the sandbox's user (and group), which a writable ``path`` is given to.
    """
    if os.geteuid() != 0:
        return
    if path.is_file():
        os.chmod(path, 0o644)
        return
    for current, _dirs, files in os.walk(path):
        os.chmod(current, 0o755)
        for name in files:
            file = os.path.join(current, name)
            if not os.path.islink(file):
                os.chmod(file, 0o644)
    if writable:
        os.chown(path, uid, uid)


def give_to_sandbox(path: Path, uid: int = SANDBOX_UID) -> None:
    """Make the tree ``path`` the sandbox user's (a study's folder its sandboxed driver writes).

    Args:
        path: a directory of the service's; nothing changes unless the service runs as root.
        uid: the sandbox's user (and group).
    """
    if os.geteuid() != 0:
        return
    for current, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(current, name), uid, uid)
    os.chown(path, uid, uid)


def python_paths(env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The directories of this Python environment a sandboxed ``python`` needs, read-only.

    The interpreter's prefixes, its ``site-packages``, the directory fedtune itself is
    imported from (an editable install's source folder, without the rest of its checkout) and
    the folders of the sandbox's own ``PYTHONPATH`` (the operator's, passed on by
    ``child_env``); nested paths are given once. Never ``sys.path``'s other entries:
    ``python -m`` puts the working directory there, which may hold the service's database.

    Args:
        env: the sandbox's environment (its ``PYTHONPATH``).

    Returns:
        Absolute, existing directories, none inside another.
    """
    extra = (env or {}).get("PYTHONPATH", "")
    entries = [Path(e) for e in extra.split(os.pathsep) if e and os.path.isabs(e)]
    return _outermost([*_interpreter_paths(), *(p.resolve() for p in entries if p.is_dir())])


@functools.cache
def _interpreter_paths() -> tuple[Path, ...]:
    import fedtune

    found = {Path(sys.prefix), Path(sys.base_prefix), Path(fedtune.__file__).resolve().parent}
    found.add(Path(os.path.realpath(sys.executable)).parent.parent)
    found.update(Path(entry) for entry in site.getsitepackages())
    return tuple(p.resolve() for p in found if p.exists())


def _ancestors(paths: Iterable[str]) -> list[str]:
    """The directories above ``paths`` (not ``/``), each once, parents first."""
    found: dict[str, None] = {}
    for path in paths:
        for parent in reversed(Path(path).parents[:-1]):
            found[str(parent)] = None
    return sorted(found, key=lambda p: p.count("/"))


def _outermost(paths: Iterable[Path]) -> tuple[Path, ...]:
    ordered = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in ordered:
        if path == Path("/") or not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return tuple(p for p in kept if p != Path("/"))


def sandbox_missing() -> str | None:
    """Why a sandbox cannot be made here, or None when it can (probed once a process).

    Returns:
        One line naming what is missing (bubblewrap, setpriv/prlimit, namespaces).
    """
    return _probe()[0]


@functools.cache
def _probe() -> tuple[str | None, bool]:
    """(why no sandbox can be made, or None; whether it can mount a ``/proc`` of its own)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)", False
    for tool in ("prlimit", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux)", False
    reason = ""
    for proc in (True, False):  # a container with a masked /proc allows no new one
        probe = Sandbox(env={"PATH": "/usr/bin:/bin"})
        try:
            done = subprocess.run(
                probe.command([sys.executable, "-I", "-c", "pass"], bwrap=exe, proc=proc),
                env=dict(probe.env),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap cannot start a sandbox here: {exc}", False
        if done.returncode == 0:
            return None, proc
        reason = reason or (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return f"bubblewrap cannot start a sandbox here: {reason}", False
