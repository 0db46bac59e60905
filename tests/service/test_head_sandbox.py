"""The pieces of a driver's sandbox on a shared Ray head (``fedtune.service.head_sandbox``).

The whole path, a hostile package's driver on a real Ray head, is
``tests/e2e/test_byo_ray_backend.py``; these check each piece where it can fail alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedtune.errors import ConfigError
from fedtune.sandbox import Sandbox
from fedtune.service.child_env import DRIVER_SANDBOX, SANDBOXED, ChildKind, child_env
from fedtune.service.driver_start import DriverCredentials, MlflowLogin, write_credentials
from fedtune.service.head_sandbox import (
    check_sandboxed_tracking,
    head_sandbox,
    ray_node,
    wants_head_sandbox,
)
from tests.fresh_imports import imported_after

from .conftest import TOKEN

STUDY = "0123456789ab"


def test_a_ray_job_of_a_study_with_code_asks_its_driver_for_the_sandbox(make_settings) -> None:
    settings = make_settings(backend="ray", public_url="http://api:8000", api_token=TOKEN)
    with_code = child_env(settings, ChildKind.RAY_JOB, ticket="ftt_one-time", code=True)
    assert with_code[DRIVER_SANDBOX] == "bwrap"
    assert with_code["FEDTUNE_STUDY_SANDBOX_MEMORY_MIB"] == "8192"  # the sandbox's memory bound
    assert "FEDTUNE_DATABASE_URL" not in with_code
    assert with_code["FEDTUNE_DRIVER_TICKET"] == "ftt_one-time"  # a ticket, no credential
    plain = child_env(settings, ChildKind.RAY_JOB, ticket="ftt_one-time", code=False)
    assert DRIVER_SANDBOX not in plain  # no code of the member's: nothing to sandbox
    opted_out = make_settings(backend="ray", public_url="http://api:8000", code_sandbox="none")
    env = child_env(opted_out, ChildKind.RAY_JOB, ticket="ftt_one-time", code=True)
    assert env[DRIVER_SANDBOX] == "none"


def test_only_a_driver_asked_to_with_code_sandboxes_itself(make_settings) -> None:
    assert wants_head_sandbox(make_settings(driver_sandbox="bwrap"), "ab" * 32)
    assert not wants_head_sandbox(make_settings(driver_sandbox="bwrap"), None)
    assert not wants_head_sandbox(make_settings(driver_sandbox="none"), "ab" * 32)
    assert not wants_head_sandbox(make_settings(), "ab" * 32)  # local, kubernetes: not asked


def test_the_head_driver_keeps_its_own_variables_and_no_secret_of_the_head(make_settings) -> None:
    settings = make_settings(driver_url="http://api:8000", driver_ticket="ftt_spent")
    head = {
        "PATH": "/usr/bin",
        "RAY_ADDRESS": "10.0.0.1:6379",
        "RAY_JOB_CONFIG_JSON_ENV_VAR": "{}",
        "MLFLOW_TRACKING_URI": "http://mlflow:5000",
        "MLFLOW_TRACKING_USERNAME": "fedtune-driver-team1",
        "MLFLOW_TRACKING_PASSWORD": "project-password",
        "FEDTUNE_HEARTBEAT_S": "5",
        "FEDTUNE_DRIVER_TICKET": "ftt_spent",  # spent: the credentials reach it on stdin
        # what the head's processes may carry, and a driver never needs
        "FEDTUNE_DATABASE_URL": "postgresql://fedtune:secret@db/fedtune",
        "FEDTUNE_API_TOKEN": TOKEN,
        "FEDTUNE_MLFLOW_ADMIN_PASSWORD": "admin-password",
        "AWS_SECRET_ACCESS_KEY": "cloud",
        DRIVER_SANDBOX: "bwrap",
    }
    env = child_env(settings, ChildKind.HEAD_DRIVER, environ=head)
    for name in ("RAY_ADDRESS", "RAY_JOB_CONFIG_JSON_ENV_VAR", "MLFLOW_TRACKING_PASSWORD"):
        assert env[name] == head[name]
    assert env["FEDTUNE_DRIVER_URL"] == "http://api:8000"
    assert "FEDTUNE_DRIVER_TICKET" not in env and "FEDTUNE_DRIVER_TOKEN" not in env
    assert env[SANDBOXED] == "1" and env["FEDTUNE_HEARTBEAT_S"] == "5"
    for name in ("FEDTUNE_DATABASE_URL", "FEDTUNE_API_TOKEN", "AWS_SECRET_ACCESS_KEY"):
        assert name not in env
    assert "FEDTUNE_MLFLOW_ADMIN_PASSWORD" not in env
    assert DRIVER_SANDBOX not in env  # the sandboxed driver runs, it does not sandbox again


def test_the_node_is_found_among_the_drivers_ancestors(tmp_path: Path) -> None:
    """A stand-in raylet (its command line as Ray's) starts a child; the child finds it."""
    session = tmp_path / "session_2026-11-26_1"
    argv = [
        sys.executable,
        "-c",
        "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])",
        "from fedtune.service.head_sandbox import ray_node; print(*ray_node())",
        f"--raylet_socket_name={session}/sockets/raylet",
        "--node_id=6d9ad670be",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(session), "6d9ad670be"]
    with pytest.raises(ConfigError, match="no raylet among its parent processes"):
        ray_node(os.getpid())  # pytest is no Ray job's


def test_the_sandbox_binds_the_study_its_code_and_the_session_only(make_settings, tmp_path) -> None:
    settings = make_settings(workdir=tmp_path / "head", driver_url="http://a", driver_ticket="t")
    code = tmp_path / "head" / "code" / ("ab" * 32)
    code.mkdir(parents=True)
    session = tmp_path / "ray" / "session_1"
    assert (
        "FEDTUNE_DRIVER_CREDENTIALS_ON_STDIN"
        not in head_sandbox(settings, STUDY, code, (session, "6d9a")).env
    )
    box = head_sandbox(settings, STUDY, code, (session, "6d9a"), stdin_credentials=True)
    assert box.env["FEDTUNE_DRIVER_CREDENTIALS_ON_STDIN"] == "1"
    assert isinstance(box, Sandbox)
    study = (tmp_path / "head" / "studies" / STUDY).resolve()
    assert box.writable == {study: str(study), session.resolve(): str(session.resolve())}
    assert box.read_only == {code.resolve(): str(code.resolve())}
    assert box.private == {str((tmp_path / "head").resolve()): 16 << 20}  # the rest: hidden
    assert box.env["FEDTUNE_RAY_NODE_ID"] == "6d9a" and box.network and box.same_user
    argv = box.command(["python"], bwrap="bwrap", proc=True)
    assert "--unshare-pid" in argv and "--unshare-user" in argv and "setpriv" not in argv
    assert argv[argv.index("--uid") + 1] == str(os.geteuid())  # the raylet's sockets are its
    assert f"--data={8192 << 20}" in argv and "--cpu=unlimited" in argv  # memory, not CPU time
    unbounded = make_settings(workdir=tmp_path / "head", study_sandbox_memory_mib=0)
    argv = head_sandbox(unbounded, STUDY, code, (session, "6d9a")).command(["python"], proc=True)
    assert "--data=unlimited" in argv


@pytest.mark.parametrize(
    ("uri", "allowed"),
    [
        (None, True),
        ("http://mlflow:5000", True),
        ("https://mlflow.example", True),
        ("sqlite:///{work}/studies/0123456789ab/mlflow.db", True),
        ("sqlite:///{work}/mlflow.db", False),  # every study's store
        ("file://{work}/mlruns", False),
        ("{work}/../mlruns", False),
    ],
)
def test_a_sandboxed_driver_refuses_a_store_every_project_shares(
    make_settings, tmp_path, uri, allowed
) -> None:
    work = tmp_path / "work"
    settings = make_settings(
        workdir=work, mlflow_tracking_uri=uri.format(work=work) if uri else None
    )
    if allowed:
        check_sandboxed_tracking(settings, STUDY)
    else:
        with pytest.raises(ConfigError, match=r"MLFLOW_TRACKING_URI: .* tracking server"):
            check_sandboxed_tracking(settings, STUDY)


def test_a_sandbox_with_the_network_resolves_names_as_its_host_does(tmp_path) -> None:
    """A driver on a cluster reaches the API and MLflow by their Service names: a sandbox with
    the host's network has its /etc/hosts and resolver settings (read-only), one without has
    neither."""
    from fedtune.sandbox import sandbox_missing
    from tests.needs import need

    need("bwrap", sandbox_missing())
    probe = (
        "import os, socket; print(socket.gethostbyname('localhost'), os.path.exists('/etc/hosts'))"
    )
    found = {}
    for network in (True, False):
        box = Sandbox(env={"PATH": "/usr/bin:/bin"}, network=network)
        done = subprocess.run(
            box.command([sys.executable, "-I", "-c", probe]),
            env=dict(box.env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        found[network] = (done.returncode, done.stdout.split())
    assert found[True] == (0, ["127.0.0.1", "True"])
    assert found[False][0] != 0 or found[False][1][1] == "False"


def test_where_no_proc_can_be_mounted_a_ray_driver_shares_the_pods_read_only() -> None:
    """A Kubernetes pod masks /proc, so a nested sandbox cannot mount one of its own; a Ray
    driver cannot start without one (measured in the cluster-in-a-box: ``NoSuchProcess`` for
    its own pid), so it shares the pod's PID namespace and reads its /proc; a sandbox that needs
    none (the code check) keeps its own PID namespace and has no /proc."""
    own = Sandbox(needs_proc=True).command(["python"], bwrap="bwrap", proc=True)
    assert "--unshare-pid" in own and own[own.index("--proc") + 1] == "/proc"
    masked = Sandbox(needs_proc=True).command(["python"], bwrap="bwrap", proc=False)
    assert "--unshare-pid" not in masked and "--proc" not in masked
    assert masked[masked.index("/proc") - 1] == "--ro-bind"
    check = Sandbox().command(["python"], bwrap="bwrap", proc=False)
    assert "--unshare-pid" in check and "/proc" not in check


def test_a_sandboxed_driver_fails_its_study_on_a_shared_store_with_one_line(
    ctx, make_settings, tmp_path
) -> None:
    """The driver refuses before any trial: the study fails with the reason, nothing runs."""
    from fedtune.service.driver import run_driver
    from fedtune.service.services import get_study

    from .helpers import running_study

    sid = running_study(ctx)
    shared = f"sqlite:///{tmp_path / 'every-study-mlflow.db'}"
    settings = ctx.settings.model_copy(update={"sandboxed": True, "mlflow_tracking_uri": shared})

    def must_not_run(*args, **kwargs):
        raise AssertionError("run_study called")

    assert run_driver(sid, settings, 1, run_study=must_not_run) == 1
    error = get_study(ctx, sid).error
    assert error.startswith("the study's driver cannot run here: MLFLOW_TRACKING_URI: sqlite"), (
        error
    )


def test_the_sandboxed_driver_reads_its_credentials_on_stdin_not_in_its_environment() -> None:
    """The driver hands what its ticket was exchanged for to the driver it sandboxes through a
    pipe: the child has them in memory, and its ``/proc/<pid>/environ`` holds none."""
    credentials = DriverCredentials(
        2, "ftd_credential-of-the-study", MlflowLogin("fedtune-driver-lab", "lab-password")
    )
    code = (
        "import os, sys\n"
        "from fedtune.service.driver_start import read_credentials\n"
        "got = read_credentials(sys.stdin.buffer)\n"
        "environ = open(f'/proc/{os.getpid()}/environ', 'rb').read()\n"
        "print(got.attempt, got.token, got.mlflow.username, got.mlflow.password)\n"
        "print(b'ftd_' in environ or b'lab-password' in environ)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "FEDTUNE_DRIVER_CREDENTIALS_ON_STDIN": "1"},
    ) as child:
        write_credentials(credentials, child.stdin)
        out = child.stdout.read().decode().split("\n")
        assert child.wait(60) == 0
    assert out[0].split() == [
        "2",
        "ftd_credential-of-the-study",
        "fedtune-driver-lab",
        "lab-password",
    ]
    assert out[1] == "False"
    assert "lab-password" not in repr(credentials) and "ftd_" not in repr(credentials)


def test_a_driver_handing_over_to_its_sandbox_imports_no_tuner(ctx, monkeypatch) -> None:
    """The outer driver of a study with code on a shared head only fetches the package and
    starts the sandboxed one: it never imports the tuner (Optuna, NumPy: a third of a CPU
    second per study), which the sandboxed driver imports again anyway."""
    from fedtune.service import driver

    from .helpers import running_study

    sid = running_study(ctx)
    handed: list[str] = []
    monkeypatch.setattr(driver, "wants_head_sandbox", lambda settings, sha256: True)
    monkeypatch.setattr(
        driver, "run_in_head_sandbox", lambda settings, study_id, *a: handed.append(study_id) or 0
    )
    monkeypatch.setitem(sys.modules, "fedtune.tuning.driver.study", None)  # importing it fails
    assert driver.run_driver(sid, ctx.settings, 1) == 0
    assert handed == [sid]


def test_a_driver_on_the_api_imports_no_database_or_tuner_to_hand_over(make_settings) -> None:
    """What the outer driver of a study with code imports before its sandbox starts: the CLI,
    the driver and its link to the API (the sandboxed driver imports the rest itself)."""
    settings = make_settings(driver_url="http://api:8000")
    code = (
        "import sys, fedtune.cli.worker, fedtune.service.driver, fedtune.service.head_sandbox\n"
        "from fedtune.service.driver_link import ApiLink, link_from_environment\n"
        "from fedtune.service.driver_start import DriverCredentials\n"
        "from fedtune.service.settings import load_settings\n"
        f"settings = load_settings(workdir={str(settings.workdir)!r}, driver_url='http://api:8000')\n"
        "link = link_from_environment('0123456789ab', settings, DriverCredentials(1, 'ftd_x'))\n"
        "assert isinstance(link, ApiLink)\n"
        "link.close()\n"
    )
    (loaded,) = imported_after(code)
    assert not loaded & {"torch", "optuna", "numpy", "mlflow", "ray", "sqlalchemy"}, loaded
