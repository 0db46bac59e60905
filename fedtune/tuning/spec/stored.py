"""A stored study document's typed summary (:class:`StoredSpec`), what readers after
acceptance (the service, comparisons) take from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    model_validator,
)

from fedtune.trainers.config import (
    TaskConfig,
)

from .sections import (
    BudgetSpec,
    Mode,
    ObjectiveSpec,
    ResourcesSpec,
    TradeoffSpec,
    _Spec,
    task_config,
)

__all__ = ["StoredSpec", "StoredTrain"]


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
    task: Annotated[TaskConfig, PlainValidator(task_config)] | None = None
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
