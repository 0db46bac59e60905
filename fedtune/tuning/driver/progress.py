"""Live progress of a study on one line of a text stream (a tuner's callback, driver side).

    quickstart-digits-fedavgm  9/16 done · 2 running · 1 diverged · best 0.2134 (#5) · 1:12 · ETA 0:54

With a budget in compute the line shows it used and left (no ``/16`` without a trial count):

    digits  23 done · 4 running · best 0.2134 (#17) · 412/600 configuration-rounds · 2:03 of 5:00 · ETA 0:58

On a terminal the line is redrawn in place (``\\r`` + erase) at most every ``interval`` seconds
and notable events (a trial diverged or failed) are printed above it; on a pipe or a log file
one line is written per finished trial instead, so logs stay readable. ETA: the soonest of the
budgets' ends, each from this session's rate since its first trial started (trials finished,
configuration-rounds trained) and the time left. No tqdm/rich: plain ANSI only.
"""

from __future__ import annotations

import math
import time
from typing import Any, TextIO

from fedtune.durations import format_duration
from fedtune.outcomes import TrialOutcome, final_outcome

from ..keys import OBJECTIVE, OUTCOME, TRIAL_KEY
from ..mlflow.callback import error_line
from ..optuna.budget import RoundBudget
from ..spec import Mode
from ..tune_hooks import Callback

__all__ = ["ProgressCallback"]


class ProgressCallback(Callback):
    """Trials done/running/total, outcomes, best objective so far, the budget used, elapsed
    and ETA.

    Args:
        stream: Where the line goes.
        name: The study's name.
        total: Trials it aims at (None: no limit in trials).
        done: Trials finished before this session.
        best: ``(value, number)`` of the best trial so far.
        counts: Finished trials by outcome.
        mode: The objective's direction.
        rounds: The study's budget in configuration-rounds (None: none).
        time_s: Its ``budget.time`` (None: none).
        interval: Seconds between redraws on a terminal.
        clock: The clock (tests).
    """

    def __init__(
        self,
        stream: TextIO,
        name: str,
        total: int | None,
        done: int = 0,
        best: tuple[float, int] | None = None,
        counts: dict[str, int] | None = None,
        mode: Mode = Mode.MIN,
        *,
        rounds: RoundBudget | None = None,
        time_s: float | None = None,
        interval: float = 0.5,
        clock: Any = time.monotonic,
    ) -> None:
        self.stream, self.name, self.total = stream, name, total
        self.rounds, self.time_s = rounds, time_s
        self._rounds_before = rounds.used if rounds is not None else 0
        self.done, self.done_here, self.running = done, 0, 0
        self.counts: dict[str, int] = {k: v for k, v in (counts or {}).items() if v}
        self.best = best  # (value, trial number)
        self.mode, self.interval, self.clock = mode, interval, clock
        self.start = clock()
        self._first: float | None = None  # first trial start: the ETA ignores Ray's start-up
        self._last_draw = -math.inf
        self._tty = bool(getattr(stream, "isatty", lambda: False)())

    # -- Tune hooks ----------------------------------------------------------------
    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info) -> None:
        if not self._tty:
            self._write(f"{self.name}  {self._done()} done · starting trials\n")

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        if self._first is None:
            self._first = self.clock()
        self.running += 1
        self.draw()

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.draw()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        result = trial.last_result or {}
        outcome = final_outcome(result.get(OUTCOME))
        number = trial.config.get(TRIAL_KEY)
        if outcome == TrialOutcome.COMPLETED:
            self._offer(result.get(OBJECTIVE), number)
        elif outcome == TrialOutcome.DIVERGED:
            self.event(f"trial {number} diverged: {result.get('reason', '')}".rstrip(": "))
        self._finish(outcome)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.event(f"trial {trial.config.get(TRIAL_KEY)} failed: {error_line(trial)}")
        self._finish(TrialOutcome.FAILED)

    def on_experiment_end(self, trials, **info) -> None:
        self.close()

    # -- display -------------------------------------------------------------------
    def _offer(self, value: Any, number: Any) -> None:
        if value is None or not math.isfinite(value):
            return
        better = self.best is None or (
            value > self.best[0] if self.mode == Mode.MAX else value < self.best[0]
        )
        if better:
            self.best = (float(value), int(number))

    def _finish(self, outcome: str) -> None:
        self.running = max(0, self.running - 1)
        self.done += 1
        self.done_here += 1
        self.counts[str(outcome)] = self.counts.get(outcome, 0) + 1
        if not self._tty:
            self._write(self.line() + "\n")
        self.draw(force=True)

    def _done(self) -> str:
        return f"{self.done}/{self.total}" if self.total is not None else str(self.done)

    def line(self) -> str:
        parts = [f"{self.name}  {self._done()} done", f"{self.running} running"]
        parts += [f"{n} {k}" for k, n in sorted(self.counts.items()) if k != TrialOutcome.COMPLETED]
        if self.best is not None:
            parts.append(f"best {self.best[0]:.4g} (#{self.best[1]})")
        if self.rounds is not None:
            parts.append(f"{self.rounds.used}/{self.rounds.limit} configuration-rounds")
        elapsed = self.clock() - self.start
        shown = format_duration(elapsed)
        parts.append(shown if self.time_s is None else f"{shown} of {format_duration(self.time_s)}")
        eta = self._eta(elapsed)
        if eta is not None:
            parts.append(f"ETA {format_duration(eta)}")
        return " · ".join(parts)

    def _eta(self, elapsed: float) -> float | None:
        """Seconds until the first budget ends, at this session's rates (None: unknown)."""
        ends = []
        if self.time_s is not None:
            ends.append(max(0.0, self.time_s - elapsed))
        if self._first is None:
            return min(ends, default=None)
        running = self.clock() - self._first
        left = None if self.total is None else self.total - self.done
        if self.done_here and left is not None and left > 0:
            ends.append(running / self.done_here * left)
        if self.rounds is not None:
            trained = self.rounds.used - self._rounds_before
            if trained > 0:
                ends.append(running / trained * self.rounds.left)
        return min(ends, default=None)

    def draw(self, force: bool = False) -> None:
        if not self._tty:
            return
        now = self.clock()
        if not force and now - self._last_draw < self.interval:
            return
        self._last_draw = now
        self._write("\r\x1b[2K" + self.line())

    def event(self, message: str) -> None:
        if self._tty:
            self._write("\r\x1b[2K" + message + "\n")
            self._last_draw = -math.inf
            self.draw()
        else:
            self._write(message + "\n")

    def close(self) -> None:
        if self._tty:
            self.draw(force=True)
            self._write("\n")
        elif self.done_here == 0:  # no trial ended (a time budget spent starting): say so once
            self._write(self.line() + "\n")

    def _write(self, text: str) -> None:
        """Write and flush; a closed pipe (``| head``) turns the display off, not the study."""
        if self.stream is None:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.stream = None
