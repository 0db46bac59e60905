"""`fedtune spaces [NAME]`: the search spaces (shipped, and those user algorithms' parts
declare), or one of them as YAML; ``--hparams`` lists an algorithm's declared hyperparameters."""

from __future__ import annotations

import argparse

from .common import add_code_options, load_code_options

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "spaces",
        help="list search spaces (shipped and declared by algorithms), or print one",
        description="Without NAME: one line per shipped search space, then one per registered "
        "algorithm that no shipped space lists (its space is declared by its parts), with "
        "where it came from. With NAME (a shipped space, a YAML file or an algorithm): the "
        "file as written, or with --resolved the validated space after `extends`, with its "
        "fingerprint; an algorithm prints its default space. --hparams NAME: the algorithm's "
        "declared hyperparameters (type, default, bounds, search entry). --study/--code "
        "import user code first.",
    )
    parser.add_argument("name", nargs="?", help="shipped space, YAML file or algorithm name")
    parser.add_argument(
        "--resolved", action="store_true", help="print the merged, validated space instead"
    )
    parser.add_argument(
        "--hparams", action="store_true", help="list the algorithm NAME's declared hyperparameters"
    )
    add_code_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from fedtune.search_spaces import SHIPPED_DIR, load_space

    load_code_options(args)
    if not args.name:
        print(_listing())
        return 0
    if args.hparams:
        print(_hparams_table(args.name))
        return 0
    text = args.name
    is_file = "/" in text or text.endswith((".yaml", ".yml")) or Path(text).is_file()
    if not is_file and not (SHIPPED_DIR / f"{text}.yaml").is_file() and _is_algorithm(text):
        space = _declared(text)
        print(f"# {space.description} ({_origin(text)})")
        print(yaml.safe_dump(space.to_dict(), sort_keys=False, allow_unicode=True), end="")
        return 0
    space = load_space(args.name)  # validates; ConfigError -> exit 2 in fedtune.cli.main
    if args.resolved:
        print(f"# fingerprint: {space.fingerprint()}")
        print(yaml.safe_dump(space.to_dict(), sort_keys=False, allow_unicode=True), end="")
    else:
        print(Path(space.source).read_text(), end="")
    return 0


def _listing() -> str:
    from fedtune.search_spaces import declared_space, shipped_spaces
    from fedtune.trainers.algorithms.registry import REGISTRY

    from .tasks import rows_table

    spaces = shipped_spaces()
    rows = [(name, "builtin", space.description) for name, space in spaces.items()]
    listed = {a for s in spaces.values() for a in s.algorithms} | set(spaces)
    for name, recipe in sorted(REGISTRY.all().items()):
        if name not in listed:
            space = declared_space(recipe)
            about = space.description if space else "its parts declare no search space"
            rows.append((name, _origin(name), about))
    return rows_table(rows)


def _is_algorithm(name: str) -> bool:
    from fedtune.trainers.algorithms.registry import REGISTRY

    return name in REGISTRY.all()


def _origin(name: str) -> str:
    from fedtune.trainers.algorithms.registry import algorithm_origin

    return str(algorithm_origin(name))


def _declared(name: str):
    from fedtune.errors import ConfigError
    from fedtune.search_spaces import default_space

    space = default_space(name)
    if space is None:
        raise ConfigError("name", f"algorithm {name!r}: its parts declare no search space")
    return space


def _hparams_table(name: str) -> str:
    """One line per declared hyperparameter of algorithm ``name``."""
    from fedtune.search_spaces import space_entry
    from fedtune.trainers.algorithms.registry import get_recipe

    recipe = get_recipe(name)
    values = recipe.hparams_type()
    rows = [("name", "type", "default", "bounds", "set by", "search", "meaning")]
    for key, h in recipe.declared.items():
        kind = h.type.__name__ if h.choices is None else "|".join(map(str, h.choices))
        bounds = h.bounds_text() if h.bounds is not None and h.choices is None else "-"
        role = "fixed" if key in recipe.fixed else "study" if key in recipe.params else "-"
        entry = space_entry(h, recipe) if key in recipe.params else None
        search = "-" if entry is None else _entry_text(entry)
        rows.append((key, kind, repr(getattr(values, key)), bounds, role, search, h.doc))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:6], widths, strict=False)) + "  " + r[6]
        for r in rows
    ).rstrip()


def _entry_text(entry: dict) -> str:
    if entry["type"] == "categorical":
        text = "{" + ", ".join(map(str, entry["choices"])) + "}"
    else:
        text = f"[{entry['low']}, {entry['high']}]" + (" log" if entry["log"] else "")
    return text + ("" if entry["enabled"] else " (off)")
