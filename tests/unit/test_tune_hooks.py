"""Ray Tune's hooks without Ray (``fedtune/tuning/tune_hooks.py``) against Ray Tune's own, and
the adapters that hand fedtune's parts to Ray Tune (``fedtune/tuning/driver/ray_adapters.py``).

The light bases promise Ray Tune's names, signatures, constants and defaults; a Ray upgrade that
renames a result field, a constant or a hook, or adds a hook, fails here (a hook added to Ray's
``Callback`` fails the adapters' import already: Ray's metaclass checks a callback container).
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from ray import tune
from ray.tune import result as ray_keys
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher as RaySearcherBase

from fedtune.tuning import tune_hooks as hooks
from fedtune.tuning.driver.ray_adapters import (
    RayCallback,
    RayScheduler,
    RaySearcher,
    for_ray_tune,
)

_KEYS = [
    "DONE",
    "TRIAL_ID",
    "PID",
    "HOSTNAME",
    "NODE_IP",
    "TIMESTAMP",
    "TRAINING_ITERATION",
    "TIME_THIS_ITER_S",
    "TIME_TOTAL_S",
]


def _hooks(cls: type) -> set[str]:
    """A callback class's hooks, as Ray's metaclass counts them (``on_*`` and ``setup``)."""
    return {
        name
        for name in dir(cls)
        if (name.startswith("on_") or name == "setup") and callable(getattr(cls, name))
    }


def _signature(cls: type, name: str) -> list[tuple[str, Any, Any]]:
    """A method's parameters: names, kinds and defaults (not their annotations)."""
    params = inspect.signature(getattr(cls, name)).parameters.values()
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize("name", _KEYS)
def test_each_result_field_is_named_as_ray_tune_names_it(name: str) -> None:
    assert getattr(hooks, name) == getattr(ray_keys, name)
    assert name in hooks.__all__


def test_the_constants_are_ray_tunes() -> None:
    assert hooks.Searcher.FINISHED == RaySearcherBase.FINISHED
    for name in ("CONTINUE", "PAUSE", "STOP", "NOOP"):
        assert getattr(hooks.Scheduler, name) == getattr(TrialScheduler, name)


def test_the_callback_has_every_hook_of_ray_tunes_with_its_signature() -> None:
    assert _hooks(hooks.Callback) == _hooks(tune.Callback)
    for name in sorted(_hooks(tune.Callback) | {"get_state", "set_state"}):
        assert _signature(hooks.Callback, name) == _signature(tune.Callback, name), name
    assert hooks.Callback().get_state() is None


def test_the_searcher_and_scheduler_hooks_have_ray_tunes_signatures() -> None:
    for name in ("set_search_properties", "suggest", "on_trial_result", "on_trial_complete"):
        assert _signature(hooks.Searcher, name) == _signature(RaySearcherBase, name), name
    for name in ("save", "restore"):
        assert _signature(hooks.Searcher, name) == _signature(RaySearcherBase, name), name
    for name in ("on_trial_result", "on_trial_complete", "on_trial_error"):
        assert _signature(hooks.Scheduler, name) == _signature(TrialScheduler, name), name


def test_the_light_bases_default_as_ray_tunes_do() -> None:
    searcher, ray_searcher = hooks.Searcher("objective", "min"), RaySearcherBase("objective", "min")
    assert (searcher.metric, searcher.mode) == (ray_searcher.metric, ray_searcher.mode)
    assert searcher.set_search_properties(None, None, {}) is False
    assert ray_searcher.set_search_properties(None, None, {}) is False
    assert searcher.on_trial_result("t", {}) is None
    for call in (
        lambda s: s.suggest("t"),
        lambda s: s.on_trial_complete("t"),
        lambda s: s.save("p"),
        lambda s: s.restore("p"),
    ):
        for one in (searcher, ray_searcher):
            with pytest.raises(NotImplementedError):
                call(one)
    scheduler, fifo = hooks.Scheduler(), FIFOScheduler()
    assert scheduler.on_trial_result(None, None, {}) == fifo.on_trial_result(None, None, {})
    assert scheduler.on_trial_complete(None, None, {}) is None
    assert scheduler.on_trial_error(None, None) is None


class _Recorder:
    """Records every call made on it, answering each with ``answer``."""

    def __init__(self, answer: Any = None) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self.answer = answer
        self.metric, self.mode = "objective", "max"

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return self.answer

        return call


def test_the_searcher_adapter_is_ray_tunes_and_delegates_each_call() -> None:
    inner = _Recorder(answer="A")
    searcher = RaySearcher(inner)  # type: ignore[arg-type]
    assert isinstance(searcher, RaySearcherBase)
    assert (searcher.metric, searcher.mode) == ("objective", "max")
    assert searcher.set_search_properties("m", "min", {}, x=1) == "A"
    assert searcher.suggest("t1") == "A"
    searcher.on_trial_result("t1", {"r": 1})
    searcher.on_trial_complete("t1", {"r": 2})
    searcher.on_trial_complete("t2", error=True)
    searcher.save("p")
    searcher.restore("p")
    assert inner.calls == [
        ("set_search_properties", ("m", "min", {}), {"x": 1}),
        ("suggest", ("t1",), {}),
        ("on_trial_result", ("t1", {"r": 1}), {}),
        ("on_trial_complete", ("t1",), {"result": {"r": 2}, "error": False}),
        ("on_trial_complete", ("t2",), {"result": None, "error": True}),
        ("save", ("p",), {}),
        ("restore", ("p",), {}),
    ]
    assert searcher.set_max_concurrency(2) is False  # Ray's: its ConcurrencyLimiter limits


def test_the_scheduler_adapter_is_fifo_with_the_inner_schedulers_decisions() -> None:
    inner = _Recorder(answer=hooks.Scheduler.STOP)
    scheduler = RayScheduler(inner)  # type: ignore[arg-type]
    assert isinstance(scheduler, FIFOScheduler)
    assert scheduler.on_trial_result("c", "trial", {"r": 1}) == TrialScheduler.STOP
    scheduler.on_trial_complete("c", "trial", {"r": 2})
    scheduler.on_trial_error("c", "trial")
    assert inner.calls == [
        ("on_trial_result", ("c", "trial", {"r": 1}), {}),
        ("on_trial_complete", ("c", "trial", {"r": 2}), {}),
        ("on_trial_error", ("c", "trial"), {}),
    ]
    assert scheduler.debug_string() == FIFOScheduler().debug_string()


def test_the_callback_adapter_delegates_every_hook_of_ray_tunes() -> None:
    inner = _Recorder(answer={"state": 1})
    callback = RayCallback(inner)  # type: ignore[arg-type]
    assert isinstance(callback, tune.Callback)
    names = sorted(_hooks(tune.Callback))
    for name in names:
        getattr(callback, name)(iteration=3, trials=[], marker=name)
    assert [(n, a, k) for n, a, k in inner.calls] == [
        (name, (), {"iteration": 3, "trials": [], "marker": name}) for name in names
    ]
    assert callback.get_state() == {"state": 1}
    callback.set_state({"state": 2})
    assert inner.calls[-2:] == [("get_state", (), {}), ("set_state", ({"state": 2},), {})]


def test_for_ray_tune_wraps_each_part() -> None:
    searcher, scheduler, callbacks = for_ray_tune(
        hooks.Searcher(), hooks.Scheduler(), [hooks.Callback(), hooks.Callback()]
    )
    assert isinstance(searcher, RaySearcher) and isinstance(scheduler, RayScheduler)
    assert [type(c) for c in callbacks] == [RayCallback, RayCallback]
