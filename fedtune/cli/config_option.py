"""``--config FILE``: a settings file (``fedtune.service.config_file``) for a verb's options.

``argparse`` cannot tell an option given on the command line from its default, yet the file
must win over the default and lose to the option. :func:`add_config_option` therefore takes the
defaults of the options the file may set off the parser and keeps them aside;
:func:`apply_config` then fills each option not given: from its variable (left to the verb),
else from the file, else from its default, a relative path default (``./mlflow-server``) being
relative to the file's folder when there is a file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedtune.service.config_file import MLFLOW_KEYS, SERVE_OPTIONS

__all__ = ["add_config_option", "apply_config"]

#: the options each section of the file may set (their parser ``dest``: the keys' names)
SECTION_OPTIONS = {"serve": SERVE_OPTIONS, "mlflow": tuple(MLFLOW_KEYS)}


def add_config_option(parser: argparse.ArgumentParser, section: str) -> None:
    """Add ``--config FILE`` to a verb whose options the file's ``[section]`` may set.

    Args:
        parser: The verb's parser, with its other options already added.
        section: ``serve`` or ``mlflow``.
    """
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"a settings file (TOML): its [{section}] section sets what no option or variable "
        "does; relative paths in it are relative to its folder (FEDTUNE_CONFIG)",
    )
    defaults: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest in SECTION_OPTIONS[section] and action.default is not None:
            defaults[action.dest] = action.default
            action.default = None  # "not given" is now None
    parser.set_defaults(config_section=section, config_defaults=defaults)


def apply_config(args: argparse.Namespace) -> Any:
    """Fill the options not given, from the settings file or their defaults.

    Args:
        args: The parsed arguments of a verb given :func:`add_config_option`.

    Returns:
        The loaded :class:`~fedtune.service.config_file.ConfigFile`, or None without one.

    Raises:
        ConfigError: The file cannot be read or is not valid (naming the key).
    """
    from fedtune.service.config_file import MLFLOW_ENV, config_path, load_config

    environ = _mlflow_environ() if args.config_section == "mlflow" else {}

    path = config_path(args.config)
    config = load_config(path) if path else None
    section = args.config_section
    from_file = config.options(section) if config is not None else {}
    for dest in SECTION_OPTIONS[section]:
        if not hasattr(args, dest) or getattr(args, dest) is not None:
            continue  # an option this verb lacks, or one given on the command line
        variable = MLFLOW_ENV.get(dest) if section == "mlflow" else None
        if variable and environ.get(variable):
            continue  # the verb reads the variable, which wins over the file
        if dest in from_file:
            setattr(args, dest, from_file[dest])
            continue
        default = args.config_defaults.get(dest)
        if config is not None and isinstance(default, Path) and not default.is_absolute():
            default = config.folder / default
        setattr(args, dest, default)
    return config


def _mlflow_environ() -> dict[str, str]:
    """What ``fedtune mlflow-server`` keeps of the environment (its store's variable among it)."""
    from fedtune.service.child_env import mlflow_server_env

    return mlflow_server_env()
