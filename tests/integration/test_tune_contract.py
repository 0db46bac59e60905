"""The in-process tuner's contract with Ray Tune, as one test both run.

:class:`~fedtune.tuning.driver.in_process.InProcessTuner` takes the place of Ray Tune's
``Tuner`` for a study whose trials run in the driver's process, and promises the calls of Ray
Tune's controller (``docs/explanation/architecture.md``, *Trials in the driver's process*): the
same searcher, scheduler and callbacks hear the same hooks in the same order, with the same
results. Here one recording searcher, scheduler and callback watch three trials of a quadratic
(one stopped by the scheduler at its second report, one failing at its second round) on each
path, and each path must give :data:`EXPECTED`. A Ray upgrade that changes Tune's order fails
the ``ray_tune`` case; a change of the tuner that leaves it fails the ``in_process`` case.

The parts subclass the Ray-free bases of :mod:`fedtune.tuning.tune_hooks`, as the study's own
do, and reach Ray Tune through the study's adapters (:func:`~fedtune.tuning.driver.ray_adapters.
for_ray_tune`), so the ``ray_tune`` case holds the adapters to the contract too.
"""

from __future__ import annotations

from typing import Any

import pytest
from ray import tune

from fedtune.tuning import tune_hooks as keys
from fedtune.tuning.driver.fit import _tune_environment
from fedtune.tuning.driver.in_process import InProcessTuner
from fedtune.tuning.mlflow.callback import error_line
from fedtune.tuning.trials.view import TrialView
from fedtune.tuning.tune_hooks import Callback, Scheduler, Searcher

ROUNDS = 3
STARTS = [4.0, -2.0, 1.0]  # trial n starts its quadratic at STARTS[n]
STOPPED, FAILS = 1, 2  # the scheduler stops trial 1 at its round 2; trial 2 raises in round 2
#: what Ray Tune adds to every result, with values of the moment (present, not compared)
STATS = (
    keys.PID,
    keys.HOSTNAME,
    keys.NODE_IP,
    keys.TIMESTAMP,
    keys.TIME_THIS_ITER_S,
    keys.TIME_TOTAL_S,
)


def quadratic(config: dict[str, Any], report: Any = None) -> None:
    """Gradient steps on x², one report per round (``report``: the in-process tuner's; None:
    Ray Tune's)."""
    report = report or tune.report
    x = config["x"]
    for r in range(1, ROUNDS + 1):
        if config["n"] == FAILS and r == 2:
            raise ValueError("boom in round 2")
        x -= 0.25 * 2 * x
        report({"round": r, "loss": x * x, "n": config["n"]})


class _Log:
    """The calls every part heard, in order, each named by its trial's number."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.ids: dict[str, int] = {}  # trial id -> number
        self.results: list[dict[str, Any]] = []

    def number(self, trial: TrialView) -> int:
        assert isinstance(trial, TrialView)  # Ray Tune's Trial and LocalTrial alike
        return int(trial.config["n"])

    def result(self, trial: TrialView, result: dict[str, Any]) -> int:
        """The result as both paths must give it: its fields, Ray Tune's own ones present."""
        assert all(k in result for k in STATS), sorted(result)
        assert result[keys.TRIAL_ID] == trial.trial_id
        self.results.append(
            {k: result[k] for k in ("n", "round", "loss", keys.TRAINING_ITERATION, keys.DONE)}
        )
        return int(result["round"])


class _Searcher(Searcher):
    def __init__(self, log: _Log) -> None:
        super().__init__()
        self.log, self.asked = log, 0

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        n = self.asked
        self.asked += 1
        self.log.ids[trial_id] = n
        self.log.calls.append(("searcher.suggest", n))
        return {"n": n, "x": STARTS[n]}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.log.calls.append(("searcher.result", self.log.ids[trial_id], result["round"]))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        last = (result or {}).get("round")
        self.log.calls.append(("searcher.complete", self.log.ids[trial_id], last, error))

    def save(self, checkpoint_path: str) -> None:  # Ray Tune saves the search state
        pass

    def restore(self, checkpoint_path: str) -> None:
        pass


class _Scheduler(Scheduler):
    def __init__(self, log: _Log) -> None:
        self.log = log

    def on_trial_result(self, tune_controller: Any, trial: TrialView, result: dict) -> str:
        n = self.log.number(trial)
        self.log.calls.append(("scheduler.result", n, result["round"]))
        stop = n == STOPPED and result["round"] == 2
        return Scheduler.STOP if stop else Scheduler.CONTINUE

    def on_trial_complete(self, tune_controller: Any, trial: TrialView, result: dict) -> None:
        self.log.calls.append(("scheduler.complete", self.log.number(trial), result["round"]))

    def on_trial_error(self, tune_controller: Any, trial: TrialView) -> None:
        self.log.calls.append(("scheduler.error", self.log.number(trial)))


class _Callback(Callback):
    def __init__(self, log: _Log) -> None:
        self.log = log

    def setup(self, **info: Any) -> None:
        self.log.calls.append(("callback.setup",))

    def on_trial_start(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        self.log.calls.append(("callback.start", self.log.number(trial)))

    def on_trial_result(self, iteration, trials, trial: TrialView, result, **info) -> None:
        n, r = self.log.number(trial), self.log.result(trial, result)
        self.log.calls.append(("callback.result", n, r, result[keys.DONE]))

    def on_trial_complete(self, iteration, trials, trial: TrialView, **info) -> None:
        last = trial.last_result.get("round")
        self.log.calls.append(("callback.complete", self.log.number(trial), last))

    def on_trial_error(self, iteration, trials, trial: TrialView, **info) -> None:
        # its traceback, from the file Ray Tune wrote or the trial's own error (error_line)
        assert error_line(trial) == "ValueError: boom in round 2"
        self.log.calls.append(("callback.error", self.log.number(trial)))

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.log.calls.append(("callback.end", len(trials)))


def _completes(n: int, rounds: int) -> list[tuple]:
    """A trial that reports ``rounds`` rounds and ends by itself."""
    out: list[tuple] = [("callback.start", n)]
    for r in range(1, rounds + 1):
        out += [("scheduler.result", n, r), ("searcher.result", n, r)]
        out += [("callback.result", n, r, False)]
    out += [("scheduler.complete", n, rounds), ("searcher.complete", n, rounds, False)]
    return [*out, ("callback.complete", n, rounds)]


#: Ray Tune's controller (Ray 2.x), one trial at a time
EXPECTED = [
    ("callback.setup",),
    ("searcher.suggest", 0),
    *_completes(0, ROUNDS),
    ("searcher.suggest", 1),
    ("callback.start", 1),
    ("scheduler.result", 1, 1),
    ("searcher.result", 1, 1),
    ("callback.result", 1, 1, False),
    ("scheduler.result", 1, 2),  # STOP: the searcher hears of it only as the trial's end
    ("callback.result", 1, 2, True),
    ("scheduler.complete", 1, 2),
    ("searcher.complete", 1, 2, False),
    ("callback.complete", 1, 2),
    ("searcher.suggest", 2),
    ("callback.start", 2),
    ("scheduler.result", 2, 1),
    ("searcher.result", 2, 1),
    ("callback.result", 2, 1, False),
    ("scheduler.error", 2),
    ("searcher.complete", 2, None, True),
    ("callback.error", 2),
    ("callback.end", 3),
]


def _in_process(log: _Log, tmp_path) -> None:
    tuner = InProcessTuner(
        quadratic,
        _Searcher(log),
        _Scheduler(log),
        [_Callback(log)],
        num_samples=len(STARTS),
        time_budget_s=None,
        threads=1,
    )
    tuner.fit()


def _ray_tune(log: _Log, tmp_path) -> None:
    import ray

    from fedtune.tuning.driver.ray_adapters import for_ray_tune

    assert ray.is_initialized()  # the session's (``ray_local``)
    searcher, scheduler, callbacks = for_ray_tune(_Searcher(log), _Scheduler(log), [_Callback(log)])
    tuner = tune.Tuner(
        tune.with_resources(quadratic, {"cpu": 1}),
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=len(STARTS),
            max_concurrent_trials=1,
        ),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "ray_results"),
            callbacks=callbacks,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    with _tune_environment():  # as the study's fit runs it
        tuner.fit()


@pytest.fixture(params=["in_process", "ray_tune"])
def path(request) -> Any:
    if request.param == "ray_tune":
        request.getfixturevalue("ray_local")
        return _ray_tune
    return _in_process


def test_the_same_parts_hear_the_same_calls_in_the_same_order(path, tmp_path):
    log = _Log()
    path(log, tmp_path)
    assert log.calls == EXPECTED
    reported = [(0, 1, False), (0, 2, False), (0, 3, False), (1, 1, False), (1, 2, True)]
    reported += [(2, 1, False)]  # then it failed
    assert log.results == [
        {"n": n, "round": r, "loss": (0.5**r * STARTS[n]) ** 2, keys.TRAINING_ITERATION: r}
        | {keys.DONE: done}
        for n, r, done in reported
    ]
