"""Registered algorithms (recipes built from composable parts)."""

from .base import (
    Algorithm,
    Cohort,
    MeasuringAlgorithm,
    RoundContext,
    ServerState,
    tree_norm,
    weighted_mean,
)
from .local_update import LocalUpdate
from .registry import Recipe, algorithms, get_recipe, register, resolve

__all__ = [
    "Algorithm",
    "Cohort",
    "LocalUpdate",
    "MeasuringAlgorithm",
    "Recipe",
    "RoundContext",
    "ServerState",
    "algorithms",
    "get_recipe",
    "register",
    "resolve",
    "tree_norm",
    "weighted_mean",
]
