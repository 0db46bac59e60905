"""Live progress of a study on one line of a text stream (a Ray Tune callback, driver side).

    quickstart-digits-fedavgm  9/16 done · 2 running · 1 diverged · best 0.2134 (#5) · 1:12 · ETA 0:54

On a terminal the line is redrawn in place (``\\r`` + erase) at most every ``interval`` seconds
and notable events (a trial diverged or failed) are printed above it; on a pipe or a log file
one line is written per finished trial instead, so logs stay readable. ETA = time since this
session's first trial started / trials finished in this session × trials left. No tqdm/rich: plain ANSI only.
"""

from __future__ import annotations

import math
import time
from typing import Any, TextIO

from ray.tune import Callback

from fedtune.outcomes import TrialOutcome, final_outcome

from .keys import OBJECTIVE, OUTCOME, TRIAL_KEY
from .spec import Mode
from .tracking import error_line

__all__ = ["ProgressCallback", "format_duration"]


def format_duration(seconds: float) -> str:
    """``75`` -> ``1:15``; ``3725`` -> ``1:02:05``."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressCallback(Callback):
    """Trials done/running/total, outcomes, best objective so far, elapsed and ETA."""

    def __init__(
        self,
        stream: TextIO,
        name: str,
        total: int,
        done: int = 0,
        best: tuple[float, int] | None = None,
        counts: dict[str, int] | None = None,
        mode: Mode = Mode.MIN,
        interval: float = 0.5,
        clock: Any = time.monotonic,
    ) -> None:
        self.stream, self.name, self.total = stream, name, total
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
            self._write(f"{self.name}  {self.done}/{self.total} done · starting trials\n")

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

    def line(self) -> str:
        parts = [f"{self.name}  {self.done}/{self.total} done", f"{self.running} running"]
        parts += [f"{n} {k}" for k, n in sorted(self.counts.items()) if k != TrialOutcome.COMPLETED]
        if self.best is not None:
            parts.append(f"best {self.best[0]:.4g} (#{self.best[1]})")
        elapsed = self.clock() - self.start
        parts.append(format_duration(elapsed))
        left = self.total - self.done
        if self.done_here and left > 0 and self._first is not None:
            per_trial = (self.clock() - self._first) / self.done_here
            parts.append(f"ETA {format_duration(per_trial * left)}")
        return " · ".join(parts)

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

    def _write(self, text: str) -> None:
        """Write and flush; a closed pipe (``| head``) turns the display off, not the study."""
        if self.stream is None:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.stream = None
