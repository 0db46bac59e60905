"""What the driver writes to a study's MLflow store through: :class:`Tracker`.

The driver holds one tracker per study and never imports MLflow itself for it. Two keep the
contract: :class:`~.tracking.StudyTracker` writes the store from the driver's process, and
:class:`~.process.ProcessTracker` sends each call to a ``StudyTracker`` in a process of its own
(a study whose trials run in the driver's process). What each call writes is
:mod:`.tracking`'s to say.

Light on purpose: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..spec import StudySpec

__all__ = ["Tracker"]


class Tracker(Protocol):
    """A study's experiment and run tree in one MLflow tracking store (module docstring)."""

    uri: str  # the tracking URI
    experiment_id: str  # the study's experiment

    # -- the study's parent run ----------------------------------------------------------
    def start_study(
        self, spec: StudySpec, space_dict: Mapping[str, Any], run_id: str | None
    ) -> str:
        """The study's parent run: ``run_id`` (a resumed study) when it exists, else a new one.

        Args:
            spec: The study.
            space_dict: Its search space (``search_space.yaml``).
            run_id: The parent run of a previous invocation, if any.

        Returns:
            The parent run's id.
        """
        ...

    def finish_study(
        self,
        run_id: str,
        metrics: Mapping[str, float],
        status: str,
        artifacts: Path | None = None,
        artifact_path: str | None = None,
        step: int = 0,
    ) -> None:
        """Summary metrics, an artifact folder and the parent's final status; every queued
        round is stored first."""
        ...

    def log_series(self, run_id: str, key: str, points: Iterable[tuple[int, float]]) -> None:
        """``(step, value)`` points of metric ``key`` not already at their steps."""
        ...

    def mark_best(self, parent: str, best_run: str | None, number: int | None) -> None:
        """Tag the best child run (and only it) and point the parent at it."""
        ...

    def log_table(
        self, run_id: str, columns: Mapping[str, list], name: str, note: str | None = None
    ) -> None:
        """An MLflow table artifact, and what its rows are (the run's tag ``name``)."""
        ...

    def read_text(self, run_id: str, path: str) -> str:
        """An artifact's text, exactly as stored."""
        ...

    def log_json(self, run_id: str, data: Any, name: str) -> None:
        """``data`` as a JSON artifact ``name``."""
        ...

    # -- the trials' child runs ----------------------------------------------------------
    def start_trial(
        self, parent: str, number: int, params: Mapping[str, Any], tags: Mapping[str, str]
    ) -> str:
        """A trial's child run under ``parent``; returns its id."""
        ...

    def log_rounds(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Queue the metrics of a trial's round rows (``step = round``)."""
        ...

    def end_trial(
        self,
        run_id: str,
        status: str,
        tags: Mapping[str, str],
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, str] | None = None,
        step: int = 0,
    ) -> None:
        """Close a child run (after its queued rounds are stored)."""
        ...

    def reconcile(self, parent: str, statuses: Mapping[str, str]) -> list[str]:
        """Close child runs left running: a finished trial's with its status, others KILLED;
        returns the runs closed."""
        ...

    def unsent(self) -> int:
        """How many queued metrics of the rounds are not stored (yet)."""
        ...
