"""The trial-configuration sections of a study spec (``task``, ``train``, ``decay``) as the
engine's own types, and which keys of them the user wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    PlainValidator,
    WithJsonSchema,
)

from fedtune.errors import as_mapping
from fedtune.trainers.config import (
    DecayConfig,
    TaskConfig,
    TrainConfig,
)
from fedtune.trainers.typed import from_mapping, to_dict

from .sections import (
    task_config,
)

__all__ = ["Decay", "Task", "Train", "written_keys"]


def _part(cls: type) -> Any:
    """Validate a spec section into the engine's dataclass ``cls`` (errors relative to it)."""

    def parse(value: Any) -> Any:
        if isinstance(value, cls):
            return value
        return from_mapping(cls, as_mapping(value, ""), "")

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
    PlainValidator(task_config),
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
GIVEN_SECTIONS = ("task", "train", "hparams", "decay")


def written_keys(raw: Any) -> tuple[str, ...]:
    """The keys a spec section was written with (a task name alone: ``name``)."""
    if isinstance(raw, str):
        return ("name",)
    if isinstance(raw, TaskConfig):
        return tuple(raw.to_dict())
    if isinstance(raw, TrainConfig | DecayConfig):
        return tuple(to_dict(raw))
    return tuple(raw) if isinstance(raw, Mapping) else ()
