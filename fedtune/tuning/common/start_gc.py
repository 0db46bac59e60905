"""Python's cyclic garbage collector paused while a study's process starts.

A study's processes import hundreds of thousands of objects before their work begins (the
driver: torch, Optuna, SQLAlchemy, the engine; its MLflow process: MLflow, SQLAlchemy, pandas)
and keep nearly all of them alive to the end. With the collector on, each of its passes during
the start walks those objects again, and finds next to nothing to free: about a sixth of a small
``fedtune tune`` study's CPU. :func:`pause` turns the collector off before the imports;
:func:`resume` then moves every object alive into the collector's permanent generation
(``gc.freeze``), which later passes do not walk, and turns the collector back on, so the work
after the start (trials, rounds, the report) is collected as before.

``fedtune tune`` and the service's driver (``fedtune worker run-study``) pause before they
import the driver (when ``fedtune.cli.main`` is the process's entry point: the verbs that set
the parser default ``start_gc``), and the driver resumes when its tuner begins
(:func:`fedtune.tuning.driver.fit.fit`); the study's MLflow process pauses before it imports
MLflow and resumes once its store is open and its late imports are done
(:mod:`fedtune.tuning.mlflow.process`); ``fedtune serve`` pauses before its imports and its app
resumes once its lifespan has started the runtime (``fedtune.service.api.app``). Whoever
paused also resumes at its end, so an error before those points leaves the collector on. The
MLflow server's start (``fedtune.service.mlflow_run``) is a block of its own: :func:`collected`
pauses the collector through it, then runs one collection of what the block left (the server
freezes MLflow's imports itself, before its steps, so that collection walks only the steps').
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["collected", "pause", "paused", "resume"]

_lock = threading.Lock()
_paused = False


def pause() -> None:
    """Turn the collector off until :func:`resume` (nothing when it is off already: whoever
    turned it off turns it on)."""
    global _paused
    with _lock:
        if gc.isenabled():
            gc.disable()
            _paused = True


def paused() -> bool:
    """Whether :func:`pause` turned the collector off and no :func:`resume` has followed."""
    return _paused


def resume() -> None:
    """Freeze every object alive and turn the collector back on, once after :func:`pause`;
    otherwise nothing."""
    global _paused
    with _lock:
        if not _paused:
            return
        _paused = False
        gc.freeze()
        gc.enable()


@contextlib.contextmanager
def collected() -> Iterator[None]:
    """The collector paused while the block runs, then one full collection (what the block
    left in cycles), and the collector as it was.

    Yields:
        Nothing.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        if was_enabled:
            gc.enable()
