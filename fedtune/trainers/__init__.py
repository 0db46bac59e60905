"""The local-update engine: pure PyTorch, no Ray, no MLflow, no HTTP.

Entry point: :func:`run_trial` (``config -> TrialResult``) or :class:`Trainer` for round-by-round
control and checkpoints.

Importing the package, or its configuration and registries, does not import torch: the
registries hold the built-ins' metadata (names, parameters, defaults) and import an
implementation when it is built, and :func:`run_trial`, :class:`Trainer` and :func:`pick_device`
are imported from :mod:`.engine` when first used. Validating a study spec therefore never
imports the engine (docs/explanation/architecture.md §1).
"""

from fedtune.lazy import lazy_attributes

from .algorithms import algorithms, get_recipe
from .config import (
    DecayConfig,
    TaskConfig,
    TrainConfig,
    TrialConfig,
    apply_overrides,
)
from .parsing import parse_trial_config
from .records import Outcome, RoundRecord, TrialResult
from .tasks import build_task, task_names, tasks

__all__ = [
    "DecayConfig",
    "Outcome",
    "RoundRecord",
    "TaskConfig",
    "TrainConfig",
    "Trainer",
    "TrialConfig",
    "TrialResult",
    "algorithms",
    "apply_overrides",
    "build_task",
    "get_recipe",
    "parse_trial_config",
    "pick_device",
    "run_trial",
    "task_names",
    "tasks",
]

__getattr__ = lazy_attributes(
    __name__, dict.fromkeys(("Trainer", "pick_device", "run_trial"), "engine")
)
