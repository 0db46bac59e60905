"""The study spec's sections other than the trial configuration: objective, sampler, scheduler,
budget, resources, trade-off, tracking and search (pydantic v2, each error at its dotted path).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from fedtune.durations import parse_duration
from fedtune.errors import ConfigError
from fedtune.search_spaces.decl import ParamDecl
from fedtune.trainers.config import (
    TaskConfig,
)
from fedtune.trainers.typed import number

from ..packing.limits import MAX_PACK
from ..strategies import SamplerName, SchedulerName, Strategy

__all__ = [
    "DEFAULT_GRACE_ROUNDS",
    "DEFAULT_LAST_ROUNDS",
    "DEFAULT_TRIALS",
    "MULTI_OBJECTIVE_SAMPLERS",
    "NAME_PATTERN",
    "RECORD_FIELD",
    "BudgetSpec",
    "Count",
    "Duration",
    "FiniteFloat",
    "Metric",
    "Mode",
    "MultiMetric",
    "NonNegFloat",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SamplerSpec",
    "SchedulerSpec",
    "SearchSpec",
    "TrackingSpec",
    "TradeoffSpec",
    "default_round_counts",
    "task_config",
]

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"


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
    """Early stopping by rounds: ASHA rungs start at ``grace_rounds``, factor ``reduction_factor``
    (a whole number: Optuna's successive-halving and Hyperband pruners take one).
    ``name``: None = the search strategy's (ASHA without a strategy). Unwritten,
    ``grace_rounds`` scales to ``train.rounds`` (:func:`default_round_counts`)."""

    name: SchedulerName | None = None
    grace_rounds: Count = 10
    reduction_factor: Annotated[float, Field(strict=True, gt=1)] = 3.0

    @model_validator(mode="after")
    def _whole_factor(self) -> SchedulerSpec:
        if self.reduction_factor != int(self.reduction_factor):
            raise ConfigError(
                "reduction_factor",
                f"must be a whole number (the rungs grow by it), got {self.reduction_factor:g}",
            )
        return self


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
    GPUs); ``pack``: configurations trained per process (an integer, or ``auto``, the default:
    packed where the cluster has fewer process slots than configurations at once and a pack
    measured on the study's task pays, :mod:`fedtune.tuning.packing.plan`)."""

    cpu: Annotated[float, Field(strict=True, gt=0)] = 1.0
    gpu: NonNegFloat = 0.0
    pack: Annotated[int, Field(strict=True, ge=1, le=MAX_PACK)] | Literal["auto"] = "auto"

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
    override: dict[str, ParamDecl | None] = Field(default_factory=dict)
    parameters: dict[str, ParamDecl] | None = None
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


def task_config(value: Any) -> TaskConfig:
    return value if isinstance(value, TaskConfig) else TaskConfig.from_dict(value, "")
