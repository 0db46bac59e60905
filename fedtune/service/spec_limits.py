"""What one submitted study may ask of a multi-user server (checked on the parsed spec, after
``StudySpec.parse`` has checked its shape and before ``StudySpec.check`` validates it in depth,
so an oversized spec never reaches the costly part: the search space, the recipe and the trial
configurations of every bound).

Every refusal is ``ConfigError(field, reason)`` (→ 422 naming the dotted field):

* **no file of the server is read on a client's behalf**: ``search.space`` entries must be names
  of the spaces shipped in ``fedtune/search_spaces`` (the check compares names; nothing is
  opened), and task data paths (``task.train_path``, ``task.test_path``, ``task.path`` and any
  task key named ``path``/``*_path``/``*_dir``/``*_root``/``*_file``) must lie under one of the
  operator's ``FEDTUNE_DATA_ROOTS`` once symlinks and ``..`` are resolved (no roots: no paths);
* **sizes** are bounded by settings (typo guards such as ``rounds: 1e12``): ``budget.trials``,
  ``train.rounds`` and ``train.eval_every``, ``task.clients`` and ``train.clients_per_round``,
  ``task.dim``, ``train.local_steps``, ``train.local_epochs``, ``train.batch_size``, ``seed``,
  ``seeds`` and ``task.seed``, ``budget.max_concurrent``, ``resources.cpu``/``gpu``, and the
  search space itself — choices (and grid values) per parameter and parameters per spec, which
  keeps validation cheap. A searched size (``search.parameters.rounds.high``) is bounded like a
  fixed one. A size is checked where the spec writes it (a default is the server's own);
* **a budget in compute** stays within what the service runs: ``budget.configuration_rounds``
  at most ``FEDTUNE_MAX_TRIALS × FEDTUNE_MAX_ROUNDS``, ``budget.time`` at most
  ``FEDTUNE_STUDY_DEADLINE_S``. A study with such a budget and no ``budget.trials`` runs at most
  ``FEDTUNE_MAX_TRIALS`` trials (the driver's target).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.errors import ConfigError
from fedtune.search_spaces import SHIPPED_DIR, resolve_path

if TYPE_CHECKING:
    from fedtune.search_spaces import ParamDecl
    from fedtune.trainers.config import TaskConfig
    from fedtune.tuning.spec import SearchSpec, StudySpec

    from .settings import Settings

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


def check_spaces(search: SearchSpec) -> None:
    """Refuse ``search.space`` entries that are not shipped spaces (compared by name).

    Args:
        search: The spec's parsed ``search`` section.

    Raises:
        ConfigError: ``search.space`` (or ``search.space[i]``) names another space.
    """
    spaces = list(search.space or ())
    shipped = sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))
    for i, name in enumerate(spaces):
        if name not in shipped:
            raise ConfigError(
                _field("search.space", spaces, i),
                f"{name[:80]!r} is not a shipped space ({', '.join(shipped)}); the service reads "
                "no files of its own: inline a space with search.parameters",
            )


def is_data_path_key(key: str) -> bool:
    """Tell whether a task key names a file or directory of data.

    Args:
        key: The key of the spec's ``task`` section.

    Returns:
        True for ``path`` and the keys ending in ``_path``, ``_dir``, ``_root`` or ``_file``.
    """
    return key == "path" or key.endswith(_PATH_SUFFIXES)


def check_data_paths(task: TaskConfig, search: SearchSpec, roots: list[Path]) -> None:
    """Refuse task data paths (fixed, or a searched choice) outside every data root.

    Args:
        task: The spec's parsed ``task`` section.
        search: The spec's parsed ``search`` section.
        roots: The operator's data roots (``FEDTUNE_DATA_ROOTS``).

    Raises:
        ConfigError: A path is not an absolute path under a root, symlinks resolved.
    """
    for key, value in task.params.items():
        if isinstance(key, str) and is_data_path_key(key) and value is not None:
            _check_path(f"task.{key}", value, roots)
    for field, entry, path in _searched(search):
        section, _, key = path.partition(".")
        if section == "task" and is_data_path_key(key):
            for i, value in enumerate(entry.choices or ()):
                if value is not None:
                    _check_path(f"{field}.choices[{i}]", value, roots)
            if entry.default is not None:
                _check_path(f"{field}.default", entry.default, roots)


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


# (dotted field, setting); a field of one name is a top-level field
_FIXED = (
    ("budget.trials", "max_trials"),
    ("train.rounds", "max_rounds"),
    ("train.eval_every", "max_rounds"),
    ("train.local_steps", "max_local_steps"),
    ("train.local_epochs", "max_local_epochs"),
    ("train.batch_size", "max_batch_size"),
    ("seed", "max_seed"),
    ("task.seed", "max_seed"),
    ("train.clients_per_round", "max_clients"),
    ("task.clients", "max_clients"),
    ("task.dim", "max_dim"),
    ("budget.max_concurrent", "max_concurrent_trials"),
    ("resources.cpu", "max_trial_cpu"),
    ("resources.gpu", "max_trial_gpu"),
)
#: searchable sizes (config path -> setting): all but the study-level budget and resources
_SEARCHED = {
    field: setting
    for field, setting in _FIXED
    if field.split(".")[0] not in ("budget", "resources")
}


def _written(spec: StudySpec, field: str) -> Any:
    """The value the spec writes at ``field`` (None where it writes none)."""
    section, _, key = field.rpartition(".")
    if not section:
        return getattr(spec, key)
    if section in ("budget", "resources"):
        part = getattr(spec, section)
        return getattr(part, key) if key in part.model_fields_set else None
    if key not in spec.given(section):
        return None
    if section == "task" and key != "seed":
        return spec.task.params[key]
    return getattr(getattr(spec, section), key)


def check_sizes(spec: StudySpec, settings: Settings) -> None:
    """Refuse sizes beyond the settings' limits (see the module docstring).

    Args:
        spec: The spec, its shape checked (``StudySpec.parse``).
        settings: The service's settings (``max_rounds`` and the other ``max_*``).

    Raises:
        ConfigError: The first size beyond its limit, named by its dotted path.
    """
    for field, setting in _FIXED:
        _at_most(field, _written(spec, field), getattr(settings, setting), setting)
    _check_compute(spec, settings)
    for i, seed in enumerate(spec.seeds or ()):
        _at_most(f"seeds[{i}]", seed, settings.max_seed, "max_seed")
    entries = list(_searched(spec.search))
    if len(entries) > settings.max_search_parameters:
        raise ConfigError(
            entries[settings.max_search_parameters][0],
            f"more than {settings.max_search_parameters} searched parameters "
            "(FEDTUNE_MAX_SEARCH_PARAMETERS)",
        )
    for field, entry, path in entries:
        for key in ("choices", "grid"):
            values = getattr(entry, key)
            if isinstance(values, tuple) and len(values) > settings.max_choices:
                raise ConfigError(
                    f"{field}.{key}",
                    f"{len(values)} values; at most {settings.max_choices} (FEDTUNE_MAX_CHOICES)",
                )
        setting = _SEARCHED.get(path)
        if setting is not None:
            limit = getattr(settings, setting)
            for key in ("high", "low", "default"):
                _at_most(f"{field}.{key}", getattr(entry, key), limit, setting)
            for i, value in enumerate(entry.choices or ()):
                _at_most(f"{field}.choices[{i}]", value, limit, setting)


def _at_most(field: str, value: Any, limit: float, setting: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
        raise ConfigError(field, f"must be at most {limit:g} (FEDTUNE_{setting.upper()})")


def _searched(search: SearchSpec) -> Iterator[tuple[str, ParamDecl, str]]:
    """``(field, entry, config path)`` of every entry of search.parameters/override."""
    for block, entries in (("parameters", search.parameters), ("override", search.override)):
        for name, entry in (entries or {}).items():
            if entry is not None:
                yield f"search.{block}.{name}", entry, resolve_path(name) or name


def _check_compute(spec: StudySpec, settings: Settings) -> None:
    """A budget in compute within what the service would run: ``budget.configuration_rounds``
    at most ``FEDTUNE_MAX_TRIALS`` trials of ``FEDTUNE_MAX_ROUNDS`` rounds, ``budget.time``
    at most ``FEDTUNE_STUDY_DEADLINE_S`` (the scheduler stops every study then)."""
    budget = spec.budget
    most = settings.max_configuration_rounds
    if budget.configuration_rounds is not None and budget.configuration_rounds > most:
        raise ConfigError(
            "budget.configuration_rounds",
            f"must be at most {most} (FEDTUNE_MAX_TRIALS × FEDTUNE_MAX_ROUNDS)",
        )
    deadline = settings.study_deadline_s
    if budget.time is not None and deadline and budget.time > deadline:
        raise ConfigError(
            "budget.time",
            f"must be at most {deadline} s (FEDTUNE_STUDY_DEADLINE_S: the service stops every "
            "study then)",
        )


def describe_limits(settings: Settings) -> str:
    """This server's limits on a spec, as Markdown (the OpenAPI description of the submit)."""
    roots = ", ".join(f"`{r}`" for r in settings.data_roots) or "none: no data paths accepted"
    rows = [
        ("budget.trials", settings.max_trials, "FEDTUNE_MAX_TRIALS"),
        (
            "budget.configuration_rounds",
            settings.max_configuration_rounds,
            "FEDTUNE_MAX_TRIALS × FEDTUNE_MAX_ROUNDS",
        ),
        (
            "budget.time (seconds; 0: no limit)",
            settings.study_deadline_s,
            "FEDTUNE_STUDY_DEADLINE_S",
        ),
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
