"""The driver's sink: a trial's rounds gathered into one write per interval, every round written
before the trial's end, at the experiment's end and at :meth:`DbSink.flush`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fedtune.service import sink as sink_module
from fedtune.service.sink import DbSink
from fedtune.service.states import TrialState


class _Recorder:
    """What the sink wrote, in order: ``("rounds", number, [rounds])`` and ``("end", number)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_trial_start(self, number, params, mlflow_run_id=None) -> None:
        self.calls.append(("start", number))

    def on_trial_result(self, number, rows) -> None:
        self.calls.append(("rounds", number, [r["round"] for r in rows]))

    def on_trial_end(self, number, state, value, outcome) -> None:
        self.calls.append(("end", number, state))


def _trial(number: int, rounds: range) -> SimpleNamespace:
    history = [{"round": r, "client_loss": 1.0 / r} for r in rounds]
    last = {"history": history, "objective": 0.5, "outcome": "completed"}
    return SimpleNamespace(
        trial_id=f"t{number}", config={"fedtune.trial": number}, last_result=last
    )


def _report(sink: DbSink, number: int, up_to: int) -> None:
    """Trial ``number`` reports rounds ``1..up_to`` (the sink keeps only the new ones)."""
    trial = _trial(number, range(1, up_to + 1))
    sink.on_trial_result(0, [], trial, trial.last_result)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    now = SimpleNamespace(t=100.0)
    monkeypatch.setattr(sink_module.time, "monotonic", lambda: now.t)
    return now


def test_rounds_are_gathered_into_one_write_per_interval(clock) -> None:
    recorder = _Recorder()
    sink = DbSink(recorder, rounds_every_s=0.5)
    _report(sink, 0, 1)  # a trial's first report goes out at once: progress is visible
    _report(sink, 0, 2)
    _report(sink, 1, 1)  # each trial its own interval
    clock.t += 0.2
    _report(sink, 0, 3)
    assert recorder.calls == [("rounds", 0, [1]), ("rounds", 1, [1])]
    clock.t += 0.3
    _report(sink, 0, 4)  # the interval has passed: rounds 2..4 in one write
    assert recorder.calls[-1] == ("rounds", 0, [2, 3, 4])
    _report(sink, 0, 6)
    sink.on_trial_complete(0, [], _trial(0, range(1, 8)))  # round 7 came with the end
    assert recorder.calls[-2:] == [("rounds", 0, [5, 6, 7]), ("end", 0, TrialState.COMPLETED)]


def test_gathered_rounds_are_written_before_an_error_and_by_flush(clock) -> None:
    recorder = _Recorder()
    sink = DbSink(recorder, rounds_every_s=0.5)
    for n in (0, 1, 2):
        _report(sink, n, 1)
        _report(sink, n, 3)
    sink.on_trial_error(0, [], _trial(1, range(1, 4)))
    assert recorder.calls[-2:] == [("rounds", 1, [2, 3]), ("end", 1, TrialState.FAILED)]
    sink.on_experiment_end([])
    assert sorted(recorder.calls[-2:]) == [("rounds", 0, [2, 3]), ("rounds", 2, [2, 3])]
    _report(sink, 2, 4)
    sink.flush()  # the driver's, however the study ended
    sink.flush()  # nothing left: nothing written
    assert recorder.calls[-1] == ("rounds", 2, [4])
    assert sum(c[0] == "rounds" for c in recorder.calls) == 7  # 3 first, 1, 2, 1
