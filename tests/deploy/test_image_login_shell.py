"""KubeRay < 1.4 starts Ray in every Ray pod with ``/bin/bash -lc -- "ulimit
-n 65536; ray start ..."``. A login shell runs ``/etc/profile``, which on Debian (the image's
base) sets ``PATH`` from scratch, so the image's ``ENV PATH=/opt/venv/bin:...`` is gone and
``ray`` / ``fedtune`` are "command not found" unless the image puts them back.

This runs in the BUILT image (``tests/deploy/image_rootfs.py``), as UID 10001 on its
read-only root with the image's own environment. The control is the image as it was before the
fix: the same root with the Dockerfile step's output hidden (an empty ``/etc/profile.d`` and a
``/usr/local/bin`` without the step's links) — the login shell then fails as reported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.deploy.pod_sandbox import IMAGE_VENV, Sandbox
from tests.deploy.test_dockerfile import DOCKERFILE, parse_dockerfile

#: what KubeRay < 1.4 runs (command ["/bin/bash", "-lc", "--"], args ["ulimit -n 65536; ray start
#: ..."]), with `ray start` replaced by the lookups it depends on (`fedtune` is what a driver runs)
#: and without the `ulimit` (this machine's hard limit may be lower than a node's)
LOGIN_SHELL = [
    "/bin/bash",
    "-lc",
    "--",
    "command -v ray fedtune mlflow && ray --version && fedtune --help >/dev/null",
]
TOOLS = ("fedtune", "ray", "mlflow")

pytestmark = pytest.mark.image


def _login_path_step() -> str:
    """The final stage's RUN that makes the venv reachable from login shells."""
    steps = [
        r.args
        for r in parse_dockerfile(DOCKERFILE.read_text()).final.all("RUN")
        if "/etc/profile.d" in r.args
    ]
    assert len(steps) == 1, "the runtime stage must write /etc/profile.d"
    return steps[0]


def _pod(tmp_path: Path, image_root, *, without_step: bool = False) -> Sandbox:
    pod = Sandbox(tmp_path / "pod", image_root)
    pod.volume("/tmp")
    if without_step:  # hide what the step wrote; keep the base's own /usr/local/bin entries
        profile_d, local_bin = tmp_path / "profile.d", tmp_path / "local-bin"
        profile_d.mkdir()
        local_bin.mkdir()
        for entry in (image_root.path / "usr/local/bin").iterdir():
            if entry.name not in TOOLS and entry.is_symlink():
                (local_bin / entry.name).symlink_to(os.readlink(entry))
        pod.overlays |= {"/etc/profile.d": profile_d, "/usr/local/bin": local_bin}
    return pod


def test_ray_and_fedtune_resolve_in_a_login_shell_as_kuberay_starts_them(
    tmp_path, image_root
) -> None:
    assert "fedtune-venv.sh" in _login_path_step()
    pod = _pod(tmp_path, image_root)
    done = pod.run(LOGIN_SHELL, env=pod.env({}), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = done.stdout.splitlines()[:3]
    assert found == [f"{IMAGE_VENV}/bin/{tool}" for tool in ("ray", "fedtune", "mlflow")], found
    assert "ray, version" in done.stdout


def test_without_the_step_the_login_shell_loses_the_venv(tmp_path, image_root) -> None:
    """The image before the fix: the sandbox shows the reported failure."""
    pod = _pod(tmp_path, image_root, without_step=True)
    done = pod.run(["/bin/bash", "-lc", "--", "ray --version"], env=pod.env({}), timeout=120)
    assert done.returncode == 127 and "ray: command not found" in done.stderr, done.stderr
    # ... while a plain (non-login) shell still had the image's PATH
    plain = pod.run(["/bin/bash", "-c", "command -v ray"], env=pod.env({}))
    assert plain.returncode == 0 and plain.stdout.strip() == f"{IMAGE_VENV}/bin/ray"
