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

import copy
import dataclasses
import enum
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_serializer,
    model_validator,
)

from fedtune.durations import parse_duration
from fedtune.errors import CodeError, ConfigError
from fedtune.search_spaces import (
    Parameter,
    ParamType,
    SearchSpace,
    combine,
    combine_errors,
    declaration_problem,
    default_space,
    load_space,
    merge,
    resolve_path,
    resolve_values,
)
from fedtune.trainers.algorithms.registry import (
    Recipe,
    effective_hparams,
    get_recipe,
    local_epochs_refusal,
    local_steps_of,
)
from fedtune.trainers.code import CodeSpec, LoadReport, load_code
from fedtune.trainers.config import (
    DecayConfig,
    TaskConfig,
    TrainConfig,
    TrialConfig,
)
from fedtune.trainers.typed import config_error, from_mapping, number, replace_fields, to_dict

from .choices import can_check_cheaply, check_choice
from .packing.limits import MAX_PACK
from .strategies import DEFAULT_STRATEGY, STRATEGIES, SamplerName, SchedulerName, Strategy

__all__ = [
    "MULTI_OBJECTIVE_SAMPLERS",
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
    "Strategy",
    "StudySpec",
    "TrackingSpec",
    "TradeoffSpec",
    "default_round_counts",
]

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
#: the sections of a trial configuration a searched path may set (``train.local_steps``, …)
_SAMPLED_SECTIONS = ("task", "train", "decay", "hparams")


class Mode(enum.StrEnum):
    MIN = "min"
    MAX = "max"


class Metric(enum.StrEnum):
    TRAIN_LOSS = "train_loss"  # ℓ_t, RoundRecord.client_loss
    TEST_ACCURACY = "test_accuracy"
    TEST_LOSS = "test_loss"


class MultiMetric(enum.StrEnum):
    FINAL_LOSS = "final_loss"
    ROUNDS_TO_TARGET = "rounds_to_target"


#: samplers that handle several objectives in Optuna 5 (CmaEsSampler raises on them)
MULTI_OBJECTIVE_SAMPLERS = frozenset(
    {SamplerName.TPE, SamplerName.RANDOM, SamplerName.GRID, SamplerName.NSGA2, SamplerName.GP}
)
#: field of ``RoundRecord.as_dict()`` each single-objective metric reads
RECORD_FIELD = {
    Metric.TRAIN_LOSS: "client_loss",
    Metric.TEST_ACCURACY: "test_accuracy",
    Metric.TEST_LOSS: "test_loss",
}

#: a count (the engine's input rule: an integral float is an integer, a bool or string is not)
Count = number(int, Field(ge=1))
NonNegFloat = Annotated[float, Field(strict=True, ge=0)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectiveSpec(_Spec):
    """Single (``metric``) or multi-objective (``metrics``: final loss, rounds to target)."""

    metric: Metric | None = None
    metrics: list[MultiMetric] | None = None
    last_rounds: Count = 10
    mode: Mode | None = None
    target_loss: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ObjectiveSpec:
        if self.metric is not None and self.metrics is not None:
            raise ConfigError("metrics", "give either metric (single) or metrics (multi-objective)")
        if self.metrics is not None:
            if len(set(self.metrics)) != len(self.metrics) or len(self.metrics) < 2:
                raise ConfigError("metrics", "needs at least two distinct metrics")
            if self.mode not in (None, Mode.MIN):
                raise ConfigError("mode", "every multi-objective metric is minimised")
            if MultiMetric.ROUNDS_TO_TARGET in self.metrics and self.target_loss is None:
                raise ConfigError("target_loss", "is required with rounds_to_target")
        elif self.target_loss is not None:
            raise ConfigError("target_loss", "is only used with metrics: [..., rounds_to_target]")
        elif self.mode is not None and self.mode != self._natural_mode():
            raise ConfigError("mode", f"{self.single_metric} is {self._natural_mode()}imised")
        return self

    @property
    def single_metric(self) -> Metric:
        return self.metric or Metric.TRAIN_LOSS

    def _natural_mode(self) -> Mode:
        return Mode.MAX if self.single_metric == Metric.TEST_ACCURACY else Mode.MIN

    @property
    def is_multi(self) -> bool:
        return self.metrics is not None

    @property
    def directions(self) -> list[Mode]:
        """One mode per objective (Optuna ``directions``: min -> minimize)."""
        return [Mode.MIN] * len(self.metrics) if self.metrics else [self._natural_mode()]

    @property
    def record_field(self) -> str:
        """The per-round record field the objective reads (``client_loss`` = ℓ_t)."""
        return "client_loss" if self.is_multi else RECORD_FIELD[self.single_metric]


class SamplerSpec(_Spec):
    """``name``: None = the search strategy's sampler (TPE without a strategy)."""

    name: SamplerName | None = None
    seed: Annotated[int, Field(strict=True)] | None = 0


class SchedulerSpec(_Spec):
    """Early stopping by rounds: ASHA rungs start at ``grace_rounds``, factor ``reduction_factor``.
    ``name``: None = the search strategy's (ASHA without a strategy). Unwritten,
    ``grace_rounds`` scales to ``train.rounds`` (:func:`default_round_counts`)."""

    name: SchedulerName | None = None
    grace_rounds: Count = 10
    reduction_factor: Annotated[float, Field(strict=True, gt=1)] = 3.0


#: ``objective.last_rounds`` and ``scheduler.grace_rounds`` when unwritten and the rounds allow
DEFAULT_LAST_ROUNDS = 10
DEFAULT_GRACE_ROUNDS = 10


def default_round_counts(rounds: int, reduction_factor: float = 3.0) -> tuple[int, int]:
    """The defaults of ``objective.last_rounds`` and ``scheduler.grace_rounds`` for a study.

    A default never exceeds the study: the objective's window is at most ``rounds``, and ASHA's
    first rung is at most ``rounds / reduction_factor`` so that its ladder (grace, grace·factor,
    …) keeps a rung below the last round (at least 1); the median rule and Hyperband's first
    rung (clamped to ``rounds / 9``) fit too.

    Args:
        rounds: The study's ``train.rounds`` (at least 1).
        reduction_factor: ``scheduler.reduction_factor`` (greater than 1).

    Returns:
        ``(last_rounds, grace_rounds)``: 10 and 10 for studies of at least 30 rounds at factor 3.
    """
    last = min(DEFAULT_LAST_ROUNDS, rounds)
    grace = max(1, min(DEFAULT_GRACE_ROUNDS, int(rounds // reduction_factor)))
    return last, grace


#: ``budget.trials`` of a study that gives no budget in trials, time or configuration-rounds
DEFAULT_TRIALS = 16

#: seconds, or a string such as ``"30m"`` (:func:`fedtune.durations.parse_duration`)
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string"},
            ]
        }
    ),
]


class BudgetSpec(_Spec):
    """What a study may spend; it stops asking for configurations at the first limit reached.

    ``trials``: configurations in all (default 16, or no limit when ``time`` or
    ``configuration_rounds`` is given); ``max_concurrent``: configurations trained at once;
    ``time``: wall-clock seconds of the fit (``90``, ``"30m"``, ``"1h30m"``; what runs then is
    stopped, as Ray Tune's ``time_budget_s``); ``configuration_rounds``: rounds trained by all
    configurations together, never exceeded (:mod:`fedtune.tuning.optuna.budget`). ``wall_clock_s``
    is the old name of ``time`` and is still read (with ``trials`` still 16 by default).
    """

    trials: Count | None = None  # default 16, or no limit with time or configuration_rounds
    max_concurrent: Count = 1  # configurations trained at once, packed or not
    time: Duration | None = None  # seconds, or 45s, 30m, 1h30m, 2d: the fit's wall-clock time
    configuration_rounds: Count | None = None  # rounds of all configurations together

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """Read ``wall_clock_s`` as ``time``; default ``trials`` when no budget is given."""
        if not isinstance(data, Mapping):
            return data
        data, old = dict(data), None
        if "wall_clock_s" in data:
            old = data.pop("wall_clock_s")
            if old is not None and data.get("time") is not None:
                raise ConfigError("wall_clock_s", "is the old name of time: give only time")
            if old is not None:
                data["time"] = old
        # a spec of the old name meant 16 trials at most, as it still does
        unbounded = data.get("configuration_rounds") is None and (
            data.get("time") is None or old is not None
        )
        if data.get("trials") is None and unbounded:
            data["trials"] = DEFAULT_TRIALS
        return data

    @property
    def compute(self) -> bool:
        """Whether the study has a budget in compute (time or configuration-rounds)."""
        return self.time is not None or self.configuration_rounds is not None


class ResourcesSpec(_Spec):
    """Per trial process: CPUs (> 0) and GPUs (a fraction < 1 shares one GPU, else whole
    GPUs); ``pack``: configurations trained per process (an integer, or ``auto``:
    :mod:`fedtune.tuning.packing.plan`)."""

    cpu: Annotated[float, Field(strict=True, gt=0)] = 1.0
    gpu: NonNegFloat = 0.0
    pack: Annotated[int, Field(strict=True, ge=1, le=MAX_PACK)] | Literal["auto"] = 1

    @model_validator(mode="after")
    def _whole_gpus(self) -> ResourcesSpec:
        if self.gpu > 1 and not float(self.gpu).is_integer():
            raise ConfigError("gpu", f"use a fraction < 1 or whole GPUs, got {self.gpu}")
        return self


#: a finite number (ints too); not a string or a bool, as the OpenAPI schema says
FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class TradeoffSpec(_Spec):
    """Targets τ of the trade-off (``fedtune.tuning.analysis.tradeoff``), single- or multi-objective.

    ``targets``: losses to report rounds-to-target for (default: quantiles of the best smoothed
    loss of the trials that ran to the end, below the starting loss); ``pareto_target``: the τ
    of the Pareto set (default: ``objective.target_loss`` with several objectives, else the
    median target).
    """

    targets: list[FiniteFloat] | None = None
    pareto_target: FiniteFloat | None = None

    @model_validator(mode="after")
    def _given(self) -> TradeoffSpec:
        if self.targets is not None and not self.targets:
            raise ConfigError("targets", "give at least one target loss, or leave it out")
        return self


class TrackingSpec(_Spec):
    experiment: str | None = None  # default: the study name
    uri: str | None = None  # default: MLFLOW_TRACKING_URI or a local store


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class SearchSpec(_Spec):
    """``space``: shipped name(s)/file(s), merged in order (default: the algorithm's space);
    ``override``: single entries (``null`` removes one); ``parameters``: a full inline space;
    ``strategy``: see :class:`Strategy` (default: ``tpe_guard``, :attr:`StudySpec.strategy`)."""

    space: Annotated[list[str], BeforeValidator(_as_list)] | None = None
    override: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    parameters: dict[str, Any] | None = None
    strategy: Strategy | None = None

    @model_validator(mode="after")
    def _one_base(self) -> SearchSpec:
        if self.space is not None and self.parameters is not None:
            raise ConfigError("parameters", "give either search.space or search.parameters")
        if self.space is not None and not self.space:
            raise ConfigError("space", "must name at least one space")
        if self.parameters is not None and not self.parameters:
            raise ConfigError("parameters", "must define at least one parameter")
        return self


def _task(value: Any) -> TaskConfig:
    return value if isinstance(value, TaskConfig) else TaskConfig.from_dict(value, "")


class StoredTrain(_Spec):
    """What a stored spec's readers need of its ``train`` section: its rounds."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    rounds: int | None = None


class StoredSpec(BaseModel):
    """A stored study document's typed summary: what the service (its scheduler, quotas,
    progress and trade-off) and comparisons read after acceptance.

    One validation of the whole document; its other sections are ignored (they were checked
    when the study was accepted). A section stored as ``null`` or left out takes its
    defaults, and a row stored before ``budget.time`` reads its old name ``wall_clock_s``.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str | None = None
    algorithm: str | None = None
    task: Annotated[TaskConfig, PlainValidator(_task)] | None = None
    train: StoredTrain = Field(default_factory=StoredTrain)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    tradeoff: TradeoffSpec = Field(default_factory=TradeoffSpec)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None}
        return data

    @property
    def maximise(self) -> bool | None:
        """Whether the objective is maximised; None for a multi-objective study."""
        return None if self.objective.is_multi else self.objective.directions[0] == Mode.MAX


def _part(cls: type) -> Any:
    """Validate a spec section into the engine's dataclass ``cls`` (errors relative to it)."""

    def parse(value: Any) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError("", f"must be a mapping, got {type(value).__name__}")
        return from_mapping(cls, value, "")

    return parse


def _object_schema(title: str) -> dict[str, Any]:
    return {"additionalProperties": True, "title": title, "type": "object"}


#: what ``task:`` takes: a name, or an object with a name and the task's parameters
_TASK_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "object",
            "required": ["name"],
            "additionalProperties": True,
            "properties": {"name": {"type": "string", "minLength": 1}},
        },
    ],
    "title": "Task",
}
#: the typed sections of a spec, the engine's own types (written back by
#: :meth:`StudySpec.section`, the keys the user wrote)
Task = Annotated[
    TaskConfig,
    PlainValidator(_task),
    WithJsonSchema(_TASK_SCHEMA),
]
Train = Annotated[
    TrainConfig,
    PlainValidator(_part(TrainConfig)),
    WithJsonSchema(_object_schema("Train")),
]
Decay = Annotated[
    DecayConfig,
    PlainValidator(_part(DecayConfig)),
    WithJsonSchema(_object_schema("Decay")),
]
#: the sections whose written keys a spec keeps (a default is not a value the user gave)
_GIVEN_SECTIONS = ("task", "train", "hparams", "decay")


def _written_keys(raw: Any) -> tuple[str, ...]:
    """The keys a spec section was written with (a task name alone: ``name``)."""
    if isinstance(raw, str):
        return ("name",)
    if isinstance(raw, TaskConfig):
        return tuple(raw.to_dict())
    if isinstance(raw, TrainConfig | DecayConfig):
        return tuple(to_dict(raw))
    return tuple(raw) if isinstance(raw, Mapping) else ()


class StudySpec(_Spec):
    """A study: a trial configuration plus what to search, how, and what to measure.

    Build one with :meth:`from_dict` or :meth:`from_file`, which also validate it.
    """

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str = ""
    task: Task
    algorithm: str
    train: Train = Field(default_factory=TrainConfig)
    hparams: dict[str, Any] = Field(default_factory=dict)
    decay: Decay = Field(default_factory=DecayConfig)
    seed: Annotated[int, Field(strict=True)] | None = None
    seeds: list[Annotated[int, Field(strict=True)]] | None = None
    search: SearchSpec = Field(default_factory=SearchSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    report_every: Count = 1
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    tradeoff: TradeoffSpec = Field(default_factory=TradeoffSpec)
    code: CodeSpec | None = None
    #: the service's project the study belongs to (who may see and change it, whose quota it
    #: uses; default ``default``) and its priority within the project (bounded by the project's
    #: ``max_priority``). ``fedtune tune`` keeps them and ignores them.
    project: (
        Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)] | None
    ) = None
    priority: Annotated[int, Field(strict=True, ge=-1000, le=1000)] = 0

    _base_dir: Path | None = PrivateAttr(default=None)
    _source: str | None = PrivateAttr(default=None)
    #: the keys the user wrote in each of :data:`_GIVEN_SECTIONS`, in their order
    _given: dict[str, tuple[str, ...]] = PrivateAttr(default_factory=dict)
    _base_config: TrialConfig | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_given_keys(cls, data: Any, handler: Any) -> StudySpec:
        spec = handler(data)
        if isinstance(data, Mapping):
            given = {}
            for section in _GIVEN_SECTIONS:
                given[section] = _written_keys(data.get(section))
            spec._given = given
        return spec

    @model_validator(mode="after")
    def _defaults_fit_the_rounds(self) -> StudySpec:
        """Unwritten round counts are :func:`default_round_counts` of ``train.rounds`` where
        the fixed defaults would exceed it (a written one is kept, and refused by
        :meth:`validate_deep` under its own name if it does not fit)."""
        last, grace = default_round_counts(self.train.rounds, self.scheduler.reduction_factor)
        for section, key, value in (
            ("objective", "last_rounds", last),
            ("scheduler", "grace_rounds", grace),
        ):
            part = getattr(self, section)
            if key not in part.model_fields_set and getattr(part, key) != value:
                object.__setattr__(self, section, part.model_copy(update={key: value}))
        return self

    @field_serializer(*_GIVEN_SECTIONS)
    def _write_given_keys(self, value: Any, info: FieldSerializationInfo) -> dict[str, Any]:
        return self.section(info.field_name)

    @model_validator(mode="after")
    def _seeds(self) -> StudySpec:
        if self.seeds is not None:
            if self.seed is not None:
                raise ConfigError("seeds", "give either seed or seeds")
            if not self.seeds or len(set(self.seeds)) != len(self.seeds):
                raise ConfigError("seeds", "must be a non-empty list of distinct seeds")
        return self

    @model_validator(mode="after")
    def _strategy(self) -> StudySpec:
        chosen = self.search.strategy
        if chosen is None:
            return self
        for section, part in (("sampler", self.sampler), ("scheduler", self.scheduler)):
            if part.name is not None:
                raise ConfigError(
                    "search.strategy",
                    f"strategy {chosen} sets the sampler and the scheduler; remove "
                    f"{section}.name = {part.name} (or the strategy, to combine them freely)",
                )
        if STRATEGIES[chosen].own_stop_rule and self.objective.is_multi:
            raise ConfigError(
                "search.strategy",
                f"{chosen} stops trials on one selection-rule value; with objective.metrics use "
                "tpe, random or sampler/scheduler",
            )
        return self

    # ------------------------------------------------------------ strategy

    @property
    def strategy(self) -> Strategy | None:
        """The search strategy (None: ``sampler`` and ``scheduler`` as given).

        A single-objective study that names none of the three gets :data:`DEFAULT_STRATEGY`.
        """
        if self.search.strategy is not None:
            return self.search.strategy
        named = self.sampler.name is not None or self.scheduler.name is not None
        return None if named or self.objective.is_multi else DEFAULT_STRATEGY

    @property
    def sampler_name(self) -> SamplerName:
        """The sampler the study uses (the strategy's, else ``sampler.name``)."""
        strategy = self.strategy
        if strategy is None:
            return self.sampler.name or SamplerName.TPE
        return STRATEGIES[strategy].sampler

    @property
    def scheduler_name(self) -> SchedulerName | None:
        """The Ray Tune scheduler (None: the trade-off strategy's own stop rule)."""
        strategy = self.strategy
        if strategy is None:
            return self.scheduler.name or SchedulerName.ASHA
        return STRATEGIES[strategy].scheduler

    # ------------------------------------------------------------ construction

    @classmethod
    def parse(
        cls, data: Any, *, base_dir: str | Path | None = None, source: str | None = None
    ) -> StudySpec:
        """Build a spec from its decoded YAML or JSON, checking its shape only.

        Every section is parsed into its type (the engine's ``TaskConfig``, ``TrainConfig`` and
        ``DecayConfig`` for ``task``, ``train`` and ``decay``); nothing is imported or read, so
        this is cheap. :meth:`check` completes the validation.

        Args:
            data: The spec, a mapping.
            base_dir: The directory that paths of user space files and of ``code.path`` are
                relative to (None: the working directory).
            source: The file the spec came from, named in errors.

        Returns:
            The spec.

        Raises:
            ConfigError: An invalid field, named by its dotted path.
        """
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            error = config_error(exc)
            raise (error.with_source(source) if source else error) from None
        spec._base_dir = Path(base_dir) if base_dir is not None else None
        spec._source = source
        return spec

    def check(self) -> None:
        """Import the ``code`` section, then run :meth:`validate_deep`.

        Raises:
            ConfigError: An invalid field, named by its dotted path (a ``CodeError`` for user
                code that fails to import or register), attributed to the spec's file.
        """
        try:
            self.load_code()
            self.validate_deep()
        except ConfigError as exc:
            if self._source and not exc.source:
                raise exc.with_source(self._source) from None
            raise

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        base_dir: str | Path | None = None,
        source: str | None = None,
        import_code: bool = True,
    ) -> StudySpec:
        """Build and validate a spec from its decoded YAML or JSON (:meth:`parse`, :meth:`check`).

        Args:
            data: The spec, a mapping.
            base_dir: The directory that paths of user space files and of ``code.path`` are
                relative to (None: the working directory).
            source: The file the spec came from, named in errors.
            import_code: Import the ``code`` section and run :meth:`validate_deep`; False
                with a ``code`` section checks the shape only (the caller validates in a
                subprocess with :meth:`load_code` and :meth:`validate_deep`).

        Returns:
            The spec.

        Raises:
            ConfigError: An invalid field, named by its dotted path (a ``CodeError`` for user
                code that fails to import or register).
        """
        spec = cls.parse(data, base_dir=base_dir, source=source)
        if spec.code is None or import_code:
            spec.check()
        return spec

    def load_code(self) -> LoadReport | None:
        """Import the study's ``code`` section; idempotent.

        Returns:
            What was imported and registered, or None without a ``code`` section.

        Raises:
            CodeError: The code fails to import or to register.
        """
        return None if self.code is None else load_code(self.code, self._base_dir)

    @property
    def resolved_code(self) -> CodeSpec | None:
        """``code`` with its path made absolute (as trial configurations carry it)."""
        return None if self.code is None else self.code.resolved(self._base_dir or ".")

    @classmethod
    def from_file(cls, path: str | Path) -> StudySpec:
        """Read, build and validate a spec from a YAML (or ``.json``) file.

        Args:
            path: The study file; relative paths in it are relative to its directory.

        Returns:
            The spec.

        Raises:
            ConfigError: The file cannot be read or parsed, or a field is invalid.
        """
        path = Path(path)
        try:
            text = path.read_text()
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError("<file>", f"cannot read the study spec: {exc}", str(path)) from None
        return cls.from_dict(data, base_dir=path.parent, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """Give the spec as JSON-ready data, every default filled in.

        ``task``, ``train``, ``hparams`` and ``decay`` hold the keys the user wrote (their
        defaults are the engine's, and a written key, even at its default, stays written).

        Returns:
            The spec, accepted back by :meth:`from_dict` as the same spec.
        """
        return self.model_dump(mode="json")

    def given(self, section: str) -> tuple[str, ...]:
        """Name the keys the user wrote in one section of the trial configuration.

        Args:
            section: ``task``, ``train``, ``hparams`` or ``decay``.

        Returns:
            The keys, in the order written (empty for another section).
        """
        return self._given.get(section, ())

    def section(self, section: str) -> dict[str, Any]:
        """Give one section of the trial configuration as plain data, the written keys only.

        Args:
            section: ``task``, ``train``, ``hparams`` or ``decay``.

        Returns:
            The section as the spec writes it (parsed values).
        """
        keys = self.given(section)
        if section == "task":
            return self.task.to_dict(keys)
        if section == "hparams":
            return copy.deepcopy(dict(self.hparams))
        part = getattr(self, section)
        return {k: to_dict(getattr(part, k)) for k in keys}

    def __eq__(self, other: object) -> bool:
        """Equal specs have equal fields and the same written keys (:meth:`given`) and base
        directory; the file named in errors and the cached :attr:`base_config` do not count."""
        if not isinstance(other, StudySpec):
            return NotImplemented

        def written(spec: StudySpec) -> dict[str, frozenset[str]]:
            return {k: frozenset(v) for k, v in spec._given.items()}

        return (self.__dict__, written(self), self._base_dir) == (
            other.__dict__,
            written(other),
            other._base_dir,
        )

    def __hash__(self) -> int:
        return super().__hash__()

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> StudySpec:
        """A copy (pydantic's), without the cached :attr:`base_config` of the original."""
        copied = super().model_copy(update=update, deep=deep)
        copied._base_config = None
        return copied

    # ------------------------------------------------------------ trial configurations

    def trial_seeds(self) -> list[int]:
        """List the seeds each configuration is trained with (the objective averages them).

        Returns:
            ``seeds``, else ``[seed]``, else ``[0]``.
        """
        return list(self.seeds) if self.seeds else [0 if self.seed is None else self.seed]

    def base_trial_config(self) -> dict[str, Any]:
        """Give the fixed part of every trial's configuration.

        Returns:
            A trial configuration, as ``fedtune.trainers.parse_trial_config`` accepts it, with
            the keys the user wrote (:meth:`section`).
        """
        base = {
            "task": self.section("task"),
            "algorithm": self.algorithm,
            "train": self.section("train"),
            "hparams": self.section("hparams"),
            "decay": self.section("decay"),
            "seed": self.trial_seeds()[0],
        }
        if self.code is not None:
            base["code"] = self.resolved_code.model_dump()
        return base

    @property
    def base_config(self) -> TrialConfig:
        """The typed :meth:`base_trial_config`, built once from the parsed sections.

        ``hparams`` are typed against the algorithm's recipe here, so the algorithm must be
        registered (:meth:`load_code` first for user code).

        Raises:
            ConfigError: The algorithm is unknown, or a hyperparameter does not suit its recipe.
        """
        if self._base_config is None:
            self._base_config = TrialConfig(
                task=self.task,
                algorithm=self.algorithm,
                train=self.train,
                hparams=get_recipe(self.algorithm).given_hparams(self.section("hparams")),
                decay=self.decay,
                seed=self.trial_seeds()[0],
                code=self.resolved_code,
            )
        return self._base_config

    def trial(self, sampled: Mapping[str, Any], seed: int | None = None) -> TrialConfig:
        """Give one trial's typed configuration.

        Args:
            sampled: The sampled values, ``{path: value}`` (``train.<field>``,
                ``decay.<field>``, ``hparams.<name>``, ``task.<name>``).
            seed: The trial's seed (None: the first of :meth:`trial_seeds`).

        Returns:
            :attr:`base_config` with each sampled value in its field, checked as the base's
            own values are, and ``seed``.

        Raises:
            ConfigError: A path outside those sections, or a value its field refuses.
        """
        base = self.base_config
        by_section: dict[str, dict[str, Any]] = {}
        for path, value in sampled.items():
            section, _, name = path.partition(".")
            if section not in _SAMPLED_SECTIONS or not name or "." in name:
                raise ConfigError(path, "is not a path a search may set")
            by_section.setdefault(section, {})[name] = value
        typed = {
            "task": lambda v: TaskConfig.from_dict({**base.task.to_dict(), **v}),
            "train": lambda v: replace_fields(base.train, v, "train"),
            "decay": lambda v: replace_fields(base.decay, v, "decay"),
            "hparams": lambda v: get_recipe(self.algorithm).given_hparams(
                {**self.section("hparams"), **v}
            ),
        }
        changes = {section: typed[section](v) for section, v in by_section.items()}
        if seed is not None:
            changes.update(seed=seed)
        return dataclasses.replace(base, **changes) if changes else base

    @property
    def experiment(self) -> str:
        """The MLflow experiment (``tracking.experiment``, else the study's name)."""
        return self.tracking.experiment or self.name

    # ------------------------------------------------------------ search space

    def search_space(self) -> SearchSpace:
        """Resolve the study's search space.

        Returns:
            The base (``search.parameters``, else ``search.space``, else the algorithm's
            default) with ``search.override`` applied.

        Raises:
            ConfigError: A space cannot be loaded or merged, or there is none for the algorithm.
        """
        s = self.search
        if s.parameters is not None:
            base = merge(
                SearchSpace(f"{self.name}-inline", ()), s.parameters, field="search.parameters"
            )
        elif s.space:
            base = combine([self._load(name, i) for i, name in enumerate(s.space)])
        else:
            found = default_space(self.algorithm)
            if found is None:
                raise ConfigError(
                    "search.space",
                    f"no shipped space for algorithm {self.algorithm!r} and its parts declare "
                    "no search space; give search.space or search.parameters",
                )
            base = found
        return merge(base, s.override, field="search.override") if s.override else base

    def _load(self, name: str, index: int) -> SearchSpace:
        try:
            return load_space(name, self._base_dir)
        except ConfigError as exc:
            if exc.source:  # an error inside the user's space file: keep file + field
                raise
            field = (
                "search.space" if len(self.search.space or ()) == 1 else f"search.space[{index}]"
            )
            raise ConfigError(field, exc.reason) from None

    def param_origin(self, path: str) -> str:
        """Say where the spec defines a searched parameter (for error messages).

        Args:
            path: The parameter's resolved path, e.g. ``hparams.client_lr``.

        Returns:
            The spec key, e.g. ``search.override.client_lr``, else ``search.space``.
        """
        for key in self.search.override:
            if resolve_path(key) == path:
                return f"search.override.{key}"
        for key in self.search.parameters or {}:
            if resolve_path(key) == path:
                return f"search.parameters.{key}"
        return "search.space"

    # ------------------------------------------------------------ deep validation

    def validate_deep(self) -> None:
        """Check the spec against the registries, the algorithm's recipe and the search space.

        The base trial configuration must parse and suit the recipe; every searched
        hyperparameter must be one the recipe accepts, inside its declared bounds, not also
        fixed, and every bound or choice must give a valid trial configuration; the sampler
        must suit the objective (CMA-ES: one objective) and the space (grid search: a grid for
        every parameter); round counts must fit ``train.rounds``.

        Raises:
            ConfigError: The first problem (or all conflicts of the space), named by its
                dotted path.
        """
        self._check_registered()
        parsed = self.base_config
        recipe = get_recipe(self.algorithm)
        _check_recipe(recipe, parsed)
        space = self._space_or_all_conflicts()
        for p in space.enabled:
            self._check_searched(p, recipe)
        self._check_values(space, recipe)
        self._check_sampler(space)
        rounds = self.train.rounds
        for field, value in (
            ("objective.last_rounds", self.objective.last_rounds),
            ("report_every", self.report_every),
            (
                "scheduler.grace_rounds",
                self.scheduler.grace_rounds
                if self.scheduler_name in (SchedulerName.ASHA, SchedulerName.MEDIAN)
                else 1,
            ),
        ):
            if value > rounds:
                raise ConfigError(field, f"{value} exceeds train.rounds = {rounds}")
        self._check_pack(parsed)

    def _check_pack(self, parsed: TrialConfig) -> None:
        """An integer ``resources.pack`` must fit ``budget.max_concurrent`` (which counts
        configurations) and an algorithm that packs; ``auto`` falls back by itself."""
        pack = self.resources.pack
        if pack == "auto" or pack == 1:
            return
        concurrent = self.budget.max_concurrent
        if pack > concurrent:
            raise ConfigError(
                "resources.pack",
                f"{pack} configurations per process but budget.max_concurrent = {concurrent} "
                f"(it counts configurations): raise max_concurrent to at least {pack}, or use "
                "pack: auto",
            )
        from fedtune.trainers.packed import pack_refusal

        why = pack_refusal(parsed)
        if why is not None:
            raise ConfigError("resources.pack", f"{why}; use pack: 1 or pack: auto")

    def _check_registered(self) -> None:
        """The task, model and algorithm the study names exist (before Ray starts: an unknown
        model used to fail every trial in turn); with user code, a missing one is a
        ``CodeError`` that says what the code's modules did register."""
        from fedtune.trainers.algorithms.registry import REGISTRY as ALGORITHMS
        from fedtune.trainers.models.registry import REGISTRY as MODELS
        from fedtune.trainers.tasks.registry import REGISTRY as TASKS

        params = self.task.params
        models = [("task.model", params["model"])] if "model" in params else []
        for key, entry in (self.search.override or {}).items():  # a searched model
            if resolve_path(key) == "task.model" and entry and entry.get("choices"):
                models += [(f"search.override.{key}.choices", m) for m in entry["choices"]]
        for field, registry, name in (
            ("task.name", TASKS, self.task.name),
            ("algorithm", ALGORITHMS, self.algorithm),
            *((f, MODELS, m) for f, m in models),
        ):
            if not isinstance(name, str):
                continue  # parse_trial_config names the problem
            try:
                registry.get(name)
            except ConfigError as exc:
                if self.code is None:
                    raise
                report = self.load_code()
                kind = registry.kind
                found = getattr(report, f"{kind}s")
                mods = ", ".join(report.modules)
                files = ", ".join(f for f in report.files.values() if f)
                raise CodeError(
                    field,
                    f"{kind} {name!r} is not registered: the study's code ({mods}) registered "
                    f"{', '.join(found) or 'no ' + kind + 's'}; {exc.reason}",
                    files or None,
                ) from None
        from fedtune.trainers.tasks.registry import check_task_params

        check_task_params(self.task.name, params)  # declared parameters: unknown, out of range

    def _space_or_all_conflicts(self) -> SearchSpace:
        """The space; a narrowed space's conflicts — with its own ranges, defaults and grids,
        and with values the base configuration fixes — are reported all at once."""
        fixed = []
        for key in self.search.override:
            path = resolve_path(key) if isinstance(key, str) else None
            if path is None or self.search.override[key] is None:
                continue
            section, name = path.split(".", 1)
            if name in self.given(section):
                fixed.append(
                    ConfigError(
                        f"{section}.{name}",
                        f"is also searched (search.override.{key}); set it in "
                        "one place (remove it here, or from the search with null)",
                    )
                )
        try:
            space = self.search_space()
        except ConfigError as exc:
            raise combine_errors([exc, *fixed], "search.override" if fixed else None) from None
        if fixed:
            raise combine_errors(fixed)
        return space

    def _check_searched(self, p: Parameter, recipe: Recipe) -> None:
        origin = self.param_origin(p.path)
        section, key = p.path.split(".", 1)
        if section == "hparams" and key not in recipe.params:
            accepted = ", ".join(recipe.params) or "none"
            raise ConfigError(
                origin,
                f"algorithm {recipe.name!r} has no hyperparameter {key!r} (it accepts: {accepted})",
            )
        if section == "hparams" and (problem := declaration_problem(p, recipe.declared[key])):
            raise ConfigError(origin, problem)
        if p.path == "train.local_steps" and recipe.fixed_local_steps is not None:
            raise ConfigError(origin, f"algorithm {recipe.name!r} fixes local_steps")
        if p.path == "train.local_epochs" and (why := local_epochs_refusal(recipe)):
            raise ConfigError(origin, f"algorithm {recipe.name!r} needs a fixed local_steps: {why}")
        if key in self.given(section):
            raise ConfigError(
                f"{section}.{key}",
                f"is also searched ({origin}); set it in one "
                "place (remove it here, or from the search with null)",
            )
        if section == "decay" and not self.decay.enabled:
            raise ConfigError(origin, f"searches {p.path} but decay.enabled is not true")

    def _check_values(self, space: SearchSpace, recipe: Recipe) -> None:
        """Every bound and choice, with the other parameters at their defaults, must be valid.

        Bounds and the first choice are checked on a whole trial configuration; every other
        choice gets the cheap check of :func:`check_choice` (the field's declared type and range,
        then the recipe), so validation does not rebuild a configuration per choice. A choice
        that other parameters tie to or are conditioned on changes them too: such a parameter's
        choices are all checked on whole configurations (their number is bounded by the
        service's ``FEDTUNE_MAX_CHOICES``).
        """
        paths = set(space.paths)
        for p in space.enabled:
            if p.tied:
                continue
            values = p.choices if p.type == ParamType.CATEGORICAL else (p.low, p.high)
            cheap = (
                p.type == ParamType.CATEGORICAL
                and can_check_cheaply(p.path)
                and not _drives_others(space, p)
            )
            base = None
            for i, v in enumerate(values):
                try:
                    if cheap and i > 0:
                        _check_recipe(recipe, check_choice(base, p.path, v))
                    else:
                        point = resolve_values(space, {p.path: v})
                        base = self.trial(point)
                        _check_recipe(recipe, base)
                except ConfigError as exc:
                    field = self.param_origin(exc.field) if exc.field in paths else exc.field
                    raise ConfigError(field, f"with {p.name} = {v!r}: {exc.reason}") from None

    def _check_sampler(self, space: SearchSpace) -> None:
        name = self.sampler_name
        if self.objective.is_multi and name not in MULTI_OBJECTIVE_SAMPLERS:
            allowed = ", ".join(sorted(MULTI_OBJECTIVE_SAMPLERS))
            raise ConfigError(
                "sampler.name",
                f"{name} optimises a single objective; with objective.metrics use one of {allowed}",
            )
        if name != SamplerName.GRID:
            return
        for p in space.enabled:
            if not p.tied and p.grid_values() is None:
                raise ConfigError(
                    f"{self.param_origin(p.path)}.grid",
                    f"the grid sampler needs a grid for {p.name}: give `grid: half-decade`, "
                    "`grid: decade` or a list of values",
                )


def _drives_others(space: SearchSpace, p: Parameter) -> bool:
    """Whether another parameter is tied to ``p`` or conditioned on it."""
    return any(q.path != p.path and p.path in q.depends_on for q in space.parameters)


def _check_recipe(recipe: Recipe, parsed: TrialConfig) -> None:
    effective_hparams(recipe, parsed)
    local_steps_of(recipe, parsed)
