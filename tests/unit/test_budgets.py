"""Budgets in compute, unit by unit: durations as written, the configuration-round ledger,
``budget`` in the spec and the progress line that shows what is used and left."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fedtune.durations import format_duration, parse_duration
from fedtune.service.specs import stored_spec
from fedtune.tuning.driver.progress import ProgressCallback
from fedtune.tuning.keys import TRIAL_KEY
from fedtune.tuning.optuna.budget import Ask, RoundBudget, rounds_spent
from fedtune.tuning.spec import DEFAULT_TRIALS, BudgetSpec


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        (90, 90.0),
        (2.5, 2.5),
        ("90", 90.0),
        ("45s", 45.0),
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        (" 10M ", 600.0),
        ("1d2h3m4s", 93784.0),
    ],
)
def test_durations_as_people_write_them(written, seconds) -> None:
    assert parse_duration(written) == seconds


@pytest.mark.parametrize(
    "written", [0, -5, "0s", True, None, "1 hour", "30m1h", "1h1h", "h", "", float("inf"), [1]]
)
def test_what_is_not_a_duration_says_so(written) -> None:
    with pytest.raises(ValueError, match=r"duration|> 0"):
        parse_duration(written)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 75, 3725, -3)] == ["0:00", "1:15", "1:02:05", "0:00"]


def test_the_ledger_never_lets_the_budget_be_exceeded() -> None:
    budget = RoundBudget(limit=25, rounds=10)
    assert budget.ask() == Ask.GO
    budget.start("a")
    assert budget.ask() == Ask.GO  # 10 held + 10 <= 25
    budget.start("b")
    assert budget.ask() == Ask.WAIT  # 20 held + 10 > 25, and two run
    budget.trained("a", 3)
    budget.trained("a", 2)  # a late, lower report changes nothing
    assert (budget.used, budget.left) == (3, 22)
    budget.end("a")  # stopped after 3 rounds: 7 given back
    assert budget.spent == 3 and budget.ask() == Ask.GO  # 3 + 10 held + 10 <= 25
    budget.start("c")
    budget.end("b", 10)
    budget.end("c", 10)
    assert budget.used == 23 and budget.ask() == Ask.DONE  # 23 + 10 > 25, nothing runs
    budget.end("never-started", 5)
    assert budget.used == 23


def test_rounds_of_earlier_sessions_count() -> None:
    class Frozen:
        def __init__(self, attrs, steps):
            self.user_attrs, self.intermediate_values = attrs, dict.fromkeys(steps, 0.1)

    ended = [Frozen({"rounds": 12}, [4, 8, 12]), Frozen({}, [3, 6])]  # the second interrupted
    assert rounds_spent(ended) == 18
    budget = RoundBudget(30, 12, rounds_spent(ended))
    assert budget.ask() == Ask.GO and budget.left == 12
    with pytest.raises(ValueError):
        RoundBudget(0, 12)


def test_budget_spec_defaults_and_names() -> None:
    assert BudgetSpec().trials == DEFAULT_TRIALS
    assert BudgetSpec(time="30m").trials is None  # tune for 30 minutes: as many as fit
    assert BudgetSpec(configuration_rounds=100).trials is None
    assert BudgetSpec(configuration_rounds=100, trials=8).trials == 8
    old = BudgetSpec.model_validate({"wall_clock_s": 10})  # the old name: 16 trials at most
    assert (old.time, old.trials) == (10.0, DEFAULT_TRIALS)
    assert BudgetSpec(time=10).compute and not BudgetSpec().compute
    with pytest.raises(ValueError, match="old name of time"):
        BudgetSpec.model_validate({"wall_clock_s": 10, "time": 10})
    # a row stored before the rename still reads
    assert stored_spec({"budget": {"trials": 4, "wall_clock_s": 30}}).budget.time == 30.0
    assert stored_spec(None).budget == BudgetSpec()
    assert stored_spec({"budget": None, "name": "x"}).budget == BudgetSpec()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Trial:
    def __init__(self, number: int) -> None:
        self.config, self.last_result = {TRIAL_KEY: number}, {}


def test_the_progress_line_shows_the_budget_used_and_left() -> None:
    clock, out, rounds = _Clock(), io.StringIO(), RoundBudget(100, 10, spent=20)
    line = ProgressCallback(out, "s", None, 2, rounds=rounds, time_s=600, clock=clock)
    assert (
        line.line()
        == "s  2 done · 0 running · 20/100 configuration-rounds · 0:00 of 10:00 · ETA 10:00"
    )
    line.on_trial_start(0, [], _Trial(2))
    rounds.start("x")
    clock.now = 30.0
    rounds.trained("x", 10)  # 10 rounds in 30 s: 70 left take 210 s, sooner than the time
    text = line.line()
    assert "30/100 configuration-rounds · 0:30 of 10:00 · ETA 3:30" in text, text
    clock.now = 500.0  # now the time ends first
    assert line.line().endswith("ETA 1:40")


def test_a_log_that_saw_no_trial_end_still_shows_the_budget_spent() -> None:
    """Without a terminal the line is written when a trial ends; a time budget spent before
    any ended (a busy machine, long trials) gets the line once, at the end of the fit."""
    clock, out = _Clock(), io.StringIO()
    progress = ProgressCallback(out, "s", None, 0, time_s=8, clock=clock)
    progress.setup()
    clock.now = 8.0
    progress.on_experiment_end([])
    expected = "s  0 done · starting trials\ns  0 done · 0 running · 0:08 of 0:08 · ETA 0:00\n"
    assert out.getvalue() == expected
    ended, out = _Clock(), io.StringIO()
    progress = ProgressCallback(out, "s", None, 0, time_s=8, clock=ended)
    progress.on_trial_complete(0, [], _Trial(0))
    progress.on_experiment_end([])
    assert out.getvalue().count("\n") == 1  # a trial ended: its line, nothing more


def _digits(budget: dict, **extra):
    import yaml

    from fedtune.tuning.spec import StudySpec

    doc = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "examples/quickstart.yaml").read_text()
    )
    return StudySpec.from_dict(doc | {"budget": budget} | extra)


def test_advice_names_the_budget_a_search_needs():
    from fedtune.tuning.budget_advice import advice, full_trials, recommended_full_trials

    assert [recommended_full_trials(n) for n in (1, 2, 3, 4, 5, 8)] == [64, 64, 64, 64, 80, 128]
    good = _digits({"trials": 64})
    assert advice(good, good.search_space()) is None
    quickstart = _digits({"trials": 16, "max_concurrent": 2})  # a quarter: a note, no warning
    note = advice(quickstart, quickstart.search_space())
    assert note is not None and note.level == "note" and "\n" not in note.line
    assert note.line.startswith("the budget is 16 full trials (30 rounds each) for 3 searched")
    assert "a good answer needs 64" in note.line and "configuration_rounds: 1920" in note.line
    small = _digits({"trials": 8})
    warned = advice(small, small.search_space())
    assert warned is not None and warned.level == "warning" and "\n" not in warned.line
    assert warned.line.startswith("the budget is 8 full trials (30 rounds each) for 3 searched")
    assert "give at least 16, better 64" in warned.line and "34 at 64" in warned.line
    assert advice(small, small.search_space(), trials=64) is None  # fedtune tune --trials 64
    assert advice(small, small.search_space(), trials=20).level == "note"
    rounds = _digits({"configuration_rounds": 300})  # 10 full trials of 30 rounds
    assert full_trials(rounds) == 10
    assert "10 full trials" in advice(rounds, rounds.search_space()).line
    both = _digits({"configuration_rounds": 3000, "trials": 4})  # the trials end it first
    assert full_trials(both) == 4
    timed = _digits({"time": "5m"})
    assert full_trials(timed) is None and advice(timed, timed.search_space()) is None
    grid = _digits({"trials": 4}, sampler={"name": "grid"}, search={"space": "fedavgm"})
    assert advice(grid, grid.search_space()) is None  # a grid has its own count


def test_a_tied_parameter_is_not_counted_as_searched():
    from fedtune.tuning.budget_advice import searched_parameters

    spec = _digits(
        {"trials": 64},
        decay={"enabled": True},
        search={
            "space": "fedavgm",
            "override": {
                "decay.window": {"type": "int", "low": 2, "high": 8},
                "decay.patience": {"tie": "decay.window"},
            },
        },
    )
    space = spec.search_space()
    assert len(space.enabled) == searched_parameters(space) + 1
