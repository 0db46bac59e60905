"""Which tracking stores :func:`prepare_tracking_store` prepares, and how (no database here:
the race on PostgreSQL is tests/service/test_mlflow_store_race.py)."""

from __future__ import annotations

import pytest

from fedtune.tuning.mlflow import store as tracking_store


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:////tmp/x/mlflow.db",
        "/tmp/mlruns",
        "file:///tmp/mlruns",
        "http://mlflow:5000",
        "https://mlflow.example",
    ],
)
def test_stores_that_create_nothing_are_left_alone(uri, monkeypatch) -> None:
    monkeypatch.setattr(tracking_store, "_open_store", lambda u: pytest.fail(f"opened {u}"))
    tracking_store.prepare_tracking_store(uri)


def test_another_database_is_retried_after_a_racing_creation(monkeypatch) -> None:
    calls: list[str] = []

    def racing(uri: str) -> None:
        calls.append(uri)
        if len(calls) < 3:
            raise RuntimeError("duplicate key value violates unique constraint")

    monkeypatch.setattr(tracking_store, "_open_store", racing)
    monkeypatch.setattr(tracking_store.time, "sleep", lambda s: None)
    tracking_store.prepare_tracking_store("mysql+pymysql://u@db/mlflow")
    assert len(calls) == 3


def test_the_lock_key_is_a_signed_64_bit_integer() -> None:
    assert -(2**63) <= tracking_store.STORE_LOCK_KEY < 2**63
