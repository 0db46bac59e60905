"""The local-update engine: pure PyTorch, no Ray, no MLflow, no HTTP.

Entry point: :func:`run_trial` (``config -> TrialResult``) or :class:`Trainer` for round-by-round
control and checkpoints.
"""

from .algorithms import algorithms, get_recipe
from .config import (
    DecayConfig,
    TaskConfig,
    TrainConfig,
    TrialConfig,
    apply_overrides,
)
from .engine import Trainer, pick_device, run_trial
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
