"""Ray Tune's trial actors start as plain Ray workers during a study's fit
(:func:`fedtune.tuning.driver.ray_adapters.plain_trial_actors`).

Ray Tune gives every trainable actor a ``runtime_env`` of its own (``env_vars`` with
PyTorch Lightning's ``PL_DISABLE_FORK``); a worker with a ``runtime_env`` is started through
Ray's ``setup_worker.py``, which imports Ray only to exec the worker (~1.1 CPU-s more per trial
process). Inside the fit's environment (:func:`~fedtune.tuning.driver.fit._tune_environment`)
the actor class Tune registers carries none; the variables Tune propagates from the driver's
environment still reach the trials, and a Ray whose defaults differ is left alone.
"""

from __future__ import annotations

import pytest
from ray.tune.execution import class_cache

from fedtune.tuning.driver import ray_adapters
from fedtune.tuning.driver.fit import _tune_environment
from fedtune.tuning.driver.ray_adapters import TUNE_DEFAULT_ENV_VARS


class _Trainable:
    """A stand-in for a Tune trainable class (only registered, never started)."""


def _actor_env_vars(monkeypatch: pytest.MonkeyPatch) -> dict[str, str] | None:
    """The ``env_vars`` of the ``runtime_env`` Tune's class cache gives a fresh actor class."""
    for name in class_cache.ENV_VARS_TO_PROPAGATE:
        monkeypatch.delenv(name, raising=False)
    options = class_cache._ActorClassCache().get(type("T", (_Trainable,), {}))._default_options
    return (options.get("runtime_env") or {}).get("env_vars")


def test_tune_default_is_what_this_ray_gives():
    """The default removed is this Ray's (else the fit leaves it, and this test says so)."""
    assert class_cache.DEFAULT_ENV_VARS == TUNE_DEFAULT_ENV_VARS


def test_trial_actors_have_no_runtime_env_of_tunes_during_the_fit(monkeypatch):
    assert _actor_env_vars(monkeypatch) == TUNE_DEFAULT_ENV_VARS  # Tune's own, outside
    with _tune_environment():
        assert not _actor_env_vars(monkeypatch)  # no runtime_env: a plain worker
    assert _actor_env_vars(monkeypatch) == TUNE_DEFAULT_ENV_VARS  # restored


def test_propagated_variables_still_reach_the_trials(monkeypatch):
    with _tune_environment():
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
        options = class_cache._ActorClassCache().get(type("T", (_Trainable,), {}))._default_options
    assert options["runtime_env"]["env_vars"] == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"}


def test_a_ray_with_other_defaults_is_left_alone(monkeypatch):
    other = {**TUNE_DEFAULT_ENV_VARS, "SOME_NEW_DEFAULT": "1"}
    monkeypatch.setattr(class_cache, "DEFAULT_ENV_VARS", other)
    with _tune_environment():
        assert _actor_env_vars(monkeypatch) == other
    assert class_cache.DEFAULT_ENV_VARS is other


def test_the_in_process_path_leaves_ray_tune_alone(monkeypatch):
    """A study whose trials run in the driver's process does not reach for Ray Tune's cache."""

    def refuse() -> None:
        raise AssertionError("plain_trial_actors on the in-process path")

    monkeypatch.setattr(ray_adapters, "plain_trial_actors", refuse)
    with _tune_environment(ray_tune=False):
        assert class_cache.DEFAULT_ENV_VARS == TUNE_DEFAULT_ENV_VARS
