"""The sandbox of a ``local`` study driver that runs uploaded code (:mod:`fedtune.sandbox`).

A study with a code package imports it in its driver and in every trial; on the ``local``
backend all of them run under the driver, so the driver, its embedded Ray and its trials run in
one bubblewrap sandbox:

* its own PID namespace: no process of the service, or of another study, is visible;
* the service's working directory is a private tmpfs, with only this study's folder
  (``<workdir>/studies/<id>``) bound into it, writable; the database file, the other studies,
  the logs, the code store and the key files are not there;
* the Python environment read-only, the operator's data roots read-only, a private ``/tmp``
  and ``/dev/shm`` (Ray's session and object store);
* a network of its own that reaches two services and nothing else (:mod:`fedtune.sandbox_net`):
  the service's API, which the driver reports to with its own study's credential, which it gets
  for its one-time start ticket (``FEDTUNE_DRIVER_URL``/``FEDTUNE_DRIVER_TICKET``: a sandboxed
  driver needs them, so it is never given the database URL), and the MLflow tracking server
  (``MLFLOW_TRACKING_URI``), which it logs to with its project's login, given with that
  credential; each through a relay, over a Unix socket bound into the sandbox. No other port of
  the machine (its PostgreSQL, a Redis, the other studies' Ray), no other address; a loopback of
  its own for its Ray;
* the environment of :func:`..child_env.child_env` (``local-driver``) with its home and
  temporary folders inside the sandbox;
* as an unprivileged user of its own (:func:`fedtune.sandbox.sandbox_uid`: where the service
  runs as root, a fresh id, so that its Ray's threads count against no other sandbox), with bounds on
  processes and threads and on each process's private memory; no bound on CPU time (a study
  runs for hours: the scheduler's study deadline ends it) or address space (Ray reserves far
  more than it uses).

It stays in the process group the backend signals (no new session); a clean stop goes to the
sandbox's first command, the inner relay, which passes it to the driver
(:func:`.local.command_pid`), since bubblewrap forwards no signal.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedtune.sandbox import (
    Limits,
    Sandbox,
    SandboxMode,
    give_to_sandbox,
    home_inside,
    sandbox_uid,
)
from fedtune.sandbox_net import SandboxNet, sweep_stale

from ..child_env import SANDBOXED
from ..paths import study_workdir
from ..settings import Settings

__all__ = ["ROUTED", "driver_sandbox", "net_folder", "sandboxes_driver"]

#: the variables naming the services a sandboxed driver reaches (when ``http(s)://``)
ROUTED = ("FEDTUNE_DRIVER_URL", "MLFLOW_TRACKING_URI")

#: the private tmpfs over the service's workdir (the code package is unpacked there)
WORKDIR_TMPFS_BYTES = 1 << 30
DRIVER_TMP_BYTES = 2 << 30
DRIVER_SHM_BYTES = 2 << 30


def sandboxes_driver(settings: Settings, code_sha256: str | None, env: Mapping[str, str]) -> bool:
    """Whether a study's local driver runs in a sandbox: it has uploaded code, the sandbox is
    on, and the driver reports through the API (it is then given no database URL).

    Args:
        settings: the service's settings.
        code_sha256: the study's code package (None: no uploaded code runs in it).
        env: the driver's environment.

    Returns:
        True when :func:`driver_sandbox` applies.
    """
    return (
        code_sha256 is not None
        and settings.code_sandbox == SandboxMode.BWRAP
        and "FEDTUNE_DRIVER_URL" in env
        and "FEDTUNE_DATABASE_URL" not in env
    )


def driver_sandbox(settings: Settings, study_id: str, env: Mapping[str, str]) -> Sandbox:
    """The sandbox of one study's local driver (see the module docstring).

    Args:
        settings: the service's settings.
        study_id: the study.
        env: the driver's environment (``child_env``'s ``local-driver``).

    Returns:
        The sandbox; its study folder exists and belongs to the sandbox's user, and the folder
        of its routes exists (its outer relay removes it when the sandbox ends).
    """
    workdir = Path(settings.workdir).resolve()
    study = study_workdir(settings, study_id).resolve()
    study.mkdir(parents=True, exist_ok=True)
    uid = sandbox_uid()
    give_to_sandbox(study, uid)
    inside = {
        **env,
        **home_inside(),
        "USER": "fedtune",
        "FEDTUNE_WORKDIR": str(workdir),
        SANDBOXED: "1",
    }
    inside.pop("VIRTUAL_ENV", None)
    urls = {k: env[k] for k in ROUTED if env.get(k, "").startswith(("http://", "https://"))}
    sweep_stale(net_folder(settings))
    net = SandboxNet.create(net_folder(settings), urls.values())
    inside.update({k: net.inside_url(url) for k, url in urls.items()})
    return Sandbox(
        read_only={root: str(root) for root in settings.data_roots},
        writable={study: str(study)},
        env=inside,
        limits=Limits.long_running(
            settings.study_sandbox_processes,
            DRIVER_TMP_BYTES,
            DRIVER_SHM_BYTES,
            settings.study_sandbox_data_bytes,
        ),
        cwd=str(workdir),
        private={str(workdir): WORKDIR_TMPFS_BYTES},
        new_session=False,
        uid=uid,
        net=net,
    )


def net_folder(settings: Settings) -> Path:
    """Where the folders of the sandboxed drivers' routes are made (outside every sandbox:
    the workdir is a private tmpfs in each).

    Args:
        settings: the service's settings.

    Returns:
        ``<workdir>/net``.
    """
    return Path(settings.workdir).resolve() / "net"
