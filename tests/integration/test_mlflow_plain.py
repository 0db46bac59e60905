"""The tests' plain MLflow server (``tests/mlflow_plain.py``, one process) serves what
``mlflow server`` would start: the same variables in its uvicorn worker's environment, the
same app, log config, address and workers (so an MLflow upgrade that changes one fails here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import mlflow_plain

#: MLflow's own command with each option set (one process: each a new one's start), its uvicorn
#: worker's start recorded, not run
_MLFLOWS_OWN = """
import json, os, sys
from fedtune.tuning.mlflow.sqlite_template import seed_sqlite_store
import mlflow.server
from mlflow.cli import server
from mlflow.server import handlers
before = dict(os.environ)
seen = []
class Done:
    pid = 0
    def poll(self): return 0
    def wait(self): return 0
def spawn(cmd, extra_env=None, **kwargs):
    env = {**os.environ, **(extra_env or {})}
    seen.append({"cmd": cmd, "env": {k: v for k, v in env.items() if before.get(k) != v}})
    return Done()
mlflow.server._exec_cmd = spawn
for argv in json.loads(sys.argv[1]):
    seed_sqlite_store(argv[1], default_experiment=False)
    server.main(argv, standalone_mode=False)
    os.environ.clear()
    os.environ.update(before)
    handlers._tracking_store = handlers._model_registry_store = None  # opened anew, as a new process
print(json.dumps(seen))
"""


def test_the_one_process_serves_what_mlflow_server_would_start(tmp_path: Path) -> None:
    from mlflow.server import _UVICORN_LOG_CONFIG

    stores = [f"sqlite:///{tmp_path / name}" for name in ("one.db", "two.db")]
    address = ["--host", "127.0.0.1", "--port", "5123"]
    argvs = [
        ["--backend-store-uri", stores[0], *address, "--workers", "1"],
        [
            *("--backend-store-uri", stores[1], *address, "--workers", "2"),
            *("--serve-artifacts", "--artifacts-destination", str(tmp_path / "artifacts")),
        ],
    ]
    done = subprocess.run(
        [sys.executable, "-c", _MLFLOWS_OWN, json.dumps(argvs)],
        env={**_environ(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    mlflows = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(mlflows) == len(argvs)
    for argv, theirs in zip(argvs, mlflows, strict=True):
        options = mlflow_plain.parse_options(argv)
        ours = mlflow_plain.worker_env(options)
        boot_ids = ours.pop("_MLFLOW_SERVER_BOOT_ID"), theirs["env"].pop("_MLFLOW_SERVER_BOOT_ID")
        assert [len(boot) for boot in boot_ids] == [32, 32]
        assert ours == theirs["env"]
        # what mlflow_plain passes uvicorn.run: the same app, log config, address and workers
        assert theirs["cmd"][1:] == [
            *("-m", "uvicorn", "--log-config", str(_UVICORN_LOG_CONFIG)),
            *("--host", options.host, "--port", str(options.port)),
            *("--workers", str(options.workers), mlflow_plain.APP),
        ]
    notice = done.stderr.strip().splitlines()[-1]
    assert notice == mlflow_plain.SECURITY_NOTICE


def _environ() -> dict[str, str]:
    """This process's environment without MLflow's server settings (as the fixture's caller)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "_MLFLOW_"))}
