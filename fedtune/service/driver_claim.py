"""What a study driver receives when it claims its study (no database, no HTTP client here).

:mod:`.driver_ops` makes it from the service database, :class:`.driver_link.ApiLink` from the
service's answer; a driver that only hands its study over (to its sandbox on a shared Ray head,
:mod:`.head_sandbox`) never imports the database's modules (SQLAlchemy: a third of a CPU second).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Claim"]


@dataclass(frozen=True)
class Claim:
    """A running study as its driver receives it.

    Attributes:
        state: the study's state.
        attempts: its current dispatch attempt.
        spec: its stored document.
        code_sha256: its code package's digest (None: no uploaded code).
        owner: the user who submitted it, whom its MLflow runs name as their user (None: a
            study from before owners were kept).
    """

    state: str
    attempts: int
    spec: dict[str, Any]
    code_sha256: str | None
    owner: str | None = None
