"""Issue 11, finding 8: KubeRay < 1.4 starts Ray in every Ray pod with ``/bin/bash -lc -- "ulimit
-n 65536; ray start ..."``. A login shell runs ``/etc/profile``, which on Debian (the image's
base) sets ``PATH`` from scratch, so the image's ``ENV PATH=/opt/venv/bin:...`` is gone and
``ray`` / ``fedtune`` are "command not found" unless the image puts them back.

The test builds the image's file system in a bubblewrap sandbox (tests/deploy/pod_sandbox.py),
runs the Dockerfile's own ``RUN`` step that writes ``/etc/profile.d`` and ``/usr/local/bin``
(as root, as ``docker build`` does), then runs KubeRay's login-shell command as UID 10001 with
the image's environment. The same command without that step — the Dockerfile before the fix —
fails with ``ray: command not found``, which shows the sandbox reproduces the failure.
"""

from __future__ import annotations

import pytest

from tests.deploy.pod_sandbox import IMAGE_VENV, Sandbox, bwrap_missing, image_env
from tests.deploy.test_dockerfile import DOCKERFILE, parse_dockerfile
from tests.needs import need

#: what KubeRay < 1.4 runs (command ["/bin/bash", "-lc", "--"], args ["ulimit -n 65536; ray start
#: ..."]), with `ray start` replaced by the lookups it depends on (`fedtune` is what a driver runs)
#: and without the `ulimit` (this machine's hard limit may be lower than a node's)
LOGIN_SHELL = ["/bin/bash", "-lc", "--",
               "command -v ray fedtune mlflow && ray --version && fedtune --help >/dev/null"]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _bwrap() -> None:
    need("bwrap", bwrap_missing())


def _login_path_step() -> str:
    """The final stage's RUN that makes the venv reachable from login shells."""
    steps = [r.args for r in parse_dockerfile(DOCKERFILE.read_text()).final.all("RUN")
             if "/etc/profile.d" in r.args]  # fmt: skip
    assert len(steps) == 1, "the runtime stage must write /etc/profile.d (finding 8)"
    return steps[0]


def _image(tmp_path, *, with_step: bool) -> Sandbox:
    """The image's file system: /etc/profile.d and /usr/local/bin as the build left them."""
    profile_d = tmp_path / "profile.d"
    local_bin = tmp_path / "local-bin"
    for host in (profile_d, local_bin):
        host.mkdir()
    if with_step:
        build = Sandbox(tmp_path / "build", uid=0, gid=0)
        build.volumes |= {"/etc/profile.d": profile_d, "/usr/local/bin": local_bin}
        done = build.run(["/bin/sh", "-c", _login_path_step()], env=image_env(DOCKERFILE.read_text()),
                         cwd="/")  # fmt: skip
        assert done.returncode == 0, done.stderr
    pod = Sandbox(tmp_path / "pod")
    pod.overlays |= {"/etc/profile.d": profile_d, "/usr/local/bin": local_bin}
    pod.volume("/tmp")
    return pod


def test_ray_and_fedtune_resolve_in_a_login_shell_as_kuberay_starts_them(tmp_path) -> None:
    pod = _image(tmp_path, with_step=True)
    done = pod.run(LOGIN_SHELL, env=image_env(DOCKERFILE.read_text()), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = done.stdout.splitlines()[:3]
    assert found == [f"{IMAGE_VENV}/bin/{tool}" for tool in ("ray", "fedtune", "mlflow")], found
    assert "ray, version" in done.stdout


def test_without_the_step_the_login_shell_loses_the_venv(tmp_path) -> None:
    """The Dockerfile before finding 8 was fixed: the sandbox shows the reported failure."""
    pod = _image(tmp_path, with_step=False)
    done = pod.run(["/bin/bash", "-lc", "--", "ray --version"],
                   env=image_env(DOCKERFILE.read_text()), timeout=120)  # fmt: skip
    assert done.returncode == 127 and "ray: command not found" in done.stderr, done.stderr
    # ... while a plain (non-login) shell still had the image's PATH
    plain = pod.run(["/bin/bash", "-c", "command -v ray"], env=image_env(DOCKERFILE.read_text()))
    assert plain.returncode == 0 and plain.stdout.strip() == f"{IMAGE_VENV}/bin/ray"
