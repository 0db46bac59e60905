"""What one submitted study may ask of a multi-user server (checked on the raw body, before
``StudySpec`` validates it, so an oversized spec costs the server nothing).

Every refusal is ``ConfigError(field, reason)`` (→ 422 naming the dotted field):

* **no file of the server is read on a client's behalf**: ``search.space`` entries must be names
  of the spaces shipped in ``fedtune/search_spaces`` (the check compares names; nothing is
  opened), and task data paths (``task.train_path``, ``task.test_path``, ``task.path`` and any
  task key named ``path``/``*_path``/``*_dir``/``*_root``/``*_file``) must lie under one of the
  operator's ``FEDTUNE_DATA_ROOTS`` once symlinks and ``..`` are resolved (no roots: no paths);
* **sizes** are bounded by settings (typo guards such as ``rounds: 1e12``): ``budget.trials``,
  ``train.rounds`` and ``train.eval_every``, ``task.clients`` and ``train.clients_per_round``,
  ``task.dim``, ``train.local_steps``, ``train.local_epochs``, ``train.batch_size``, ``seed`` and
  ``task.seed``, ``budget.max_concurrent``, ``resources.cpu``/``gpu``, and the search space
  itself — choices
  (and grid values) per parameter and parameters per spec, which keeps validation cheap.
  A searched size (``search.parameters.rounds.high``) is bounded like a fixed one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedtune.errors import ConfigError
from fedtune.search_spaces import SHIPPED_DIR, resolve_path

__all__ = [
    "check_data_paths",
    "check_sizes",
    "check_spaces",
    "describe_limits",
    "is_data_path_key",
]

_PATH_SUFFIXES = ("_path", "_dir", "_root", "_file")


def _field(base: str, items: list[Any], index: int) -> str:
    return base if len(items) == 1 else f"{base}[{index}]"


def check_spaces(search: Any) -> None:
    """``search.space`` names only shipped spaces (compared by name, never opened)."""
    if not isinstance(search, Mapping):
        return
    spaces = search.get("space")
    spaces = [spaces] if isinstance(spaces, str) else spaces
    if not isinstance(spaces, list):
        return
    shipped = sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))
    for i, name in enumerate(spaces):
        if name not in shipped:
            shown = repr(name)[:80] if isinstance(name, str) else type(name).__name__
            raise ConfigError(
                _field("search.space", spaces, i),
                f"{shown} is not a shipped space ({', '.join(shipped)}); the service reads no "
                "files of its own: inline a space with search.parameters",
            )


def is_data_path_key(key: str) -> bool:
    """Task keys that name a file or directory of data."""
    return key == "path" or key.endswith(_PATH_SUFFIXES)


def check_data_paths(task: Any, search: Any, roots: list[Path]) -> None:
    """Every task data path (fixed, or a searched choice) lies under one of ``roots``."""
    if isinstance(task, Mapping):
        for key, value in task.items():
            if isinstance(key, str) and is_data_path_key(key) and value is not None:
                _check_path(f"task.{key}", value, roots)
    for field, entry, path in _searched(search):
        section, _, key = path.partition(".")
        if section == "task" and is_data_path_key(key):
            for i, value in enumerate(_listed(entry, "choices")):
                if value is not None:
                    _check_path(f"{field}.choices[{i}]", value, roots)
            if entry.get("default") is not None:
                _check_path(f"{field}.default", entry["default"], roots)


def _check_path(field: str, value: Any, roots: list[Path]) -> None:
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(field, "must be a non-empty path string")
    if not roots:
        raise ConfigError(
            field, "this service accepts no data paths (the operator sets FEDTUNE_DATA_ROOTS)"
        )
    if not os.path.isabs(value):
        raise ConfigError(field, "must be an absolute path under a data root")
    real = Path(os.path.realpath(value))  # symlinks and `..` resolved before the check
    if not any(real.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        raise ConfigError(field, f"must lie under a data root ({shown}), symlinks resolved")


# (path in the raw spec, setting); a path of one key is a top-level field
_FIXED = (
    (("budget", "trials"), "max_trials"),
    (("train", "rounds"), "max_rounds"),
    (("train", "eval_every"), "max_rounds"),
    (("train", "local_steps"), "max_local_steps"),
    (("train", "local_epochs"), "max_local_epochs"),
    (("train", "batch_size"), "max_batch_size"),
    (("seed",), "max_seed"),
    (("task", "seed"), "max_seed"),
    (("train", "clients_per_round"), "max_clients"),
    (("task", "clients"), "max_clients"),
    (("task", "dim"), "max_dim"),
    (("budget", "max_concurrent"), "max_concurrent_trials"),
    (("resources", "cpu"), "max_trial_cpu"),
    (("resources", "gpu"), "max_trial_gpu"),
)
#: searchable sizes (config path -> setting): all but the study-level budget and resources
_SEARCHED = {
    ".".join(path): setting for path, setting in _FIXED if path[0] not in ("budget", "resources")
}


def check_sizes(data: Mapping[str, Any], settings: Any) -> None:
    """Sizes within the settings' limits (see the module docstring)."""
    for path, setting in _FIXED:
        *sections, key = path
        block = data.get(sections[0]) if sections else data
        if isinstance(block, Mapping):
            _at_most(".".join(path), block.get(key), getattr(settings, setting), setting)
    search = data.get("search")
    entries = list(_searched(search))
    if len(entries) > settings.max_search_parameters:
        raise ConfigError(
            entries[settings.max_search_parameters][0],
            f"more than {settings.max_search_parameters} searched parameters "
            "(FEDTUNE_MAX_SEARCH_PARAMETERS)",
        )
    for field, entry, path in entries:
        for key in ("choices", "grid"):
            values = entry.get(key)
            if isinstance(values, list) and len(values) > settings.max_choices:
                raise ConfigError(
                    f"{field}.{key}",
                    f"{len(values)} values; at most {settings.max_choices} (FEDTUNE_MAX_CHOICES)",
                )
        setting = _SEARCHED.get(path)
        if setting is not None:
            limit = getattr(settings, setting)
            for key in ("high", "low", "default"):
                _at_most(f"{field}.{key}", entry.get(key), limit, setting)
            for i, value in enumerate(_listed(entry, "choices")):
                _at_most(f"{field}.choices[{i}]", value, limit, setting)


def _at_most(field: str, value: Any, limit: float, setting: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
        raise ConfigError(field, f"must be at most {limit:g} (FEDTUNE_{setting.upper()})")


def _listed(entry: Mapping[str, Any], key: str) -> list[Any]:
    value = entry.get(key)
    if key == "default":
        return [] if value is None else [value]
    return list(value) if isinstance(value, list) else []


def _searched(search: Any):
    """``(field, raw entry, config path)`` of every entry of search.parameters/override."""
    if not isinstance(search, Mapping):
        return
    for block in ("parameters", "override"):
        entries = search.get(block)
        if not isinstance(entries, Mapping):
            continue
        for name, entry in entries.items():
            if isinstance(name, str) and isinstance(entry, Mapping):
                path = resolve_path(name)
                yield f"search.{block}.{name}", entry, path or name


def describe_limits(settings: Any) -> str:
    """This server's limits on a spec, as Markdown (the OpenAPI description of the submit)."""
    roots = ", ".join(f"`{r}`" for r in settings.data_roots) or "none: no data paths accepted"
    rows = [
        ("budget.trials", settings.max_trials, "FEDTUNE_MAX_TRIALS"),
        ("train.rounds", settings.max_rounds, "FEDTUNE_MAX_ROUNDS"),
        ("task.clients, train.clients_per_round", settings.max_clients, "FEDTUNE_MAX_CLIENTS"),
        ("task.dim", settings.max_dim, "FEDTUNE_MAX_DIM"),
        ("train.local_steps", settings.max_local_steps, "FEDTUNE_MAX_LOCAL_STEPS"),
        ("train.local_epochs", settings.max_local_epochs, "FEDTUNE_MAX_LOCAL_EPOCHS"),
        ("train.batch_size", settings.max_batch_size, "FEDTUNE_MAX_BATCH_SIZE"),
        ("train.eval_every", settings.max_rounds, "FEDTUNE_MAX_ROUNDS"),
        ("seed, task.seed", settings.max_seed, "FEDTUNE_MAX_SEED"),
        ("budget.max_concurrent", settings.max_concurrent_trials, "FEDTUNE_MAX_CONCURRENT_TRIALS"),
        ("resources.cpu", settings.max_trial_cpu, "FEDTUNE_MAX_TRIAL_CPU"),
        ("resources.gpu", settings.max_trial_gpu, "FEDTUNE_MAX_TRIAL_GPU"),
        (
            "choices (or grid values) of one searched parameter",
            settings.max_choices,
            "FEDTUNE_MAX_CHOICES",
        ),
        (
            "searched parameters (search.parameters + search.override)",
            settings.max_search_parameters,
            "FEDTUNE_MAX_SEARCH_PARAMETERS",
        ),
        (
            "submissions validated at once",
            settings.max_concurrent_validations,
            "FEDTUNE_MAX_CONCURRENT_VALIDATIONS",
        ),
        (
            "submissions waiting for validation (more: 503 busy)",
            settings.validation_queue,
            "FEDTUNE_VALIDATION_QUEUE",
        ),
        ("request body bytes (more: 413)", settings.max_request_bytes, "FEDTUNE_MAX_REQUEST_BYTES"),
    ]
    table = "\n".join(f"| {what} | {limit:g} | `{env}` |" for what, limit, env in rows)
    return (
        "**Limits of this server** (each refusal is a 422 whose `field` is the dotted path):\n\n"
        "| what | at most | setting |\n|---|---|---|\n"
        f"{table}\n\n"
        "`search.space` may name only shipped spaces (`GET /v1/search-spaces`); give other "
        "spaces inline with `search.parameters`. Task data paths (`task.train_path`, "
        "`task.test_path`, `task.path`, any `*_path`/`*_dir`/`*_root`/`*_file` key) must be "
        f"absolute and lie under a data root (`FEDTUNE_DATA_ROOTS`: {roots}) once symlinks "
        "and `..` are resolved. The server opens no file a spec names."
    )
