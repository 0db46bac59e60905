"""A user task that records where Ray built it — evidence for the multi-node Ray tests.

``ft_user_probe`` is :func:`ft_user_lab.methods.blobs` plus, when built inside a Ray worker, one
JSON record in ``probe_dir``: the node id and that node's resources (as Ray reports them), the
GPU ids Ray assigned, the process id, this module's file and the process's ``sys.path``.
``probe_meet: n`` waits until ``n`` records exist (only trials that run *at the same time* can
meet); ``probe_hold_on: <resource>`` parks a trial built on the node owning that custom resource
(the node the test then kills).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

from fedtune.extend import register_task

from .methods import blobs

MEET_TIMEOUT_S = 600.0


def _where() -> dict:
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    resources = next(n["Resources"] for n in ray.nodes() if n["NodeID"] == node_id)
    return {
        "node_id": node_id,
        "node_resources": sorted(resources),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "pid": os.getpid(),
        "module_file": __file__,
        "sys_path": list(sys.path),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


@register_task("ft_user_probe", "ft_user_blobs, recording the Ray node that built it")
def probe(params, seed):
    import ray

    if ray.is_initialized() and params.get("probe_dir"):
        folder = Path(params["probe_dir"])
        record = _where()
        (folder / f"{uuid.uuid4().hex}.json").write_text(json.dumps(record))
        hold = params.get("probe_hold_on")
        if hold and hold in record["node_resources"]:
            (folder / f"holding-{record['pid']}").touch()
            while True:  # until the test kills this node
                time.sleep(1.0)
        meet = int(params.get("probe_meet", 0))
        deadline = time.monotonic() + MEET_TIMEOUT_S
        while len(list(folder.glob("*.json"))) < meet:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(list(folder.glob('*.json')))} of {meet} met")
            time.sleep(0.2)
    return blobs({"clients": params.get("clients", 6)}, seed)
