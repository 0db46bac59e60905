"""Kueue's side of a study's RayJob: why Kueue holds it.

Kueue makes a Workload for every job it queues, labelled ``kueue.x-k8s.io/job-uid=<the job's
uid>``, and writes why it is not admitted in its ``QuotaReserved``/``Admitted`` conditions
(``couldn't assign flavors to pod set head: insufficient quota for nvidia.com/gpu …``). The API's
Role may ``list`` Workloads in its namespace when the chart's ``kueue.enabled`` is set.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["KUEUE_GROUP", "KUEUE_VERSION", "workload_reason"]

log = logging.getLogger(__name__)
KUEUE_GROUP, KUEUE_VERSION, WORKLOADS = "kueue.x-k8s.io", "v1beta2", "workloads"
TIMEOUT_S = 30


def workload_reason(api: Any, namespace: str, uid: str | None) -> str | None:
    """The message of the first ``False`` QuotaReserved/Admitted condition of the Workload of
    the job ``uid`` (one line), or None (none yet, no Kueue, no permission)."""
    if not uid:
        return None
    try:
        found = api.list_namespaced_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            WORKLOADS,
            label_selector=f"kueue.x-k8s.io/job-uid={uid}",
            _request_timeout=(5, TIMEOUT_S),
        )
    except Exception as exc:  # no Kueue, no permission: the plain reason is still right
        log.debug("reading Kueue workloads failed: %s", exc)
        return None
    for workload in found.get("items", []):
        conditions = {
            c.get("type"): c for c in (workload.get("status") or {}).get("conditions", [])
        }
        for kind in ("QuotaReserved", "Admitted"):
            c = conditions.get(kind)
            if c is not None and c.get("status") == "False":
                return " ".join(str(c.get("message") or c.get("reason") or "").split())
    return None
