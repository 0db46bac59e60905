"""The built image, as a root file system the chart's containers run from.

:func:`image_root` (a pytest session fixture of the same name in ``tests/deploy/conftest.py``)
builds ``localhost/fedtune:<version>`` once per session with ``deploy/build_image.py`` — the
same script as ``make image``: buildah without a daemon, layers cached, so a session after a
code change rebuilds the last layers only — then makes one working container of it
(``buildah from``) and mounts it (``buildah mount``: an overlay whose upper layer is that
container's, so nothing a test does reaches the image). :class:`ImageRoot` carries the mounted
path and the image's own configuration (``Env``, ``User``, ``WorkingDir``) as the image
declares it; :class:`tests.deploy.pod_sandbox.Sandbox` runs a container's command there under
bubblewrap, read-only, as the pod's user.

``FEDTUNE_IMAGE=<ref>`` uses an image that exists already instead of building (e.g. one built
by ``make image`` with other build arguments). Without buildah or as a non-root user, the tests
that need the image skip with the reason, or fail where ``FEDTUNE_REQUIRE_IMAGE=1`` (CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.needs import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "deploy" / "build_image.py"
BUILD_TIMEOUT_S = 3600  # a cold build on 2 cores: the Debian base and every wheel


@dataclass(frozen=True)
class ImageRoot:
    """A mounted working container of the image: ``path`` is its ``/``."""

    ref: str
    container: str
    path: Path
    env: dict[str, str]
    user: str
    workdir: str

    @property
    def uid_gid(self) -> tuple[int, int]:
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)


def missing_reason() -> str | None:
    """None when this machine can build and mount the image, else why not."""
    if shutil.which("buildah") is None:
        return "buildah is not installed (apt-get install -y buildah debootstrap)"
    if os.geteuid() != 0:
        return "mounting an image's root file system needs root (buildah mount)"
    return None


def build_image() -> str:
    """Build (or reuse, with ``FEDTUNE_IMAGE``) the image; returns its reference."""
    given = os.environ.get("FEDTUNE_IMAGE")
    if given:
        return given
    done = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--engine", "buildah", "--quiet"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the image failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"buildah {args[0]} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def mount(ref: str) -> ImageRoot:
    """A new working container of ``ref``, mounted; :func:`unmount` removes it."""
    config = json.loads(_buildah("inspect", "--type", "image", ref))["OCIv1"]["config"]
    env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
    container = _buildah("from", "--pull-never", ref)
    try:
        path = Path(_buildah("mount", container))
    except BaseException:
        _buildah("rm", container)
        raise
    return ImageRoot(
        ref, container, path, env, config.get("User") or "0", config.get("WorkingDir") or "/"
    )


def unmount(root: ImageRoot) -> None:
    subprocess.run(["buildah", "umount", root.container], capture_output=True, timeout=120)
    subprocess.run(["buildah", "rm", root.container], capture_output=True, timeout=120)
