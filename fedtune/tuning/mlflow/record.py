"""What a study's parent run records of its spec (:class:`StudyRecord`), made without MLflow:
the driver makes it, and the tracker writes it where it runs (:mod:`.process`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedtune.redact import scrub

if TYPE_CHECKING:
    from ..spec import StudySpec

__all__ = ["StudyRecord", "study_record"]


@dataclass(frozen=True)
class StudyRecord:
    """A study as its parent run records it.

    Args:
        name: The study's name (the run's name and its ``study`` tag).
        algorithm: Its algorithm (tag).
        task: Its task's name (tag).
        document: The spec as data, without any credential of a URI (``spec.yaml``, params).
        space: The search space's name, or ``inline``.
    """

    name: str
    algorithm: str
    task: str
    document: dict[str, Any]
    space: str


def study_record(spec: StudySpec) -> StudyRecord:
    """The record of ``spec`` (its tracking URI's credentials scrubbed)."""
    return StudyRecord(
        name=spec.name,
        algorithm=spec.algorithm,
        task=spec.task.name,
        document=scrub(spec.to_dict()),
        space=str(spec.search.space or "inline"),
    )
