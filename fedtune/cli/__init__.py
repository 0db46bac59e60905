"""`fedtune` command line.

Each verb lives in its own module ``fedtune/cli/<verb>.py`` exposing
``register(subparsers) -> None``; the parser it adds sets ``func(args) -> int``.
Heavy imports (torch, Ray, MLflow) happen inside ``func`` so ``fedtune --help`` is instant.
Invalid input is reported as one line on stderr with exit code 2 (``ConfigError``/``DataError``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from typing import NoReturn

from fedtune.errors import ConfigError, DataError, FedtuneError

__all__ = ["main"]

#: verb modules, in the order `fedtune --help` lists them; a module that is absent is skipped
VERBS = (
    "train",
    "tune",
    "spaces",
    "tasks",
    "algorithms",
    "frontier",
    "reproduce",
    "serve",
    "remote",
    "worker",
    "db",
    "users",
    "manifest",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"fedtune: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedtune", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for verb in VERBS:
        try:
            module = importlib.import_module(f"fedtune.cli.{verb}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("fedtune.cli"):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the verb of ``argv`` (default: the command line); its exit code.

    Called as the process's entry point (``argv`` None) for a verb that sets the parser
    default ``fast_exit`` (``tune``), the process ends here through :func:`exit_now`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code = _run(args)
    if argv is None and getattr(args, "fast_exit", False):
        exit_now(code)
    return code


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except (ConfigError, DataError) as exc:
        print(f"fedtune: error: {exc}", file=sys.stderr)
        return 2
    except FedtuneError as exc:
        print(f"fedtune: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fedtune: interrupted", file=sys.stderr)
        return 130


def exit_now(code: int) -> NoReturn:
    """End the process as a normal exit does — non-daemon threads joined, ``atexit`` handlers
    run (logging flushed, Ray's shutdown hook), stdout/stderr flushed — but without the
    interpreter's teardown of every module, which after a study (torch, Ray, MLflow loaded)
    took 2 s of a 2-trial study's 17 s (issue 21 req. 3, ``benchmarks/startup.py --whole``)."""
    import atexit
    import os
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # what interpreter exit does first
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
