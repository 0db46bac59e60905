"""The driver's side of packed trials: each configuration of a pack is its own trial.

Ray Tune runs a pack (:mod:`.pack_trial`) as one trial; everything fedtune records is per
configuration. Three wrappers turn a pack's events into its members' events, so that the
study's searcher and callbacks (Optuna, MLflow, the progress line, the service's sink) work on
members exactly as they work on unpacked trials:

* :class:`PackSearch` wraps :class:`~.optuna_glue.FedtuneSearch`. Tune asks it for one trial;
  it asks Optuna for up to P configurations at once (one ``ask`` each: with TPE's
  ``constant_liar`` every configuration asked and not yet told is a *pending* trial that the
  next ask treats as having the worst value seen, so a batch spreads out instead of asking the
  same point P times) and packs those that share a
  :func:`~fedtune.trainers.packed.pack_key`. A searched choice such as ``server_opt`` splits a
  batch: it asks on (up to 2P configurations waiting) until one key has P, packs the largest
  group (ties: the key asked first), and the rest wait for the next pack. It stops asking at
  the study's budget of configurations.
* :class:`PackScheduler` stops members: every member's new rounds go to the study's
  :class:`~.stop_rules.Stopper` (a stopped member's trial ends at that report, as an unpacked
  trial's does when Tune stops it), and the pack is told through a :class:`StopBox` actor so
  the member costs no more compute. Ray Tune's ASHA and median rule cannot stop part of a
  trial; a packed study uses Optuna's ``SuccessiveHalvingPruner`` / ``MedianPruner`` on the
  same rounds instead (:func:`packed_stopper`). A pack whose members have all ended stops.
* :class:`PackCallback` wraps the study's Tune callbacks, calling them with a
  :class:`MemberTrial` per member.

A stopped member's place is not refilled: its pack shrinks (a member that joined later would
run at other rounds, with other cohorts, and the pack would lose the batching it exists for);
the next pack asks for new configurations. Nothing about a study's meaning changes with
packing: ``docs/explanation/packing.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from fedtune.outcomes import RUNNING

from .pack_trial import MEMBERS, PACK_KEY, member_numbers
from .stop_rules import PrunerStopper, Stopper, TuneSchedulerStopper
from .store import StudyStore
from .trainable import HISTORY, OBJECTIVE, OUTCOME, ROUND, TRIAL_KEY

__all__ = [
    "MemberTrial",
    "PackBook",
    "PackCallback",
    "PackScheduler",
    "PackSearch",
    "config_key",
    "pack_name",
    "packed_stopper",
    "stops",
]


def pack_name(first: int) -> str:
    """A pack's name (its Ray Tune trial's): ``pack-<its first member's number>``."""
    return f"pack-{first:04d}"


def member_id(number: int) -> str:
    """The trial id a member has in the searcher and the callbacks."""
    return f"config-{number}"


class MemberTrial:
    """A pack's member, as a Tune callback sees a trial (``trial_id``, ``config``,
    ``last_result``; anything else, such as the error of a failed pack, is the pack's).

    Args:
        pack: The pack's Tune trial.
        config: The member's config (its sampled values and ``TRIAL_KEY``).
    """

    def __init__(self, pack: Any, config: Mapping[str, Any]) -> None:
        self.pack = pack
        self.config = dict(config)
        self.trial_id = member_id(int(config[TRIAL_KEY]))
        self.last_result: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pack, name)


@dataclass
class PackBook:
    """What the driver knows of its packs: their members, their last results, who was stopped.

    Args:
        stopped: Members the scheduler stopped (their trials end at that report).
    """

    members: dict[str, list[int]] = field(default_factory=dict)  # pack trial id -> numbers
    last: dict[int, dict[str, Any]] = field(default_factory=dict)  # number -> last result
    stopped: set[int] = field(default_factory=set)

    def open(self, pack_id: str, numbers: Sequence[int]) -> None:
        self.members[pack_id] = list(numbers)

    def numbers(self, pack_id: str, config: Mapping[str, Any] | None = None) -> list[int]:
        """A pack's members (from its config when the book has not seen it)."""
        if pack_id not in self.members and config is not None and PACK_KEY in config:
            self.members[pack_id] = member_numbers(config)
        return self.members.get(pack_id, [])

    def results(self, result: Mapping[str, Any] | None) -> Iterator[tuple[int, dict, bool]]:
        """Each member result in a pack's result: ``(number, result, ended)``.

        A member has ended when its outcome is final or the scheduler stopped it.
        """
        for member in (result or {}).get(MEMBERS, ()):
            number = int(member[TRIAL_KEY])
            self.last[number] = member
            ended = member.get(OUTCOME, RUNNING) != RUNNING or number in self.stopped
            yield number, member, ended


class PackSearch(Searcher):
    """The study's searcher over packs of up to ``size`` configurations (module docstring).

    Args:
        inner: The study's :class:`~.optuna_glue.FedtuneSearch`.
        book: The driver's :class:`PackBook`.
        size: Configurations per pack.
        budget: Configurations to run in all (the study's remaining trials).
        key: A member config's pack key (members with equal keys share a pack).
        store: The study's store: each member's Optuna user attribute ``pack`` names its pack
            (``pack-<first member's number>``, the pack's Ray Tune trial directory).
    """

    def __init__(
        self,
        inner: Searcher,
        book: PackBook,
        size: int,
        budget: int,
        key: Callable[[Mapping[str, Any]], str],
        store: StudyStore,
    ) -> None:
        super().__init__(metric=None, mode=None)
        self.inner, self.book, self.size, self.budget, self.key = inner, book, size, budget, key
        self.store = store
        self.asked = 0
        self._backlog: list[tuple[str, dict[str, Any]]] = []  # asked, not yet in a pack
        self._closed: set[int] = set()
        self._ids: dict[int, str] = {}  # member number -> the inner searcher's trial id

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def save(self, checkpoint_path: str) -> None:
        self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.inner.restore(checkpoint_path)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        while self._largest() < self.size and len(self._backlog) < 2 * self.size:
            if self.asked >= self.budget:
                break
            self.asked += 1
            asked = f"ask-{self.asked}"  # the inner searcher's id of the configuration
            config = self.inner.suggest(asked)
            self._ids[int(config[TRIAL_KEY])] = asked
            self._backlog.append((self.key(config), config))
        if not self._backlog:
            return Searcher.FINISHED
        groups = self._groups()
        key = max(groups, key=lambda k: len(groups[k]))  # the first of the largest: the oldest
        pack = groups[key][: self.size]
        taken = {id(c) for c in pack}
        self._backlog = [(k, c) for k, c in self._backlog if id(c) not in taken]
        numbers = [int(c[TRIAL_KEY]) for c in pack]
        self.book.open(trial_id, numbers)
        for number in numbers:
            self.store.set_trial_attrs(number, pack=pack_name(numbers[0]))
        return {PACK_KEY: pack, TRIAL_KEY: numbers[0]}

    def _groups(self) -> dict[str, list[dict[str, Any]]]:
        """The backlog by pack key, in the order each key was first asked."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for key, config in self._backlog:
            groups.setdefault(key, []).append(config)
        return groups

    def _largest(self) -> int:
        return max((len(g) for g in self._groups().values()), default=0)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        for number, member, ended in self.book.results(result):
            self._member(number, member, ended)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        self.on_trial_result(trial_id, result or {})
        for number in self.book.numbers(trial_id):
            if number not in self._closed:  # still open when its pack ended
                self._closed.add(number)
                last = self.book.last.get(number)
                self.inner.on_trial_complete(self._ids[number], last, error=error)

    def _member(self, number: int, member: dict, ended: bool) -> None:
        if number in self._closed:
            return
        self.inner.on_trial_result(self._ids[number], member)
        if ended:
            self._closed.add(number)
            self.inner.on_trial_complete(self._ids[number], member)


class PackScheduler(FIFOScheduler):
    """Stops a pack's members when the study's stopper says so (module docstring).

    Args:
        stopper: The study's stopper (:func:`packed_stopper`).
        book: The driver's :class:`PackBook`.
        stops: The :class:`~.pack_trial.StopBox` actor the packs read (None: the stopper
            never stops).
    """

    def __init__(self, stopper: Stopper, book: PackBook, stops: Any) -> None:
        super().__init__()
        self.stopper, self.book, self.stops = stopper, book, stops
        self._seen: dict[int, int] = {}
        self._ended: set[int] = set()

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        stopped = []
        for member in result.get(MEMBERS, ()):
            number = int(member[TRIAL_KEY])
            if number in self._ended:
                continue
            if member.get(OUTCOME, RUNNING) != RUNNING:
                self._ended.add(number)
                continue
            if self._observe(number, member):
                stopped.append(number)
                self._ended.add(number)
        if stopped:
            self.book.stopped.update(stopped)
            if self.stops is not None:
                self.stops.stop.remote(stopped)
        numbers = self.book.numbers(trial.trial_id, trial.config)
        if numbers and all(n in self._ended for n in numbers):
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def _observe(self, number: int, member: Mapping[str, Any]) -> bool:
        last = self._seen.get(number, 0)
        values = []
        for row in member.get(HISTORY, ()):
            if row[ROUND] <= last or row.get(OBJECTIVE) is None:
                continue
            values.append(float(row[OBJECTIVE]))
            last = int(row[ROUND])
        self._seen[number] = last
        return bool(values) and self.stopper.observe(number, values) is not None


class PackCallback(tune.Callback):
    """The study's Tune callbacks, called once per member of each pack (module docstring).

    Args:
        inner: The callbacks (each sees members as trials).
        book: The driver's :class:`PackBook`.
    """

    def __init__(self, inner: Sequence[Any], book: PackBook) -> None:
        self.inner, self.book = list(inner), book
        self._trials: dict[int, MemberTrial] = {}
        self._closed: set[int] = set()

    def _each(self, hook: str, trial: MemberTrial, **kwargs: Any) -> None:
        for callback in self.inner:
            getattr(callback, hook)(trial=trial, **kwargs)

    def setup(self, **info: Any) -> None:
        for callback in self.inner:
            callback.setup(**info)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        for config in trial.config.get(PACK_KEY, ()):
            member = MemberTrial(trial, config)
            self._trials[int(config[TRIAL_KEY])] = member
            self._each("on_trial_start", member, iteration=iteration, trials=trials, **info)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        for number, member, ended in self.book.results(result):
            self._member(number, member, ended, iteration, trials, info)

    def _member(self, number, member, ended, iteration, trials, info) -> None:
        trial = self._trials.get(number)
        if trial is None or number in self._closed:
            return
        trial.last_result = member
        self._each("on_trial_result", trial, iteration=iteration, trials=trials, result=member)
        if ended:
            self._closed.add(number)
            del self._trials[number]
            self._each("on_trial_complete", trial, iteration=iteration, trials=trials, **info)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._end(trial, "on_trial_complete", iteration, trials, info)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._end(trial, "on_trial_error", iteration, trials, info)

    def _end(self, pack: Any, hook: str, iteration: int, trials: list, info: dict) -> None:
        for number in self.book.numbers(pack.trial_id, pack.config):
            member = self._trials.pop(number, None)
            if member is None or number in self._closed:
                continue
            self._closed.add(number)
            self._each(hook, member, iteration=iteration, trials=trials, **info)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for callback in self.inner:
            callback.on_experiment_end(trials=trials, **info)


def stops(stopper: Stopper) -> bool:
    """Whether a (packed) study's stopper may stop members: all but Ray Tune's ``none``.

    A study whose stopper never stops gives its packs no :class:`~.pack_trial.StopBox` (an
    actor process of its own, and a question at every report).
    """
    return not (isinstance(stopper, TuneSchedulerStopper) and stopper.scheduler == "none")


def config_key(spec: Any) -> Callable[[Mapping[str, Any]], str]:
    """A member config's pack key: configurations with equal keys can share a pack.

    The engine's :func:`~fedtune.trainers.packed.pack_key` of the configuration (its first
    seed; the seeds differ only in what a pack may differ in), or a key of its own when it
    cannot be packed (it then runs alone). Parsed without the trial's device: the driver may
    have no GPU.

    Args:
        spec: The study.

    Returns:
        The function of a member's Tune config.
    """
    from fedtune.trainers import parse_trial_config
    from fedtune.trainers.packed import pack_key, pack_refusal

    from .trainable import sampled_params

    def key(config: Mapping[str, Any]) -> str:
        parsed = parse_trial_config(spec.trial_config(sampled_params(config)))
        if pack_refusal(parsed) is not None:
            return f"alone:{config[TRIAL_KEY]}"
        return pack_key(parsed)

    return key


def packed_stopper(stopper: Stopper, name: str, minimize: bool) -> Stopper:
    """The study's stopper as a packed study needs it: one that decides on each member.

    Ray Tune's schedulers stop whole trials; for a packed study ASHA becomes Optuna's
    ``SuccessiveHalvingPruner`` (the same asynchronous successive halving: rungs at
    ``grace · factor^k`` rounds, the top 1/factor of the values seen at a rung go on) and the
    median rule Optuna's ``MedianPruner`` (after ``grace`` rounds, stop below the median of
    the others at the same round), both fed every round by :class:`PrunerStopper`. Every other
    stopper already decides on each trial.

    Args:
        stopper: The study's stopper.
        name: The study's name.
        minimize: The objective is minimised.

    Returns:
        A stopper whose :meth:`~.stop_rules.Stopper.observe` decides.
    """
    if not isinstance(stopper, TuneSchedulerStopper):
        return stopper
    import optuna

    if stopper.scheduler == "asha":
        pruner: optuna.pruners.BasePruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=stopper.grace, reduction_factor=max(2, int(stopper.factor))
        )
    elif stopper.scheduler == "median":
        pruner = optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=stopper.grace)
    else:
        return stopper
    return PrunerStopper(pruner, name, minimize)
