"""What a trial reports: a configuration's typed trial configurations, its rows and objective,
and the schema of its results and of its pack's.

Every trial is a pack of P ≥ 1 configurations (its trainable: :mod:`.trainable`). A pack's Tune
config holds its members under :data:`PACK_KEY` and each of its results holds one result per
reporting member under :data:`MEMBERS` (:func:`pack_name`, :func:`member_numbers`). Each
configuration's Tune config is the plain ``{config path: value}`` dict that the Optuna
searcher sampled, plus the Optuna trial number under :data:`~.keys.TRIAL_KEY`; it becomes one
typed trial configuration per seed of ``spec.seeds`` (:func:`trial_configs`, by
``spec.trial``), and its per-round record is the mean over its seeds
(:func:`~fedtune.tuning.packing.runs.seed_mean`). Its result, every ``spec.report_every``
rounds and at the end, is built by :class:`TrialRows`. Ray's result-throughput guidance is to
report seconds, not milliseconds, apart; every result therefore carries the rounds since the
previous one under :data:`~.keys.HISTORY`, so nothing is lost when reports are sparse.

Objective (the papers' selection rule, Charles & Konečný 2020 (arXiv:2007.00878) §8.3): with the
per-round values v_t of ``objective.record_field`` (ℓ_t for ``train_loss``),

    objective_t = mean(v_{t-N+1..t})   over the last N = ``objective.last_rounds`` values

reported every time (the study's stopper compares trials on it) and carried in every round row of
:data:`~.keys.HISTORY` under :data:`~.keys.OBJECTIVE`, so the searcher reports it to Optuna as the
intermediate value and MLflow logs it per round. **One value per trial**: the objective at the
last round the trial reached — a completed trial's final objective, a stopped (pruned) trial's
objective at the round it was stopped (Optuna's value of a PRUNED trial is its last
intermediate value, i.e. exactly this), the worst value for a diverged one — used by Optuna,
MLflow, the service and the trade-off files alike. Multi-objective studies also report
``final_loss`` (the same mean of ℓ_t) and ``rounds_to_target`` = first round whose trailing mean
of :data:`~.keys.SMOOTH_WINDOW` values of ℓ is ≤ ``objective.target_loss`` (∞ while not reached), the
definitions of :mod:`fedtune.tuning.analysis.tradeoff`.

GPU trials (``resources.gpu > 0``) compute on CUDA: ``train.device: auto`` becomes ``cuda``, and
when CUDA is not available in the trial's process (a CPU image, a node without a driver, Ray's
logical GPUs) the trial fails at once with one line (:func:`gpu_device`) instead of training
on CPU while holding GPUs. ``train.device: cpu`` stated in the spec is obeyed (the GPUs are then
a scheduling reservation only, e.g. logical GPUs in tests).

With ``decay.enabled`` every row also carries :data:`~.keys.DECAYS` (decays so far, mean over seeds)
and the final report :data:`~.keys.DECAY_ROUNDS` (the rounds after which a rate decayed).

A diverged trial (non-finite or exploding loss, an *outcome* of the engine) ends with a report
whose :data:`~.keys.OUTCOME` is ``diverged`` and whose objectives are the worst possible values
(+∞ when minimised, −∞ when maximised); an exception raised in a trial fails only its pack
(:class:`TrialError`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedtune.errors import FedtuneError
from fedtune.outcomes import RUNNING
from fedtune.trainers import Outcome, TrialConfig

from .. import env
from ..keys import (
    DECAY_ROUNDS,
    DECAYS,
    DEVICE,
    HISTORY,
    OBJECTIVE,
    OUTCOME,
    ROUND,
    SMOOTH_WINDOW,
    TRIAL_KEY,
)
from ..spec import Mode, MultiMetric, StudySpec

__all__ = [
    "MEMBERS",
    "PACK_KEY",
    "RUNNING",
    "ObjectiveTracker",
    "TrialError",
    "TrialRows",
    "gpu_device",
    "member_numbers",
    "pack_name",
    "sampled_params",
    "trial_configs",
    "trial_message",
]

PACK_KEY = "fedtune.pack"  # a pack's Tune config: its members' configs
MEMBERS = "members"  # a pack's result: one result per member that reports


def pack_name(first: int) -> str:
    """A pack's name (its Ray Tune trial's and its key in the box): ``pack-<its first
    member's number>``."""
    return f"pack-{first:04d}"


def member_numbers(config: Mapping[str, Any]) -> list[int]:
    """The Optuna numbers of a pack's members, in order."""
    return [int(m[TRIAL_KEY]) for m in config[PACK_KEY]]


def sampled_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """The sampled ``{path: value}`` of a Tune config (without fedtune's bookkeeping keys)."""
    return {k: v for k, v in config.items() if k != TRIAL_KEY}


def trial_configs(spec: StudySpec, config: Mapping[str, Any]) -> list[TrialConfig]:
    """One typed trial configuration per seed of the study (GPU trials: see :func:`gpu_device`)."""
    spec.load_code()  # idempotent: the study's algorithm must be registered to type hparams
    sampled = sampled_params(config)
    configs = [spec.trial(sampled, seed=seed) for seed in spec.trial_seeds()]
    if spec.resources.gpu <= 0:
        return configs
    return [
        dataclasses.replace(
            c,
            train=dataclasses.replace(
                c.train, device=gpu_device(spec.resources.gpu, c.train.device)
            ),
        )
        for c in configs
    ]


def gpu_device(gpu: float, requested: str) -> str:
    """The device of a trial holding ``gpu`` GPUs: ``cpu`` only when the spec says so; else
    CUDA, which must be available in this process (else one-line ``TrialError``)."""
    if requested == "cpu":
        return requested
    import torch

    if not torch.cuda.is_available():
        visible = env.cuda_visible_devices()
        raise TrialError(
            f"resources.gpu={gpu:g} but CUDA is not available in this trial's process "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}, "
            f"CUDA_VISIBLE_DEVICES={'<unset>' if visible is None else visible}); run "
            "GPU trials on CUDA nodes with the CUDA image, or set train.device: cpu explicitly"
        )
    return "cuda" if requested == "auto" else requested


class ObjectiveTracker:
    """Running objective(s) of one trial from its per-round records (see module docstring)."""

    def __init__(self, spec: StudySpec) -> None:
        obj = spec.objective
        self.field = obj.record_field
        self.last_rounds = obj.last_rounds
        self.multi = obj.is_multi
        self.metrics = [str(m) for m in obj.metrics] if obj.metrics else []
        self.target = obj.target_loss
        self.mode = obj.directions[0]
        self._tail: deque[float] = deque(maxlen=self.last_rounds)
        self._reach = _FirstReach(self.target) if self.multi and self.target is not None else None

    def observe(self, row: Mapping[str, Any]) -> None:
        """One round's record; constant work per round (no pass over the rounds so far)."""
        value = row.get(self.field)
        if value is not None:
            self._tail.append(float(value))
        if self._reach is not None:
            self._reach.observe(int(row[ROUND]), float(row["client_loss"]))

    def current(self) -> float | None:
        """The running objective after the rows seen so far (None before any value)."""
        return float(np.mean(self._tail)) if self._tail else None

    def worst(self) -> float:
        return -math.inf if self.mode == Mode.MAX else math.inf

    def values(self, diverged: bool = False) -> dict[str, float]:
        """``objective`` (and the multi-objective metrics) now; worst values once diverged."""
        if diverged:
            out = {OBJECTIVE: self.worst()}
            out.update({m: math.inf for m in self.metrics})
            return out
        objective = float(np.mean(self._tail)) if self._tail else self.worst()
        out = {OBJECTIVE: objective}
        if self.multi:
            out[str(MultiMetric.FINAL_LOSS)] = objective
            if self._reach is not None:
                out[str(MultiMetric.ROUNDS_TO_TARGET)] = self._reach.round
        return {k: out[k] for k in [OBJECTIVE, *self.metrics]}


class _FirstReach:
    """Rounds to target of a growing curve, one round at a time: the first round whose
    trailing mean of :data:`~.keys.SMOOTH_WINDOW` values of ℓ is ≤ ``target`` (∞ until then).

    Bit for bit :func:`~.analysis.tradeoff.smooth` + :func:`~.analysis.tradeoff.rounds_to_target` of the whole
    curve (the trade-off's definition): the same sequential cumulative sums of the finite values
    and counts of the non-finite ones, of which only the last ``SMOOTH_WINDOW + 1`` are kept.
    """

    def __init__(self, target: float) -> None:
        self.target, self.round = target, math.inf
        self._sums: deque[float] = deque([0.0], maxlen=SMOOTH_WINDOW + 1)
        self._bad: deque[int] = deque([0], maxlen=SMOOTH_WINDOW + 1)

    def observe(self, round_: int, loss: float) -> None:
        finite = math.isfinite(loss)
        self._sums.append(self._sums[-1] + (loss if finite else 0.0))
        self._bad.append(self._bad[-1] + (not finite))
        if self.round != math.inf:
            return
        n = len(self._sums) - 1  # values in the window (expanding at the start)
        mean = (self._sums[-1] - self._sums[0]) / n
        if self._bad[-1] - self._bad[0] > 0:
            mean = math.inf
        if mean <= self.target:
            self.round = float(round_)


class TrialRows:
    """One trial's rows since its last report, its running objective and its decay rounds.

    Args:
        spec: The study (its objective).
        rounds: The trial's ``train.rounds``.
        decay: Whether its rates decay (rows then carry :data:`~.keys.DECAYS`).
        device: Where it computes (:func:`~fedtune.trainers.engine.device_label`), given in
            each result (None: not given).
    """

    def __init__(self, spec: StudySpec, rounds: int, decay: bool, device: str | None = None):
        self.tracker = ObjectiveTracker(spec)
        self.rounds, self.decay, self.device = rounds, decay, device
        self.pending: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {ROUND: 0}
        self.decay_rounds: list[int] = []

    def add(self, row: Mapping[str, Any], decays: float = 0.0) -> None:
        """Take one round's record (``decays``: the decays so far, mean over seeds)."""
        self.tracker.observe(row)
        row = dict(row)
        if (value := self.tracker.current()) is not None:
            row[OBJECTIVE] = value
        if self.decay:
            before = self.last.get(DECAYS, 0.0)
            row[DECAYS] = decays
            if decays > before:  # a rate decayed after this round's loss
                self.decay_rounds.append(int(row[ROUND]))
        self.pending.append(row)
        self.last = row

    def report(self, outcome: str = RUNNING, reason: str = "") -> dict[str, Any]:
        """The result to report now (it takes the pending rows); a final one once ended."""
        out = _result(self.last, self.pending, self.tracker, outcome, self.rounds)
        self.pending = []
        if outcome == Outcome.DIVERGED:
            out["reason"] = reason
        if outcome != RUNNING and self.decay:
            out[DECAY_ROUNDS] = list(self.decay_rounds)
        if self.device is not None:
            out[DEVICE] = self.device
        return out


class TrialError(RuntimeError):
    """A fedtune error inside a trial, re-raised in a form Ray can ship to the driver.

    ``ConfigError``/``DataError`` take several constructor arguments and do not survive the
    pickling Ray does between processes; the message (``ConfigError: field: reason``) does.
    """


_RAY_PACKAGE = re.compile(r"\S*/runtime_resources/py_modules_files/_ray_pkg_[0-9a-f]+/")


def trial_message(exc: FedtuneError, spec: StudySpec) -> str:
    """A trial's fedtune error as the user should read it: its own message
    (``task.name: the builder … raised OSError: …``, no ``CodeError:`` class prefix), with the
    files of the code Ray unpacked for the trial (``…/runtime_resources/py_modules_files/
    _ray_pkg_<hash>/pkg/x.py``) named where the study's ``code.path`` has them."""
    text = str(exc)
    code = spec.resolved_code
    if code is not None and code.path:
        text = _RAY_PACKAGE.sub(lambda _: str(code.path).rstrip("/") + "/", text)
    return text


def _result(
    last: Mapping[str, Any],
    history: list[dict[str, Any]],
    tracker: ObjectiveTracker,
    outcome: str,
    rounds: int,
) -> dict[str, Any]:
    metrics = {k: v for k, v in last.items() if k not in (ROUND, OBJECTIVE)}
    return {
        **metrics,
        ROUND: int(last[ROUND]),
        "rounds_total": rounds,
        OUTCOME: outcome,
        **tracker.values(diverged=outcome == Outcome.DIVERGED),
        HISTORY: list(history),
    }
