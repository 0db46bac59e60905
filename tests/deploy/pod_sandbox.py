"""Run a container's command the way a pod runs it: from the built image's root file system
(``tests/deploy/image_rootfs.py``: ``localhost/fedtune:<version>``, mounted with buildah), as
UID 10001 with no capabilities, on a read-only root where only the pod's volume mounts can be
written (bubblewrap, ``bwrap`` from Debian; no Kubernetes, no Docker).

What a container runtime does and the sandbox does too:

============================ =====================================================================
runtime                      in the sandbox
============================ =====================================================================
image root file system       the mounted working container, ``--ro-bind`` at ``/``; mount points
                             the pod needs and the image lacks are created in that container's
                             own layer first (as a runtime does), never in the image
``readOnlyRootFilesystem``   the root stays read-only; each rendered ``volumeMount`` is a fresh
                             host directory owned by the pod's user (an emptyDir or a new PVC
                             with ``fsGroup``), read-only when the mount says ``readOnly``
``runAsUser``/``Group``      ``setpriv`` from the image drops to UID/GID with empty capability
``capabilities: drop: ALL``  sets, no bounding set and ``no_new_privs`` (as root; as another
``allowPrivilegeEscalation`` user, a user namespace maps the pod's UID onto that user)
image ``Env``                the image's own configuration (``buildah inspect``), then the
                             container's rendered ``env``
/proc, /dev, /sys            a new /proc of a new PID namespace, a minimal /dev with a tmpfs
                             ``/dev/shm`` (mode 1777, as a runtime gives every container), /sys
                             read-only
``seccompProfile: Localhost`` the profile, compiled and loaded with libseccomp
                             (``tests/seccomp_profiles.py``) before the sandbox is made, so that
                             the container's processes and the sandbox's set-up run under it;
                             ``RuntimeDefault`` is not emulated (no filter)
============================ =====================================================================

The network is this machine's unless the caller runs the sandbox inside a network namespace
(``tests/deploy/netbox.py``), so a pod's service URLs are translated by the caller.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy.image_rootfs import ImageRoot
from tests.seccomp_profiles import under_profile

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_VENV = "/opt/venv"
IMAGE_HOME = "/home/fedtune"


def bwrap_missing() -> str | None:
    """None when bubblewrap can build a sandbox here, else why not."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    probe = subprocess.run(
        [exe, "--ro-bind", "/", "/", "--unshare-pid", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"bwrap cannot create a sandbox here: {probe.stderr.strip()}"
    return None


@dataclass
class Sandbox:
    """One pod's container over the image ``root``. ``volumes``: mountPath -> host directory
    (writable unless listed in ``readonly_mounts``); ``overlays``: image path -> host path
    mounted read-only over it (e.g. a translated ``/etc/hosts``)."""

    scratch: Path
    root: ImageRoot
    volumes: dict[str, Path] = field(default_factory=dict)
    readonly_mounts: set[str] = field(default_factory=set)
    overlays: dict[str, Path] = field(default_factory=dict)
    uid: int = 10001
    gid: int = 10001
    seccomp: Path | None = None

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

    def _mount_points(self) -> None:
        """Create what the mounts need in the working container's layer (a runtime does)."""
        for target, host in [*self.overlays.items(), *self.volumes.items()]:
            inside = self.root.path / target.lstrip("/")
            if not inside.exists() and not inside.is_symlink():
                if host.is_dir():
                    inside.mkdir(parents=True)
                else:
                    inside.parent.mkdir(parents=True, exist_ok=True)
                    inside.touch()

    def argv(self, command: Sequence[str], *, cwd: str) -> list[str]:
        self._mount_points()
        args = [
            shutil.which("bwrap") or "bwrap",
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--new-session",
            "--ro-bind",
            str(self.root.path),
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "1777",
            "--tmpfs",
            "/dev/shm",
            "--ro-bind",
            "/sys",
            "/sys",
        ]
        for target, host in self.overlays.items():
            args += ["--ro-bind", str(host), target]
        for mount_path, host in sorted(self.volumes.items()):
            ro = mount_path in self.readonly_mounts
            args += ["--ro-bind" if ro else "--bind", str(host), mount_path]
        args += ["--chdir", cwd]
        if self.uid == 0:  # root in the image (a Dockerfile RUN step)
            args += [] if os.geteuid() == 0 else ["--unshare-user", "--uid", "0", "--gid", "0"]
        elif os.geteuid() == 0:
            args += [
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                "--cap-add",
                "CAP_SETPCAP",
                "/usr/bin/setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        else:
            args += ["--unshare-user", "--uid", str(self.uid), "--gid", str(self.gid)]
        if self.seccomp is not None:
            assert self.seccomp.is_file(), f"no seccomp profile at {self.seccomp} on the node"
            return under_profile(self.seccomp, [*args, *command])
        return [*args, *command]

    def env(self, container_env: Mapping[str, str]) -> dict[str, str]:
        """The process environment: the image's ``Env``, then the container's."""
        return {**self.root.env, **container_env}

    def run(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = "/data",
        timeout: float = 600,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(command, cwd=cwd),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(
        self, command: Sequence[str], *, env: Mapping[str, str], cwd: str = "/data", log: Path
    ) -> subprocess.Popen:
        """A long-running container process (a server), its output in ``log``."""
        with log.open("w") as handle:
            return subprocess.Popen(
                self.argv(command, cwd=cwd), env=dict(env), stdout=handle, stderr=subprocess.STDOUT
            )
