"""The SDK's handle on one study: its status, a wait with a progress line, trials, curves.

:class:`Study` is what :meth:`fedtune.client.Client.submit` and :meth:`~fedtune.client.Client.study`
give (a study of methods gives a :class:`StudyOfMethods`, one handle per algorithm); every call
goes through its client's ``request``, so it retries and fails as the client does
(:mod:`fedtune.client`). Users import these names from :mod:`fedtune.client`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from fedtune.results import TradeOff
from fedtune.states import TrialState
from fedtune.wire_models import BestTrial, CurveOut, CurvePoint, StudyDetail, TrialOut

if TYPE_CHECKING:
    from fedtune.client import Client

__all__ = ["Study", "StudyOfMethods", "StudyStatus", "TrialInfo"]

#: the SDK's names of a study's answers (:mod:`fedtune.wire_models`, shared with the service)
StudyStatus = StudyDetail
TrialInfo = TrialOut


class StudyOfMethods(list):
    """The studies of one study of methods (a list of :class:`Study`) and its ``group`` id.

    Args:
        studies: One handle per algorithm, in the order listed.
        group: The study of methods' id.
    """

    def __init__(self, studies: Sequence[Study], group: str) -> None:
        super().__init__(studies)
        self.group = group


class Study:
    """A handle on one study of the service (get it from :meth:`Client.submit` or
    :meth:`Client.study`).

    Args:
        client: The client that talks to the service.
        study_id: The study's id.
    """

    def __init__(self, client: Client, study_id: str) -> None:
        self.client, self.id = client, study_id

    def __repr__(self) -> str:
        return f"Study({self.id!r})"

    def _get(self, suffix: str = "", **kwargs: Any) -> Any:
        return self.client.request("GET", f"/v1/studies/{self.id}{suffix}", **kwargs)

    def status(self) -> StudyStatus:
        """Get the study's state, progress, best trial and MLflow links.

        Returns:
            The study's details.
        """
        return StudyStatus.from_json(self._get())

    def wait(
        self,
        progress: bool = True,
        timeout: float | None = None,
        *,
        poll_s: float = 1.0,
        stream: TextIO | None = None,
    ) -> StudyStatus:
        """Poll until the study has ended.

        Args:
            progress: Print a progress line whenever it changes.
            timeout: Give up after this many seconds (None: wait for ever).
            poll_s: Seconds between two polls.
            stream: Where the progress goes (default: ``sys.stderr``).

        Returns:
            The study's final details.

        Raises:
            TimeoutError: The study has not ended after ``timeout`` seconds.
        """
        stream = stream or sys.stderr
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = ""
        while True:
            status = self.status()
            if progress:
                line = _progress_line(status)
                if line != shown:
                    print(line, file=stream, flush=True)
                    shown = line
            if status.done:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"study {self.id} still {status.state} after {timeout} s")
            time.sleep(poll_s)

    def trials(self, state: TrialState | str | None = None) -> list[TrialInfo]:
        """List the study's trials.

        Args:
            state: Only trials in this state (None: all).

        Returns:
            The trials.

        Raises:
            ValueError: ``state`` names no trial state.
        """
        params = {"state": str(TrialState(state))} if state is not None else None
        return [TrialInfo.from_json(t) for t in self._get("/trials", params=params)]

    def curve(self, number: int) -> list[CurvePoint]:
        """Get one trial's learning curve.

        Args:
            number: The trial's number.

        Returns:
            The metrics it logged, round by round.

        Raises:
            TrialNotFoundError: The study has no such trial.
        """
        return CurveOut.from_json(self._get(f"/trials/{int(number)}/curve")).rounds

    def tradeoff(self) -> TradeOff:
        """Get the study's measured trade-off (also called as ``frontier``).

        Returns:
            The trade-off of its finished trials and their Pareto set.
        """
        return TradeOff.from_json(self._get("/tradeoff"))

    frontier = tradeoff

    def best(self) -> BestTrial | None:
        """Get the best trial so far (the driver's pick once the study has ended).

        Returns:
            The best trial, or None while there is none.
        """
        return self.status().best

    def cancel(self) -> StudyStatus:
        """Cancel the study (a no-op for a cancelled one).

        Returns:
            The study's details after the cancellation.

        Raises:
            IllegalStateChangeError: The study has already ended otherwise.
        """
        return StudyStatus.from_json(self.client.request("POST", f"/v1/studies/{self.id}/cancel"))


def _progress_line(status: StudyStatus) -> str:
    p, best = status.progress, ""
    if status.best is not None and status.best.value is not None:
        best = f", best {status.best.value:.6g} (trial {status.best.number})"
    return (
        f"study {status.name} [{status.id}] {status.state}: {p.finished}/{p.requested} trials "
        f"finished, {p.running} running{best}"
    )
