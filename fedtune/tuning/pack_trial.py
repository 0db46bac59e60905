"""The Ray Tune function trainable of a pack: several configurations in one trial process.

A pack's Tune ``config`` holds its members under :data:`PACK_KEY`: each member is the config
an unpacked trial would get (its sampled ``{path: value}`` and its Optuna number under
``TRIAL_KEY``). Each member trains with every seed of ``spec.seeds`` as one member of one
:class:`~fedtune.trainers.packed.PackedTrainer` (a member alone, or one that cannot be packed,
trains with the engine's own :class:`~fedtune.trainers.Trainer`); its per-round record is the
mean over its seeds, exactly as :mod:`.trainable` computes it.

Every ``spec.report_every`` rounds (and when members end) the pack reports one result whose
:data:`MEMBERS` list holds each reporting member's result in the unpacked schema of
:mod:`.trainable` (its rows since its last report under ``HISTORY``, its running objective, its
outcome), with its number under ``TRIAL_KEY``; :mod:`.pack_driver` hands each one to the
searcher and the callbacks as the result of that member's own trial. A member that the driver
stopped (``stops``, a :class:`StopBox` actor the pack asks at its reports) leaves the pack:
it costs no more compute and is not reported again (the driver ended its trial at the report
it was stopped on; :class:`StopPoll` asks without waiting). A study whose stopper never stops
trials (``scheduler: none``, ``tpe``, ``random``) gives the pack no box. The pack ends when every
member has ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedtune.errors import FedtuneError
from fedtune.outcomes import RUNNING
from fedtune.trainers import Outcome, TrialConfig

from . import timeline
from .spec import StudySpec
from .trainable import (
    OUTCOME,
    ROUND,
    TRIAL_KEY,
    TrialError,
    TrialRows,
    _SeedRuns,
    seed_mean,
    trial_configs,
    trial_message,
)

__all__ = ["MEMBERS", "PACK_KEY", "StopBox", "StopPoll", "member_numbers", "train_pack"]

PACK_KEY = "fedtune.pack"  # a pack's Tune config: its members' configs
MEMBERS = "members"  # a pack's result: one result per member that reports


def member_numbers(config: Mapping[str, Any]) -> list[int]:
    """The Optuna numbers of a pack's members, in order."""
    return [int(m[TRIAL_KEY]) for m in config[PACK_KEY]]


class StopBox:
    """The driver's stop decisions, read by the packs (a Ray actor: ``ray.remote(StopBox)``)."""

    def __init__(self) -> None:
        self._stopped: set[int] = set()

    def stop(self, numbers: Sequence[int]) -> None:
        """Note members the driver stopped."""
        self._stopped.update(int(n) for n in numbers)

    def which(self, numbers: Sequence[int]) -> list[int]:
        """Those of ``numbers`` the driver stopped."""
        return [n for n in numbers if n in self._stopped]


class _Single:
    """One member trained alone by the engine's trainers (a pack of one)."""

    def __init__(self, number: int, configs: list[TrialConfig]) -> None:
        self.number, self.runs = number, _SeedRuns(configs)

    def step(self) -> dict[int, dict[str, Any] | None]:
        return {self.number: self.runs.step()}

    def done(self, number: int) -> bool:
        return self.runs.done

    def decays(self, number: int) -> float:
        return self.runs.decays()

    def reason(self, number: int) -> str:
        return self.runs.reason()

    def stop(self, number: int) -> None:
        return None


class _Packed:
    """Every member and seed in one :class:`PackedTrainer` (members × seeds rows)."""

    def __init__(self, members: dict[int, list[TrialConfig]]) -> None:
        from fedtune.trainers.packed import PackedTrainer

        self.index: dict[int, list[int]] = {}
        flat: list[TrialConfig] = []
        for number, configs in members.items():
            self.index[number] = list(range(len(flat), len(flat) + len(configs)))
            flat.extend(configs)
        self.trainer = PackedTrainer(flat)
        self.rounds = {n: c[0].train.rounds for n, c in members.items()}
        self._ended: set[int] = set()

    def step(self) -> dict[int, dict[str, Any] | None]:
        """Each live member's mean record this round, None for one that diverged."""
        records = self.trainer.step()
        out: dict[int, dict[str, Any] | None] = {}
        for number, rows in self.index.items():
            if number in self._ended:
                continue
            got = [r for r in (records[i] for i in rows) if r is not None]
            if len(got) == len(rows):
                out[number] = seed_mean([r.as_dict() for r in got])
                if got[0].round >= self.rounds[number]:
                    self._ended.add(number)
            else:  # a seed diverged: the member ends as diverged (as _SeedRuns)
                out[number] = None
                self.stop(number)
        return out

    def done(self, number: int) -> bool:
        return number in self._ended

    def decays(self, number: int) -> float:
        rows = self.index[number]
        return sum(self.trainer.decays(i) for i in rows) / len(rows)

    def reason(self, number: int) -> str:
        return next(
            (
                why
                for i in self.index[number]
                for outcome, why in [self.trainer.outcome(i)]
                if outcome == Outcome.DIVERGED
            ),
            "",
        )

    def stop(self, number: int) -> None:
        self._ended.add(number)
        for i in self.index[number]:
            if self.trainer.outcome(i)[0] is None:
                self.trainer.stop(i)


def train_pack(config: dict[str, Any], spec: StudySpec, stops: Any = None) -> None:
    """Ray Tune function trainable of a pack (see the module docstring).

    Args:
        config: The pack's Tune config (:data:`PACK_KEY`).
        spec: The study.
        stops: The driver's :class:`StopBox` actor (None: nothing stops members).
    """
    if timeline.enabled():
        timeline.mark("trial_process_start", timeline.process_start())
        timeline.mark("trial_entered")
    try:
        _train_pack(config, spec, stops)
    except FedtuneError as exc:
        raise TrialError(trial_message(exc, spec)) from None


def _runs(config: Mapping[str, Any], spec: StudySpec) -> tuple[Any, dict[int, list]]:
    members = {int(m[TRIAL_KEY]): trial_configs(spec, m) for m in config[PACK_KEY]}
    if len(members) == 1:
        ((number, configs),) = members.items()
        return _Single(number, configs), members
    return _Packed(members), members


def _train_pack(config: dict[str, Any], spec: StudySpec, stops: Any) -> None:
    runs, members = _runs(config, spec)
    from ray import tune  # imported here: the engine never needs Ray

    timeline.mark("trial_built")
    rows = {n: TrialRows(spec, c[0].train.rounds, c[0].decay.enabled) for n, c in members.items()}
    live = list(members)
    poll = None if stops is None else StopPoll(stops)
    t = 0
    while live:
        stepped = runs.step()
        t += 1
        ended: list[dict[str, Any]] = []
        for number in list(live):
            if number not in stepped:
                continue
            row = stepped[number]
            if row is None:
                ended.append(_final(rows[number], number, Outcome.DIVERGED, runs.reason(number)))
            else:
                trial = rows[number]
                trial.add(row, runs.decays(number) if trial.decay else 0.0)
                if not runs.done(number):
                    continue
                ended.append(_final(trial, number, Outcome.COMPLETED))
            live.remove(number)
        due = t % spec.report_every == 0 and live
        if not ended and not due:
            continue
        if due and poll is not None:
            for number in poll.stopped(live):
                runs.stop(number)
                live.remove(number)
        reports = ended + [{**rows[n].report(), TRIAL_KEY: n} for n in live if due]
        tune.report({ROUND: t, OUTCOME: RUNNING if live else "ended", MEMBERS: reports})
    timeline.mark("trial_reported")


class StopPoll:
    """The driver's stop decisions, asked without waiting: one question to the
    :class:`StopBox` in flight, its answer applied at the first report after it arrived.

    A member the driver stopped has ended for the study at that report (its trial is told
    then); the pack only stops spending compute on it, so a late answer costs rounds, never
    records. Waiting for the answer at every report cost a pack a fifth of its time.

    Args:
        box: The driver's :class:`StopBox` actor.
    """

    def __init__(self, box: Any) -> None:
        self.box, self.asked = box, None

    def stopped(self, live: list[int]) -> list[int]:
        """Those of ``live`` the driver has stopped, as far as its last answer says."""
        import ray

        answer: list[int] = []
        if self.asked is not None:
            ready, _ = ray.wait([self.asked], timeout=0)
            if not ready:
                return []
            answer = ray.get(self.asked)
        self.asked = self.box.which.remote(live)
        return [n for n in answer if n in live]


def _final(rows: TrialRows, number: int, outcome: Outcome, reason: str = "") -> dict[str, Any]:
    return {**rows.report(str(outcome), reason), TRIAL_KEY: number}


def make_pack_trainable(spec: StudySpec, stops: Any) -> Any:
    """``train_pack`` bound to ``spec`` and the driver's :class:`StopBox` (shipped once)."""
    from ray import tune

    return tune.with_parameters(train_pack, spec=spec, stops=stops)
