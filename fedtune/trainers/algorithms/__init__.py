"""Registered algorithms (recipes built from composable parts).

The registry and the recipes are imported with the package (they are metadata: no torch); the
engine's parts named here (:class:`Algorithm`, :class:`LocalUpdate`, …) are imported when first
used, so that validating a study spec does not import torch.
"""

from fedtune.lazy import lazy_attributes

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

__getattr__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(
            (
                "Algorithm",
                "Cohort",
                "MeasuringAlgorithm",
                "RoundContext",
                "ServerState",
                "tree_norm",
                "weighted_mean",
            ),
            "base",
        ),
        "LocalUpdate": "local_update",
    },
)
