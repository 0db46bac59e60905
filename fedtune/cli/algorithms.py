"""`fedtune algorithms`: the registered algorithms (built-in and user) with their origin."""

from __future__ import annotations

import argparse

from .common import add_code_options, load_code_options
from .tasks import rows_table

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "algorithms",
        help="list registered algorithms (built-in, entry points, user code)",
        description="One line per algorithm: name, origin (builtin, entry point DIST==VERSION, "
        "or code PATH) and summary. --study/--code import user code first.",
    )
    add_code_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fedtune.trainers.algorithms.registry import REGISTRY

    load_code_options(args)
    recipes = REGISTRY.all()
    rows = [(n, str(REGISTRY.origin(n)), r.summary) for n, r in sorted(recipes.items())]
    print(rows_table(rows))
    return 0
