"""``python -m tests.lean_script [--no-dashboard] SCRIPT [ARG ...]`` (or ``-c CODE [ARG ...]``):
run a script (or code, as ``python -c`` does) as ``__main__`` with every in-process ``ray.init``
of it starting a lean head (``tests/ray_start.py``: no log or autoscaler monitor, dashboard
agents sampling every 60 s; ``--no-dashboard``: nor the dashboard's web UI modules), for tests
that run a script which starts its own Ray and reads no node metrics or worker logs."""

from __future__ import annotations

import runpy
import sys
import types

from tests.ray_start import lean_head


def command(*argv: str, dashboard: bool = True) -> list[str]:
    """The command that runs ``argv`` under this module, with this Python.

    Args:
        argv: A script's path and its arguments, or ``-c``, the code and its arguments.
        dashboard: ``False``: the head without the dashboard's web UI modules.

    Returns:
        ``python -m tests.lean_script [--no-dashboard] ARGV...`` (the child needs the repository
        root on its ``PYTHONPATH`` when its working folder is elsewhere).
    """
    flags = [] if dashboard else ["--no-dashboard"]
    return [sys.executable, "-m", "tests.lean_script", *flags, *argv]


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` with ``argv`` as its ``sys.argv``, its Ray lean.

    Args:
        argv: ``[--no-dashboard]``, then the script's path or ``-c CODE``, and its arguments.
    """
    dashboard = argv[:1] != ["--no-dashboard"]
    argv = argv[0 if dashboard else 1 :]
    with lean_head(dashboard=dashboard):
        if argv[0] == "-c":  # as ``python -c``: sys.argv[0] is "-c", the code runs in __main__
            code, sys.argv = argv[1], ["-c", *argv[2:]]
            module = types.ModuleType("__main__")
            sys.modules["__main__"] = module
            exec(compile(code, "<string>", "exec"), module.__dict__)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
