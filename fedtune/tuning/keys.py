"""The keys of what a trial reports to Ray Tune each round, and of its config.

One vocabulary for everything that writes or reads those results: the trainables (one
configuration or a pack), the schedulers and stop rules, the searcher, the MLflow and progress
callbacks, and the service's sink. It imports nothing, so any of them may use it.
"""

from __future__ import annotations

__all__ = [
    "DECAYS",
    "DECAY_ROUNDS",
    "DEVICE",
    "HISTORY",
    "OBJECTIVE",
    "OUTCOME",
    "ROUND",
    "SMOOTH_WINDOW",
    "TRIAL_KEY",
    "trial_name",
]

TRIAL_KEY = "fedtune.trial"  # Optuna trial number, added to the Tune config by the searcher
ROUND = "round"
OUTCOME = "outcome"
OBJECTIVE = "objective"
HISTORY = "history"
DECAYS = "decays"
DECAY_ROUNDS = "decay_rounds"
DEVICE = "device"  # where a trial computes (each result; the MLflow run's tag)
SMOOTH_WINDOW = 5  # trailing window of ℓ for rounds-to-target (study and trade-off share it)


def trial_name(number: int) -> str:
    """A configuration's name, ``trial-<its Optuna number>``: its MLflow child run's, and its Ray
    Tune trial's when it has a process of its own."""
    return f"trial-{number:04d}"
