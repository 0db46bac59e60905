"""`fedtune spaces [NAME]`: list the shipped search spaces, or print one as YAML."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "spaces",
        help="list shipped search spaces, or print one",
        description="Without NAME: one line per shipped search space. With NAME (a shipped "
        "space or a YAML file): the file as written, or with --resolved the validated space "
        "after `extends`, with its fingerprint.",
    )
    parser.add_argument("name", nargs="?", help="shipped space name or path to a YAML file")
    parser.add_argument(
        "--resolved", action="store_true", help="print the merged, validated space instead"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from fedtune.search_spaces import load_space, shipped_spaces

    if not args.name:
        spaces = shipped_spaces()
        width = max(len(n) for n in spaces)
        for name, space in spaces.items():
            print(f"{name:<{width}}  {space.description}")
        return 0
    space = load_space(args.name)  # validates; ConfigError -> exit 2 in fedtune.cli.main
    if args.resolved:
        print(f"# fingerprint: {space.fingerprint()}")
        print(yaml.safe_dump(space.to_dict(), sort_keys=False, allow_unicode=True), end="")
    else:
        print(Path(space.source).read_text(), end="")
    return 0
