"""The study specification (pydantic v2): a training configuration plus what to search and how.

    name: digits-fedavgm
    task: {name: digits, clients: 50, dirichlet: 0.3, model: mlp, seed: 0}
    algorithm: fedavgm
    train: {rounds: 30, clients_per_round: 10, local_steps: 5, batch_size: 20}
    search: {space: fedavgm, override: {client_lr: {high: 1.0}}}
    objective: {metric: train_loss, last_rounds: 10, mode: min}
    sampler: {name: tpe, seed: 0}
    scheduler: {name: asha, grace_rounds: 10}
    budget: {trials: 16, max_concurrent: 2}
    code: {path: ./my_lab, modules: [my_lab.tasks]}     # optional user code (fedtune.extend)

``task/algorithm/train/hparams/decay/seed`` are exactly a trial configuration, parsed once into
the engine's own types (``task``: ``TaskConfig``, ``train``: ``TrainConfig``, ``decay``:
``DecayConfig``; ``hparams`` typed against the algorithm's recipe in
:attr:`StudySpec.base_config`); the spec keeps which keys the user wrote (a default is not a
written value, and :meth:`StudySpec.to_dict` writes back only those). A trial's configuration is
the base with each sampled ``{path: value}`` in its typed field (:meth:`StudySpec.trial`). The
default objective is the papers' selection rule, the mean training loss ℓ_t over the last N
rounds (Charles & Konečný 2020 (arXiv:2007.00878) §8.3); the multi-objective form (final loss,
rounds to reach ``target_loss``) explores the convergence–accuracy trade-off
(Charles & Konečný 2021 (arXiv:2103.05032) §4).

Every invalid field raises ``ConfigError`` whose ``field`` is the dotted path in the spec
(``budget.trials``, ``search.parameters.client_lr.low``, ``seeds[1]``; one convention,
``fedtune.trainers.typed.config_error``). Validation has two steps: :meth:`StudySpec.parse`
checks the shape (cheap: nothing is imported or read) and :meth:`StudySpec.check` runs
:meth:`StudySpec.validate_deep`, which checks the spec against the algorithm's recipe and the
search space; ``from_dict``/``from_file`` do both. A ``code`` section (a directory or wheel
relative to the study file, and the modules that register the study's task/model/algorithm) is
imported before that (:func:`fedtune.extend.load_code`) unless ``import_code=False`` (the
service validates user code in a subprocess instead).
"""

from __future__ import annotations

from ..strategies import DEFAULT_STRATEGY, SamplerName, SchedulerName, Strategy
from .sections import (
    DEFAULT_TRIALS,
    MULTI_OBJECTIVE_SAMPLERS,
    NAME_PATTERN,
    RECORD_FIELD,
    BudgetSpec,
    Metric,
    Mode,
    MultiMetric,
    ObjectiveSpec,
    ResourcesSpec,
    SamplerSpec,
    SchedulerSpec,
    SearchSpec,
    TrackingSpec,
    TradeoffSpec,
    default_round_counts,
)
from .stored import StoredSpec, StoredTrain
from .study import StudySpec

__all__ = [
    "DEFAULT_STRATEGY",
    "DEFAULT_TRIALS",
    "MULTI_OBJECTIVE_SAMPLERS",
    "NAME_PATTERN",
    "RECORD_FIELD",
    "BudgetSpec",
    "Metric",
    "Mode",
    "MultiMetric",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SamplerName",
    "SamplerSpec",
    "SchedulerName",
    "SchedulerSpec",
    "SearchSpec",
    "StoredSpec",
    "StoredTrain",
    "Strategy",
    "StudySpec",
    "TrackingSpec",
    "TradeoffSpec",
    "default_round_counts",
]
