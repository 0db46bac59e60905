"""The service's cancel ends a study's MLflow runs with the parent last: a client that waits for
the parent to read ``KILLED`` (the service's users, ``tests/e2e/test_service_e2e.py``) then finds
no run of the study still ``RUNNING``."""

from __future__ import annotations

import sys
import types

from fedtune.tuning.mlflow.client import kill_study_runs

PARENT = "0" * 32  # sorts before every child: ended first if the runs were ended in id order
CHILDREN = ["a" * 32, "b" * 32, "c" * 32]


class _Client:
    """A fake ``MlflowClient``: every run RUNNING, the order runs are ended in."""

    ended: list[str] = []

    def __init__(self, tracking_uri: str | None = None) -> None:
        self.status: dict[str, str] = {}

    def search_runs(self, experiments: list[str], filter_string: str) -> list:
        return [types.SimpleNamespace(info=types.SimpleNamespace(run_id=r)) for r in CHILDREN]

    def get_run(self, run_id: str):
        status = self.status.get(run_id, "RUNNING")
        return types.SimpleNamespace(info=types.SimpleNamespace(status=status))

    def set_terminated(self, run_id: str, status: str) -> None:
        self.status[run_id] = status
        _Client.ended.append(run_id)


def test_the_parent_run_is_ended_after_every_child(monkeypatch) -> None:
    """Each run is marked ``KILLED``, the parent (whose id sorts first) after the others.

    Args:
        monkeypatch: pytest's fixture (a fake ``mlflow`` module).
    """
    monkeypatch.setitem(sys.modules, "mlflow", types.SimpleNamespace(MlflowClient=_Client))
    _Client.ended = []
    killed = kill_study_runs("sqlite:///unused.db", "1", PARENT, [CHILDREN[0]])
    assert _Client.ended == [*CHILDREN, PARENT]
    assert sorted(killed) == sorted([*CHILDREN, PARENT])
