"""Learning rates and decay counts reach MLflow as the points that draw their steps
(``fedtune.tuning.mlflow.step_points``), not once per round: the first round, both sides of each
change, the last round. Against a real MLflow store (a SQLite file) through ``StudyTracker``."""

from __future__ import annotations

from mlflow.entities import Metric

from fedtune.tuning.mlflow.step_points import StepPoints
from fedtune.tuning.mlflow.tracking import StudyTracker


def _rows(rounds: int, decay_at: int | None = None) -> list[dict]:
    rows = []
    for r in range(1, rounds + 1):
        decayed = decay_at is not None and r >= decay_at
        rows.append(
            {
                "round": r,
                "client_loss": 1.0 / r,
                "client_lr": 0.05 if decayed else 0.1,
                "server_lr": 1.0,
                "decays": 1.0 if decayed else 0.0,
            }
        )
    return rows


def _history(tracker: StudyTracker, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracker.client.get_metric_history(run_id, key))


def _value_at(points: list[tuple[int, float]], step: int) -> float:
    return [v for s, v in points if s <= step][-1]


def test_a_constant_rate_is_two_points_and_a_decay_two_more(tmp_path) -> None:
    tracker = StudyTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "steps")
    parent = tracker.client.create_run(tracker.experiment_id).info.run_id
    flat, decayed = (tracker.start_trial(parent, n, {"n": n}, {}) for n in range(2))
    rows = {flat: _rows(30), decayed: _rows(30, decay_at=12)}
    for first in range(0, 30, 4):  # reports of 4 rounds, as with report_every: 4
        for run_id, all_rows in rows.items():
            tracker.log_rounds(run_id, all_rows[first : first + 4])
    for run_id in rows:
        tracker.end_trial(run_id, "FINISHED", {"outcome": "completed"})

    assert _history(tracker, flat, "client_lr") == [(1, 0.1), (30, 0.1)]  # was 30 points
    assert _history(tracker, flat, "server_lr") == [(1, 1.0), (30, 1.0)]
    assert _history(tracker, decayed, "client_lr") == [(1, 0.1), (11, 0.1), (12, 0.05), (30, 0.05)]
    assert _history(tracker, decayed, "decays") == [(1, 0.0), (11, 0.0), (12, 1.0), (30, 1.0)]
    for run_id, all_rows in rows.items():  # every round's value reads off the points
        points = _history(tracker, run_id, "client_lr")
        assert [_value_at(points, r["round"]) for r in all_rows] == [
            r["client_lr"] for r in all_rows
        ]
        assert len(tracker.client.get_metric_history(run_id, "client_loss")) == 30  # untouched
    tracker.finish_study(parent, {}, "FINISHED")


def test_a_change_right_after_a_logged_point_repeats_nothing() -> None:
    steps = StepPoints()
    out = steps.keep(
        "r", [Metric("client_lr", v, 0, s) for s, v in ((1, 0.1), (2, 0.05), (3, 0.05), (4, 0.02))]
    )
    assert [(m.step, m.value) for m in out] == [(1, 0.1), (2, 0.05), (3, 0.05), (4, 0.02)]
    assert steps.close("r", 0) == []  # the last round is already a point
    again = steps.keep("r", [Metric("client_lr", 0.3, 0, 9)])  # a closed run starts anew
    assert [(m.step, m.value) for m in again] == [(9, 0.3)]


def test_the_runner_flag_and_the_evaluated_clients_are_step_points_too(tmp_path) -> None:
    """``runner_vectorized`` (every round) and ``eval_clients`` (evaluation rounds only) hold
    still: two points each, and a fallback to the sequential runner shows as its step."""
    tracker = StudyTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "steps")
    parent = tracker.client.create_run(tracker.experiment_id).info.run_id
    run_id = tracker.start_trial(parent, 0, {"n": 0}, {})
    rows = []
    for r in range(1, 31):
        row = {"round": r, "client_loss": 1.0 / r, "runner_vectorized": 0.0 if r > 20 else 1.0}
        if r == 1 or r % 10 == 0:
            row["eval_clients"] = 100.0
        rows.append(row)
    for first in range(0, 30, 5):
        tracker.log_rounds(run_id, rows[first : first + 5])
    tracker.end_trial(run_id, "FINISHED", {"outcome": "completed"})
    assert _history(tracker, run_id, "runner_vectorized") == [
        (1, 1.0),
        (20, 1.0),
        (21, 0.0),
        (30, 0.0),
    ]
    assert _history(tracker, run_id, "eval_clients") == [(1, 100.0), (30, 100.0)]
    assert len(tracker.client.get_metric_history(run_id, "client_loss")) == 30
    tracker.finish_study(parent, {}, "FINISHED")
