"""``fedtune init [NAME ...]``: write example study files into a folder, from the installed package.

    fedtune init                       # every example, into the current folder
    fedtune init quickstart --dir lab  # lab/quickstart.yaml

A light install (``pip install fedtune``) has no checkout, and so no ``examples/`` folder; the
examples ship in the package (``fedtune/examples/``, which the checkout's ``examples/`` files
link to), so the quick start's ``fedtune submit quickstart.yaml`` works anywhere. An existing file
is kept unless ``--force``: an edited study is never overwritten by mistake.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources

__all__ = ["EXAMPLES", "register"]

#: example name -> (file in ``fedtune/examples``, what it is)
EXAMPLES = {
    "quickstart": (
        "quickstart.yaml",
        "FedAvgM on non-IID digits, 16 trials: the quick start (`fedtune tune` or `submit`)",
    ),
    "study-of-methods": (
        "study-of-methods.yaml",
        "FedAvg against FedSGD on one quadratic, compared (`fedtune tune`)",
    ),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "init",
        help="write example study files into a folder",
        description="Write example study files, shipped in the package, into a folder: "
        + "; ".join(f"{name}: {what}" for name, (_, what) in EXAMPLES.items())
        + ".",
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"the examples to write ({', '.join(EXAMPLES)}; default: all)",
    )
    p.add_argument("--dir", default=".", help="the folder to write into (default: here)")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    unknown = [n for n in args.names if n not in EXAMPLES]
    if unknown:
        print(
            f"fedtune: error: NAME: no example {unknown[0]!r} (examples: {', '.join(EXAMPLES)})",
            file=sys.stderr,
        )
        return 2
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    shipped = resources.files("fedtune") / "examples"
    for name in args.names or list(EXAMPLES):
        file, _ = EXAMPLES[name]
        target = folder / file
        if target.exists() and not args.force:
            print(f"kept {target} (it exists; --force overwrites it)")
            continue
        target.write_text((shipped / file).read_text(encoding="utf-8"), encoding="utf-8")
        print(f"wrote {target}")
    return 0
