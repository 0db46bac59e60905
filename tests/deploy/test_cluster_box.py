"""The cluster in a box: the chart's pods, each in a network namespace of its
own (tests/deploy/netbox.py), running from the built image as rendered, with the rendered
NetworkPolicies enforced by nftables; a study of ``examples/byo`` submitted from a "laptop"
namespace through the SDK on the ``ray`` backend.

The pods and what runs in them:

============== ======================================================================================
pod            process
============== ======================================================================================
postgresql     Debian's PostgreSQL server (the chart's ``postgres:17`` image cannot be pulled here),
               started as that image's entrypoint does: ``initdb`` with ``POSTGRES_USER`` and
               ``POSTGRES_PASSWORD`` (scram-sha-256 for TCP), then the rendered init ConfigMap's
               ``01-roles.sh`` with the container's rendered env
db-upgrade     the migration Job's container, from the image, to completion
mlflow         the MLflow Deployment's init container (``mlflow db upgrade``), then its server, with
               one worker process (``mlflow.workers: 1``; the chart's two: test_pod_servers_run.py)
ray-head       the RayCluster's head container, started as KubeRay starts it (below)
ray-worker-N   two pods of the worker group, started as KubeRay starts them
api            the API Deployment's container (``fedtune serve``, backend ``ray``)
laptop         this machine's virtualenv: the SDK uploads ``examples/byo`` and submits the study
============== ======================================================================================

Every image container runs under tests/deploy/pod_sandbox.py (read-only root, UID 10001, no
capabilities, only its rendered volumes writable) inside its pod's namespace, with the rendered
env (Secrets resolved) and ``/etc/hosts`` answering the rendered Service names (and KubeRay's
``<cluster>-head-svc``) with the pods' IPs: no URL is translated. Code upload is on, so the API
and the Ray head containers name the chart's ``Localhost`` seccomp profile: the chart's installer
script writes it into a directory that stands for the node's seccomp root, and those two
containers run under it (every code check and every sandboxed driver starts bubblewrap there).

KubeRay's part, emulated (its operator does not run here): the pods of the RayCluster get the
labels KubeRay adds (``ray.io/cluster``, ``ray.io/node-type``); their containers run
``/bin/bash -lc -- "ulimit -n 65536; ray start [--head | --address=<head-svc>:6379] --block
<rayStartParams as --key=value>"`` plus ``--node-ip-address=<pod IP>`` (KubeRay passes the pod IP),
``--num-cpus`` from the container's CPU limit where rayStartParams do not set it,
``--num-gpus=0`` (KubeRay would pass the ``nvidia.com/gpu`` limit: there is no GPU or device
plugin here), and on the head ``--no-monitor`` where ``enableInTreeAutoscaling`` is on (the
autoscaler runs in KubeRay's sidecar instead of the head container; a ``"true"`` parameter
becomes a bare flag, as KubeRay writes it); ``authOptions.mode: token`` becomes
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the rendered Secret in the Ray containers,
as KubeRay injects them. The box's own addition: each node is a lean one
(``tests/ray_start.py``: no log monitor, dashboard agents sampling their pod's processes every
60 s), since the studies' drivers take no worker logs and nothing reads node metrics, started
by the image's ``ray`` CLI as the tests' lean clusters start theirs
(``tests/service/ray_cluster.py``'s ``ray_cli``: none of the command groups ``ray start`` never
uses; the head's dashboard with only the modules the ``ray`` backend and this test call,
``BACKEND_MODULES``, and no Ray Client server; a worker's dashboard agent a minimal one); Ray
started from the image exactly as KubeRay starts it, log monitor included, is
``tests/deploy/test_pod_servers_run.py``'s. Not emulated: the autoscaler sidecar, probes,
restarts, and RayJob status polling (the ``ray`` backend talks to the head's Jobs API itself).
One restart is emulated, the kubelet's (``restartPolicy: Always``): a
worker container whose ``ray start`` exits while the box starts (its raylet has a fixed 30 s to
register with the head, which a loaded machine can exceed) is started again, until the head
counts both workers ALIVE.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import RELEASE, one
from tests.deploy.netbox import NetBox, box_missing
from tests.deploy.pod_sandbox import Sandbox
from tests.deploy.test_netbox_policies import chart_pods
from tests.deploy.test_pod_commands_run import container_argv, container_env, pod_process
from tests.needs import REPO_ROOT, need
from tests.ray_start import LEAN_ENV, lean_flags
from tests.seccomp_profiles import install_profile, seccomp_missing
from tests.service.ray_cluster import BACKEND_MODULES, ray_cli

pytestmark = [pytest.mark.box, pytest.mark.image, pytest.mark.integration]

FULLNAME = f"{RELEASE}-fedtune"
RAY = f"{FULLNAME}-ray"
EXAMPLE = REPO_ROOT / "examples" / "byo"
TOKEN = "box-api-token-0123456789abcdef"
#: a study has two attempts, re-queued 1 s after a transient error (MLflow not answering)
#: instead of three after 5 s then 10 s: the failing study still goes through a re-dispatch.
#: The API decides (api.extraEnv) and the driver waits out the backoff, or fails its last
#: attempt at once, by its own settings (rayCluster.head.env): the same values in both
RETRIES = [
    {"name": "FEDTUNE_MAX_DISPATCH_ATTEMPTS", "value": "2"},
    {"name": "FEDTUNE_RETRY_BACKOFF_S", "value": "1"},
]
#: the head's MLflow client gives up after one 10 s attempt (rayCluster.head.env): without it a
#: refused MLflow costs minutes of retries before the study can fail
HEAD_ENV = [
    {"name": "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "value": "0"},
    {"name": "MLFLOW_HTTP_REQUEST_TIMEOUT", "value": "10"},
    *RETRIES,
]
#: one CPU per worker (rayStartParams win over KubeRay's CPU limit): two concurrent trials take
#: one worker each, so a lost worker is sure to take a running trial with it
VALUES = {
    "backend": "ray",
    "api": {"extraEnv": RETRIES},
    "auth": {"apiToken": TOKEN},
    # the API and the Ray head start bubblewrap under the chart's seccomp profile, installed on
    # the "node" by the chart's installer (tests/seccomp_profiles.py)
    "codeUpload": {"enabled": True, "seccomp": {"install": True}},
    # one MLflow server process (the chart's default is two uvicorn workers, each importing
    # MLflow's server, ~3.5 CPU-s apiece): the box sends MLflow a few requests at a time; the
    # chart's two-worker start runs from the image in tests/deploy/test_pod_servers_run.py
    "mlflow": {"workers": 1},
    "rayCluster": {
        "enabled": True,
        "head": {"env": HEAD_ENV},
        "worker": {"rayStartParams": {"num-cpus": "1"}},
    },
}
START_S = 300  # each server's start on a loaded 2-core machine


#: ``url token every_s``: ask ``url`` every ``every_s`` until it answers 200
_UNTIL_200 = """
import sys, time, urllib.request
url, token, every = sys.argv[1], sys.argv[2], float(sys.argv[3])
req = urllib.request.Request(url)
if token:
    req.add_header("Authorization", "Bearer " + token)
while True:
    try:
        if urllib.request.urlopen(req, timeout=5).status == 200:
            break
    except Exception:
        pass
    time.sleep(every)
"""


@dataclass
class Box:
    net: NetBox
    manifests: list[dict]
    policies: list[dict]
    root: Path
    hosts: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    #: each pod's IP, kept after a pod is removed
    net_ips: dict[str, str] = field(default_factory=dict)
    ray_token: str = ""
    seccomp_root: Path | None = None

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def python(
        self,
        pod: str,
        code: str,
        *args: str,
        timeout: float = 60,
        env: Mapping[str, str] | None = None,
    ) -> Any:
        """Run ``code`` with this machine's Python in ``pod``'s namespace; its stdout as JSON."""
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
        done = subprocess.run(
            self.net.exec_argv(pod, [sys.executable, "-c", code, *args]),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def http(self, pod: str, url: str, token: str | None = None) -> int:
        code = (
            "import json,sys,urllib.request\nreq=urllib.request.Request(sys.argv[1])\n"
            "if sys.argv[2]: req.add_header('Authorization','Bearer '+sys.argv[2])\n"
            "try:\n print(urllib.request.urlopen(req,timeout=5).status)\n"
            "except Exception as e:\n print(getattr(e,'code',0))\n"
        )
        return int(self.python(pod, code, url, token or ""))

    def until_http(self, pod: str, url: str, process: str, token: str | None = None) -> None:
        """Wait until ``url`` answers 200 from ``pod``, failing as soon as ``process`` exits.

        One interpreter in ``pod`` asks every 2 s (a new one per request cost more CPU than the
        requests); this process watches ``process`` meanwhile."""

        def alive() -> None:
            assert self.procs[process].poll() is None, f"{process} exited:\n{self.log(process)}"

        self.poll_in(pod, [_UNTIL_200, url, token or "", "2"], alive, f"{url} from {pod}", process)

    def poll_in(
        self, pod: str, argv: list[str], watch: Callable[[], None], what: str, log: str
    ) -> str:
        """Run the polling script ``argv`` (``python -c`` and its arguments) in ``pod`` until it
        exits, calling ``watch`` every 0.5 s meanwhile; fail after :data:`START_S` (with the
        log of the box's process ``log``) or when the script fails.

        Returns:
            What the script printed.
        """
        poller = subprocess.Popen(
            self.net.exec_argv(pod, [sys.executable, "-c", *argv]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            end = time.monotonic() + START_S
            while poller.poll() is None:
                watch()
                assert time.monotonic() < end, f"{what}: not in {START_S} s:\n{self.log(log)}"
                time.sleep(0.5)
        finally:
            if poller.poll() is None:
                poller.kill()
            out, err = poller.communicate()
        assert poller.returncode == 0, err
        return out

    def start(
        self, pod: str, name: str, argv: list[str], env: dict[str, str], user: str | None = None
    ) -> subprocess.Popen:
        prefix = ["runuser", "-u", user, "--"] if user else []
        with (self.root / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(
                self.net.exec_argv(pod, [*prefix, *argv]),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def stop(self, *names: str, sig: int = signal.SIGTERM) -> None:
        """Signal each process of ``names`` at once, then wait for each (SIGKILL after 60 s):
        the box's teardown waits for its slowest server's shutdown, not for their sum."""
        procs = [self.procs.pop(name) for name in names]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        end = time.monotonic() + 60
        for proc in procs:
            try:
                proc.wait(max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


def _container(
    box: Box, pod: str, spec: dict, container: dict, image_root: Any, env: dict[str, str]
) -> tuple[Sandbox, dict[str, str], str]:
    sandbox, full_env, cwd = pod_process(
        box.root / pod, spec, container, env, image_root, box.seccomp_root
    )
    sandbox.overlays["/etc/hosts"] = box.hosts
    return sandbox, full_env, cwd


def _run_image(
    box: Box,
    pod: str,
    name: str,
    spec: dict,
    container: dict,
    image_root: Any,
    argv: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> None:
    env = container_env(container, box.manifests) | (extra_env or {})
    sandbox, full_env, cwd = _container(box, pod, spec, container, image_root, env)
    box.start(pod, name, sandbox.argv(argv or container_argv(container), cwd=cwd), full_env)


def _wait_exit(box: Box, name: str, timeout: float = START_S) -> None:
    proc = box.procs.pop(name)
    assert proc.wait(timeout) == 0, box.log(name)


def _postgresql(box: Box) -> None:
    sts = one(box.manifests, "StatefulSet", f"{FULLNAME}-postgresql")["spec"]["template"]["spec"]
    env = container_env(sts["containers"][0], box.manifests)
    init = one(box.manifests, "ConfigMap", f"{FULLNAME}-postgresql-init")["data"]["01-roles.sh"]
    bin_dir = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    home = Path(tempfile.mkdtemp(prefix="ftbox-pg-", dir="/tmp"))  # the postgres user reaches it
    home.chmod(0o755)
    pg = pwd.getpwnam("postgres")
    (home / "pwfile").write_text(env["POSTGRES_PASSWORD"])
    (home / "01-roles.sh").write_text(init)
    for sub in ("data", "sock"):
        (home / sub).mkdir()
    for path in home.iterdir():
        os.chown(path, pg.pw_uid, pg.pw_gid)
    box.root.joinpath("pg-home").write_text(str(home))
    subprocess.run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            str(bin_dir / "initdb"),
            "-D",
            str(home / "data"),
            "-U",
            env["POSTGRES_USER"],
            f"--pwfile={home / 'pwfile'}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
        ],
        check=True,
        capture_output=True,
    )
    with (home / "data" / "pg_hba.conf").open("a") as hba:
        hba.write("host all all 0.0.0.0/0 scram-sha-256\n")
    box.start(
        "postgresql",
        "postgresql",
        [
            str(bin_dir / "postgres"),
            "-D",
            str(home / "data"),
            "-c",
            "listen_addresses=*",
            "-p",
            "5432",
            "-k",
            str(home / "sock"),
        ],
        {"PATH": os.environ["PATH"]},
        user="postgres",
    )
    end = time.monotonic() + START_S
    while subprocess.run(
        box.net.exec_argv(
            "postgresql", [str(bin_dir / "pg_isready"), "-h", str(home / "sock"), "-p", "5432"]
        ),
        capture_output=True,
    ).returncode:
        assert time.monotonic() < end and box.procs["postgresql"].poll() is None, box.log(
            "postgresql"
        )
        time.sleep(1)
    roles = subprocess.run(
        box.net.exec_argv(
            "postgresql",
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                "env",
                *[f"{k}={v}" for k, v in env.items()],
                f"PGHOST={home / 'sock'}",
                "sh",
                str(home / "01-roles.sh"),
            ],
        ),
        capture_output=True,
        text=True,
    )
    assert roles.returncode == 0, roles.stderr


def _kuberay(
    params: dict[str, str], container: dict, ip: str, head: bool, autoscaling: bool = False
) -> list[str]:
    params = dict(params)
    limits = container.get("resources", {}).get("limits", {})
    params.setdefault("num-cpus", str(limits.get("cpu", "1")))
    params["num-gpus"] = "0"
    if head and autoscaling:  # KubeRay: the monitor is its autoscaler sidecar's, not the head's
        params["no-monitor"] = "true"
    flags = [f"--{k}" if v.lower() == "true" else f"--{k}={v}" for k, v in params.items()]
    flags.append(f"--node-ip-address={ip}")
    # the test's own: a lean node (tests/ray_start.py), which the head's `--no-monitor` may be
    flags += [flag for flag in lean_flags(head=head) if flag not in flags]
    where = ["--head"] if head else [f"--address={RAY}-head-svc.ml.svc.cluster.local:6379"]
    # the image's `ray` CLI as the tests' lean clusters run it (tests/service/ray_cluster.py):
    # the head's dashboard with the modules the `ray` backend and this test call and no Ray
    # Client server, a worker's dashboard agent a minimal one
    cli = ray_cli(BACKEND_MODULES) if head else ray_cli(minimal_agent=True)
    start = ["python", *cli[1:], "start", *where, "--block", *flags, "--disable-usage-stats"]
    return ["/bin/bash", "-lc", "--", "ulimit -n 65536 2>/dev/null || true; " + shlex.join(start)]


def _ray_head(box: Box, image_root: Any) -> dict[str, str]:
    """Start the RayCluster's head as KubeRay would (it needs no other pod); its Ray env (the
    token KubeRay injects, and :data:`tests.ray_start.LEAN_ENV`), the workers' too."""
    cluster = one(box.manifests, "RayCluster")["spec"]
    token = one(box.manifests, "Secret", f"{RAY}-auth")

    auth = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": base64.b64decode(token["data"]["auth_token"]).decode(),
        **LEAN_ENV,
    }
    box.ray_token = auth["RAY_AUTH_TOKEN"]
    head = cluster["headGroupSpec"]
    spec = head["template"]["spec"]
    container = spec["containers"][0]
    ip = box.net.pods["ray-head"].ip
    _run_image(
        box,
        "ray-head",
        "ray-head",
        spec,
        container,
        image_root,
        _kuberay(
            head["rayStartParams"], container, ip, True, bool(cluster["enableInTreeAutoscaling"])
        ),
        auth,
    )
    return auth


WORKERS = ("ray-worker-1", "ray-worker-2")
#: the cluster's nodes, from the dashboard's state API, asked from a pod as the API would ask
NODES_URL = f"http://{RAY}-head-svc.ml.svc:8265/api/v0/nodes?detail=true"
#: ``nodes(url, token)``: the nodes the state API at ``url`` lists (the start of a script)
_NODES = """
import json, sys, time, urllib.request
def nodes(url, token):
    req = urllib.request.Request(url)
    req.add_header("Authorization", "Bearer " + token)
    return json.load(urllib.request.urlopen(req, timeout=10))["data"]["result"]["result"]
"""
#: ``url token n``: print the states of the cluster's nodes once ``n`` of them are ALIVE, asking
#: every 2 s
_UNTIL_ALIVE = (
    _NODES
    + """
url, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
while True:
    try:
        states = sorted(node["state"] for node in nodes(url, token))
        if states.count("ALIVE") >= n:
            print(json.dumps(states))
            break
    except Exception:
        pass
    time.sleep(2)
"""
)

#: ``url token want timeout``: each node IP's latest state (by start time), asked every 5 s
#: until it is ``want`` (JSON) or ``timeout`` s have passed; the last answer
_UNTIL_STATES = (
    _NODES
    + """
url, token, want, end = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
end += time.monotonic()
while True:
    found = sorted(nodes(url, token), key=lambda n: n.get("start_time_ms") or 0)
    states = {n["node_ip"]: n["state"] for n in found}
    if states == want or time.monotonic() >= end:
        break
    time.sleep(5)
print(json.dumps(states))
"""
)


def _ray_workers(box: Box, image_root: Any, auth: dict[str, str]) -> None:
    """Wait for the head's Jobs API, then start the two worker pods as KubeRay would."""
    ip = box.net.pods["ray-head"].ip
    box.until_http("api", f"http://{ip}:8265/api/version", "ray-head", auth["RAY_AUTH_TOKEN"])
    for pod in WORKERS:
        _ray_worker(box, pod, image_root, auth)


def _ray_worker(box: Box, pod: str, image_root: Any, auth: dict[str, str]) -> None:
    cluster = one(box.manifests, "RayCluster")["spec"]
    group = cluster["workerGroupSpecs"][0]
    spec = group["template"]["spec"]
    container = spec["containers"][0]
    params = group.get("rayStartParams", {})
    argv = _kuberay(params, container, box.net.pods[pod].ip, False)
    _run_image(box, pod, pod, spec, container, image_root, argv, auth)


def _until_workers_alive(box: Box, image_root: Any, auth: dict[str, str]) -> None:
    """Wait until the head counts the head and both workers ALIVE; a worker container whose
    ``ray start`` exited meanwhile is started again, as the kubelet would (at most twice)."""
    restarts = {pod: 0 for pod in WORKERS}

    def restart_exited() -> None:
        assert box.procs["ray-head"].poll() is None, box.log("ray-head")
        for pod in WORKERS:
            if box.procs[pod].poll() is not None:
                assert restarts[pod] < 2, f"{pod} exited again:\n{box.log(pod)}"
                print(f"{pod}: ray start exited, restarted:\n{box.log(pod)[-600:]}")
                restarts[pod] += 1
                box.procs.pop(pod)
                _ray_worker(box, pod, image_root, auth)

    argv = [_UNTIL_ALIVE, NODES_URL, auth["RAY_AUTH_TOKEN"], "3"]
    box.poll_in("api", argv, restart_exited, "the workers joining the head", "ray-head")


@pytest.fixture(scope="module")
def box(render, image_root, tmp_path_factory) -> Iterator[Box]:
    need("box", box_missing())
    need("seccomp", seccomp_missing())
    root = tmp_path_factory.mktemp("box")
    policies, pods, services = chart_pods(render, VALUES)
    manifests = render(VALUES)
    net = NetBox(f"cb{os.getpid() % 1000}", (234, os.getpid() % 250))
    made = Box(net, manifests, policies, root, root / "hosts")
    made.seccomp_root = root / "node-seccomp"
    install_profile(
        one(manifests, "DaemonSet", f"{FULLNAME}-seccomp-installer"),
        one(manifests, "ConfigMap", f"{FULLNAME}-seccomp"),
        made.seccomp_root,
    )
    try:
        for name in (
            "laptop",
            "postgresql",
            "db-upgrade",
            "mlflow",
            "ray-head",
            "ray-worker-1",
            "ray-worker-2",
            "api",
        ):
            labels, ports = pods.get(name, ({}, {}))
            net.add_pod(name, labels, ports, namespace="laptop" if name == "laptop" else "ml")
        made.net_ips.update({name: pod.ip for name, pod in net.pods.items()})
        made.hosts.write_text(net.hosts(services))
        net.publish_hosts(made.hosts.read_text())
        net.enforce(policies)
        started = time.monotonic()
        # what depends on nothing starts first, the rest as soon as what it needs is there: the
        # Ray head beside PostgreSQL, both migrations (two databases) at once, the API after its
        # migration, MLflow after its init container, the workers once the head answers
        auth = _ray_head(made, image_root)
        _postgresql(made)
        job = one(manifests, "Job", f"{FULLNAME}-db-init")["spec"]["template"]["spec"]
        _run_image(made, "db-upgrade", "db-upgrade", job, job["containers"][0], image_root)
        mlflow = one(manifests, "Deployment", f"{FULLNAME}-mlflow")["spec"]["template"]["spec"]
        _run_image(
            made, "mlflow", "mlflow-db-upgrade", mlflow, mlflow["initContainers"][0], image_root
        )
        _wait_exit(made, "db-upgrade")
        api = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]
        _run_image(made, "api", "api", api, api["containers"][0], image_root)
        _wait_exit(made, "mlflow-db-upgrade")
        _run_image(made, "mlflow", "mlflow", mlflow, mlflow["containers"][0], image_root)
        _ray_workers(made, image_root, auth)
        made.until_http("laptop", f"http://{FULLNAME}.ml.svc.cluster.local:8000/readyz", "api")
        made.until_http("api", f"http://{FULLNAME}-mlflow.ml.svc:5000/health", "mlflow")
        _until_workers_alive(made, image_root, auth)
        print(f"box up in {time.monotonic() - started:.1f} s")
        yield made
    finally:
        made.stop(*made.procs)
        net.close()
        home = root / "pg-home"
        if home.exists():
            shutil.rmtree(home.read_text(), ignore_errors=True)


#: the laptop's SDK calls, the start of each script: ``report(study, wait_s)``, the study as the
#: laptop sees it after waiting up to ``wait_s`` for its end (0: now), polling every second;
#: ``until_busy(study, timeout)``, polling every second until two of its trials run, it ends, a
#: trial completes or ``timeout`` s pass: every snapshot seen (the study's state, its trials'
#: states), in order
_CLIENT = """
import json, sys, time, yaml
from fedtune.client import Client

def report(study, wait_s):
    final = study.wait(progress=False, timeout=wait_s, poll_s=1) if wait_s else study.status()
    trials = [{"number": t.number, "state": str(t.state), "outcome": t.outcome}
              for t in study.trials()]
    return {"id": study.id, "state": str(final.state), "error": final.error,
            "trials": trials, "mlflow": final.mlflow.to_json()}

def until_busy(study, timeout):
    end = time.monotonic() + timeout
    seen = []
    while True:
        state = str(study.status().state)
        trials = [str(t.state) for t in study.trials()]
        seen.append({"state": state, "trials": trials})
        if trials.count("running") == 2:
            break
        if state not in ("queued", "running") or "completed" in trials:
            break
        if time.monotonic() >= end:
            break
        time.sleep(1)
    return seen
"""

#: ``url token spec code then wait_s``: submit ``spec`` (with the code at ``code``; ``-``: none),
#: then in the same interpreter (one import of the SDK per study, not one per call) its
#: ``report`` (``then``: ``wait``) or ``until_busy`` (``busy``) snapshots, with the study's id
_SUBMIT = (
    _CLIENT
    + """
url, token, spec, code, then, wait_s = sys.argv[1:7]
with Client(url, token=token, timeout=60) as sdk:
    study = sdk.submit(yaml.safe_load(spec), code=None if code == "-" else code)
    wait_s = float(wait_s)
    print(json.dumps(report(study, wait_s) if then == "wait" else
                     {"id": study.id, "seen": until_busy(study, wait_s)}))
"""
)

#: ``url token study_id wait_s``: the ``report`` of a submitted study
_WAIT = (
    _CLIENT
    + """
url, token, study_id, wait_s = sys.argv[1:5]
with Client(url, token=token, timeout=60) as sdk:
    print(json.dumps(report(sdk.study(study_id), float(wait_s))))
"""
)

API_URL = f"http://{FULLNAME}.ml.svc.cluster.local:8000"


def _small(name: str, trials: int = 2, rounds: int = 4) -> str:
    spec = yaml.safe_load((EXAMPLE / "study.yaml").read_text())
    spec["name"] = name
    spec["code"] = {"modules": spec["code"]["modules"]}
    spec["budget"] = {"trials": trials, "max_concurrent": 2}
    spec["train"] = {**spec["train"], "rounds": rounds, "eval_every": 2}
    spec["objective"] = {**spec["objective"], "last_rounds": 2}
    return yaml.safe_dump(spec)


def _submit(
    box: Box, spec: str, timeout: float = 600, code: str = str(EXAMPLE), then: str = "wait"
) -> dict[str, Any]:
    """Submit ``spec`` from the laptop (with ``code``, ``examples/byo`` unless ``-``), then
    wait up to ``timeout`` s for the end (``then``: ``wait``; the study's ``report``) or for two
    trials running (``busy``; its id and ``until_busy`` snapshots): 60 s for the submission
    (the API checks the uploaded code), and ``timeout`` + 60 s for what follows."""
    argv = [API_URL, TOKEN, spec, code, then, str(timeout)]
    return box.python("laptop", _SUBMIT, *argv, timeout=timeout + 120)


def _status(box: Box, study_id: str, wait_s: float = 0) -> dict[str, Any]:
    """The study as the laptop sees it, after waiting up to ``wait_s`` for its end (0: now)."""
    return box.python("laptop", _WAIT, API_URL, TOKEN, study_id, str(wait_s), timeout=wait_s + 60)


#: ``url run_id``: ``[status, number of child runs]`` of the run, asked through MLflow's REST API
#: as ``MlflowClient`` asks it (``runs/get``, then ``runs/search`` of its experiment for
#: ``tags.`mlflow.parentRunId```), with the login and workspace of ``MLFLOW_TRACKING_USERNAME``,
#: ``MLFLOW_TRACKING_PASSWORD`` and ``MLFLOW_WORKSPACE``: urllib, not an import of mlflow
_PARENT_AND_CHILDREN = """
import base64, json, os, sys, urllib.parse, urllib.request
url, run_id = sys.argv[1], sys.argv[2]
login = os.environ["MLFLOW_TRACKING_USERNAME"] + ":" + os.environ["MLFLOW_TRACKING_PASSWORD"]
headers = {"Authorization": "Basic " + base64.b64encode(login.encode()).decode(),
           "X-MLFLOW-WORKSPACE": os.environ["MLFLOW_WORKSPACE"],
           "Content-Type": "application/json"}
def call(path, body=None):
    req = urllib.request.Request(url + "/api/2.0/mlflow/" + path, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    return json.load(urllib.request.urlopen(req, timeout=30))
info = call("runs/get?" + urllib.parse.urlencode({"run_id": run_id}))["run"]["info"]
kids, token = [], None
while True:
    body = {"experiment_ids": [info["experiment_id"]],
            "filter": "tags.`mlflow.parentRunId` = '" + info["run_id"] + "'"}
    page = call("runs/search", body | ({"page_token": token} if token else {}))
    kids += page.get("runs", [])
    token = page.get("next_page_token")
    if not token:
        break
print(json.dumps([info["status"], len(kids)]))
"""


def _seccomp_mode(pid: int) -> int:
    """0: no filter, 2: a seccomp filter (``/proc/<pid>/status``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("Seccomp:", 1)[1].split()[0])


def test_a_study_from_the_laptop_runs_across_the_box(box: Box) -> None:
    t0 = time.monotonic()
    done = _submit(box, _small("box-study"))
    took = time.monotonic() - t0
    assert done["state"] == "succeeded", (done, box.log("api"), box.log("ray-head"))
    assert [t["state"] for t in done["trials"]] == ["completed"] * 2
    # its code was checked in the API and its driver sandboxed on the head, each container under
    # the chart's Localhost profile (the others under no filter: RuntimeDefault is not emulated)
    assert [_seccomp_mode(box.procs[n].pid) for n in ("api", "ray-head", "mlflow")] == [2, 2, 0]
    # MLflow has the study's runs in its project's workspace (`default`), behind MLflow's login:
    # asked from the API's pod (the laptop may not reach MLflow) with the rendered admin password
    password = one(box.manifests, "Secret", f"{FULLNAME}-mlflow-auth")["stringData"]
    admin = {
        "MLFLOW_TRACKING_USERNAME": "admin",
        "MLFLOW_TRACKING_PASSWORD": password["admin-password"],
        "MLFLOW_WORKSPACE": "default",
    }
    mlflow_url = f"http://{FULLNAME}-mlflow.ml.svc:5000"
    assert box.http("api", f"{mlflow_url}/api/2.0/mlflow/experiments/search") == 401
    runs = box.python("api", _PARENT_AND_CHILDREN, mlflow_url, done["mlflow"]["run_id"], env=admin)
    assert runs == ["FINISHED", 2]
    assert box.net.probe("laptop", [("mlflow", 5000)], 1.0) == {("mlflow", 5000): False}
    flows = sorted(f.comment for f in box.net.flows())
    for flow in flows:
        print(f"allowed: {flow}")
    # the driver reports through the API with its study's credential, never to the database
    assert f"{FULLNAME}-postgresql: ray-head -> postgresql:5432" not in flows
    assert f"{RAY}: api -> ray-head:8265" in flows  # the Jobs API
    assert any(f.startswith(f"{RAY}: ray-worker-") for f in flows)  # trials joined the head
    print(f"study in the box: {took:.1f} s")


def test_a_packed_study_runs_two_configurations_per_worker_and_lists_each(box: Box) -> None:
    spec = {
        "name": "box-packed",
        "algorithm": "fedavg",
        "task": {"name": "quadratic", "clients": 8, "dim": 4, "seed": 0},
        "train": {"rounds": 6, "clients_per_round": 4, "local_steps": 2, "batch_size": 4},
        "search": {
            "space": "fedavg",
            "override": {
                "client_lr": {"low": 0.01, "high": 0.1},
                "server_lr": {"low": 0.05, "high": 0.2},
            },
        },
        "objective": {"metric": "train_loss", "last_rounds": 2},
        "sampler": {"name": "random", "seed": 0},
        "scheduler": {"name": "none"},
        "budget": {"trials": 4, "max_concurrent": 4},
        "resources": {"cpu": 1, "pack": 2},  # 4 configurations at once in the 2 workers' CPUs
    }
    done = _submit(box, yaml.safe_dump(spec), 600, code="-")
    assert done["state"] == "succeeded", (done, box.log("api"), box.log("ray-head"))
    # the laptop's SDK lists configurations, never packs
    assert sorted(t["number"] for t in done["trials"]) == [0, 1, 2, 3], done["trials"]
    assert {t["state"] for t in done["trials"]} == {"completed"}


def test_a_worker_node_lost_mid_study_leaves_no_trial_running(box: Box) -> None:
    # both workers busy: two trials running, none finished yet (the laptop process that
    # submitted polls)
    busy = _submit(box, _small("box-node-lost", trials=3, rounds=150), 300, then="busy")
    study_id = busy["id"]
    *before, now = busy["seen"]
    for then in before:
        assert then["state"] in ("queued", "running") and "completed" not in then["trials"], then
    assert now["trials"].count("running") == 2, (now, before[-5:])
    box.stop("ray-worker-2", sig=signal.SIGKILL)  # the node's pod dies, and its network with it
    box.net.remove_pod("ray-worker-2")
    result = _status(box, study_id, 900)
    assert result["state"] == "succeeded", (result, box.log("ray-head")[-2000:])
    # as on a real cluster (tests/integration/test_multinode_ray.py): the trial that was running
    # on the lost node is recorded failed (Tune's max_failures=0), the others complete (the one
    # running on the other node, and the third, started on that node after the loss), and no
    # trial is left running
    states = sorted(t["state"] for t in result["trials"])
    assert states == ["completed", "completed", "failed"], result["trials"]
    # the head's GCS declares the node dead (its health checks go unanswered: the namespace is
    # gone, no connection was reset), asked from the API's pod as the API would ask: each pod's
    # node (its IP's latest, should a worker have been restarted as the box started)
    ips = {pod: box.net_ips[pod] for pod in ("ray-head", *WORKERS)}
    want = {ips["ray-head"]: "ALIVE", ips["ray-worker-1"]: "ALIVE", ips["ray-worker-2"]: "DEAD"}
    argv = [NODES_URL, box.ray_token, json.dumps(want), "180"]
    states = box.python("api", _UNTIL_STATES, *argv, timeout=240)
    assert states == want, (states, ips)


def test_a_port_removed_from_a_policy_fails_the_study_with_a_clear_error(box: Box) -> None:
    """MLflow's policy without its port: the driver on the head cannot reach MLflow, and the
    study ends ``failed`` saying so (the policies are enforced, not decoration)."""
    import copy

    edited = copy.deepcopy(box.policies)
    [policy] = [p for p in edited if p["metadata"]["name"] == f"{FULLNAME}-mlflow"]
    for rule in policy["spec"]["ingress"]:
        rule["ports"] = [{"port": 5001, "protocol": "TCP"}]  # 5000 ("http") removed
    box.net.enforce(edited)
    try:
        done = _submit(box, _small("box-no-mlflow", trials=1), timeout=400)
    finally:
        box.net.enforce(box.policies)
    assert done["state"] == "failed", done
    assert "mlflow" in (done["error"] or "").lower(), done["error"]
    print(f"the study's error: {done['error']}")
