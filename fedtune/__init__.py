"""fedtune: hyperparameter tuning for local-update federated and meta-learning methods.

* :mod:`fedtune.trainers` — the PyTorch local-update engine (``run_trial``), tasks, theory
* :mod:`fedtune.search_spaces` — declarative search spaces
* :mod:`fedtune.tuning` — one study end to end (Optuna + Ray Tune + MLflow)
* :mod:`fedtune.service` — the REST service; :class:`fedtune.Client` — its Python SDK
"""

from __future__ import annotations

__all__ = ["Client", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # the SDK only needs httpx; import it lazily so `import fedtune` stays light
    if name == "Client":
        from .client import Client

        return Client
    raise AttributeError(f"module 'fedtune' has no attribute {name!r}")
