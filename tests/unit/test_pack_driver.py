"""Packed trials without a cluster: the pack's reports, the driver's fan-out, the plan.

The trainables run in this process with ``ray.tune.report`` captured; the driver's wrappers
(:mod:`fedtune.tuning.driver.pack_members`) run against recording fakes of the searcher, callbacks and
stopper they wrap, so each test names exactly which member event must reach them, and how often.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from fedtune.errors import ConfigError
from fedtune.outcomes import RUNNING, TrialOutcome
from fedtune.tuning.driver import pack_members as pd
from fedtune.tuning.keys import DECAY_ROUNDS, HISTORY, OBJECTIVE, OUTCOME, ROUND, TRIAL_KEY
from fedtune.tuning.packing.box import LocalBox, RayBox
from fedtune.tuning.packing.limits import AUTO_MAX
from fedtune.tuning.packing.memory import PackMemory
from fedtune.tuning.packing.plan import plan, reserved_processes
from fedtune.tuning.packing.speed import PAYS, PackSpeed, draws, measure
from fedtune.tuning.spec import StudySpec
from fedtune.tuning.trials import trainable as pack_trial
from fedtune.tuning.trials.results import MEMBERS, PACK_KEY
from fedtune.tuning.trials.schedulers import PackScheduler
from fedtune.tuning.trials.stop_rules import NeverStop, StopReason
from fedtune.tuning.trials.trainable import train_pack
from fedtune.tuning.tune_hooks import Scheduler, Searcher

ROUNDS = 8
#: fields of a round's record that are measured time, not arithmetic
TIMED = {"wall_time", "round_time", "client_time", "eval_time"}


def _spec(**overrides: Any) -> StudySpec:
    doc = {
        "name": "packs",
        "algorithm": "fedavg",
        "task": {"name": "quadratic", "clients": 6, "dim": 3, "seed": 0},
        "train": {
            "rounds": ROUNDS,
            "clients_per_round": 3,
            "local_steps": 2,
            "batch_size": 2,
            "eval_every": 4,
            "dtype": "float64",
        },
        "search": {"space": "fedavg"},
        "objective": {"metric": "train_loss", "last_rounds": 3},
        "budget": {"trials": 8, "max_concurrent": 4},
        "report_every": 3,
    }
    doc.update(overrides)
    return StudySpec.from_dict(doc)


def _capture(monkeypatch) -> list[dict]:
    import ray.tune

    reports: list[dict] = []
    monkeypatch.setattr(ray.tune, "report", lambda result: reports.append(result))
    return reports


def _member(number: int, client_lr: float, server_lr: float = 0.1) -> dict[str, Any]:
    return {"hparams.client_lr": client_lr, "hparams.server_lr": server_lr, TRIAL_KEY: number}


def _alone(monkeypatch, member: dict[str, Any], spec: StudySpec) -> list[dict]:
    """What a configuration reports in a pack of its own (the engine's trainers, no
    PackedTrainer): its member results, without the pack's bookkeeping."""
    reports = _capture(monkeypatch)
    train_pack({PACK_KEY: [dict(member)]}, spec)
    mine = [{k: v for k, v in m.items() if k != TRIAL_KEY} for r in reports for m in r[MEMBERS]]
    assert all(m[TRIAL_KEY] == member[TRIAL_KEY] for r in reports for m in r[MEMBERS])
    return mine


def _joined(reports: list[dict]) -> dict[str, Any]:
    """An unpacked trial's reports as one: every row, and the final result's fields."""
    rows = [row for r in reports for row in r[HISTORY]]
    return {**reports[-1], HISTORY: rows}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a if k not in TIMED)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


# -- the pack's trainable ---------------------------------------------------------------------
def test_each_member_reports_what_its_unpacked_trial_reports(monkeypatch):
    spec = _spec(
        seeds=[0, 1],
        decay={"enabled": True, "window": 2, "patience": 1, "cooldown": 1},
    )
    members = [_member(0, 0.05), _member(1, 5e3), _member(2, 0.08, 0.2)]  # 1 diverges
    reports = _capture(monkeypatch)
    train_pack({PACK_KEY: members}, spec)
    packed: dict[int, list[dict]] = {}
    for report in reports:
        for result in report[MEMBERS]:
            packed.setdefault(result.pop(TRIAL_KEY), []).append(result)
    assert sorted(packed) == [0, 1, 2]
    assert reports[-1][OUTCOME] != RUNNING and all(r[OUTCOME] == RUNNING for r in reports[:-1])
    for member in members:
        number = member[TRIAL_KEY]
        alone = _alone(monkeypatch, member, spec)
        mine = packed[number]
        assert [r[OUTCOME] for r in mine[:-1]] == [RUNNING] * (len(mine) - 1)
        assert _same(_joined(mine), _joined(alone)), number
    assert packed[1][-1][OUTCOME] == TrialOutcome.DIVERGED
    assert packed[1][-1][OBJECTIVE] == math.inf and packed[1][-1]["reason"]
    assert packed[0][-1][OUTCOME] == TrialOutcome.COMPLETED and packed[0][-1][ROUND] == ROUNDS
    assert any(packed[n][-1][DECAY_ROUNDS] for n in (0, 2))  # the decay rule acted, and agreed


class _Poll:
    """The BoxPoll's answers, scripted: ``answers[i]`` is the i-th report's ``(stopped,
    offered)``; ``waits`` what a pack with no member left gets when it waits."""

    def __init__(self, answers: list[tuple[list[int], list[dict]]], waits: list[list[dict]]):
        self.answers, self.waits = list(answers), list(waits)
        self.asked: list[list[int]] = []
        self.reports: list[int] = []
        self.waited: list[int] = []

    def __call__(self, box: Any, first: int, answered: bool) -> _Poll:
        assert answered  # a pack of two or more: the driver answers its every report
        return self

    def answer(self, report: int, live: list[int]) -> tuple[list[int], list[dict]]:
        self.asked.append(list(live))
        self.reports.append(report)
        return self.answers.pop(0) if self.answers else ([], [])

    def wait(self) -> list[dict]:
        self.waited.append(self.reports[-1])  # the answer to its last report
        return self.waits.pop(0) if self.waits else []


def _by_member(reports: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for report in reports:
        for result in report[MEMBERS]:
            out.setdefault(result[TRIAL_KEY], []).append(dict(result))
    return out


def test_a_stopped_member_leaves_the_pack_and_is_not_reported_again(monkeypatch):
    spec = _spec()
    reports = _capture(monkeypatch)
    poll = _Poll([([1], [])], [])  # member 1 was stopped at the first report
    monkeypatch.setattr(pack_trial, "BoxPoll", poll)
    train_pack({PACK_KEY: [_member(0, 0.05), _member(1, 0.1)]}, spec, box=LocalBox())
    assert poll.asked[0] == [0, 1] and all(1 not in live for live in poll.asked[1:])
    rounds_of = {
        n: [row[ROUND] for r in results for row in r[HISTORY]]
        for n, results in _by_member(reports).items()
    }
    assert rounds_of[0] == list(range(1, ROUNDS + 1))
    assert 1 not in rounds_of  # its rows up to the stop went with the report it was stopped on
    assert poll.waited == [ROUNDS]  # no member left: it waited for the answer to its last report


def test_a_refill_joins_at_round_0_and_reports_what_its_unpacked_trial_reports(monkeypatch):
    decay = {"enabled": True, "window": 2, "patience": 1, "cooldown": 1}
    spec = _spec(seeds=[0, 1], decay=decay)
    reports = _capture(monkeypatch)
    late, last = _member(7, 0.07, 0.3), _member(9, 0.02)
    # 1 diverges (reported at step 2); 7 is offered at the second report (step 3) and diverges
    # at its own round 7 (step 10); 9 joins when the pack has no member left
    poll = _Poll([([], []), ([], [late])], [[last], []])
    monkeypatch.setattr(pack_trial, "BoxPoll", poll)
    train_pack({PACK_KEY: [_member(0, 0.05), _member(1, 5e3)]}, spec, box=LocalBox())
    packed = _by_member(reports)
    assert sorted(packed) == [0, 1, 7, 9]
    for member in (late, last):
        alone = _alone(monkeypatch, member, spec)
        mine = [{k: v for k, v in r.items() if k != TRIAL_KEY} for r in packed[member[TRIAL_KEY]]]
        assert [r[OUTCOME] for r in mine[:-1]] == [RUNNING] * (len(mine) - 1)
        assert _same(_joined(mine), _joined(alone)), member[TRIAL_KEY]
        assert [r[ROUND] for r in mine] == [r[ROUND] for r in alone]  # its own report rounds
    # 0 completed at step 8 and 7 diverged at step 10: the pack waited for the answer to that
    # report, took 9, and after 9's 8 rounds waited again and ended
    assert poll.waited == [10, 18]
    assert packed[7][-1][OUTCOME] == TrialOutcome.DIVERGED
    assert packed[9][-1][OUTCOME] == TrialOutcome.COMPLETED
    assert [r[OUTCOME] for r in reports].count("ended") == 2


class _ScriptedBox(LocalBox):
    """A box whose every answer is ``([1, 7], [joining])``, there once ``arrived``."""

    def __init__(self, joining: dict) -> None:
        super().__init__()
        self.joining, self.arrived = joining, False
        self.asked: list[tuple] = []

    def ask(self, pack: str, live, report: int | None = None) -> object:
        self.asked.append((pack, list(live), report))
        return len(self.asked)

    def ready(self, question: object) -> bool:
        return self.arrived

    def result(self, question: object) -> tuple[list[int], list[dict]]:
        return [1, 7], [self.joining]


@pytest.mark.parametrize("answered", [True, False])
def test_the_box_poll_takes_each_answer_at_the_next_report(answered):
    joining = {TRIAL_KEY: 9}
    box = _ScriptedBox(joining)
    box.arrived = answered  # a question whose answer is waited for needs no readiness
    poll = pack_trial.BoxPoll(box, 3, answered)
    assert poll.answer(6, [0, 1, 2]) == ([], [])  # nothing asked before
    question = ("pack-0003", [0, 1, 2], 6 if answered else None)  # None: without waiting
    assert box.asked == [question]
    got = poll.answer(7, [0, 1, 2])
    if answered:  # the driver answers every report: the pack waits for it (here: it is there)
        assert got == ([1], [joining]) and box.asked[-1] == ("pack-0003", [0, 1, 2], 7)
    else:  # not arrived: no waiting and no second question
        assert got == ([], []) and len(box.asked) == 1
        box.arrived = True
        assert poll.answer(7, [0, 1, 2]) == ([1], [joining])  # 7 is not in the pack any more
    # no member left: the answer to its last report, waited for, brings 9
    assert poll.wait() == [joining] and poll.wait() == []


def test_a_local_box_answers_from_what_the_driver_decided_when_the_answer_is_read():
    box = LocalBox()
    asked = box.ask("pack-0001", [1, 2, 3], report=4)
    box.stop([2, 8])
    box.offer("pack-0001", [{TRIAL_KEY: 5}], answers=4)
    box.offer("pack-0002", [{TRIAL_KEY: 6}])
    assert box.ready(asked)  # its reports were processed before it asks: always there
    assert box.result(asked) == ([2], [{TRIAL_KEY: 5}])  # the members live when it asked
    assert box.result(box.ask("pack-0001", [1, 3])) == ([], [])  # an offer is taken once


def test_a_ray_box_asks_its_actor_and_reads_the_answer_with_ray(monkeypatch):
    import ray

    calls: list[tuple] = []

    class Method:
        def __init__(self, name: str) -> None:
            self.name = name

        def remote(self, *args: Any) -> tuple:
            calls.append((self.name, *args))
            return ([2], [{TRIAL_KEY: 5}])  # the "object reference": its own value

    class Actor:
        stop, offer = Method("stop"), Method("offer")
        poll, answer = Method("poll"), Method("answer")

    monkeypatch.setattr(ray, "wait", lambda refs, timeout: (refs, []) if timeout == 0 else None)
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    box = RayBox(Actor())
    box.stop((2,))
    box.offer("pack-0001", ({TRIAL_KEY: 5},), 4)
    waited, now = box.ask("pack-0001", (1, 2), report=4), box.ask("pack-0001", (1, 2))
    assert calls == [
        ("stop", [2]),
        ("offer", "pack-0001", [{TRIAL_KEY: 5}], 4),
        ("answer", "pack-0001", 4, [1, 2]),  # waits in the actor until report 4 is answered
        ("poll", "pack-0001", [1, 2]),
    ]
    assert box.ready(now) and box.result(waited) == ([2], [{TRIAL_KEY: 5}])


# -- the driver's searcher --------------------------------------------------------------------
class _Inner(Searcher):
    """Records what the pack searcher asks and tells; configurations alternate in ``opt``."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: dict[str, int] = {}
        self.events: list[tuple] = []

    def suggest(self, trial_id: str) -> dict[str, Any]:
        number = len(self.asked)
        self.asked[trial_id] = number
        return {"opt": "a" if number % 3 else "b", TRIAL_KEY: number}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.events.append(("result", self.asked[trial_id], result.get(ROUND)))

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self.events.append(("complete", self.asked[trial_id], error))


class _Store:
    def __init__(self) -> None:
        self.attrs: dict[int, dict] = {}

    def set_trial_attrs(self, number: int, **attrs: Any) -> None:
        self.attrs.setdefault(number, {}).update(attrs)


def _search(size: int = 3, budget: int = 7, box: Any = None):
    inner, book, store = _Inner(), pd.PackBook(), _Store()
    search = pd.PackSearch(inner, book, size, budget, lambda c: c["opt"], store, box)
    return search, inner, book, store


class _Offers(LocalBox):
    """A box whose offers are recorded: ``(pack, member numbers, answers)``."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple] = []

    def offer(self, pack: str, configs, answers: int | None = None) -> None:
        self.sent.append((pack, [c[TRIAL_KEY] for c in configs], answers))


def test_the_searcher_packs_configurations_that_share_a_key_up_to_the_budget():
    search, _inner, _book, store = _search()
    packs = []
    while (config := search.suggest(f"t{len(packs)}")) != Searcher.FINISHED:
        packs.append([m[TRIAL_KEY] for m in config[PACK_KEY]])
        assert {m["opt"] for m in config[PACK_KEY]} == {config[PACK_KEY][0]["opt"]}
        assert config[TRIAL_KEY] == packs[-1][0]
    # 0, 3 and 6 are "b", the rest "a": it asks on until one key fills a pack (at most 2P
    # waiting), packs the largest group, and the budget's last one runs alone
    assert packs == [[1, 2, 4], [0, 3, 6], [5]]
    assert {store.attrs[n]["pack"] for n in packs[1]} == {pd.pack_name(packs[1][0])}


def _result(*members: tuple[int, str, int]) -> dict:
    return {
        MEMBERS: [
            {TRIAL_KEY: n, OUTCOME: outcome, ROUND: r, HISTORY: [{ROUND: r}]}
            for n, outcome, r in members
        ]
    }


def test_the_searcher_tells_each_member_once_and_ends_open_members_with_their_pack():
    search, inner, book, _store = _search(size=3, budget=3)
    config = search.suggest("pack")
    numbers = [m[TRIAL_KEY] for m in config[PACK_KEY]]
    assert len(numbers) == 2  # 0 ("b") waits: 1 and 2 ("a") ... or the other way round
    a, b = numbers
    book.stopped.add(b)  # the scheduler stopped b at this report
    search.on_trial_result("pack", _result((a, RUNNING, 3), (b, RUNNING, 3)))
    search.on_trial_result("pack", _result((a, RUNNING, 6), (b, RUNNING, 6)))  # b's late rows
    search.on_trial_complete("pack", None, error=True)
    assert inner.events == [
        ("result", a, 3),
        ("result", b, 3),
        ("complete", b, False),
        ("result", a, 6),
        ("complete", a, True),
    ]


def test_the_searcher_refills_a_freed_place_after_telling_its_member_and_answers_each_report():
    box = _Offers()
    search, inner, book, store = _search(size=2, budget=6, box=box)
    config = search.suggest("p")
    a, b = [m[TRIAL_KEY] for m in config[PACK_KEY]]  # 1 and 2 ("a"); 0 ("b") waits
    assert (a, b) == (1, 2) and book.refilled == {"p"}
    search.on_trial_result("p", {ROUND: 3, OUTCOME: RUNNING, **_result((a, "completed", 3))})
    # a is told before its place is asked for: 3 ("b") waits too, 4 ("a") joins the pack
    assert inner.events[-2:] == [("result", a, 3), ("complete", a, False)]
    assert list(inner.asked.values()) == [0, 1, 2, 3, 4]
    assert box.sent == [("pack-0001", [4], 3)] and book.members["p"] == [1, 2, 4]
    assert store.attrs[4]["pack"] == "pack-0001"
    search.on_trial_result("p", {ROUND: 5, OUTCOME: RUNNING, **_result((b, RUNNING, 5))})
    assert box.sent[-1] == ("pack-0001", [], 5)  # nothing ended: an answer all the same
    ended = _result((b, "diverged", 6), (4, "completed", 6))
    search.on_trial_result("p", {ROUND: 6, OUTCOME: "ended", **ended})
    # two places: 5 ("a") is asked, then the budget (6) is spent; the pack waits on report 6
    assert box.sent[-1] == ("pack-0001", [5], 6)
    search.on_trial_result("p", {ROUND: 9, OUTCOME: "ended", **_result((5, "completed", 9))})
    assert box.sent[-1] == ("pack-0001", [], 9)  # nothing left with its key: the pack ends
    assert search.suggest("q")[PACK_KEY] == [{"opt": "b", TRIAL_KEY: 0}, {"opt": "b", TRIAL_KEY: 3}]


def test_a_pack_of_one_or_a_study_without_a_box_is_never_refilled():
    box = _Offers()
    search, _inner, book, _store = _search(size=3, budget=1, box=box)
    assert [m[TRIAL_KEY] for m in search.suggest("alone")[PACK_KEY]] == [0]
    search.on_trial_result("alone", {ROUND: 8, OUTCOME: "ended", **_result((0, "completed", 8))})
    assert box.sent == [] and book.refilled == set()


# -- the driver's scheduler -------------------------------------------------------------------
class _Stopper(NeverStop):
    def observe(self, number: int, values) -> StopReason | None:
        return StopReason.RUNG if number in (1, 5) else None


class _Box(LocalBox):
    """A box whose stops are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[list[int]] = []

    def stop(self, numbers) -> None:
        self.sent.append(list(numbers))


class _Trial:
    def __init__(self, trial_id: str, numbers: list[int]) -> None:
        self.trial_id = trial_id
        self.config = {PACK_KEY: [{TRIAL_KEY: n} for n in numbers], TRIAL_KEY: numbers[0]}


def _rows(number: int, outcome: str, rounds: range) -> dict:
    rows = [{ROUND: r, OBJECTIVE: 1.0 / r} for r in rounds]
    return {TRIAL_KEY: number, OUTCOME: outcome, HISTORY: rows}


def test_the_scheduler_stops_members_and_a_pack_whose_last_members_it_stopped():
    book, box = pd.PackBook(), _Box()
    scheduler = PackScheduler(_Stopper(), book, box)
    pack = _Trial("p", [0, 1])
    first = {MEMBERS: [_rows(0, RUNNING, range(1, 4)), _rows(1, RUNNING, range(1, 4))]}
    assert scheduler.on_trial_result(None, pack, first) == Scheduler.CONTINUE
    assert book.stopped == {1} and box.sent == [[1]]
    last = {MEMBERS: [_rows(0, TrialOutcome.COMPLETED, range(4, 9))]}
    assert scheduler.on_trial_result(None, pack, last) == Scheduler.CONTINUE  # ends itself
    alone = _Trial("a", [5])  # a pack of one whose configuration is stopped: Tune stops it
    one = {MEMBERS: [_rows(5, RUNNING, range(1, 4))]}
    assert scheduler.on_trial_result(None, alone, one) == Scheduler.STOP
    refilled = _Trial("r", [2, 3])
    book.refilled.add("r")  # a pack that takes refills ends when the searcher says so
    ended = {MEMBERS: [_rows(n, TrialOutcome.COMPLETED, range(1, 9)) for n in (2, 3)]}
    assert scheduler.on_trial_result(None, refilled, ended) == Scheduler.CONTINUE


# -- the callbacks ----------------------------------------------------------------------------
class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, hook: str):
        def record(trial=None, **kwargs: Any) -> None:
            seen = trial and (trial.trial_id, trial.config[TRIAL_KEY], dict(trial.last_result))
            self.calls.append((hook, seen))

        return record


def test_callbacks_see_each_member_as_a_trial():
    book, recorder = pd.PackBook(), _Recorder()
    callback = pd.PackCallback([recorder], book)
    pack = _Trial("p", [4, 5])
    pack.error_file = "/tmp/the-pack-error"
    book.open("p", pack.config[PACK_KEY], "key", refills=True)
    callback.on_trial_start(iteration=0, trials=[], trial=pack)
    result = {MEMBERS: [_rows(4, TrialOutcome.COMPLETED, range(1, 3))]}
    book.join("p", {TRIAL_KEY: 6})  # the searcher refilled 4's place at this report
    callback.on_trial_result(iteration=1, trials=[], trial=pack, result=result)
    callback.on_trial_error(iteration=2, trials=[], trial=pack)
    hooks = [(hook, seen[0]) for hook, seen in recorder.calls]
    assert hooks == [
        ("on_trial_start", "config-4"),
        ("on_trial_start", "config-5"),
        ("on_trial_result", "config-4"),
        ("on_trial_complete", "config-4"),
        ("on_trial_start", "config-6"),  # the refill starts at the report that freed its place
        ("on_trial_error", "config-5"),  # the members still open when their pack failed
        ("on_trial_error", "config-6"),
    ]
    assert recorder.calls[3][1][2][OUTCOME] == TrialOutcome.COMPLETED
    member = pd.MemberTrial(pack, pack.config[PACK_KEY][1])
    assert member.error_file == "/tmp/the-pack-error"  # a failed pack's error is its members'
    assert (member.trial_id, member.config[TRIAL_KEY]) == ("config-5", 5)
    pack.local_path = "/tmp/the-pack"
    with pytest.raises(AttributeError):  # a member is not a proxy of its pack
        member.local_path  # noqa: B018
    assert not callback._trials  # ended members are not kept


def test_a_member_of_a_pack_tune_stops_ends_after_its_searcher_hears_of_it():
    """Tune tells the searcher of a result it stops a trial on only when it stops the trial
    (``search_alg.on_trial_complete``), before the callbacks' ``on_trial_complete``: a pack of
    one stopped at a result ends its member there, not at the result, so the progress line and
    MLflow see the searcher's ledger after the member's end, as for any trial."""
    book, recorder = pd.PackBook(), _Recorder()
    callback = pd.PackCallback([recorder], book)
    pack = _Trial("p", [3])
    book.open("p", pack.config[PACK_KEY], "alone:3", refills=False)
    callback.on_trial_start(iteration=0, trials=[], trial=pack)
    final = {MEMBERS: [_rows(3, TrialOutcome.COMPLETED, range(1, 9))], "done": True, "pid": 41}
    callback.on_trial_result(iteration=1, trials=[], trial=pack, result=final)
    assert [hook for hook, _ in recorder.calls] == ["on_trial_start", "on_trial_result"]
    assert recorder.calls[-1][1][2]["pid"] == 41  # where it was reported from, as a trial's
    callback.on_trial_complete(iteration=2, trials=[], trial=pack)  # after the searcher's
    assert recorder.calls[-1][0] == "on_trial_complete"
    assert recorder.calls[-1][1][2][OUTCOME] == TrialOutcome.COMPLETED  # its last result


# -- the plan ---------------------------------------------------------------------------------
def test_auto_packs_the_concurrent_configurations_into_the_clusters_process_slots():
    spec = _spec(budget={"trials": 64, "max_concurrent": 64}, resources={"pack": "auto"})
    two_cpus = plan(spec, {"CPU": 2.0})
    assert (two_cpus.size, two_cpus.processes) == (32, 2)
    assert "auto, 2 process slots" in two_cpus.note
    assert plan(spec, {"CPU": 128.0}).size == 1  # a slot per configuration: no packing
    wide = _spec(budget={"trials": 512, "max_concurrent": 512}, resources={"pack": "auto"})
    assert plan(wide, {"CPU": 1.0}).size == AUTO_MAX
    gpus = _spec(budget={"max_concurrent": 16}, resources={"pack": "auto", "gpu": 0.5})
    assert plan(gpus, {"CPU": 64.0, "GPU": 2.0}).processes == 4  # 2 GPUs / 0.5 per process


def test_on_a_gpu_the_devices_memory_decides_the_pack():
    MiB = 2**20
    # 100 MiB for the task and model, 20 MiB per configuration, 2 GiB for a trial:
    # 0.85 · 2048 MiB − 100 MiB holds 82 configurations
    memory = PackMemory(base=100 * MiB, per_member=20 * MiB, available=2048 * MiB, device="H100")
    assert memory.fits() == 82 and memory.refusal(82) is None
    measured = []

    def measure() -> PackMemory:
        measured.append(1)
        return memory

    spec = _spec(budget={"max_concurrent": 512}, resources={"pack": "auto", "gpu": 1})
    auto = plan(spec, {"CPU": 16.0, "GPU": 1.0}, measure)
    assert (auto.size, auto.processes) == (82, 7), auto  # not AUTO_MAX: a GPU goes past 64
    assert "at most 82 in the GPU's memory" in auto.note
    roomy = PackMemory(base=100 * MiB, per_member=MiB, available=80 * 2**30)
    assert plan(spec, {"GPU": 1.0}, lambda: roomy).size == 512  # all of them, one process
    fixed = _spec(budget={"max_concurrent": 256}, resources={"pack": 256, "gpu": 1})
    with pytest.raises(ConfigError) as caught:
        plan(fixed, {"GPU": 1.0}, measure)
    line = str(caught.value)
    assert caught.value.field == "resources.pack" and "\n" not in line
    # 100 MiB + 256 · 20 MiB = 5220 MiB at 85 % usable: 6.0 GiB needed
    assert "256 configurations need 6.0 GiB of GPU memory" in line, line
    assert "2.0 GiB on H100: pack at most 82" in line, line
    cpu = _spec(budget={"max_concurrent": 512}, resources={"pack": "auto"})
    assert plan(cpu, {"CPU": 1.0}, measure).size == AUTO_MAX  # a CPU study is not measured
    assert len(measured) == 2
    tiny = PackMemory(base=3 * 2**30, per_member=MiB, available=2**30)
    assert "not even one configuration fits" in tiny.refusal(1)
    assert plan(spec, {"GPU": 1.0}, lambda: tiny).size == 1  # auto: the trial says what fails
    assert plan(spec, {"GPU": 1.0}, lambda: None).size == 512  # not measured: MAX_PACK bounds


def test_auto_on_cpus_packs_only_where_a_pack_measured_on_the_task_pays():
    spec = _spec(budget={"trials": 16, "max_concurrent": 8}, resources={"pack": "auto"})
    asked: list[int] = []

    def speed(found: PackSpeed | None):
        def measure(size: int) -> PackSpeed | None:
            asked.append(size)
            return found

        return measure

    pays = plan(spec, {"CPU": 2.0}, speed=speed(PackSpeed(4, 300.0, 100.0)))
    assert (pays.size, pays.processes) == (4, 2) and asked == [4]
    assert "a pack of 4 measured 3.00× the configuration-rounds/s of one at a time" in pays.note
    slower = plan(spec, {"CPU": 2.0}, speed=speed(PackSpeed(4, 150.0, 100.0)))
    assert (slower.size, slower.processes) == (1, 8)  # 1.5× < PAYS: one configuration each
    assert "1.50×" in slower.note and "\n" not in slower.note
    arithmetic = PackSpeed(4, None, None, "a round of one configuration took 2.0 s")
    assert plan(spec, {"CPU": 2.0}, speed=speed(arithmetic)).size == 1
    unmeasured = plan(spec, {"CPU": 2.0}, speed=speed(None))
    assert unmeasured.size == 1 and "not measured" in unmeasured.note
    assert plan(spec, {"CPU": 8.0}, speed=speed(None)).size == 1 and len(asked) == 4  # no probe
    fixed = _spec(budget={"trials": 16, "max_concurrent": 8}, resources={"pack": 4})
    assert plan(fixed, {"CPU": 2.0}, speed=speed(None)).size == 4  # an integer is what it says
    assert len(asked) == 4


def test_a_pack_speed_is_packed_over_one_at_a_time_and_pays_from_the_threshold():
    assert PackSpeed(8, 2.0 * 50, 50.0).pays and PackSpeed(8, 2.0 * 50, 50.0).speedup == PAYS
    assert not PackSpeed(8, 99.0, 50.0).pays
    assert PackSpeed(8, None, 50.0).speedup is None and not PackSpeed(8, 0.0, 50.0).pays


def test_the_speed_probe_times_configurations_of_the_studys_own_space():
    import torch

    spec = _spec(budget={"trials": 16, "max_concurrent": 8}, resources={"pack": "auto"})
    drawn = draws(spec, 4, seed=3)
    assert len(drawn) == 4 and len({c.hparams["client_lr"] for c in drawn}) == 4
    assert draws(spec, 4, seed=3) == drawn  # seeded
    assert {"hparams.client_lr", "hparams.server_lr"} <= set(spec.search_space().paths)
    threads = torch.get_num_threads()
    found = measure(spec, 4)
    assert torch.get_num_threads() == threads  # the probe's thread count is its own
    assert found.size == 4 and found.packed > 0 and found.unpacked > 0
    assert found.speedup == found.packed / found.unpacked
    assert found.describe().startswith("a pack of 4 measured")


def test_an_integer_pack_and_the_processes_a_study_reserves():
    spec = _spec(budget={"max_concurrent": 8}, resources={"pack": 4})
    spec.validate_deep()
    packed = plan(spec, {"CPU": 1.0})
    assert (packed.size, packed.processes, packed.packed) == (4, 2, True)
    assert reserved_processes(4, 8) == 2 and reserved_processes(3, 8) == 3
    assert reserved_processes("auto", 8) == 8 and reserved_processes(1, 8) == 8


def test_auto_falls_back_with_one_line_for_an_algorithm_that_cannot_be_packed():
    spec = _spec(algorithm="scaffold", search={"space": "scaffold"}, resources={"pack": "auto"})
    fallback = plan(spec, {"CPU": 1.0})
    assert fallback.size == 1 and "scaffold" in fallback.note and "\n" not in fallback.note


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"resources": {"pack": 8}, "budget": {"max_concurrent": 4}}, "budget.max_concurrent = 4"),
        (
            {"algorithm": "scaffold", "search": {"space": "scaffold"}, "resources": {"pack": 2}},
            "scaffold",
        ),
    ],
)
def test_an_integer_pack_that_cannot_be_honoured_is_refused_by_field(overrides, words):
    with pytest.raises(ConfigError) as caught:
        _spec(**overrides).validate_deep()
    assert caught.value.field == "resources.pack" and words in str(caught.value)


@pytest.mark.parametrize("pack", [0, -1, "all", 1.5, True])
def test_a_pack_that_is_not_a_count_or_auto_is_refused(pack):
    with pytest.raises(ConfigError) as caught:
        _spec(resources={"pack": pack})
    assert caught.value.field.startswith("resources.pack")
