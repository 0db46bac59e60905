"""The one trial type the study's scheduler and callbacks see, whatever runs the trial.

Three things run a trial: Ray Tune (its ``Trial``, a pack of configurations), the driver's
pack callback (:class:`~fedtune.tuning.driver.pack_members.MemberTrial`, one configuration of a
pack) and the driver's own tuner (:class:`~fedtune.tuning.driver.in_process.LocalTrial`, a
trial in the driver's process). The scheduler and the callbacks read the same few things of
each: :class:`TrialView`. Ray Tune's ``Trial`` satisfies it as it is, and the other two are
written to it; ``tests/unit/test_trial_view.py`` holds all three to it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["TrialView"]


@runtime_checkable
class TrialView(Protocol):
    """A trial as the scheduler and the callbacks read it: its id, its config, its last result
    and its error once it failed."""

    @property
    def trial_id(self) -> str:
        """Its id, unique in the fit."""
        ...

    @property
    def config(self) -> dict[str, Any]:
        """The config its searcher suggested (a pack's: its members under ``PACK_KEY``)."""
        ...

    @property
    def last_result(self) -> dict[str, Any]:
        """Its latest result (empty before its first report)."""
        ...

    @property
    def error_file(self) -> str | None:
        """The file of its traceback, once it failed and a file holds it (else None)."""
        ...

    def get_error(self) -> Any:
        """Its error (the traceback's text, or an error object), None while it has none."""
        ...
