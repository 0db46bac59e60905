"""Per-round metrics that hold still between changes: only the points that draw them.

A trial's learning rates γ_t and η_t change only when LocalUpdateDecay decays them
(Charles & Konečný 2020 (arXiv:2007.00878) §9, docs/explanation/algorithms.md §2: γ ← a_client · γ,
η ← a_server · η once the window's loss has plateaued P times, then C rounds of cooldown), and
``decays`` counts those decays: per round all three are piecewise constant. So are the
engine's ``runner_vectorized`` (1 while the clients run vectorised; it changes only when the
vectorised runner falls back) and ``eval_clients`` (|E_t| on evaluation rounds, set by the
study). Logging them every round made three or four of a round's ~7 MLflow metrics pure
repetition — the tracking server's writes are the limit of a team's load
(``benchmarks/load.py``).

A key of :data:`STEP_KEYS` is logged

* at the first round a run reports it,
* around each change: the last round of the old value (if not logged yet) and the first round
  of the new one — MLflow's line chart then draws the step exactly where it happened,
* at the run's last reported round (:meth:`StepPoints.close`, called when the run is closed).

So a constant rate costs two points per trial instead of one per round, and
``get_metric_history`` still gives the value at every round: the value of the latest point at
or before it.
"""

from __future__ import annotations

from collections.abc import Iterable

from mlflow.entities import Metric

from fedtune.round_keys import EVAL_CLIENTS_METRIC, RUNNER_METRIC

__all__ = ["STEP_KEYS", "StepPoints"]

STEP_KEYS = frozenset({"client_lr", "server_lr", "decays", RUNNER_METRIC, EVAL_CLIENTS_METRIC})


class StepPoints:
    """Per run and key of :data:`STEP_KEYS`: the last value seen, at which round, and whether
    that point was logged (module docstring)."""

    def __init__(self, keys: Iterable[str] = STEP_KEYS) -> None:
        self.keys = frozenset(keys)
        self._last: dict[str, dict[str, tuple[int, float, bool]]] = {}

    def keep(self, run_id: str, metrics: Iterable[Metric]) -> list[Metric]:
        """The metrics to log, in order: every metric of another key; of a step key, the
        points that draw it."""
        last = self._last.setdefault(run_id, {})
        out = []
        for m in metrics:
            if m.key not in self.keys:
                out.append(m)
                continue
            before = last.get(m.key)
            if before is not None and before[1] == m.value:
                last[m.key] = (m.step, m.value, False)
                continue
            if before is not None and not before[2]:  # the old value's last round
                out.append(Metric(m.key, before[1], m.timestamp, before[0]))
            out.append(m)
            last[m.key] = (m.step, m.value, True)
        return out

    def close(self, run_id: str, timestamp: int) -> list[Metric]:
        """The points still owed for ``run_id`` (each key's last round), and forget the run."""
        last = self._last.pop(run_id, {})
        return [Metric(k, v, timestamp, s) for k, (s, v, logged) in last.items() if not logged]
