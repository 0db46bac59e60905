"""No credential at rest: a study whose tracking URI carries a password, run with tokens in the
driver's environment, writes neither into any file of its workdir, yet logs to MLflow with it.

The URI ``http://<user>:<password>@127.0.0.1:<port>`` reaches the session's real ``mlflow
server`` (the client sends the URI's user and password as basic auth, which a server without
authentication ignores); it is given both to :func:`run_study` and in the spec's
``tracking.uri``. Every file under the workdir — Ray Tune's experiment state and trial
directories, the Optuna storage, the MLflow artifacts, logs — is read as bytes; the study is then
extended by one trial by ``fedtune tune`` with the URI in ``MLFLOW_TRACKING_URI`` and its own
embedded Ray, and the walk repeated (Ray's temp dir too when it is outside the workdir).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import optuna
import yaml
from mlflow import MlflowClient

from fedtune.tuning.driver.ray_runtime import ray_temp_dir
from fedtune.tuning.driver.study import run_study
from fedtune.tuning.spec import StudySpec

PASSWORD = "S3cretPW-at-rest-9f2c"
TOKENS = {
    "FEDTUNE_API_TOKEN": "fedtune-api-t0ken-at-rest-51d7",
    "RAY_AUTH_TOKEN": "ray-auth-t0ken-at-rest-83e0",
}
SECRETS = [PASSWORD, *TOKENS.values()]


_WALK = """
import sys
from pathlib import Path

root, secrets = Path(sys.argv[1]), [s.encode() for s in sys.argv[2:]]
secrets += [s.decode().encode("utf-16-le") for s in secrets]
for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
    data = path.read_bytes()
    if any(s in data for s in secrets):
        print(path.relative_to(root))
"""


def _leaks(root: Path) -> list[str]:
    """The files under ``root`` (every one, read as bytes) that hold a secret.

    Read by a child process: closing a file this process read would drop the POSIX locks its
    open SQLite connections (the in-process study's Optuna storage) hold on that file.

    Args:
        root: The directory to walk.

    Returns:
        The paths, relative to ``root``, of the files that hold a secret.
    """
    walk = subprocess.run(
        [sys.executable, "-c", _WALK, str(root), *SECRETS],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return walk.stdout.splitlines()


def test_no_credential_in_the_study_files(
    tmp_path, ray_local, mlflow_server, quadratic_study, monkeypatch
):
    for key, value in TOKENS.items():
        monkeypatch.setenv(key, value)
    server = urlsplit(mlflow_server)
    uri = f"http://fedtune_pw_user:{PASSWORD}@{server.netloc}"
    spec = StudySpec.from_dict(
        quadratic_study(
            "at-rest",
            tracking={"uri": uri},
            budget={"trials": 2, "max_concurrent": 2},
        )
    )
    workdir = tmp_path / "study"

    result = run_study(spec, workdir, tracking_uri=uri)
    assert result.finished == 2
    assert _leaks(workdir) == []
    assert PASSWORD not in str(result.to_dict())  # printed by ``fedtune tune --json``
    assert (workdir / "ray_results").is_dir()  # Tune's state was written, and walked

    # the secret was used, not dropped: the runs are in the store it names
    client = MlflowClient(uri)
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [result.experiment_id], f"tags.`mlflow.parentRunId` = '{result.parent_run_id}'"
    )
    assert len(children) == 2

    # extended by one trial through ``fedtune tune`` (its own embedded Ray), the URI from
    # MLFLOW_TRACKING_URI this time: the same parent run goes on
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({**spec.to_dict(), "tracking": {}}))
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    cmd = [
        str(Path(sys.executable).parent / "fedtune"),
        "tune",
        str(tmp_path / "study.yaml"),
        "--workdir",
        str(workdir),
        "--trials",
        "3",
        "--json",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    again = json.loads(run.stdout)
    assert again["finished"] == 3 and again["ran"] == 1
    assert again["parent_run_id"] == result.parent_run_id
    assert not [s for s in SECRETS if s in run.stdout]
    assert _leaks(workdir) == []
    temp = ray_temp_dir(workdir)  # /tmp when the workdir's path is too long for Ray's sockets
    assert not temp.is_dir() or _leaks(temp) == []
    study = optuna.load_study(study_name=again["name"], storage=again["storage_url"])
    runs = {t.user_attrs["mlflow_run_id"] for t in study.trials}
    stored = {
        r.info.run_id
        for r in client.search_runs(
            [again["experiment_id"]], f"tags.`mlflow.parentRunId` = '{result.parent_run_id}'"
        )
    }
    assert runs == stored and len(runs) == 3
