"""Quotas and fair share on a real multi-node Ray cluster: tests and measurements.

    .venv/bin/python benchmarks/fair_share.py [--studies 6] [--out benchmarks/results/fair_share.json]

A local Ray cluster (a head with no CPUs, two worker nodes with 2 logical GPUs each: 4 GPUs), a
real ``fedtune serve`` (backend ``ray``; ``FEDTUNE_CLUSTER_GPUS`` unset, so the service reads the
4 GPUs from the Ray cluster's nodes) on a PostgreSQL schema of
its own. Three projects — ``a`` and ``b`` (weight 1, quota 2 GPUs), ``c`` (weight 2, quota 4
GPUs) — each submit ``--studies`` small studies at once (one trial at a time on one logical GPU,
``train.device: cpu``: the GPUs are the reservation). Every 0.5 s the script reads the studies'
reservations from the service database: the figures are the largest reservation per project
seen (never above its quota), GPU-seconds per project over the busy period (from the first to
the last dispatch while every project still had work waiting), their shares against the
weighted shares (1:1:2) and Jain's fairness index of share/weighted-share. Writes JSON with the
machine, versions and load average.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import environment  # noqa: E402

from fedtune.client import Client  # noqa: E402
from fedtune.service import identity  # noqa: E402
from fedtune.service.db import Database  # noqa: E402
from fedtune.service.models import Study  # noqa: E402
from fedtune.service.states import StudyState  # noqa: E402
from tests.service.helpers import Server, pg_schema, tiny_spec  # noqa: E402
from tests.service.ray_cluster import LocalRayCluster  # noqa: E402

TOKEN = "fair-share-token-0123456789"
PROJECTS = {"a": (1.0, 2), "b": (1.0, 2), "c": (2.0, 4)}  # weight, GPU quota
CLUSTER_GPUS = 4


def _sample(db: Database) -> tuple[dict[str, float], dict[str, int]]:
    """GPUs reserved by running studies, and queued studies, per project, now."""
    from sqlalchemy import select

    with db.session(readonly=True) as s:
        rows = s.execute(select(Study.project, Study.state, Study.reserved_gpus)).all()
    reserved = dict.fromkeys(PROJECTS, 0.0)
    waiting = dict.fromkeys(PROJECTS, 0)
    for project, state, gpus in rows:
        if state == StudyState.RUNNING:
            reserved[project] += gpus or 0.0
        elif state == StudyState.QUEUED:
            waiting[project] += 1
    return reserved, waiting


def run(studies: int, out: Path) -> dict:
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"fair-share-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    with pg_schema() as url:
        db = Database(url)
        env = {
            "FEDTUNE_DATABASE_URL": url,
            "FEDTUNE_WORKDIR": str(root / "head"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        cluster = LocalRayCluster(env, head_cpus=0)
        server = None
        try:
            cluster.start()
            for name in ("w1", "w2"):
                cluster.add_node(name, num_cpus=2, num_gpus=2)
            server = Server(
                {
                    **env,
                    "FEDTUNE_WORKDIR": str(root / "api"),
                    "FEDTUNE_BACKEND": "ray",
                    "RAY_ADDRESS": cluster.address,
                    "RAY_AUTH_TOKEN": cluster.client_env["RAY_AUTH_TOKEN"],
                    "FEDTUNE_API_TOKEN": TOKEN,
                    "FEDTUNE_MAX_CONCURRENT_STUDIES": "8",
                    # no FEDTUNE_CLUSTER_GPUS: the service reads the cluster's 4 GPUs from Ray
                    "FEDTUNE_SCHEDULER_INTERVAL_S": "0.5",
                    "FEDTUNE_HEARTBEAT_S": "2",
                    "FEDTUNE_FAIR_SHARE_WINDOW_S": "3600",
                },
                root / "serve.log",
            ).start(timeout=180)
            with db.session() as s:
                for name, (weight, gpus) in PROJECTS.items():
                    identity.create_project(s, name)
                    identity.set_quota(s, name, quota_gpus=gpus, weight=weight)
            samples: list[tuple[float, dict[str, float], dict[str, int]]] = []
            stop = threading.Event()

            def sampler() -> None:
                while not stop.is_set():
                    samples.append((time.monotonic(), *_sample(db)))
                    stop.wait(0.5)

            with Client(server.url, token=TOKEN, retries=3) as client:
                threading.Thread(target=sampler, daemon=True).start()
                started = time.monotonic()
                ids = [
                    client.submit(
                        tiny_spec(
                            name=f"{p}{i}",
                            project=p,
                            trials=2,
                            rounds=20,
                            resources={"cpu": 1, "gpu": 1},
                            train={
                                "rounds": 20,
                                "clients_per_round": 3,
                                "local_steps": 2,
                                "batch_size": 2,
                                "device": "cpu",
                            },
                        )
                    ).id
                    for i in range(studies)
                    for p in PROJECTS
                ]
                finals = [client.study(i).wait(progress=False, timeout=3600, poll_s=2) for i in ids]
                took = time.monotonic() - started
            stop.set()
        finally:
            if server is not None:
                server.stop()
            cluster.stop()
            db.dispose()
    states = {f.id: str(f.state) for f in finals}
    peak = {p: max(s[1][p] for s in samples) for p in PROJECTS}
    # the busy period: every project has work waiting or running
    busy = [
        (t, r)
        for t, r, w in samples
        if all(r[p] > 0 or w[p] > 0 for p in PROJECTS) and any(w.values())
    ]
    gpu_s = dict.fromkeys(PROJECTS, 0.0)
    for (t0, r0), (t1, _) in itertools.pairwise(busy):
        for p in PROJECTS:
            gpu_s[p] += r0[p] * (t1 - t0)
    total = sum(gpu_s.values()) or 1.0
    weights = sum(w for w, _ in PROJECTS.values())
    ratio = {p: (gpu_s[p] / total) / (PROJECTS[p][0] / weights) for p in PROJECTS}
    jain = sum(ratio.values()) ** 2 / (len(ratio) * sum(x * x for x in ratio.values()))
    result = {
        "benchmark": "fair_share",
        "command": f"python benchmarks/fair_share.py --studies {studies}",
        "environment": environment(),
        "cluster": {
            "nodes": 2,
            "logical_gpus": CLUSTER_GPUS,
            "cpus": 4,
            "capacity_source": "Ray's nodes (/api/v0/nodes), FEDTUNE_CLUSTER_GPUS unset",
        },
        "cluster_gpus_ever_exceeded": any(sum(r.values()) > CLUSTER_GPUS for _, r, _ in samples),
        "projects": {p: {"weight": w, "quota_gpus": q} for p, (w, q) in PROJECTS.items()},
        "studies": len(finals),
        "succeeded": sum(s == "succeeded" for s in states.values()),
        "wall_s": round(took, 1),
        "samples": len(samples),
        "peak_reserved_gpus": peak,
        "quota_ever_exceeded": any(peak[p] > PROJECTS[p][1] for p in PROJECTS),
        "busy_period_s": round(busy[-1][0] - busy[0][0], 1) if len(busy) > 1 else 0.0,
        "gpu_seconds_busy": {p: round(v, 1) for p, v in gpu_s.items()},
        "share_over_weighted_share": {p: round(v, 3) for p, v in ratio.items()},
        "max_share_error": round(max(abs(v - 1) for v in ratio.values()), 3),
        "jain_index": round(jain, 4),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=6, help="studies per project")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/fair_share.json")
    args = parser.parse_args()
    print(json.dumps(run(args.studies, args.out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
