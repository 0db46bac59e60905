"""MLflow runs read over a tracking server's REST API (``runs/get``, ``runs/search``), the
replies ``MlflowClient`` reads, without importing MLflow into the test's process (~1.3 CPU-s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class MlflowRun:
    """A run as MLflow's REST API returns it: its status and experiment, and its metrics (latest
    values) and tags by name, as ``MlflowClient``'s ``Run`` has them."""

    status: str
    experiment_id: str
    metrics: dict[str, float]
    tags: dict[str, str]

    @classmethod
    def from_json(cls, run: dict[str, Any]) -> MlflowRun:
        data = run.get("data", {})  # a reply leaves out what is empty
        return cls(
            run["info"]["status"],
            run["info"]["experiment_id"],
            {m["key"]: m["value"] for m in data.get("metrics", [])},
            {t["key"]: t["value"] for t in data.get("tags", [])},
        )


def mlflow_api(
    uri: str, *, auth: tuple[str, str] | None = None, workspace: str | None = None
) -> httpx.Client:
    """A client of the server's REST API.

    Args:
        uri: the tracking server's URL.
        auth: a basic-auth user and password, if the server asks for one.
        workspace: the workspace to read in (``X-MLFLOW-WORKSPACE``), if any.

    Returns:
        An ``httpx.Client`` whose base is ``{uri}/api/2.0/mlflow``.
    """
    headers = {"X-MLFLOW-WORKSPACE": workspace} if workspace else {}
    return httpx.Client(base_url=f"{uri}/api/2.0/mlflow", auth=auth, headers=headers, timeout=60)


def get_run(api: httpx.Client, run_id: str) -> MlflowRun:
    """Run ``run_id`` (``GET runs/get``, as ``MlflowClient.get_run``)."""
    reply = api.get("/runs/get", params={"run_id": run_id})
    assert reply.status_code == 200, (reply.status_code, reply.text[:2000])
    return MlflowRun.from_json(reply.json()["run"])


def child_runs(api: httpx.Client, parent: MlflowRun, parent_id: str) -> list[MlflowRun]:
    """The runs whose ``mlflow.parentRunId`` is ``parent_id``, in the parent's experiment
    (``POST runs/search``, as ``MlflowClient.search_runs`` with that filter)."""
    found = api.post(
        "/runs/search",
        json={
            "experiment_ids": [parent.experiment_id],
            "filter": f"tags.`mlflow.parentRunId` = '{parent_id}'",
            "max_results": 1000,
        },
    )
    assert found.status_code == 200, (found.status_code, found.text[:2000])
    return [MlflowRun.from_json(r) for r in found.json().get("runs", [])]
