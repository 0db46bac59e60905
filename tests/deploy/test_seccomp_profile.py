"""The chart's seccomp profile for the containers that start the code sandbox: what it allows
(bubblewrap's user namespaces), what it refuses (what RuntimeDefault refuses), where the chart
puts it, and its installer.

A profile is loaded as a container runtime loads it (libseccomp, ``tests/seccomp_load.py``);
the cluster in a box runs the API and the Ray head under it (tests/deploy/test_cluster_box.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import RELEASE, find, one, pod_specs
from tests.needs import REPO_ROOT, need
from tests.seccomp_profiles import (
    CHART_PROFILE,
    SYSTEM_PYTHON,
    install_profile,
    seccomp_missing,
    under_profile,
)

FULLNAME = f"{RELEASE}-fedtune"
LOCALHOST = {"type": "Localhost", "localhostProfile": "fedtune/code-sandbox.json"}
RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
CODE_ON = {"auth": {"apiToken": "t" * 20}, "codeUpload": {"enabled": True}}
RAY = {"backend": "ray", "rayCluster": {"enabled": True}}
#: a harmless call of each kind RuntimeDefault refuses, and what it does without a profile
#: (never EPERM): (name, arguments)
REFUSED = [
    ("keyctl", (0, -2, 0)),  # KEYCTL_GET_KEYRING_ID of the process keyring: works
    ("bpf", (-1, 0, 0)),  # an unknown command: EINVAL
    ("perf_event_open", (0, 0, -1, -1, 0)),  # no attributes: EFAULT
    ("setns", (-1, 0)),  # no such descriptor: EBADF
    ("io_uring_setup", (1, 0)),  # no parameters: EFAULT
    ("userfaultfd", (-1,)),  # unknown flags: EINVAL
    ("open_by_handle_at", (-1, 0, 0)),  # EBADF (or EPERM without CAP_DAC_READ_SEARCH)
]
_CALLS = """
import ctypes, json, sys, seccomp
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, args in json.loads(sys.argv[1]):
    number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
    ctypes.set_errno(0)
    result = libc.syscall(number, *[ctypes.c_long(a) for a in args])
    out[name] = ctypes.get_errno() if result == -1 else 0
print(json.dumps(out))
"""
#: a sandbox as the code check's, with nothing of the host but /usr (as an unprivileged user:
#: it must make a user namespace)
_BWRAP = [
    "/usr/bin/bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "/usr/bin/true",
]
_NOBODY = [
    "/usr/bin/setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=-all",
    "--bounding-set=-all",
]


def _containers(manifests: list[dict]) -> dict[str, dict]:
    """Every container of every rendered workload, by "<kind>/<name>/<container>"."""
    found = {}
    for manifest in manifests:
        for _, _, pod in pod_specs(manifest):
            for c in pod.get("initContainers", []) + pod.get("containers", []):
                where = f"{manifest['kind']}/{manifest['metadata']['name']}/{c['name']}"
                found[where] = (pod.get("securityContext") or {}) | (c.get("securityContext") or {})
    return found


def test_code_upload_gives_only_the_sandbox_containers_the_profile(render) -> None:
    contexts = _containers(render(CODE_ON | RAY))
    localhost = {k for k, sc in contexts.items() if sc.get("seccompProfile") == LOCALHOST}
    assert localhost == {
        f"Deployment/{FULLNAME}/api",
        f"RayCluster/{FULLNAME}-ray/ray-head",
    }
    others = {k: sc.get("seccompProfile") for k, sc in contexts.items() if k not in localhost}
    assert others and all(p == RUNTIME_DEFAULT for p in others.values()), others
    assert not find(render(CODE_ON | RAY), "DaemonSet")  # installing it is the operator's choice


@pytest.mark.parametrize(
    "values",
    [
        {},  # code upload off
        CODE_ON | {"codeUpload": {"enabled": True, "sandbox": "none"}},
        CODE_ON | {"codeUpload": {"enabled": True, "seccomp": {"localhostProfile": ""}}},
    ],
    ids=["off", "no-sandbox", "no-profile"],
)
def test_without_the_sandbox_every_container_keeps_runtime_default(render, values) -> None:
    contexts = _containers(render(values | RAY))
    assert {str(sc.get("seccompProfile")) for sc in contexts.values()} == {str(RUNTIME_DEFAULT)}


@pytest.mark.parametrize("path", ["../etc/x.json", "fedtune/../../x.json"])
def test_a_profile_outside_the_seccomp_root_fails_the_render(render, path) -> None:
    values = CODE_ON | {"codeUpload": {"enabled": True, "seccomp": {"localhostProfile": path}}}
    with pytest.raises(Exception, match=r"codeUpload\.seccomp\.localhostProfile: a path inside"):
        render(values)


def test_the_installer_writes_the_chart_profile_on_the_node(render, tmp_path: Path) -> None:
    from tests.deploy.pod_sandbox import bwrap_missing

    need("bwrap", bwrap_missing())
    values = CODE_ON | {"codeUpload": {"enabled": True, "seccomp": {"install": True}}}
    manifests = render(values)
    daemonset = one(manifests, "DaemonSet", f"{FULLNAME}-seccomp-installer")
    configmap = one(manifests, "ConfigMap", f"{FULLNAME}-seccomp")
    template = daemonset["spec"]["template"]
    chart_text = CHART_PROFILE.read_text()
    assert template["metadata"]["annotations"]["checksum/profile"] == (
        hashlib.sha256(chart_text.encode()).hexdigest()
    )
    assert template["spec"]["automountServiceAccountToken"] is False
    (volume,) = [v for v in template["spec"]["volumes"] if "hostPath" in v]
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/seccomp", "type": "DirectoryOrCreate"}
    installed = install_profile(daemonset, configmap, tmp_path / "node")
    assert installed == tmp_path / "node" / LOCALHOST["localhostProfile"]
    assert installed.read_text() == chart_text
    assert not list(installed.parent.glob("*.new"))


def test_the_committed_profile_is_what_the_tool_writes() -> None:
    need("seccomp", seccomp_missing())
    done = subprocess.run(
        [SYSTEM_PYTHON, str(REPO_ROOT / "tools" / "seccomp_profile.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_profile_refuses_what_runtime_default_refuses() -> None:
    need("seccomp", seccomp_missing())
    argv = [SYSTEM_PYTHON, "-c", _CALLS, json.dumps(REFUSED)]
    plain = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    confined = json.loads(
        subprocess.run(
            under_profile(CHART_PROFILE, argv), capture_output=True, text=True, check=True
        ).stdout
    )
    assert set(plain) == {name for name, _ in REFUSED}
    assert all(code != 1 for code in plain.values()), plain  # 1: EPERM
    assert confined == dict.fromkeys(plain, 1), confined


def _without(names: set[str], tmp_path: Path) -> Path:
    profile = json.loads(CHART_PROFILE.read_text())
    allowed = profile["syscalls"][0]
    allowed["names"] = [n for n in allowed["names"] if n not in names]
    path = tmp_path / "without.json"
    path.write_text(json.dumps(profile))
    return path


@pytest.mark.parametrize("user", ["unprivileged", "service"])
def test_bubblewrap_starts_under_the_profile(user: str, tmp_path: Path) -> None:
    """As an unprivileged user (the pod's) bubblewrap must make a user namespace; as the service
    runs here, fedtune's own probe of its sandbox must find it working."""
    need("seccomp", seccomp_missing())
    need("bwrap", None if os.path.exists(_BWRAP[0]) else "bubblewrap is not installed")
    if user == "unprivileged":
        argv = _NOBODY + _BWRAP if os.geteuid() == 0 else _BWRAP
    else:
        argv = [
            sys.executable,
            "-c",
            "from fedtune.sandbox import sandbox_missing as m; print(m())",
        ]
    done = subprocess.run(
        under_profile(CHART_PROFILE, argv), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "bubblewrap cannot" not in done.stdout, done.stderr
    assert user == "unprivileged" or done.stdout.strip() == "None", done.stdout
    # what the profile adds to RuntimeDefault is what makes it work
    without = _without({"unshare", "mount", "pivot_root", "umount2"}, tmp_path)
    refused = subprocess.run(under_profile(without, argv), capture_output=True, text=True)
    assert refused.returncode != 0 or "bubblewrap cannot" in refused.stdout, refused
