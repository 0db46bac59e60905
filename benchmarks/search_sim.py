"""fedtune's search strategies run in-process, one trial at a time (the suite's fast path),
C unpacked trials at once, or packed.

Same parts as ``run_study`` — the study's sampler (:func:`~fedtune.tuning.optuna.search.make_sampler`),
the space's Optuna distributions (``suggest``), the strategy's stopper
(:func:`~fedtune.tuning.trials.stoppers.stopper_for`, :mod:`fedtune.tuning.trials.stop_rules`), Optuna's
pruners — and the same meaning of a trial as
:class:`~fedtune.tuning.optuna.searcher.FedtuneSearch` gives it (completed → its selection-rule
value, diverged → the worst value, stopped → ``PRUNED`` with its per-round values reported),
but without Ray, MLflow or the RDB storage: a trial is the engine's ``run_trial`` on the task's
built data, and the strategy's stop decision is taken after every round (``report_every: 1``).
A configuration seen before (the same point in the same task) replays its cached curve instead
of training again; a curve cached only up to an earlier stop is trained again from round 1
when more rounds are needed (the engine is deterministic for a configuration).

``asha`` is Optuna's ``SuccessiveHalvingPruner`` here as in a study (asynchronous successive
halving, grace ``min_resource``, factor 3, no promotion): the stopper is ``stopper_for``'s.

**Packed trials** (``pack=P``, a study's ``resources.pack``, :mod:`fedtune.tuning.packing.plan`): the
study as :mod:`fedtune.tuning.driver.pack_members` runs it with ``budget.max_concurrent = P`` (one pack
at a time), :func:`run_packed`:

* up to P configurations are asked at once (one Optuna ``ask`` each, the stopper's proposal
  first when nothing is queued, as ``FedtuneSearch.suggest``; TPE's ``constant_liar`` counts
  those asked and not yet told as pending) and packed by the driver's own
  :class:`~fedtune.tuning.driver.pack_members.Backlog`: those sharing a pack key
  (:func:`~fedtune.tuning.driver.pack_members.config_key`) form the pack, the others wait;
* the members run in lockstep, one round at a time, each at its own round. Each round every
  live member's new selection-rule value is reported to Optuna and goes to the stopper
  (``stopper_for``'s: ASHA and the median rule are Optuna's pruners); a member whose row is
  final (its last round, or the round it diverged) is not observed, as ``PackScheduler`` skips a final member result. The
  members that ended are then told, final ones first, then those the stopper stopped
  (``PRUNED``), each exactly as ``FedtuneSearch`` tells a trial and with the stopper's
  ``complete``;
* each freed place is then refilled with a configuration of the pack's key (the backlog's,
  else newly asked; ``PackSearch``'s refill), which runs its round 1 at the pack's next round.
  The driver's pack takes it one report later (``refill_lag.py``: 1 round, 0 when the pack
  had no member left), which ``refill_delay=1`` models. A pack with no member left and
  nothing to take ends, and the next pack is formed; a pack of one is never refilled;
* a member's curve is its configuration's whole unpacked curve (the engine's, cached; a packed
  member's curve equals it to ≤ 1e-12, ``tests/unit/test_packed_exactness.py``), replayed round
  by round, so a member the stopper stops was trained to its end once (the cache keeps it);
* the budget counts rounds as unpacked: a study stops asking once its members have run B · T
  rounds (or 4 · B configurations were asked). At equal rounds: the rounds a pack runs between
  two members' ends are charged to the member that ends (:attr:`Step.cost`; members ending at
  the same round: the first one carries them), so a trial counts as within a budget only when
  every round its pack had run by then fits.

**Concurrent unpacked trials** (``concurrent=C``, a study's ``budget.max_concurrent = C``
without packing, what a packed study with ``pack: C`` must be compared with),
:func:`run_concurrent`: up to C trials run at once, each in its own process as Ray Tune runs
them, all of the same speed:

* the simulation advances in ticks; each tick every running trial runs its next round, whose
  selection-rule value is reported to Optuna and goes to the study's stopper (``stopper_for``,
  as the sequential path; every row, its last one included: a study's scheduler skips a final
  row, which differs only where a pruner's rung falls on the last round). A trial ends at its last round (``completed``: the engine has finished, whatever the
  stopper says then, as the engine path of the sequential study), at the round it diverged (no
  row; ``diverged``) or when the stopper stops it (``stopped``, ``PRUNED``). Those that ended in
  a tick are told, in the order they started, exactly as ``FedtuneSearch`` tells a trial
  (:func:`_tell`, the stopper's ``complete``);
* each freed slot is refilled at once: the next configuration is asked (the stopper's proposal
  first when nothing is queued, as ``FedtuneSearch.suggest``; the trials still running are
  pending under TPE's constant liar) and runs its round 1 at the next tick ("refill"; a pack
  instead shrinks until all its members ended);
* rounds are charged as :func:`run_packed` charges them: :attr:`Step.cost` of a trial is the
  rounds *all* running trials ran since the previous trial was told (trials told in the same
  tick: the first one carries them), so a trial counts as within a budget only when every
  round the study had run by the time it ended fits — equal rounds for ``concurrent=C`` and
  ``pack=C``. The study stops asking once B · T rounds ran (or 4 · B configurations were
  asked); the trials still running then run to their end and are told (beyond the budget);
* a trial's curve is its configuration's whole curve (cached, trained once), replayed.

``concurrent=1`` is the sequential path above, unchanged (:func:`run_strategy` takes it);
:func:`run_concurrent` with one slot decides as it does except in that path's corner below (a
trial the stopper stops at its last round ends ``completed`` here, as when the engine runs it).

A study whose algorithm cannot pack (``pack_refusal``) runs one configuration per process, and
so does the sim, one at a time (:func:`pack_plan` says why; the study would run P such trials at
once). ``pack=1`` is the sequential path above, unchanged, including one corner of it: a trial
the stopper stops at its last round ends ``stopped`` when its curve is replayed from the cache
but ``completed`` when the engine runs it (the engine has already finished), so an unpacked run
can depend on which curves an earlier run cached; the packed path never observes a final row.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from fedtune.search_spaces.optuna_adapter import suggest
from fedtune.tuning.optuna.search import make_sampler
from fedtune.tuning.spec import StudySpec
from fedtune.tuning.trials.stop_rules import Stopper
from fedtune.tuning.trials.stoppers import stopper_for

__all__ = [
    "CurveCache",
    "Step",
    "pack_plan",
    "run_concurrent",
    "run_packed",
    "run_strategy",
    "study_spec",
]


@dataclass(frozen=True)
class Step:
    """One finished trial: rounds run, value if completed (inf if diverged), why it stopped."""

    number: int
    point: dict[str, Any]
    rounds: int
    value: float | None  # completed: selection-rule value; diverged: inf; stopped: None
    stop: str | None = None  # the stop reason (stopped trials)
    partial: float | None = None  # selection-rule value at the last round it ran
    cost: int | None = None  # packed: rounds its pack ran since the previous member ended
    pack: int | None = None  # packed: which pack of the study (0, 1, ...) it ran in

    @property
    def charged(self) -> int:
        """Rounds the study ran between the previous trial's end and this one's.

        Returns:
            ``cost`` for a packed trial, else its own rounds (trials one after another).
        """
        return self.rounds if self.cost is None else self.cost

    def to_row(self) -> list[Any]:
        """The trace row: rounds, value (None unless finite), why it ended early; a packed
        trial adds its ``cost`` and ``pack``.

        Returns:
            ``[rounds, value, stop]`` (``[rounds, value, stop, cost, pack]`` when packed).
        """
        v = self.value
        row = [
            self.rounds,
            None if v is None or not math.isfinite(v) else v,
            "diverged" if v is not None and not math.isfinite(v) else self.stop,
        ]
        return row if self.cost is None else [*row, self.cost, self.pack]


class CurveCache:
    """ℓ_t per configuration of one task: (losses, outcome, complete?)."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.curves: dict[str, tuple[list[float], str, bool]] = {}
        self.engine_rounds = 0

    @staticmethod
    def key(point: dict[str, Any]) -> str:
        return json.dumps({k: point[k] for k in sorted(point)}, default=str)

    def evaluate(
        self, point: dict[str, Any], go_on: Callable[[int, float], bool]
    ) -> tuple[list[float], str]:
        """Feed ℓ_1, ℓ_2, … to ``go_on(t, ℓ_t)`` until it says stop or the trial ends."""
        key = self.key(point)
        cached = self.curves.get(key)
        if cached is not None:
            losses, outcome, complete = cached
            for t, loss in enumerate(losses, start=1):
                if not go_on(t, loss):
                    return losses[:t], "stopped"
            if complete:
                return losses, outcome
        seen = len(cached[0]) if cached else 0
        losses = []

        def on_round(record: Any) -> bool:
            losses.append(float(record.client_loss))
            t = len(losses)
            return True if t <= seen else go_on(t, losses[-1])

        result = self.task.run(point, on_round)
        self.engine_rounds += result.rounds_completed
        losses = [v for _, v in result.curve("client_loss")]
        outcome = str(result.outcome)
        complete = outcome != "stopped"
        self.curves[key] = (losses, outcome, complete)
        return losses, outcome

    def curve(self, point: dict[str, Any]) -> tuple[list[float], str]:
        """The configuration's whole curve: ℓ_t to its last round, or to the round before it
        diverged.

        Args:
            point: The configuration.

        Returns:
            ``(losses, outcome)``, outcome ``completed`` or ``diverged`` (trained once, cached).
        """
        return self.evaluate(point, lambda _t, _loss: True)


def _objective(tail: list[float]) -> float:
    return sum(tail) / len(tail) if tail and all(map(math.isfinite, tail)) else math.inf


def study_spec(
    task: Any, strategy: str, seed: int, target_trials: int, grace: int | None = None
) -> StudySpec:
    """The task as one seed's study of ``strategy`` configured for ``target_trials`` trials.

    Args:
        task: The suite's task (``search_tasks.Task``).
        strategy: The ``search.strategy``.
        seed: The sampler's seed.
        target_trials: The study's ``budget.trials`` (its sampler's random start-up follows it).
        grace: ``scheduler.grace_rounds`` (None: T / 6).

    Returns:
        The study.
    """
    return task.spec.model_copy(
        update={
            "name": f"{task.name}-{strategy}-s{seed}",
            "search": task.spec.search.model_copy(update={"strategy": strategy}),
            "sampler": task.spec.sampler.model_copy(update={"seed": seed}),
            "budget": task.spec.budget.model_copy(update={"trials": target_trials}),
            "scheduler": task.spec.scheduler.model_copy(
                update={"grace_rounds": grace or max(1, task.rounds // 6)}
            ),
        }
    )


def pack_plan(spec: StudySpec, pack: int) -> tuple[StudySpec, int, str]:
    """The study with ``resources.pack = pack`` and ``budget.max_concurrent = pack``, resolved.

    Args:
        spec: The study.
        pack: Configurations per trial process.

    Returns:
        ``(study, size, note)``: the study as packed, the configurations a pack holds (1: it
        cannot pack, the note says why) and the plan's line (:func:`fedtune.tuning.packing.plan.plan`).
    """
    from fedtune.tuning.packing.plan import plan

    packed = spec.model_copy(
        update={
            "resources": spec.resources.model_copy(update={"pack": pack}),
            "budget": spec.budget.model_copy(
                update={"max_concurrent": max(pack, spec.budget.max_concurrent)}
            ),
        }
    )
    resolved = plan(packed)
    return packed, resolved.size, resolved.note


def _ask(study: optuna.Study, stopper: Stopper, space: Any) -> tuple[Any, dict[str, Any]]:
    """Ask the study for its next trial as ``FedtuneSearch.suggest`` does: the stopper's sweep
    point first (enqueued, tagged, tied parameters left to ``suggest``), unless an enqueued
    trial is still waiting; then the stopper is told the trial started.

    Returns:
        The Optuna trial and its point.
    """
    from fedtune.tuning.trials.sweep import SWEEP_ATTR

    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    proposal = None if waiting else stopper.propose()
    if proposal is not None:
        tag, point = proposal
        tied = {p.path for p in space.parameters if p.tied}
        sampled = {k: v for k, v in point.items() if k not in tied}
        study.enqueue_trial(sampled, user_attrs={SWEEP_ATTR: tag})
    trial = study.ask()
    point = suggest(trial, space)
    stopper.started(trial.number, trial.user_attrs.get(SWEEP_ATTR))
    return trial, point


def _study(spec: StudySpec, target_trials: int) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.create_study(direction="minimize", sampler=make_sampler(spec, target_trials))


def run_strategy(
    task: Any,
    strategy: str,
    seed: int,
    round_budget: int,
    max_trials: int,
    target_trials: int,
    cache: CurveCache,
    last: int = 10,
    grace: int | None = None,
    pack: int = 1,
    concurrent: int = 1,
    groups: list[int] | None = None,
    refill_delay: int = 0,
) -> list[Step]:
    """Trials of ``strategy`` until ``round_budget`` rounds have run (or ``max_trials``).

    Args:
        task: The suite's task (``search_tasks.Task``).
        strategy: The ``search.strategy``.
        seed: The sampler's seed.
        round_budget: Rounds the study may start trials within (B · T).
        max_trials: The most trials it starts.
        target_trials: The study's ``budget.trials`` (the sampler's start-up follows it).
        cache: The task's curves.
        last: Rounds in the selection rule's mean.
        grace: ``scheduler.grace_rounds`` (None: T / 6).
        pack: Configurations per trial process (``resources.pack``); > 1: :func:`run_packed`.
        concurrent: Unpacked trials at once (``budget.max_concurrent``); > 1:
            :func:`run_concurrent` (1: one after another, this function's own path).
        groups: Packed: gets, per round a pack ran, its vmapped groups (:func:`run_packed`).
        refill_delay: Packed: rounds a refill waits before its round 1 (:func:`run_packed`).

    Returns:
        The trials in the order they ended.
    """
    spec = study_spec(task, strategy, seed, target_trials, grace)
    if pack > 1:
        packed, size, _ = pack_plan(spec, pack)
        if size > 1:
            return run_packed(
                *(task, packed, size, round_budget, max_trials, target_trials, cache, last),
                groups=groups,
                refill_delay=refill_delay,
            )
    if concurrent > 1:
        wide = spec.model_copy(
            update={"budget": spec.budget.model_copy(update={"max_concurrent": concurrent})}
        )
        return run_concurrent(
            task, wide, concurrent, round_budget, max_trials, target_trials, cache, last
        )
    study = _study(spec, target_trials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stopper = stopper_for(spec, task.space, task.rounds)
    steps: list[Step] = []
    used = 0
    while used < round_budget and len(steps) < max_trials:
        trial, point = _ask(study, stopper, task.space)
        tail: list[float] = []
        reason: list[str] = []

        def go_on(t: int, loss: float, trial: Any = trial, tail=tail, reason=reason) -> bool:
            tail.append(loss)
            value = _objective(tail[-last:])
            if math.isfinite(value):
                trial.report(value, t)
            why = stopper.observe(trial.number, [value])
            if why:
                reason.append(str(why))
            return not why

        losses, outcome = cache.evaluate(point, go_on)
        partial = _objective(losses[-last:]) if losses else math.inf
        rounds = len(losses)
        if outcome == "stopped":
            value, state = None, TrialState.PRUNED
        elif outcome == "diverged":
            value, state = math.inf, TrialState.COMPLETE
        else:
            value, state = partial, TrialState.COMPLETE
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study.tell(trial, None if state == TrialState.PRUNED else value, state=state)
        stopper.complete(trial.number, outcome, value if outcome == "completed" else None)
        steps.append(
            Step(trial.number, point, rounds, value, reason[0] if reason else None, partial)
        )
        used += rounds
    return steps


@dataclass(eq=False)
class _Member:
    """A configuration of the running pack: its trial, curve and the rounds it has run."""

    trial: Any
    point: dict[str, Any]
    losses: list[float]
    outcome: str  # of its whole curve: completed | diverged
    ran: int = 0
    stop: str | None = None
    wait: int = 0  # rounds of the pack it waits before its round 1 (a refill's lag)

    @property
    def final_at(self) -> int:
        """The round whose row is final: its last (completed) or the one it diverged at."""
        return len(self.losses) + (self.outcome == "diverged")


def run_packed(
    task: Any,
    spec: StudySpec,
    size: int,
    round_budget: int,
    max_trials: int,
    target_trials: int,
    cache: CurveCache,
    last: int = 10,
    groups: list[int] | None = None,
    refill_delay: int = 0,
) -> list[Step]:
    """The study of ``spec`` with ``size`` configurations per pack (module docstring).

    Args:
        task: The suite's task (``search_tasks.Task``).
        spec: The study (:func:`study_spec`, packed by :func:`pack_plan`).
        size: Configurations per pack (1: one at a time, through the packed path).
        round_budget: Rounds its members may run before it stops asking (B · T).
        max_trials: The most configurations it asks.
        target_trials: The study's ``budget.trials`` (the sampler's start-up follows it).
        cache: The task's curves.
        last: Rounds in the selection rule's mean.
        groups: Gets, per round a pack ran, the distinct round indices of the members that ran
            it: the vmapped groups a ``PackedTrainer`` runs then (refills start at round 0).
        refill_delay: Rounds of the pack a refill waits before its round 1 while other members
            run (the driver's lag, ``benchmarks/refill_lag.py``); 0: the next round. A pack
            with no member left waits for its refills, so they never wait then.

    Returns:
        The members in the order they were told, each with its pack and :attr:`Step.cost`.
    """
    from fedtune.tuning.driver.pack_members import Backlog, config_key
    from fedtune.tuning.keys import TRIAL_KEY

    study = _study(spec, target_trials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stopper = stopper_for(spec, task.space, task.rounds)
    run = _PackedRun(study, stopper, last, groups, refill_delay)
    asked: dict[int, tuple[Any, dict[str, Any]]] = {}  # number -> (trial, point)

    def ask() -> dict[str, Any] | None:  # PackSearch's, within the sim's budget
        if len(asked) >= max_trials or run.used >= round_budget:
            return None
        trial, point = _ask(study, stopper, task.space)
        asked[trial.number] = (trial, point)
        return {**point, TRIAL_KEY: trial.number}

    def member(config: dict[str, Any]) -> _Member:
        trial, point = asked[int(config[TRIAL_KEY])]
        return _Member(trial, point, *cache.curve(point))

    backlog = Backlog(size, config_key(spec), ask)
    while run.used < round_budget and (first := backlog.pack()):

        def refill(n: int, key: str = backlog.key(first[0]), alone: bool = len(first) == 1):
            return [] if alone else [member(c) for c in backlog.refill(key, n)]  # one: unpacked

        run.pack([member(c) for c in first], refill)
    return run.steps


class _PackedRun:
    """The packs of a study, one after another, and what they were charged (module docstring).

    Args:
        study: The study (reported to and told).
        stopper: The study's stopper (``stopper_for``).
        last: Rounds in the selection rule's mean.
        groups: Gets each round's vmapped groups (None: not kept).
        delay: Rounds a refill waits while other members run (:func:`run_packed`).
    """

    def __init__(
        self,
        study: optuna.Study,
        stopper: Stopper,
        last: int,
        groups: list[int] | None = None,
        delay: int = 0,
    ) -> None:
        self.study, self.stopper, self.last, self.groups = study, stopper, last, groups
        self.delay = delay
        self.steps: list[Step] = []
        self.used = 0  # rounds every pack's members ran so far
        self.packs = 0

    def pack(self, members: list[_Member], refill: Callable[[int], list[_Member]]) -> None:
        """Run one pack in lockstep until no member is left; append its members' steps.

        Args:
            members: The pack's first members, in pack order.
            refill: The members that take ``n`` freed places (``PackSearch``'s refill; they
                run their round 1 at the next round of the pack).
        """
        live, charged = list(members), self.used  # rounds run before this pack: charged
        while live:
            if all(m.wait for m in live):  # nothing runs: the pack waits for its refills
                for m in live:
                    m.wait = 0
            waiting = [m for m in live if m.wait]
            for m in waiting:
                m.wait -= 1
            running = {m.ran for m in live if m not in waiting and m.ran < len(m.losses)}
            if self.groups is not None and running:
                self.groups.append(len(running))
            final = []
            for m in live:  # m.ran + 1: this member's own round (refills joined later)
                if m in waiting:
                    continue
                t = m.ran + 1
                if t > len(m.losses):  # diverged at round t: no row
                    final.append(m)
                    continue
                m.ran = t
                self.used += 1
                value = _objective(m.losses[max(0, t - self.last) : t])
                if math.isfinite(value):
                    m.trial.report(value, t)
                if t == m.final_at:  # PackScheduler observes non-final member results only
                    final.append(m)
                    continue
                why = self.stopper.observe(m.trial.number, [value])
                if why:
                    m.stop = str(why)
            stopped = [m for m in live if m.stop and m not in final]
            for m in final + stopped:  # charged the rounds its pack ran since the previous tell
                self.steps.append(
                    _tell(m, self.study, self.stopper, self.last, self.used - charged, self.packs)
                )
                charged = self.used
                live.remove(m)
            joining = refill(len(final) + len(stopped)) if final or stopped else []
            for m in joining:
                m.wait = self.delay
            live += joining
        self.packs += 1


def _tell(
    m: _Member, study: optuna.Study, stopper: Stopper, last: int, cost: int, index: int
) -> Step:
    """Tell Optuna and the stopper that a member ended, as ``FedtuneSearch`` tells a trial.

    Args:
        m: The member.
        study: The study.
        stopper: The study's stopper.
        last: Rounds in the selection rule's mean.
        cost: The rounds charged to it (:attr:`Step.cost`).
        index: Its pack's index in the study.

    Returns:
        Its step.
    """
    losses = m.losses[: m.ran]
    partial = _objective(losses[-last:]) if losses else math.inf
    outcome = "stopped" if m.stop else m.outcome
    if outcome == "stopped":
        value, state = None, TrialState.PRUNED
    elif outcome == "diverged":
        value, state = math.inf, TrialState.COMPLETE
    else:
        value, state = partial, TrialState.COMPLETE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.tell(m.trial, None if state == TrialState.PRUNED else value, state=state)
    stopper.complete(m.trial.number, outcome, value if outcome == "completed" else None)
    return Step(m.trial.number, m.point, m.ran, value, m.stop, partial, cost, index)


def run_concurrent(
    task: Any,
    spec: StudySpec,
    slots: int,
    round_budget: int,
    max_trials: int,
    target_trials: int,
    cache: CurveCache,
    last: int = 10,
) -> list[Step]:
    """The unpacked study of ``spec`` with up to ``slots`` trials at once (module docstring).

    Args:
        task: The suite's task (``search_tasks.Task``).
        spec: The study (:func:`study_spec`, ``budget.max_concurrent = slots``).
        slots: Trials running at once (``budget.max_concurrent``).
        round_budget: Rounds its trials may run before it stops asking (B · T).
        max_trials: The most configurations it asks.
        target_trials: The study's ``budget.trials`` (the sampler's start-up follows it).
        cache: The task's curves.
        last: Rounds in the selection rule's mean.

    Returns:
        The trials in the order they were told, each with :attr:`Step.cost` (``pack`` None).
    """
    study = _study(spec, target_trials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stopper = stopper_for(spec, task.space, task.rounds)
    running: list[_Member] = []  # in the order they started
    steps: list[Step] = []
    asked = used = charged = 0
    while True:
        while len(running) < slots and asked < max_trials and used < round_budget:
            trial, point = _ask(study, stopper, task.space)  # running ones are pending
            asked += 1
            running.append(_Member(trial, point, *cache.curve(point)))
        if not running:
            return steps
        ended: list[_Member] = []
        for m in running:  # one tick: every running trial runs its next round
            t = m.ran + 1
            if t > len(m.losses):  # diverged at round t: no row, it ends
                ended.append(m)
                continue
            m.ran = t
            used += 1
            value = _objective(m.losses[max(0, t - last) : t])
            if math.isfinite(value):
                m.trial.report(value, t)
            why = stopper.observe(m.trial.number, [value])  # the scheduler sees every result
            final = t == m.final_at  # its last round: it ends completed whatever the stopper says
            if why and not final:
                m.stop = str(why)
            if final or m.stop:
                ended.append(m)
        for m in ended:  # told in the order they started; their slots free for the next tick
            steps.append(_tell(m, study, stopper, last, used - charged, None))
            charged = used
            running.remove(m)
