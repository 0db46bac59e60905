"""The Ray Tune function trainable of every trial: a pack of P ≥ 1 configurations in one
process.

A pack's Tune ``config`` holds its members under :data:`~.results.PACK_KEY`: each member is a
configuration's config (its sampled ``{path: value}`` and its Optuna number under
``TRIAL_KEY``). Each member trains with every seed of ``spec.seeds``: a pack of one with the
engine's own :class:`~fedtune.trainers.Trainer` per seed, a larger pack as members of one
:class:`~fedtune.trainers.packed.PackedTrainer`; the pack's loop sees either as its
:class:`~fedtune.tuning.packing.runs.PackRuns`.

Every ``spec.report_every`` of a member's rounds (and when members end) the pack reports one
result whose :data:`~.results.MEMBERS` list holds each reporting member's result in the schema
of :mod:`.results` (its rows since its last report under ``HISTORY``, its running objective,
its outcome), with its number under ``TRIAL_KEY``; the driver
(:mod:`fedtune.tuning.driver.pack_members`) hands each one to the searcher and the callbacks as
the result of that member's own trial.

The driver's decisions come through its :class:`~fedtune.tuning.packing.box.Box` (``box``),
asked at each report and taken at the next (:class:`BoxPoll`). A member the driver stopped
leaves the pack: it costs no more compute and is not reported again (the driver ended its trial
at the report it was stopped on). A configuration the driver offers joins the pack at round 0 (a refill of a
place that a member's end freed). A pack with no member left reports so and waits for the
driver's answer to that report: it ends when the answer brings no configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedtune.errors import FedtuneError
from fedtune.outcomes import RUNNING
from fedtune.trainers import Outcome, TrialConfig
from fedtune.trainers.engine import device_label

from ..common import timeline
from ..keys import OUTCOME, ROUND, TRIAL_KEY
from ..packing.box import Answer, Box
from ..packing.runs import PackRuns, open_runs
from ..spec import StudySpec
from .results import (
    MEMBERS,
    PACK_KEY,
    TrialError,
    TrialRows,
    member_numbers,
    pack_name,
    trial_configs,
    trial_message,
)

__all__ = ["BoxPoll", "make_pack_trainable", "train_pack"]


def train_pack(
    config: dict[str, Any],
    spec: StudySpec,
    box: Box | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Ray Tune function trainable of a pack (see the module docstring).

    Args:
        config: The pack's Tune config (:data:`~.results.PACK_KEY`).
        spec: The study.
        box: The driver's :class:`~fedtune.tuning.packing.box.Box` (None: no stops, no
            refills).
        report: Where each report goes (None: Ray Tune's ``tune.report``; a trial in the
            driver's process: :class:`~..driver.in_process.InProcessTuner`'s).
    """
    if timeline.enabled():
        timeline.mark("trial_process_start", timeline.process_start())
        timeline.mark("trial_entered")
    try:
        _train_pack(config, spec, box, report)
    except FedtuneError as exc:
        raise TrialError(trial_message(exc, spec)) from None


class _Members:
    """A pack's members as its loop sees them: their rows, who trains, when each joined.

    Args:
        spec: The study.
        runs: The pack's runs.
        members: Its first members' seed configurations, by number.
    """

    def __init__(self, spec: StudySpec, runs: PackRuns, members: dict[int, list]) -> None:
        self.spec, self.runs = spec, runs
        self.rows: dict[int, TrialRows] = {}
        self.joined: dict[int, int] = {}  # member -> the pack's step it joined after
        self.live: list[int] = []
        for number, configs in members.items():
            self._enter(number, configs, 0)

    def _enter(self, number: int, configs: list[TrialConfig], t: int) -> None:
        first = configs[0]
        device = device_label(first.train.device)
        self.rows[number] = TrialRows(self.spec, first.train.rounds, first.decay.enabled, device)
        self.joined[number] = t
        self.live.append(number)

    def join(self, offered: list[dict[str, Any]], t: int) -> None:
        """Take the configurations the driver offered; each starts at round 0 after step t."""
        for member in offered:
            number, configs = int(member[TRIAL_KEY]), trial_configs(self.spec, member)
            self.runs.add(number, configs)
            self._enter(number, configs, t)

    def due(self, t: int) -> list[int]:
        """Live members whose own rounds at step t are a multiple of ``report_every``."""
        return [n for n in self.live if (t - self.joined[n]) % self.spec.report_every == 0]


def _train_pack(
    config: dict[str, Any],
    spec: StudySpec,
    box: Box | None,
    report: Callable[[dict[str, Any]], None] | None,
) -> None:
    first = {int(m[TRIAL_KEY]): trial_configs(spec, m) for m in config[PACK_KEY]}
    runs = open_runs(first)
    if report is None:
        from ray import tune  # imported here: the engine never needs Ray

        report = tune.report

    timeline.mark("trial_built")
    pack = _Members(spec, runs, first)
    poll = None if box is None else BoxPoll(box, member_numbers(config)[0], runs.refills)
    t = 0
    while True:
        if not pack.live:
            if poll is None or not runs.refills:
                break
            offered = poll.wait()  # the driver's answer to the report that said so
            if not offered:
                break
            pack.join(offered, t)
        stepped = runs.step()
        t += 1
        ended: list[dict[str, Any]] = []
        for number in list(pack.live):
            if number not in stepped:
                continue
            row, rows = stepped[number], pack.rows[number]
            if row is None:
                ended.append(_final(rows, number, Outcome.DIVERGED, runs.reason(number)))
            else:
                rows.add(row, runs.decays(number) if rows.decay else 0.0)
                if not runs.done(number):
                    continue
                ended.append(_final(rows, number, Outcome.COMPLETED))
            pack.live.remove(number)
        due = pack.due(t)
        if not ended and not due:
            continue
        if poll is not None:
            stopped, offered = poll.answer(t, pack.live)
            for number in stopped:
                runs.stop(number)
                pack.live.remove(number)
            pack.join(offered, t)
        reports = ended + [{**pack.rows[n].report(), TRIAL_KEY: n} for n in due if n in pack.live]
        report({ROUND: t, OUTCOME: RUNNING if pack.live else "ended", MEMBERS: reports})
    timeline.mark("trial_reported")


class BoxPoll:
    """The driver's decisions for one pack: one question to the
    :class:`~fedtune.tuning.packing.box.Box` in flight, asked at each report and taken at the
    next.

    A pack that takes refills (``answered``) asks for the driver's answer to the report it is
    about to send and takes it at its next report, waiting if the driver has not answered yet:
    the driver answers every report of such a pack, usually while the pack runs the round in
    between, so a refill joins one report after the one that freed its place. A pack of one
    (``answered`` False; the driver offers it nothing) asks without waiting and applies an
    answer at the first report after it arrived: for it a stop only saves compute, and a late
    one costs rounds, never records.

    Args:
        box: The driver's box.
        first: The pack's first member's number (its name in the box).
        answered: The driver answers each of its reports (it takes refills).
    """

    def __init__(self, box: Box, first: int, answered: bool) -> None:
        self.box, self.pack, self.answered = box, pack_name(first), answered
        self.asked: object = None  # the question in flight

    def answer(self, report: int, live: list[int]) -> Answer:
        """``(stopped, offered)``: the previous question's answer (those of ``live`` the driver
        stopped, the configurations it offered); asks the question of ``report``.

        Args:
            report: The ``round`` of the report the pack is about to send.
            live: The pack's members still training.

        Returns:
            The stopped members and the offered member configs (taken from the box).
        """
        stopped: list[int] = []
        offered: list[dict[str, Any]] = []
        if self.asked is not None:
            if not self.answered and not self.box.ready(self.asked):
                return [], []  # not there yet: no second question
            stopped, offered = self.box.result(self.asked)
        self.asked = self.box.ask(self.pack, live, report if self.answered else None)
        return [n for n in stopped if n in live], offered

    def wait(self) -> list[dict[str, Any]]:
        """The configurations that join a pack with no member left: the answer to its last
        report (the question in flight), waited for; none: the pack ends."""
        if self.asked is None:
            return []
        _, offered = self.box.result(self.asked)
        self.asked = None
        return offered


def _final(rows: TrialRows, number: int, outcome: Outcome, reason: str = "") -> dict[str, Any]:
    return {**rows.report(str(outcome), reason), TRIAL_KEY: number}


def make_pack_trainable(spec: StudySpec, box: Box | None) -> Any:
    """``train_pack`` bound to ``spec`` and the driver's
    :class:`~fedtune.tuning.packing.box.Box` (shipped once)."""
    from ray import tune

    return tune.with_parameters(train_pack, spec=spec, box=box)
