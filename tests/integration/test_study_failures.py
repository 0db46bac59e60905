"""Issue 15, item 4, end to end: real Ray trials that all raise end the study ``failed``.

A study is submitted to the service (its data path under ``FEDTUNE_DATA_ROOTS``, so item 2's rule
lets it in) and run by the real driver with the real ``run_study``: every trial's task reads a
file that is not HDF5 and raises. The study used to end ``succeeded`` with ``error: null``; now
it ends ``failed``, its reason naming the number of failed trials and the first trial's error,
which the Optuna storage also keeps.
"""

from __future__ import annotations

import optuna
import pytest

from fedtune.service.db import Database
from fedtune.service.driver import run_driver
from fedtune.service.migrate import upgrade_database
from fedtune.service.paths import study_workdir
from fedtune.service.repository import Repository
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.settings import load_settings
from fedtune.service.states import StudyState, TrialState
from fedtune.tuning import optuna_glue as og
from fedtune.tuning.failures import FIRST_ERROR_ATTR

pytestmark = pytest.mark.integration


def test_a_study_whose_trials_all_raise_ends_failed_with_the_first_error(tmp_path, ray_local):
    data = tmp_path / "data"
    data.mkdir()
    bad = data / "train.h5"
    bad.write_text("not an HDF5 file\n")
    settings = load_settings(database_url=f"sqlite:///{tmp_path / 'fedtune.db'}",
                             workdir=str(tmp_path / "work"), backend="none",
                             data_roots=str(data), heartbeat_s=1.0)  # fmt: skip
    db = Database(settings.database_url)
    upgrade_database(db)
    try:
        spec = {
            "name": "all-fail",
            "task": {"name": "emnist", "train_path": str(bad), "max_clients": 4},
            "algorithm": "fedavg",
            "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 1, "batch_size": 2},
            "objective": {"last_rounds": 1},
            "scheduler": {"name": "none"},
            "sampler": {"name": "random", "seed": 0},
            "budget": {"trials": 2, "max_concurrent": 1},
        }
        sid = submit_study(ServiceContext(db, settings), spec)[0].id
        with db.session() as s:
            Repository(s).transition(sid, StudyState.RUNNING, attempts=1)

        assert run_driver(sid, settings, 1) == 1

        with db.session(readonly=True) as s:
            repo = Repository(s)
            study = repo.require_study(sid)
            trials = repo.list_trials(sid)
        assert study.state == StudyState.FAILED, study.error
        assert study.error.startswith("all 2 trials failed; trial 0: ")
        assert "DataError" in study.error and str(bad) in study.error
        assert [t.state for t in trials] == [TrialState.FAILED, TrialState.FAILED]
        storage = og.storage_url(study_workdir(settings, sid))
        kept = optuna.load_study(study_name="all-fail", storage=storage).user_attrs
        assert kept[FIRST_ERROR_ATTR]["trial"] == 0
    finally:
        db.dispose()
