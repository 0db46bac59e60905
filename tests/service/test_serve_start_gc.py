"""``fedtune serve`` starts with Python's cyclic garbage collector paused
(``fedtune.tuning.common.start_gc``): through its imports and the app's creation, until the app's
lifespan has started the runtime (the database, its migrations, the scheduler); then the
collector runs, with the start's objects frozen, while it serves."""

from __future__ import annotations

import gc
import sys

from fedtune.cli import main
from fedtune.tuning.common import start_gc
from tests.ports import free_port


def test_fedtune_serve_starts_with_the_collector_paused(collector, tmp_path, monkeypatch) -> None:
    import uvicorn
    from fastapi.testclient import TestClient

    seen = {}

    def serve(app, **kwargs) -> None:
        seen["before_lifespan"] = (gc.isenabled(), start_gc.paused())
        with TestClient(app) as client:  # the lifespan: the runtime starts
            seen["serving"] = (gc.isenabled(), start_gc.paused())
            seen["health"] = client.get("/healthz").status_code

    monkeypatch.setattr(uvicorn, "run", serve)
    gc.unfreeze()
    argv = [
        "serve",
        "--database-url",
        f"sqlite:///{tmp_path / 'fedtune.db'}",
        "--backend",
        "none",
        "--workdir",
        str(tmp_path / "w"),
        "--insecure-open",
        "--port",
        str(free_port()),
    ]
    monkeypatch.setattr(sys, "argv", ["fedtune", *argv])
    code = main()  # the process's entry point
    assert code == 0
    assert seen == {"before_lifespan": (False, True), "serving": (True, False), "health": 200}
    assert gc.get_freeze_count() > 0


def test_serve_called_as_a_library_leaves_the_collector_alone(
    collector, tmp_path, monkeypatch
) -> None:
    """``main([...])`` from another program (argv given): its process's collector is its own."""
    import uvicorn

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(on=gc.isenabled()))
    gc.unfreeze()
    url = f"sqlite:///{tmp_path / 'fedtune.db'}"
    args = ["serve", "--database-url", url, "--backend", "none", "--insecure-open"]
    assert main([*args, "--workdir", str(tmp_path / "w"), "--port", str(free_port())]) == 0
    assert seen == {"on": True} and gc.get_freeze_count() == 0
