"""`fedtune` command line.

Each verb lives in its own module ``fedtune/cli/<verb>.py`` exposing
``register(subparsers) -> None``; the parser it adds sets ``func(args) -> int``.
Heavy imports (torch, Ray, MLflow) happen inside ``func`` so ``fedtune --help`` is instant.
Invalid input is reported as one line on stderr with exit code 2 (``ConfigError``/``DataError``).
A verb whose extra is not installed (``fedtune tune`` in the light install, ``pip install
fedtune``) stops before its work with one line naming the extra to install, exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import textwrap
from typing import Any, NoReturn

from fedtune.errors import ConfigError, DataError, FedtuneError
from fedtune.redact import scrub_text

__all__ = ["main"]

#: verb modules, in the order `fedtune --help` lists them; a module that is absent is skipped
VERBS = (
    "init",
    "train",
    "tune",
    "compare",
    "spaces",
    "tasks",
    "algorithms",
    "frontier",
    "reproduce",
    "serve",
    "mlflow_server",
    "remote",
    "worker",
    "db",
    "users",
    "manifest",
)


DESCRIPTION = "Hyperparameter tuning for local-update federated and meta-learning methods."

#: ``fedtune --help`` lists the verbs under these headings, in this order; a verb in none of them
#: (``worker``: the service starts it) is not listed but runs
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("getting started", ("init",)),
    (
        "local work",
        (
            "tune",
            "compare",
            "train",
            "spaces",
            "tasks",
            "algorithms",
            "frontier",
            "reproduce",
            "manifest",
        ),
    ),
    (
        "the service's client",
        (
            "submit",
            "status",
            "studies",
            "wait",
            "cancel",
            "trials",
            "tradeoff",
            "whoami",
            "mlflow-login",
        ),
    ),
    ("administration", ("serve", "mlflow-server", "db", "users", "projects")),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"fedtune: error: {message}\n")


class _TopParser(_Parser):
    """The ``fedtune`` parser: its help lists the verbs by :data:`GROUPS`."""

    verbs: dict[str, str]

    def format_help(self) -> str:
        from fedtune.client_settings import CLIENT_SETTINGS

        lines = [self.format_usage().rstrip(), "", self.description or "", ""]
        width = max(len(v) for v in self.verbs) + 2
        for title, names in GROUPS:
            shown = [n for n in names if n in self.verbs]
            if shown:
                lines += [f"{title}:", *(f"  {n:<{width}}{self.verbs[n]}" for n in shown), ""]
        listed = {n for _, names in GROUPS for n in names}
        rest = [n for n in self.verbs if n not in listed]
        if rest:
            lines += ["other:", *(f"  {n:<{width}}{self.verbs[n]}" for n in rest), ""]
        lines += [
            "options:",
            "  -h, --help  show this help message and exit",
            "  --version   print the version and exit",
            "",
            "The service's client verbs take --url, --token and --project:",
        ]
        for setting in CLIENT_SETTINGS:
            lines += textwrap.wrap(
                setting.describe(),
                100,
                initial_indent=f"  {setting.option:<10}",
                subsequent_indent=" " * 12,
            )
        lines += [
            "",
            "The service's client verbs need only `pip install fedtune`; local work needs",
            "'fedtune[tune]', administration 'fedtune[service]'. `fedtune VERB --help`",
            "describes a verb.",
        ]
        return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The ``fedtune`` parser, with every verb whose module is present.

    Returns:
        The parser; its help lists the verbs by :data:`GROUPS` and the client settings of
        :data:`fedtune.client_settings.CLIENT_SETTINGS`.
    """
    from fedtune import __version__

    parser = _TopParser(
        prog="fedtune", description=DESCRIPTION, usage="fedtune [-h] [--version] VERB ..."
    )
    parser.add_argument("--version", action="version", version=f"fedtune {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser, prog="fedtune")
    for verb in VERBS:
        try:
            module = importlib.import_module(f"fedtune.cli.{verb}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("fedtune.cli"):
                continue
            raise
        module.register(sub)
    # the verbs registered with a help line (``worker`` has none: internal)
    parser.verbs = {a.dest: a.help or "" for a in sub._choices_actions}
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the verb of ``argv`` (default: the command line).

    Called as the process's entry point (``argv`` None) for a verb that sets the parser
    default ``fast_exit`` (``tune``), the process ends here through :func:`exit_now`, and one
    that sets ``start_gc`` starts with the cyclic collector paused (:func:`_run_started`). Output
    into a pipe that closes early (``fedtune tasks | head``) ends the process quietly, as a
    SIGPIPE ends ``ls``.

    Args:
        argv: the arguments after ``fedtune`` (None: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 done, 1 failed, 2 bad input or a verb this install lacks the extra of.
    """
    if sys.excepthook is sys.__excepthook__:  # a traceback shows no URI's password
        sys.excepthook = _scrubbed_excepthook
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        code = _run_started(args) if argv is None else _run(args)
        sys.stdout.flush()  # a closed pipe surfaces here, not in the interpreter's teardown
    except BrokenPipeError:
        return _broken_pipe()
    if argv is None and getattr(args, "fast_exit", False):
        exit_now(code)
    return code


def _run_started(args: argparse.Namespace) -> int:
    """:func:`_run` as the process's entry point: a verb that sets the parser default
    ``start_gc`` (a study's driver, the service) runs its start with Python's cyclic collector
    paused (``fedtune.tuning.common.start_gc``); a caller's own process is left alone.

    Args:
        args: The parsed arguments.

    Returns:
        The exit code.
    """
    if not getattr(args, "start_gc", False):
        return _run(args)
    from fedtune.tuning.common import start_gc

    start_gc.pause()  # resumed where the start ends (the tuner, the app's lifespan), or here
    try:
        return _run(args)
    finally:
        start_gc.resume()


def _scrubbed_excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """Print an uncaught exception's traceback as Python does, with :func:`scrub_text` on it.

    Args:
        kind: The exception's class.
        exc: The exception.
        tb: Its traceback.
    """
    import traceback

    sys.stderr.write(scrub_text("".join(traceback.format_exception(kind, exc, tb))))
    sys.stderr.flush()


#: the exit code of a process that SIGPIPE ended (128 + 13), as the shell reports ``ls | head``
EXIT_BROKEN_PIPE = 141


def _broken_pipe() -> int:
    """The reader of stdout went away: no traceback, and no second error when Python flushes
    stdout at exit (it now points at ``/dev/null``)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError):
        os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _run(args: argparse.Namespace) -> int:
    from .common import missing_extra

    verb = getattr(args, "verb", None)
    needed = getattr(args, "needs_extra", None)  # a verb whose extra depends on its options
    needs = missing_extra(verb) if needed is None or needed(args) else None
    if needs is not None:
        print(f"fedtune: error: {needs}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (ConfigError, DataError) as exc:
        print(f"fedtune: error: {scrub_text(str(exc))}", file=sys.stderr)
        return 2
    except FedtuneError as exc:
        print(f"fedtune: error: {scrub_text(str(exc))}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        needs = missing_extra(verb, exc.name or "")
        if needs is None:
            raise
        print(f"fedtune: error: {needs}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedtune: interrupted", file=sys.stderr)
        return 130


def exit_now(code: int) -> NoReturn:
    """End the process as a normal exit does — non-daemon threads joined, ``atexit`` handlers
    run (logging flushed, Ray's shutdown hook), stdout/stderr flushed — but without the
    interpreter's teardown of every module, which after a study (torch, Ray, MLflow loaded)
    took 2 s of a 2-trial study's 17 s (``benchmarks/startup.py --whole``)."""
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
