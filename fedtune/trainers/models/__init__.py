"""Model factories by name: ``build_model(name, input_shape, num_outputs, generator)``.

``basic`` holds the small models of the built-in tasks (linear, MLP, small CNN); ``paper`` the
models of the papers' experiments (docs/explanation/algorithms.md §7.2). Models avoid dropout and
BatchNorm so that they are pure functions of (parameters, inputs) and vmap over clients.
"""

from .registry import build_model, model_names, register_model

__all__ = ["build_model", "model_names", "register_model"]
