"""A pack's members as trials, on the driver's side: each configuration of a pack is its own
trial.

Ray Tune runs a pack (:mod:`~fedtune.tuning.trials.trainable`) of P ≥ 1 configurations as one
trial; everything fedtune records is per configuration. A study that does not pack is one whose
packs hold one configuration each, on the same path. Three wrappers turn a pack's events into
its members' events, so that the study's searcher and callbacks (Optuna, MLflow, the progress
line, the service's sink) see configurations, whatever the pack size:

* :class:`PackSearch` wraps :class:`~fedtune.tuning.optuna.searcher.FedtuneSearch`. Tune asks it
  for one trial; it asks Optuna for up to P configurations at once (one ``ask`` each: with TPE's
  ``constant_liar`` every configuration asked and not yet told is a *pending* trial that the
  next ask treats as having the worst value seen, so a batch spreads out instead of asking the
  same point P times) and packs those that share a
  :func:`~fedtune.trainers.packed.pack_key` (:class:`Backlog`). A searched choice such as
  ``server_opt`` splits a batch: it asks on (up to 2P configurations waiting) until one key has
  P, packs the largest group (ties: the key asked first), and the rest wait for the next pack.
  It stops asking at the study's budget of configurations.
* The study's scheduler (:class:`~fedtune.tuning.trials.schedulers.PackScheduler`) stops
  members on the study's stopper's word, and tells a pack through its
  :class:`~fedtune.tuning.packing.box.Box`.
* :class:`PackCallback` wraps the study's callbacks, calling them with a
  :class:`MemberTrial` per member.

**Refills.** A member that ends (completed, diverged or stopped) frees its place: once its
trial is told, :class:`PackSearch` asks for a configuration with the pack's key and offers it
to the pack through the box, so a pack keeps P configurations pending as P unpacked trials
would. The searcher answers every report of such a pack; the pack takes the answer at its
next report, so the member joins at round 0 one report after the end that freed its place. A
pack with no member left waits for the answer to its last report, which either brings
configurations or ends the pack (the budget is spent, or none of the waiting ones shares its
key). A pack of one trains on the engine's own trainer and is never refilled. Nothing about a
study's meaning changes with packing: ``docs/explanation/packing.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedtune.outcomes import RUNNING

from ..keys import OUTCOME, ROUND, TRIAL_KEY
from ..optuna.store import StudyStore
from ..packing.box import Box
from ..trials.results import MEMBERS, PACK_KEY, member_numbers, pack_name, sampled_params
from ..trials.view import TrialView
from ..tune_hooks import DONE, HOSTNAME, NODE_IP, PID, TIMESTAMP, Callback, Searcher

__all__ = [
    "Backlog",
    "MemberTrial",
    "PackBook",
    "PackCallback",
    "PackSearch",
    "alone",
    "config_key",
]


def member_id(number: int) -> str:
    """The trial id a member has in the searcher and the callbacks."""
    return f"config-{number}"


#: what Ray Tune adds to every result about where and when it was reported: true of each member
#: of the pack, so a member's result carries them as a trial's would
_REPORTED_FROM = (PID, HOSTNAME, NODE_IP, TIMESTAMP)


class MemberTrial:
    """A pack's member as the study's callbacks see a trial (a
    :class:`~fedtune.tuning.trials.view.TrialView`): its own ``trial_id``, ``config`` and
    ``last_result``, and its pack's error (``error_file``, ``get_error``) when the pack fails. These are all the callbacks read of a Tune trial (MLflow, progress, the service's
    sink, the first error).

    Args:
        pack: The pack's Tune trial.
        config: The member's config (its sampled values and ``TRIAL_KEY``).
    """

    def __init__(self, pack: TrialView, config: Mapping[str, Any]) -> None:
        self.pack = pack
        self.config = dict(config)
        self.trial_id = member_id(int(config[TRIAL_KEY]))
        self.last_result: dict[str, Any] = {}

    @property
    def error_file(self) -> str | None:
        """The file of the pack's traceback, once it failed (Tune writes it on the driver)."""
        return self.pack.error_file

    def get_error(self) -> Any:
        """The pack's error (None while it has none)."""
        return self.pack.get_error()


@dataclass
class PackBook:
    """What the driver knows of its packs: their members, their last results, who was stopped.

    Args:
        stopped: Members the scheduler stopped (their trials end at that report).
    """

    members: dict[str, list[int]] = field(default_factory=dict)  # pack trial id -> numbers
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)  # number -> its config
    keys: dict[str, str] = field(default_factory=dict)  # pack trial id -> its pack key
    refilled: set[str] = field(default_factory=set)  # packs that take refills
    last: dict[int, dict[str, Any]] = field(default_factory=dict)  # number -> last result
    stopped: set[int] = field(default_factory=set)

    def open(
        self, pack_id: str, configs: Sequence[Mapping[str, Any]], key: str, refills: bool
    ) -> None:
        """Note a new pack: its members' configs, its pack key, whether it takes refills."""
        self.members[pack_id] = []
        self.keys[pack_id] = key
        if refills:
            self.refilled.add(pack_id)
        for config in configs:
            self.join(pack_id, config)

    def join(self, pack_id: str, config: Mapping[str, Any]) -> None:
        """Note a member of a pack (one of its first, or a refill)."""
        number = int(config[TRIAL_KEY])
        self.members[pack_id].append(number)
        self.configs[number] = dict(config)

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


class Backlog:
    """Configurations asked and not yet in a pack, by pack key, in the order they were asked.

    Args:
        size: Configurations per pack.
        key: A member config's pack key (:func:`config_key`).
        ask: Ask the sampler for one more member config; None once the budget is spent.
    """

    def __init__(
        self,
        size: int,
        key: Callable[[Mapping[str, Any]], str],
        ask: Callable[[], dict[str, Any] | None],
    ) -> None:
        self.size, self.key, self.ask = size, key, ask
        self.waiting: list[tuple[str, dict[str, Any]]] = []

    def pack(self) -> list[dict[str, Any]]:
        """The next pack's member configs (none: nothing left to run).

        Asks on, up to ``2 · size`` configurations waiting, until one key has ``size``, and
        packs the largest group (ties: the key asked first).
        """
        while self._largest() < self.size and len(self.waiting) < 2 * self.size:
            if not self._ask_one():
                break
        groups = self._groups()
        if not groups:
            return []
        key = max(groups, key=lambda k: len(groups[k]))
        return self._take(key, self.size)

    def refill(self, key: str, places: int) -> list[dict[str, Any]]:
        """Up to ``places`` member configs with pack key ``key``, for places that ended members
        freed: those waiting first, then newly asked (up to ``2 · size`` waiting; one of
        another key waits for a later pack).
        """
        while self._count(key) < places and len(self.waiting) < 2 * self.size:
            if not self._ask_one():
                break
        return self._take(key, places)

    def _ask_one(self) -> bool:
        config = self.ask()
        if config is None:
            return False
        self.waiting.append((self.key(config), config))
        return True

    def _take(self, key: str, count: int) -> list[dict[str, Any]]:
        taken = [c for k, c in self.waiting if k == key][:count]
        gone = {id(c) for c in taken}
        self.waiting = [(k, c) for k, c in self.waiting if id(c) not in gone]
        return taken

    def _groups(self) -> dict[str, list[dict[str, Any]]]:
        groups: dict[str, list[dict[str, Any]]] = {}
        for key, config in self.waiting:
            groups.setdefault(key, []).append(config)
        return groups

    def _count(self, key: str) -> int:
        return sum(k == key for k, _ in self.waiting)

    def _largest(self) -> int:
        return max((len(g) for g in self._groups().values()), default=0)


class PackSearch(Searcher):
    """The study's searcher over packs of up to ``size`` configurations (module docstring).

    Args:
        inner: The study's :class:`~fedtune.tuning.optuna.searcher.FedtuneSearch`.
        book: The driver's :class:`PackBook`.
        size: Configurations per pack.
        budget: Configurations to run in all (the study's remaining trials; None: no limit,
            the inner searcher's budget in configuration-rounds ends the study).
        key: A member config's pack key (members with equal keys share a pack).
        store: The study's store: each member's Optuna user attribute ``pack`` names its pack
            (``pack-<first member's number>``, the pack's Ray Tune trial directory).
        box: The study's :class:`~fedtune.tuning.packing.box.Box`, through which packs of two
            or more take refills (None: packs only shrink).
    """

    def __init__(
        self,
        inner: Searcher,
        book: PackBook,
        size: int,
        budget: int | None,
        key: Callable[[Mapping[str, Any]], str],
        store: StudyStore,
        box: Box | None = None,
    ) -> None:
        super().__init__(metric=None, mode=None)
        self.inner, self.book, self.size, self.budget, self.key = inner, book, size, budget, key
        self.store, self.box = store, box
        self.asked = 0
        self.finished = False  # no configuration will ever be asked again
        self.backlog = Backlog(size, key, self._ask)
        self._closed: set[int] = set()
        self._ids: dict[int, str] = {}  # member number -> the inner searcher's trial id

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def save(self, checkpoint_path: str) -> None:
        self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.inner.restore(checkpoint_path)

    def _ask(self) -> dict[str, Any] | None:
        """One configuration from the inner searcher (None: none now; :attr:`finished` says
        whether ever again)."""
        if self.budget is not None and self.asked >= self.budget:
            self.finished = True
            return None
        asked = f"ask-{self.asked + 1}"  # the inner searcher's id of the configuration
        config = self.inner.suggest(asked)
        if not isinstance(config, dict):  # its configuration-rounds: wait, or finished
            self.finished = config == Searcher.FINISHED
            return None
        self.asked += 1
        self._ids[int(config[TRIAL_KEY])] = asked
        return config

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        pack = self.backlog.pack()
        if not pack:
            return Searcher.FINISHED if self.finished else None
        refills = self.box is not None and len(pack) > 1  # a pack of one: never refilled
        self.book.open(trial_id, pack, self.key(pack[0]), refills)
        self._name(trial_id, pack)
        return {PACK_KEY: pack, TRIAL_KEY: int(pack[0][TRIAL_KEY])}

    def _name(self, trial_id: str, configs: Sequence[Mapping[str, Any]]) -> str:
        """Give members of a pack its name (their Optuna user attribute ``pack``, in a study
        that packs); returns it."""
        name = pack_name(self.book.members[trial_id][0])
        if self.size > 1:
            for config in configs:
                self.store.set_trial_attrs(int(config[TRIAL_KEY]), pack=name)
        return name

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        freed = self._tell(result)
        if trial_id in self.book.refilled:
            self._refill(trial_id, freed, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        self._tell(result or {})
        for number in self.book.numbers(trial_id):
            if number not in self._closed:  # still open when its pack ended
                self._closed.add(number)
                last = self.book.last.get(number)
                self.inner.on_trial_complete(self._ids[number], last, error=error)

    def _tell(self, result: Mapping[str, Any]) -> int:
        """Hand each member result to the inner searcher; the number that ended here."""
        freed = 0
        for number, member, ended in self.book.results(result):
            if number in self._closed:
                continue
            self.inner.on_trial_result(self._ids[number], member)
            if ended:
                self._closed.add(number)
                self.inner.on_trial_complete(self._ids[number], member)
                freed += 1
        return freed

    def _refill(self, trial_id: str, freed: int, result: Mapping[str, Any]) -> None:
        """Answer a pack's report: configurations for the places its ended members freed (the
        pack takes the answer at its next report, or waits for it when it has no member
        left)."""
        joining = self.backlog.refill(self.book.keys[trial_id], freed) if freed else []
        for config in joining:
            self.book.join(trial_id, config)
        name = self._name(trial_id, joining)
        self.box.offer(name, joining, int(result[ROUND]))  # every report


class PackCallback(Callback):
    """The study's callbacks, called once per member of each pack (module docstring).

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

    def on_trial_start(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        for config in trial.config.get(PACK_KEY, ()):
            self._start(trial, config, iteration, trials, info)

    def _start(self, pack: TrialView, config: Mapping[str, Any], iteration, trials, info) -> None:
        member = MemberTrial(pack, config)
        self._trials[int(config[TRIAL_KEY])] = member
        self._each("on_trial_start", member, iteration=iteration, trials=trials, **info)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        # Tune stops the pack at this result (``done``): the searcher hears of it only when the
        # pack is stopped, so its members end then (:meth:`on_trial_complete`), after the
        # searcher has told them, as a trial's callbacks always hear of its end after its
        # searcher
        stopping = bool(result.get(DONE))
        where = {k: result[k] for k in _REPORTED_FROM if k in result}
        for number, member, ended in self.book.results(result):
            member = {**where, **member}
            self._member(number, member, ended and not stopping, iteration, trials, info)
        for number in self.book.numbers(trial.trial_id, trial.config):  # refills: start now
            if number not in self._trials and number not in self._closed:
                self._start(trial, self.book.configs[number], iteration, trials, {})

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

    def _end(self, pack: TrialView, hook: str, iteration: int, trials: list, info: dict) -> None:
        for number in self.book.numbers(pack.trial_id, pack.config):
            member = self._trials.pop(number, None)
            if member is None or number in self._closed:
                continue
            self._closed.add(number)
            self._each(hook, member, iteration=iteration, trials=trials, **info)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for callback in self.inner:
            callback.on_experiment_end(trials=trials, **info)


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
    from fedtune.trainers.packed import pack_key, pack_refusal

    def key(config: Mapping[str, Any]) -> str:
        parsed = spec.trial(sampled_params(config))
        if pack_refusal(parsed) is not None:
            return alone(config)
        return pack_key(parsed)

    return key


def alone(config: Mapping[str, Any]) -> str:
    """The pack key of a configuration that runs alone (its own; a study with packs of one
    asks no more)."""
    return f"alone:{config[TRIAL_KEY]}"
