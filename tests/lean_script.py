"""``python -m tests.lean_script [--no-dashboard] [--plain-trial-actors] SCRIPT [ARG ...]`` (or
``-c CODE [ARG ...]``): run a script (or code, as ``python -c`` does) as ``__main__`` with every
in-process ``ray.init`` of it starting a lean head (``tests/ray_start.py``: no log or autoscaler
monitor, dashboard agents sampling every 60 s; ``--no-dashboard``: nor the dashboard's web UI
modules), for tests that run a script which starts its own Ray and reads no node metrics or
worker logs. ``--plain-trial-actors``: the script's Ray Tune trial actors start as plain Ray
workers, as fedtune's do (``plain_trial_actors``), not through ``setup_worker.py``."""

from __future__ import annotations

import contextlib
import runpy
import sys
import types

from tests.ray_start import lean_head


def command(*argv: str, dashboard: bool = True, plain_trial_actors: bool = False) -> list[str]:
    """The command that runs ``argv`` under this module, with this Python.

    Args:
        argv: A script's path and its arguments, or ``-c``, the code and its arguments.
        dashboard: ``False``: the head without the dashboard's web UI modules.
        plain_trial_actors: ``True``: Ray Tune starts the script's trial actors without its
            default ``runtime_env`` (:func:`fedtune.tuning.driver.ray_adapters.plain_trial_actors`),
            so each trial process is one Python start, not ``setup_worker.py``'s and then the
            worker's (~1 CPU-s a trial), for a test that reads nothing Tune's default
            (``PL_DISABLE_FORK``, for PyTorch Lightning) changes.

    Returns:
        ``python -m tests.lean_script [--no-dashboard] [--plain-trial-actors] ARGV...`` (the
        child needs the repository root on its ``PYTHONPATH`` when its working folder is
        elsewhere).
    """
    flags = ([] if dashboard else ["--no-dashboard"]) + (
        ["--plain-trial-actors"] if plain_trial_actors else []
    )
    return [sys.executable, "-m", "tests.lean_script", *flags, *argv]


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` with ``argv`` as its ``sys.argv``, its Ray lean.

    Args:
        argv: ``[--no-dashboard] [--plain-trial-actors]``, then the script's path or
            ``-c CODE``, and its arguments.
    """
    dashboard = argv[:1] != ["--no-dashboard"]
    argv = argv[0 if dashboard else 1 :]
    plain = argv[:1] == ["--plain-trial-actors"]
    argv = argv[1 if plain else 0 :]
    with lean_head(dashboard=dashboard), _plain_trial_actors(plain):
        if argv[0] == "-c":  # as ``python -c``: sys.argv[0] is "-c", the code runs in __main__
            code, sys.argv = argv[1], ["-c", *argv[2:]]
            module = types.ModuleType("__main__")
            sys.modules["__main__"] = module
            exec(compile(code, "<string>", "exec"), module.__dict__)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")


def _plain_trial_actors(on: bool) -> contextlib.AbstractContextManager[None]:
    """fedtune's ``plain_trial_actors`` when ``on`` (it imports Ray Tune, which a script that
    uses Tune imports anyway), else nothing."""
    if not on:
        return contextlib.nullcontext()
    from fedtune.tuning.driver.ray_adapters import plain_trial_actors

    return plain_trial_actors()


if __name__ == "__main__":
    main(sys.argv[1:])
