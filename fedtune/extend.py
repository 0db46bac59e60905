"""The public extension API: bring your own task, model and method.

Everything a user module needs, importable from one place::

    from fedtune.extend import FederatedData, Dataset, Task, register_task, register_model

    @register_model("my_mlp")
    def my_mlp(input_shape, num_outputs):               # -> torch.nn.Module
        ...

    @register_task("my_lab_digits", "my digits split")
    def build(params, seed):                            # -> Task, deterministic in ``seed``
        ...

    register_algorithm("fedavg_clip", summary="...", params=("client_lr", "server_lr"),
                       aggregator=ClippedMean())     # (messages, weights, steps, γ) -> q
    register_algorithm(
        "fedavg_damped", summary="...", build=build_damped,        # build(recipe, hp, K, task)
        hparams=(HParam("damping", float, 0.5, bounds=(0.0, 1.0), open="low",
                        space=Space(0.05, 1.0, log=True), doc="server step damping"),),
    )

Contracts
---------
* **Task builder** ``builder(params: Mapping, seed: int) -> Task``. ``params`` are the study's
  ``task:`` keys other than ``name``/``seed``; the builder validates them (raise
  ``ConfigError("task.<key>", reason)``). It must be deterministic in ``seed`` (the *data*
  seed: data, split and client sampling; never hyperparameters).
* **FederatedData** is the interface of a task's clients (``num_clients``, ``client_sizes``
  int64 ``[C]``, ``cohort(clients)`` -> an :class:`InMemoryData` view addressed by global
  client index, ``to(device, dtype)``). In memory: ``FederatedData.from_clients([(x_i, y_i),
  ...])`` (client ``i`` owns rows ``offsets[i]:offsets[i]+counts[i]``); on disk, loaded per
  cohort: :class:`CallableData` (``load(i) -> (x_i, y_i)``) or a :class:`LazyFederatedData`
  subclass. Same clients -> same tensors (determinism). ``Dataset`` is a pooled split (test,
  central data).
* **Task**: ``model_fn(generator) -> nn.Module`` (parameters drawn from ``generator`` only, e.g.
  via :func:`build_model`), ``loss_fn(outputs [B, ...], targets [B, ...]) -> [B]`` per-example
  losses, optional ``test`` split and ``metric_fns`` (per-example, like the loss).
* **Model factory** ``factory(input_shape, num_outputs) -> nn.Module``. The model must be a pure
  function of (parameters, inputs) — no dropout, no BatchNorm — because the vectorized runner
  ``torch.func.vmap``-s the clients' local steps over the cohort (per-client batches stacked
  ``[M, K, B, ...]``); a model that cannot be vmapped falls back to the sequential runner.
* **Algorithms** are recipes of parts (client rule, message rule, aggregator, server optimizer)
  registered with :func:`register_algorithm`; see that function. A recipe declares what its
  round is (``round_form``) and whether and how it packs (``packable``, ``member_hparams``); a
  ``build`` of your own packs when it says ``packable=True`` and returns the LocalUpdate a pack
  runs (docs/explanation/packing.md, "A user build that packs").
* **Hyperparameters** are declared once by the part that reads them, as :class:`HParam`
  (type, default, ``bounds=(low, high)`` — required for numbers, ``math.inf`` for no limit —
  and an optional default search entry :class:`Space`). The declaration validates trial
  configurations (errors name ``hparams.<name>``), gives the algorithm's default search space
  when no shipped space lists it (``fedtune spaces NAME``), and bounds every searched range.

User modules are found three ways, listed with their origin by ``fedtune tasks``,
``fedtune algorithms`` and ``fedtune spaces``: built in; an installed distribution's entry
points (groups ``fedtune.tasks``, ``fedtune.models``, ``fedtune.algorithms``; the entry point
names a module to import or a zero-argument function to call); or a study's
``code: {path: ./my_lab, modules: [my_lab.tasks]}`` section, imported by :func:`load_code`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedtune.errors import CodeError, ConfigError
from fedtune.suggest import did_you_mean
from fedtune.trainers.algorithms.base import (
    Algorithm,
    Cohort,
    RoundContext,
    ServerState,
    members_weighted_mean,
    tree_norm,
    weighted_mean,
)
from fedtune.trainers.algorithms.local_update import (
    Aggregator,
    LocalUpdate,
    PackedAggregator,
    mean_aggregator,
)
from fedtune.trainers.algorithms.recipe import SERVER_PARAMS, Recipe
from fedtune.trainers.algorithms.registry import algorithm_origin, algorithms, register
from fedtune.trainers.client import ClientRule
from fedtune.trainers.code import CodeSpec, LoadReport, load_code
from fedtune.trainers.hparams import HParam, Space
from fedtune.trainers.models.registry import build_model, model_names, register_model
from fedtune.trainers.plugins import Origin, caller_location
from fedtune.trainers.server_opt import ServerOpt, make_server_opt
from fedtune.trainers.tasks.base import CentralData, Dataset, FederatedData, InMemoryData, Task
from fedtune.trainers.tasks.lazy import CallableData, LazyFederatedData
from fedtune.trainers.tasks.registry import Builder as TaskBuilder
from fedtune.trainers.tasks.registry import register_task, task_origin, tasks

__all__ = [
    "Aggregator",
    "Algorithm",
    "CallableData",
    "CentralData",
    "ClientRule",
    "CodeError",
    "CodeSpec",
    "Cohort",
    "ConfigError",
    "Dataset",
    "FederatedData",
    "HParam",
    "InMemoryData",
    "LazyFederatedData",
    "LoadReport",
    "LocalUpdate",
    "Origin",
    "PackedAggregator",
    "Recipe",
    "RoundContext",
    "ServerOpt",
    "ServerState",
    "Space",
    "Task",
    "TaskBuilder",
    "algorithm_origin",
    "algorithms",
    "build_model",
    "load_code",
    "make_server_opt",
    "mean_aggregator",
    "members_weighted_mean",
    "model_names",
    "register_algorithm",
    "register_model",
    "register_task",
    "task_origin",
    "tasks",
    "tree_norm",
    "weighted_mean",
]


def register_algorithm(name: str, *, aggregator: Aggregator | None = None, **recipe: Any) -> Recipe:
    """Register an algorithm through the same registry as the built-ins.

    Args:
        name: The algorithm's name, as a study's ``algorithm:`` names it.
        aggregator: The method's aggregation part, ``aggregator(messages [M, ...], weights [M],
            steps τ [M], client_lr) -> (q, diagnostics)`` (see :class:`Aggregator`), used in
            place of the weighted mean q = Σ_i w_i q_i of :class:`LocalUpdate` (e.g. FedNova's
            normalized averaging). Give either ``aggregator`` or ``build``, not both. Its form
            over a pack's stacked members, ``packed_aggregator`` (see
            :class:`PackedAggregator`), lets configurations of the method share a pack.
        **recipe: The :class:`Recipe`'s fields: ``summary``, ``paper``, ``hparams`` (the
            :class:`HParam` declarations of what your parts read besides ``client_lr``,
            ``prox_alpha``, ``theta`` and ``server_*``; ``build`` reads them as
            ``hp.<name>``), ``params`` (the names a study may set; default: ``client_lr``, the
            server optimizer's and all of yours, less ``fixed``), ``theta``, ``units``,
            ``defaults``, ``fixed``, ``server_opts``, ``build(recipe, hp, local_steps, task)``,
            ``round_form`` (``local_update``: the LocalUpdate of the recipe's parts, which a
            ``build`` beside it must return; ``own``: whatever ``build`` makes; default:
            ``own`` with a ``build``, else ``local_update``), ``packed_aggregator``,
            ``aggregator_hparams`` (the declared numbers the aggregator reads, passed by
            keyword: a value, or every member's as a float64 ``[P]`` tensor to
            ``packed_aggregator``), ``packable`` (True, False or the reason
            it does not pack, printed by the refusal; default: True for a first-order
            ``local_update`` round whose aggregator is the mean or has a
            ``packed_aggregator``; a ``build`` packs only when it says True and returns the
            LocalUpdate a pack runs: docs/explanation/packing.md) and ``member_hparams``
            (which hyperparameters members of one pack may differ in: of γ, η, α, Θ, β, β₁,
            β₂, ε and the ``aggregator_hparams`` of a ``packed_aggregator``; default: the
            first eight) …

    Returns:
        The registered recipe.

    Raises:
        CodeError: An unknown recipe field; ``hparams`` not a tuple of :class:`HParam`; both
            ``aggregator`` and ``build``, or an ``aggregator`` that is not callable; a name in
            ``params``, ``defaults`` or ``fixed`` that no part declares; a numeric declaration
            without bounds; a ``round_form`` that does not fit ``build``; ``packable=True``
            for a round without a packed form; a ``member_hparams`` name a pack cannot hold
            per member (``algorithm.member_hparams``, with the reason).

    Example:
        ```python
        register_algorithm("fedavg_clip", summary="...", aggregator=ClippedMean())
        ```
    """
    recipe.setdefault("summary", "")
    recipe.setdefault("paper", "")
    own = recipe.get("hparams", ())
    if isinstance(own, HParam) or not all(isinstance(h, HParam) for h in own):
        raise CodeError(
            "algorithm.hparams", "must be a tuple of HParam declarations", caller_location()
        )
    fixed = recipe.get("fixed", {})
    names = ("client_lr", *SERVER_PARAMS, *(h.name for h in own))
    recipe.setdefault("params", tuple(n for n in names if n not in fixed))
    if aggregator is not None:  # the recipe checks it (callable, not beside a build)
        recipe["aggregator"] = aggregator
    return register(Recipe(name, **_fields(recipe)))


def _fields(recipe: Mapping[str, Any]) -> dict[str, Any]:
    known = {f.name for f in Recipe.__dataclass_fields__.values() if f.init} - {"name"}
    unknown = sorted(set(recipe) - known)
    if unknown:
        raise CodeError(
            f"algorithm.{unknown[0]}",
            f"unknown recipe field{did_you_mean(unknown[0], known)} "
            f"(known: {', '.join(sorted(known))})",
        )
    return {
        **recipe,
        "params": tuple(recipe["params"]),
        "hparams": tuple(recipe.get("hparams", ())),
    }
