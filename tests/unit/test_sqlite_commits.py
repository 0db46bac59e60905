"""A study's SQLite stores commit in WAL mode with synchronous=NORMAL, and lose nothing on kill -9."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedtune.tuning.common import sqlite_commits
from fedtune.tuning.common.sqlite_commits import fast_commits, filesystem_type, wal_allowed
from fedtune.tuning.optuna.store import make_storage, storage_url

pytest.importorskip("sqlalchemy")

NORMAL, FULL = 1, 2


def journal_mode(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]


def engine_synchronous(url: str) -> int:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
    finally:
        engine.dispose()


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv("FEDTUNE_SQLITE_WAL", raising=False)


def test_the_optuna_store_commits_in_wal_mode_without_fsync(tmp_path: Path) -> None:
    url = storage_url(tmp_path)
    storage = make_storage(url)
    assert journal_mode(tmp_path / "optuna.db") == "wal"
    storage.engine.dispose()  # a new connection of Optuna's own engine
    with storage.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == NORMAL
    # any engine on the store (MLflow's, a dashboard's in this process) gets the same
    assert engine_synchronous(url) == NORMAL


def test_other_sqlite_files_keep_sqlites_defaults(tmp_path: Path) -> None:
    make_storage(storage_url(tmp_path / "a"))
    other = tmp_path / "other.db"
    sqlite3.connect(other).close()
    assert engine_synchronous(f"sqlite:///{other}") == FULL
    assert journal_mode(other) == "delete"


def test_the_mlflow_store_commits_in_wal_mode(tmp_path: Path, monkeypatch) -> None:
    from fedtune.tuning.mlflow.tracking import StudyTracker

    monkeypatch.setenv("FEDTUNE_CACHE_DIR", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    StudyTracker(uri, "probe")
    assert journal_mode(tmp_path / "mlflow.db") == "wal"
    assert engine_synchronous(uri) == NORMAL


def test_the_setting_turns_it_off(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FEDTUNE_SQLITE_WAL", "0")
    url = storage_url(tmp_path)
    make_storage(url)
    assert journal_mode(tmp_path / "optuna.db") == "delete"
    assert not fast_commits(tmp_path / "optuna.db")


MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
server:/export /mnt/shared nfs4 rw 0 0
/dev/vdb /mnt/shared/local xfs rw 0 0
//nas/x /mnt/my\\040nas cifs rw 0 0
"""


def test_network_file_systems_keep_the_rollback_journal(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    m = str(mounts)
    assert filesystem_type(Path("/mnt/shared/study"), m) == "nfs4"
    assert filesystem_type(Path("/mnt/shared/local/study"), m) == "xfs"  # longest mount point
    assert filesystem_type(Path("/mnt/shared2/study"), m) == "ext4"  # not a prefix match
    assert filesystem_type(Path("/mnt/my nas/study"), m) == "cifs"
    assert not wal_allowed(Path("/mnt/shared/study/optuna.db"), {}, m)
    assert wal_allowed(Path("/mnt/shared/local/study/optuna.db"), {}, m)
    assert not wal_allowed(Path("/mnt/my nas/s/optuna.db"), {}, m)
    assert wal_allowed(Path("/mnt/shared/study/optuna.db"), {"FEDTUNE_SQLITE_WAL": "1"}, m)
    assert filesystem_type(Path("/x"), str(tmp_path / "absent")) is None  # e.g. macOS: local
    assert wal_allowed(Path("/x/optuna.db"), {}, str(tmp_path / "absent"))


def test_a_finished_trial_survives_kill_9_right_after_its_commit(tmp_path: Path) -> None:
    """The driver dies the instant Optuna's tell returns: the trial is in the store."""
    script = textwrap.dedent(
        f"""
        import os, signal, optuna
        from fedtune.tuning.optuna.store import make_storage, storage_url
        storage = make_storage(storage_url({str(tmp_path)!r}))
        study = optuna.create_study(storage=storage, study_name="s")
        for i in range(3):
            trial = study.ask()
            trial.suggest_float("lr", 0.0, 1.0)
            study.tell(trial, float(i))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=120)
    assert proc.returncode == -9
    assert (tmp_path / "optuna.db-wal").exists()  # the commits are in the WAL, not checkpointed
    import optuna

    study = optuna.load_study(study_name="s", storage=make_storage(storage_url(tmp_path)))
    assert [t.value for t in study.trials] == [0.0, 1.0, 2.0]
    with sqlite3.connect(tmp_path / "optuna.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_the_hook_ignores_connections_of_other_drivers() -> None:
    class Other:
        def execute(self, *_):  # pragma: no cover - must not be called
            raise AssertionError("not a sqlite3 connection: left alone")

    sqlite_commits._on_connect(Other(), None)
