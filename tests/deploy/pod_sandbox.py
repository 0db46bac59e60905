"""Run a container's command on this machine the way a pod runs it in fedtune's image: as UID
10001 with no capabilities, on a read-only root file system where only the pod's writable
volume mounts can be written (bubblewrap, ``bwrap`` from Debian; no Kubernetes, no Docker).

The image's file system is emulated, and every difference from the image is listed here:

============================ =====================================================================
image path                   in the sandbox
============================ =====================================================================
``/usr``, ``/etc``, ``/bin``  this machine's, read-only (Debian 12 "bookworm", the base of
                             ``python:3.11-slim-bookworm``, so ``/etc/profile`` is the image's)
``/etc/passwd``, group       this machine's plus the ``fedtune`` user (10001) the Dockerfile adds
``/home/fedtune``            ``/etc/skel``, read-only (``useradd --create-home`` copies it)
``/opt/venv``                this machine's virtualenv, read-only; it is also mounted at its own
                             path (its scripts' ``#!`` lines name it) with its base interpreter
this checkout                read-only at its own path and first on ``PYTHONPATH`` (the image has
                             fedtune installed in the venv; the venv's editable install may point
                             at another checkout)
``/data``, ``/tmp``, ...      directories of the read-only root, unless the pod mounts a volume
                             there: each rendered ``volumeMount`` is a fresh host directory owned
                             by 10001 (an emptyDir or a new PVC with ``fsGroup``), read-only when
                             the mount says ``readOnly``
============================ =====================================================================

The network is this machine's, so a pod's service URLs are translated by the caller. As root,
bwrap mounts everything and ``setpriv`` then becomes 10001:10001 with empty capability sets and
``no_new_privs`` (``allowPrivilegeEscalation: false``, ``capabilities: drop: [ALL]``); as another
user, a user namespace maps 10001 onto that user.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_VENV = "/opt/venv"
IMAGE_HOME = "/home/fedtune"
#: the ``ENV`` of ``python:3.11-slim-bookworm`` that the Dockerfile builds on
BASE_IMAGE_ENV = {
    "PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
#: directories of the image's root file system and their modes (read-only at run time)
IMAGE_DIRS = {"/data": "0755", "/tmp": "1777", "/var/tmp": "1777", "/run": "0755",
              "/home": "0755"}  # fmt: skip


def bwrap_missing() -> str | None:
    """None when bubblewrap can build a sandbox here, else why not."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    probe = subprocess.run([exe, "--ro-bind", "/", "/", "--unshare-pid", "true"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    if probe.returncode != 0:
        return f"bwrap cannot create a sandbox here: {probe.stderr.strip()}"
    return None


def _editable_source() -> Path | None:
    """Where the venv's editable fedtune points (it must be readable for the venv to start)."""
    try:
        text = importlib.metadata.distribution("fedtune").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    url = json.loads(text or "{}").get("url", "")
    return Path(url.removeprefix("file://")) if url.startswith("file://") else None


def host_python_paths() -> list[Path]:
    """Host directories the venv needs at their own paths (venv, base interpreter, checkouts)."""
    paths = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), REPO_ROOT]
    source = _editable_source()
    if source is not None and source.exists():
        paths.append(source.resolve())
    unique: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(parent) for parent in unique):
            unique.append(path)
    return unique


@dataclass
class Sandbox:
    """One pod's file system. ``volumes``: mountPath -> host directory (writable unless listed
    in ``readonly_mounts``); ``overlays``: image path -> host path mounted read-only over it
    (e.g. files the Dockerfile writes)."""

    scratch: Path
    volumes: dict[str, Path] = field(default_factory=dict)
    readonly_mounts: set[str] = field(default_factory=set)
    overlays: dict[str, Path] = field(default_factory=dict)
    uid: int = 10001
    gid: int = 10001

    def volume(self, mount_path: str, *, read_only: bool = False) -> Path:
        """A fresh host directory for ``mount_path``, owned by the pod's user (emptyDir/fsGroup)."""
        host = self.scratch / "volumes" / mount_path.strip("/").replace("/", "_")
        host.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(host, self.uid, self.gid)
        self.volumes[mount_path] = host
        if read_only:
            self.readonly_mounts.add(mount_path)
        return host

    def _identity_files(self) -> list[str]:
        etc = self.scratch / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        passwd, group = etc / "passwd", etc / "group"
        passwd.write_text(Path("/etc/passwd").read_text()
                          + f"fedtune:x:{self.uid}:{self.gid}::{IMAGE_HOME}:/bin/bash\n")  # fmt: skip
        group.write_text(Path("/etc/group").read_text() + f"fedtune:x:{self.gid}:\n")
        return ["--ro-bind", str(passwd), "/etc/passwd", "--ro-bind", str(group), "/etc/group"]

    def argv(self, command: Sequence[str], *, cwd: str) -> list[str]:
        args = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--unshare-pid",
                "--unshare-ipc", "--new-session"]  # fmt: skip
        for path, mode in IMAGE_DIRS.items():
            args += ["--perms", mode, "--dir", path]
        targets = [*map(str, host_python_paths()), IMAGE_VENV, *self.overlays, *self.volumes]
        for parent in sorted({str(p) for t in targets for p in Path(t).parents} - {"/"}):
            if parent not in IMAGE_DIRS:  # e.g. /root of /root/.pyenv: traversable
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link in ("bin", "sbin", "lib", "lib64"):
            if Path(f"/{link}").is_symlink():
                args += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
            elif Path(f"/{link}").exists():
                args += ["--ro-bind", f"/{link}", f"/{link}"]
        args += self._identity_files()
        args += ["--ro-bind", "/etc/skel", IMAGE_HOME]
        args += ["--proc", "/proc", "--dev", "/dev", "--ro-bind", "/sys", "/sys"]
        for path in host_python_paths():
            args += ["--ro-bind", str(path), str(path)]
        args += ["--ro-bind", str(Path(sys.prefix)), IMAGE_VENV]
        for target, host in self.overlays.items():
            args += ["--ro-bind", str(host), target]
        for mount_path, host in sorted(self.volumes.items()):
            ro = mount_path in self.readonly_mounts
            args += ["--ro-bind" if ro else "--bind", str(host), mount_path]
        args += ["--remount-ro", "/", "--chdir", cwd]
        if self.uid == 0:  # a Dockerfile RUN step (root in the image)
            args += [] if os.geteuid() == 0 else ["--unshare-user", "--uid", "0", "--gid", "0"]
        elif os.geteuid() == 0:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                     "--cap-add", "CAP_SETPCAP", "/usr/bin/setpriv",
                     f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
        else:
            args += ["--unshare-user", "--uid", str(self.uid), "--gid", str(self.gid)]
        return [*args, *command]

    def run(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = "/data",
        timeout: float = 600,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command, cwd=cwd), env=dict(env), capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip

    def popen(self, command: Sequence[str], *, env: Mapping[str, str], cwd: str = "/data",
              log: Path) -> subprocess.Popen:  # fmt: skip
        """A long-running container process (a server), its output in ``log``."""
        with log.open("w") as handle:
            return subprocess.Popen(self.argv(command, cwd=cwd), env=dict(env), stdout=handle,
                                    stderr=subprocess.STDOUT)  # fmt: skip


def image_env(dockerfile_text: str) -> dict[str, str]:
    """The environment a container of the image starts with: the base image's ``ENV`` and then
    the final stage's ``ENV`` instructions, ``$VAR`` references expanded as Docker does."""
    import re
    import shlex

    from tests.deploy.test_dockerfile import parse_dockerfile

    env = dict(BASE_IMAGE_ENV)
    for instruction in parse_dockerfile(dockerfile_text).final.all("ENV"):
        for word in shlex.split(instruction.args):
            name, _, value = word.partition("=")
            env[name] = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                               lambda m: env.get(m.group(1), ""), value)  # fmt: skip
    return env
