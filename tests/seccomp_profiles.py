"""The chart's seccomp profile on this machine: load it as a runtime would, install it as the
chart's installer does.

A ``Localhost`` profile is compiled and loaded by ``tests/seccomp_load.py`` under Debian's own
Python, whose ``python3-seccomp`` is libseccomp's binding (runc builds its filters with
libseccomp too). The installer's rendered script runs under bubblewrap with the rendered
ConfigMap at ``/profile`` and a directory standing for the node's seccomp root at ``/host``.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
LOADER = REPO_ROOT / "tests" / "seccomp_load.py"
CHART_PROFILE = REPO_ROOT / "helm" / "fedtune" / "files" / "seccomp" / "code-sandbox.json"


def seccomp_missing() -> str | None:
    """None when a seccomp profile can be loaded here, else why not."""
    if not Path(SYSTEM_PYTHON).exists():
        return f"{SYSTEM_PYTHON} is missing (Debian's python3 with python3-seccomp)"
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import seccomp"], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        return "libseccomp's Python binding is missing (apt-get install -y python3-seccomp)"
    return None


def under_profile(profile: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` started under the seccomp ``profile`` (and every process it starts)."""
    return [SYSTEM_PYTHON, str(LOADER), "exec", str(profile), "--", *argv]


def install_profile(daemonset: dict, configmap: dict, node_root: Path) -> Path:
    """Run the installer DaemonSet's container script with its ConfigMap, ``node_root`` standing
    for the node's seccomp root (its hostPath); return the installed file.

    Args:
        daemonset: the rendered installer DaemonSet.
        configmap: the rendered ConfigMap it mounts.
        node_root: the directory that stands for the node's seccomp root.

    Returns:
        The profile as the kubelet would find it: ``node_root / <localhostProfile>``.
    """
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    profile_dir = node_root.parent / f"{node_root.name}-configmap"
    profile_dir.mkdir(parents=True, exist_ok=True)
    for key, text in configmap["data"].items():
        (profile_dir / key).write_text(text)
    node_root.mkdir(parents=True, exist_ok=True)
    assert volumes["seccomp-root"]["hostPath"]["path"] == env["SECCOMP_ROOT"]
    assert volumes["profile"]["configMap"]["name"] == configmap["metadata"]["name"]
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--die-with-parent",
        "--unshare-pid",
        "--tmpfs",
        "/",
        "--ro-bind",
        "/usr",
        "/usr",
        *[x for d in ("bin", "lib", "lib64", "sbin") for x in ("--symlink", f"usr/{d}", f"/{d}")],
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--ro-bind",
        str(profile_dir),
        mounts["profile"],
        "--bind",
        str(node_root),
        mounts["seccomp-root"],
        *container["command"],
        *container["args"],
    ]
    target = node_root / env["PROFILE"]
    # the installer's own word that it is done: the file is renamed into place before the line
    # is printed, so the file's existence alone comes before the line (a test that stopped the
    # installer when the file appeared could find nothing printed yet)
    said = (
        f"installed the code sandbox's seccomp profile at {env['SECCOMP_ROOT']}/{env['PROFILE']}\n"
    )
    proc = subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", **env}, stdout=subprocess.PIPE)
    out = b""
    try:
        out = _until_printed(proc, said.encode(), 60)
        assert proc.poll() is None, f"the installer exited {proc.returncode}"  # it stays up
    finally:
        proc.kill()
        out += proc.communicate(timeout=30)[0]
    text = out.decode(errors="replace")
    assert said in text, text
    assert target.exists(), text
    return target


def _until_printed(proc: subprocess.Popen, line: bytes, timeout: float) -> bytes:
    """What ``proc`` printed until it printed ``line``, ended its output, or ``timeout`` passed.

    Args:
        proc: a process whose standard output is a pipe (bytes).
        line: the whole line to wait for (its newline included).
        timeout: seconds to wait.

    Returns:
        Its output so far.
    """
    assert proc.stdout is not None
    out, deadline = b"", time.monotonic() + timeout
    while line not in out and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([proc.stdout], [], [], left)
        chunk = os.read(proc.stdout.fileno(), 4096) if ready else b""
        if not chunk:  # the end of its output, or the timeout
            break
        out += chunk
    return out
