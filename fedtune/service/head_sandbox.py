"""A study driver that runs uploaded code on a shared Ray head re-runs itself in a sandbox.

Under the ``ray`` backend every study's driver is a Ray job on the same head (Ray's job
supervisor starts it there), next to the head's own processes and the other studies' drivers.
A driver imports its study's code (the spec's check, the task built once before the trials),
so a driver of a study with uploaded code (``FEDTUNE_DRIVER_SANDBOX``, which the service puts in
that job's ``runtime_env``) first fetches and unpacks its package through its link, imports
nothing, and runs the rest of itself, ``fedtune worker run-study`` again, in a bubblewrap
sandbox (:mod:`fedtune.sandbox`):

* its own PID namespace: no process of the head (the raylet, the GCS, the other drivers) is
  visible, so no ``/proc/<pid>/environ``; except in a container that masks ``/proc`` (a
  Kubernetes pod, unless ``procMount: Unmasked``), where no ``/proc`` of its own can be mounted
  and a Ray driver cannot run without one: there it shares the pod's PID namespace and reads its
  ``/proc`` (the head pod's processes: Ray's, and the other drivers, whose environments hold
  what Ray's own job API shows any code on the cluster: docs/explanation/threat-model.md);
* the head's ``FEDTUNE_WORKDIR`` is a private tmpfs, with only this study's folder bound
  writable and its code package bound read-only; the other studies, the code store and any
  file of the head are not there;
* the Ray session folder of the head (its sockets, which a driver needs to join the cluster,
  and Ray's logs) bound writable, and the node named (``FEDTUNE_RAY_NODE_ID``: Ray finds it
  among the processes a driver sees, and this one sees none of the head's): Ray has no
  isolation between the jobs of one cluster, which docs/explanation/threat-model.md says;
* the network of the head: the driver reports to the service's API with its study's
  credential and logs to MLflow with its project's;
* the environment of :func:`.child_env.head_driver_env`: never a database URL or another
  secret the head's processes carry, nor the credentials the driver's start ticket was
  exchanged for: the driver writes those to the sandboxed driver's standard input
  (:func:`.driver_start.write_credentials`), so no ``/proc/<pid>/environ`` holds them;
* as the head's own user (the raylet's sockets are its), every capability dropped.

A head without bubblewrap fails the study with one line saying so, unless the service's operator
opted out (``FEDTUNE_CODE_SANDBOX=none``, which the job carries).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fedtune.errors import ConfigError
from fedtune.sandbox import Limits, Sandbox, SandboxMode, home_inside, sandbox_missing

from .backends.base import python_driver_argv
from .child_env import DRIVER_SANDBOX, ChildKind, child_env
from .paths import study_workdir
from .settings import Settings

if TYPE_CHECKING:
    from .driver_start import DriverCredentials

__all__ = [
    "check_sandboxed_tracking",
    "head_sandbox",
    "run_in_head_sandbox",
    "wants_head_sandbox",
]

log = logging.getLogger(__name__)

#: the private tmpfs over the head's workdir (only mount points: the study and its code)
WORKDIR_TMPFS_BYTES = 16 << 20
#: the driver's private /tmp and /dev/shm
DRIVER_TMP_BYTES = 2 << 30
DRIVER_SHM_BYTES = 256 << 20
_RAYLET_SOCKET = b"--raylet_socket_name="


def wants_head_sandbox(settings: Settings, code_sha256: str | None) -> bool:
    """Whether this driver re-runs itself in a head sandbox.

    Args:
        settings: the driver's settings (``FEDTUNE_DRIVER_SANDBOX``).
        code_sha256: its study's code package (None: no uploaded code).

    Returns:
        True for a study with uploaded code whose Ray job asked for the sandbox.
    """
    mode = settings.driver_sandbox
    return code_sha256 is not None and mode is not None and mode != SandboxMode.NONE


def ray_node(pid: int | None = None) -> tuple[Path, str]:
    """The Ray session folder and node id of the node this driver runs on.

    The driver's ancestors lead to the node's raylet, whose command line names its socket
    (``--raylet_socket_name=<session>/sockets/raylet``) and its node (``--node_id=<hex>``).

    Args:
        pid: the process to start from (default: this one).

    Returns:
        (the session folder, the node's id).

    Raises:
        ConfigError: no raylet is among the ancestors (the driver is not a Ray job's).
    """
    pid = os.getpid() if pid is None else pid
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        flags = dict(
            os.fsdecode(a).split("=", 1) for a in argv if a.startswith(b"--") and b"=" in a
        )
        if "--raylet_socket_name" in flags and "--node_id" in flags:
            return Path(flags["--raylet_socket_name"]).parent.parent, flags["--node_id"]
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    raise ConfigError(
        DRIVER_SANDBOX, "the driver is not a Ray job's: no raylet among its parent processes"
    )


def head_sandbox(
    settings: Settings,
    study_id: str,
    code_root: Path,
    node: tuple[Path, str],
    *,
    stdin_credentials: bool = False,
) -> Sandbox:
    """The sandbox of one study's driver on a shared head (see the module docstring).

    Args:
        settings: the driver's settings.
        study_id: the study.
        code_root: where its package was unpacked (read-only inside).
        node: the head's Ray session folder (writable inside) and node id (the sandboxed
            driver joins it: ``FEDTUNE_RAY_NODE_ID``).
        stdin_credentials: the sandboxed driver reads its credentials from its standard input
            (``FEDTUNE_DRIVER_CREDENTIALS_ON_STDIN``).

    Returns:
        The sandbox; its study folder exists.
    """
    workdir = Path(settings.workdir).resolve()
    study = study_workdir(settings, study_id).resolve()
    study.mkdir(parents=True, exist_ok=True)
    session, node_id = node
    inside = {
        **child_env(settings, ChildKind.HEAD_DRIVER),
        "FEDTUNE_RAY_NODE_ID": node_id,
        **home_inside(),
    }
    if stdin_credentials:
        inside["FEDTUNE_DRIVER_CREDENTIALS_ON_STDIN"] = "1"
    read_only = {root: str(root) for root in settings.data_roots}
    read_only[code_root.resolve()] = str(code_root.resolve())
    return Sandbox(
        read_only=read_only,
        writable={study: str(study), session.resolve(): str(session.resolve())},
        env=inside,
        limits=Limits.long_running(
            settings.study_sandbox_processes,
            DRIVER_TMP_BYTES,
            DRIVER_SHM_BYTES,
            settings.study_sandbox_data_bytes,
        ),
        cwd=str(study),
        network=True,
        private={str(workdir): WORKDIR_TMPFS_BYTES},
        new_session=False,
        same_user=True,
        needs_proc=True,
    )


def run_in_head_sandbox(
    settings: Settings,
    study_id: str,
    attempt: int,
    document: Mapping[str, object],
    credentials: DriverCredentials | None = None,
) -> int:
    """Run the rest of this driver, ``fedtune worker run-study``, in its head sandbox.

    Args:
        settings: the driver's settings.
        study_id: the study.
        attempt: its dispatch attempt (the sandboxed driver checks it again).
        document: the study's spec, its ``code.path`` the unpacked package.
        credentials: what this driver's start ticket was exchanged for: written to the
            sandboxed driver's standard input, never its environment.

    Returns:
        The sandboxed driver's exit code.

    Raises:
        ConfigError: the head cannot make a sandbox, or the driver is not a Ray job's.
    """
    missing = sandbox_missing()
    if missing is not None:
        raise ConfigError(
            "code",
            f"the Ray head cannot sandbox uploaded code ({missing}); install bubblewrap on the "
            "cluster's image, or opt out on the service with FEDTUNE_CODE_SANDBOX=none",
        )
    code = document.get("code")
    code_root = Path(str(code.get("path"))) if isinstance(code, Mapping) else None
    if code_root is None or not code_root.is_dir():
        raise ConfigError("code.path", "the study's package was not unpacked on the head")
    box = head_sandbox(
        settings, study_id, code_root, ray_node(), stdin_credentials=credentials is not None
    )
    log.info("study %s: the driver runs its uploaded code in a sandbox", study_id)
    argv = box.command(python_driver_argv(study_id, attempt))
    if credentials is None:
        return subprocess.call(argv, env=dict(box.env), stdin=subprocess.DEVNULL)
    from .driver_start import write_credentials

    with subprocess.Popen(argv, env=dict(box.env), stdin=subprocess.PIPE) as driver:
        try:  # as subprocess.call: a stop (KeyboardInterrupt) kills the sandbox too
            # it may end before reading them: its exit status then says why
            with contextlib.suppress(BrokenPipeError):
                write_credentials(credentials, driver.stdin)
            return driver.wait()
        except BaseException:
            driver.kill()
            raise


def check_sandboxed_tracking(settings: Settings, study_id: str) -> None:
    """Refuse an MLflow store a sandboxed driver cannot reach: a file outside its study folder.

    A SQLite file or folder store that the service and every study share is not given to a
    sandbox (it holds every project's runs); a tracking server (``http(s)://``) is, with the
    project's login, and the default store inside the study's folder is.

    Args:
        settings: the sandboxed driver's settings.
        study_id: its study.

    Raises:
        ConfigError: ``MLFLOW_TRACKING_URI`` names a file outside the study's folder.
    """
    uri = settings.mlflow_tracking_uri
    if not uri or uri.startswith(("http://", "https://")):
        return
    path = uri.split("://", 1)[1] if "://" in uri else uri.removeprefix("file:")
    path = path[1:] if uri.startswith("sqlite:///") and path.startswith("//") else path
    study = study_workdir(settings, study_id).resolve()
    if Path(path).resolve().is_relative_to(study):
        return
    raise ConfigError(
        "MLFLOW_TRACKING_URI",
        f"{uri.split('://', 1)[0]} store outside the study's folder: a study with uploaded code "
        "runs in a sandbox, which is given no store that every project shares; give the "
        "service and its drivers an MLflow tracking server (http://…)",
    )
