"""Per-round records and the outcome of a trial."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from fedtune.outcomes import TrialOutcome

__all__ = ["Outcome", "RoundRecord", "TrialResult", "divergence"]


def divergence(
    loss: float, initial: float | None, factor: float, t: int
) -> tuple[float | None, str | None]:
    """The divergence rule of a round: ℓ_t not finite, or ℓ_t > ``factor`` · |ℓ_1|.

    Args:
        loss: Round ``t``'s client loss ℓ_t.
        initial: |ℓ_1| so far (None until a finite loss was seen).
        factor: ``train.divergence_factor``.
        t: The round (0-based).

    Returns:
        |ℓ_1| (set at the first finite loss) and why the trial diverged (None: it did not).
    """
    if initial is None and math.isfinite(loss):
        initial = max(abs(loss), 1e-12)
    bound = factor * (initial or 1.0)
    if math.isfinite(loss) and loss <= bound:
        return initial, None
    return initial, f"round {t + 1}: client loss {loss:.4g} (bound {bound:.4g})"


class Outcome(enum.StrEnum):
    """How a training run ended: the :class:`fedtune.outcomes.TrialOutcome` values a run has."""

    COMPLETED = TrialOutcome.COMPLETED.value
    DIVERGED = TrialOutcome.DIVERGED.value  # loss non-finite or over the divergence bound
    STOPPED = TrialOutcome.STOPPED.value  # stopped early by the caller (e.g. a scheduler)


@dataclass(frozen=True)
class RoundRecord:
    """What happened in one round (1-based ``round``).

    ``client_loss`` is ℓ_t: the mean loss of the round's sampled clients on their own data at
    the broadcast model, *before* local training (Charles & Konečný 2020 (arXiv:2007.00878)
    §8.4/§9). ``train_loss`` (population loss, mean over clients) and ``test_*`` exist on evaluation
    rounds.
    """

    round: int
    client_loss: float
    update_norm: float
    client_lr: float
    server_lr: float
    examples: int
    wall_time: float
    train_loss: float | None = None
    test: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        """Flat metrics (``test_loss``, ``test_accuracy``, extras) without missing values."""
        out: dict[str, Any] = {
            "round": self.round,
            "client_loss": self.client_loss,
            "update_norm": self.update_norm,
            "client_lr": self.client_lr,
            "server_lr": self.server_lr,
            "examples": self.examples,
            "wall_time": self.wall_time,
        }
        if self.train_loss is not None:
            out["train_loss"] = self.train_loss
        out.update({f"test_{k}": v for k, v in self.test.items()})
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RoundRecord:
        base = {
            "round",
            "client_loss",
            "update_norm",
            "client_lr",
            "server_lr",
            "examples",
            "wall_time",
            "train_loss",
        }
        test = {k[5:]: v for k, v in d.items() if k.startswith("test_")}
        extra = {k: v for k, v in d.items() if k not in base and not k.startswith("test_")}
        return cls(
            round=int(d["round"]),
            client_loss=d["client_loss"],
            update_norm=d["update_norm"],
            client_lr=d["client_lr"],
            server_lr=d["server_lr"],
            examples=int(d["examples"]),
            wall_time=d["wall_time"],
            train_loss=d.get("train_loss"),
            test=test,
            extra=extra,
        )


@dataclass
class TrialResult:
    outcome: Outcome
    records: list[RoundRecord]
    config: dict[str, Any]
    runner: str
    device: str
    decays: int = 0
    reason: str = ""

    @property
    def rounds_completed(self) -> int:
        return len(self.records)

    def curve(self, metric: str = "client_loss") -> list[tuple[int, float]]:
        return [(r.round, v) for r in self.records if (v := r.as_dict().get(metric)) is not None]

    def final_loss(self, last_rounds: int = 100, metric: str = "client_loss") -> float:
        """The papers' selection rule: mean training loss over the last N rounds (inf if none)."""
        values = [v for _, v in self.curve(metric)][-last_rounds:]
        if not values or self.outcome == Outcome.DIVERGED:
            return math.inf
        return sum(values) / len(values)

    def summary(self, last_rounds: int = 10) -> dict[str, Any]:
        last = self.records[-1].as_dict() if self.records else {}
        return {
            "outcome": str(self.outcome),
            "rounds": self.rounds_completed,
            "final_loss": self.final_loss(last_rounds),
            "last": last,
            "decays": self.decays,
            "runner": self.runner,
            "device": self.device,
            "reason": self.reason,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "config": self.config,
            "records": [r.as_dict() for r in self.records],
        }
