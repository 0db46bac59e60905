"""`fedtune tasks`: the registered tasks (built-in and user) with where each came from."""

from __future__ import annotations

import argparse

from .common import add_code_options, load_code_options

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tasks",
        help="list registered tasks and models (built-in, entry points, user code)",
        description="One line per task: name, origin (builtin, entry point DIST==VERSION, or "
        "code PATH) and description; then the models. --study/--code import user code first.",
    )
    parser.add_argument(
        "--params", metavar="NAME", help="list the parameters task NAME declares (type, default)"
    )
    add_code_options(parser)
    parser.set_defaults(func=run)


def rows_table(rows: list[tuple[str, str, str]]) -> str:
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows)


def run(args: argparse.Namespace) -> int:
    from fedtune.trainers.models.registry import REGISTRY as MODELS
    from fedtune.trainers.tasks.registry import REGISTRY as TASKS

    load_code_options(args)
    if args.params:
        return _params(args.params)
    tasks = TASKS.all()
    print(rows_table([(n, str(TASKS.origin(n)), t.description) for n, t in sorted(tasks.items())]))
    models = MODELS.all()
    print("\nmodels:")
    print(rows_table([(n, str(MODELS.origin(n)), "") for n in sorted(models)]))
    return 0


def _params(name: str) -> int:
    """``fedtune tasks --params NAME``: what ``task:`` may hold for task NAME."""
    from fedtune.trainers.tasks.registry import REGISTRY as TASKS
    from fedtune.trainers.tasks.registry import task_parameters

    info = TASKS.get(name)  # an unknown task: ConfigError, one line, exit 2
    rows = task_parameters(name)
    print(f"{name}: {info.description}")
    if not rows:
        print("  (it declares no parameters: they are checked when it is built)")
        return 0
    print(rows_table([("parameter", "type", "default"), *((n, t, repr(d)) for n, t, d in rows)]))
    validate = getattr(info.params, "validate", None)
    if validate is not None:
        print("(ranges are checked by its validate(); an out-of-range value names the field)")
    return 0
