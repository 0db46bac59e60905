"""Typed configuration of one training run (a *trial*).

A trial configuration is plain YAML/JSON at the edges and frozen dataclasses inside::

    task:      {name: digits, seed: 0, clients: 100, dirichlet: 0.3, model: cnn}
    algorithm: fedavgm
    train:     {rounds: 60, clients_per_round: 10, local_steps: 10, batch_size: 20, eval_every: 5}
    hparams:   {client_lr: 0.1, server_lr: 1.0, server_momentum: 0.9}
    decay:     {enabled: false}
    seed:      0
    code:      {path: /abs/my_lab, modules: [my_lab.tasks]}   # optional: user code to import

``task.seed`` is the *data* seed: it fixes the data, the split and the client-sampling sequence,
so every trial of a study sees the same clients each round whatever its hyperparameters (the
fairness protocol of Charles & Konečný 2020 (arXiv:2007.00878) §8). ``seed`` is the *trial* seed:
model initialisation and mini-batch draws.

``hparams`` holds the values the user gave, validated against the algorithm's declarations
(each part owns its hyperparameters: :mod:`fedtune.trainers.hparams`); the values a run uses
(recipe defaults < user < recipe-fixed) are ``fedtune.trainers.algorithms.resolve``'s.
Parsing a plain mapping against the registries is :mod:`.parsing`'s (this module holds the
types, which the algorithm registry names, so it imports no registry).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fedtune.errors import ConfigError, as_mapping
from fedtune.overrides import apply_overrides

from .code_spec import CodeSpec
from .typed import check, to_dict

__all__ = [
    "DecayConfig",
    "TaskConfig",
    "TrainConfig",
    "TrialConfig",
    "apply_overrides",
]


@dataclass(frozen=True)
class TrainConfig:
    """How a trial is run (shared by every algorithm)."""

    rounds: int = 100
    clients_per_round: int = 10  # M
    local_steps: int | None = None  # K; None = the algorithm's default
    local_epochs: float | None = None  # E: client i runs ⌈E·n_i/B⌉ steps (instead of K)
    batch_size: int = 20  # B
    eval_every: int = 10
    weighting: Literal["uniform", "examples"] = "uniform"
    batch_sampling: Literal["with_replacement", "shuffle", "full"] = "with_replacement"
    runner: Literal["auto", "vectorized", "sequential"] = "auto"
    device: str = "auto"
    dtype: Literal["float32", "float64"] = "float32"
    divergence_factor: float = 1e3
    eval_batch_size: int = 4096
    # population loss on evaluation rounds: every client, a seeded sample of eval_clients
    # clients (a function of the data seed and the round), or none (train_loss stays None)
    eval_population: Literal["full", "sample", "off"] = "full"
    eval_clients: int | None = None  # S, with eval_population: sample

    def validate(self, path: str = "train") -> None:
        p = f"{path}." if path else ""
        check(self.rounds >= 1, f"{p}rounds", f"must be >= 1, got {self.rounds}")
        check(self.clients_per_round >= 1, f"{p}clients_per_round", "must be >= 1")
        check(
            self.local_steps is None or self.local_steps >= 1,
            f"{p}local_steps",
            f"must be >= 1, got {self.local_steps}",
        )
        check(self.batch_size >= 1, f"{p}batch_size", f"must be >= 1, got {self.batch_size}")
        self._validate_epochs(p)
        check(self.eval_every >= 1, f"{p}eval_every", "must be >= 1")
        check(self.divergence_factor > 1, f"{p}divergence_factor", "must be > 1")
        check(self.eval_batch_size >= 1, f"{p}eval_batch_size", "must be >= 1")
        self._validate_eval_population(p)
        check(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"),
            f"{p}device",
            "must be auto, cpu, cuda or cuda:N",
        )

    def _validate_eval_population(self, p: str) -> None:
        if self.eval_population == "sample":
            check(
                self.eval_clients is not None and self.eval_clients >= 1,
                f"{p}eval_clients",
                f"eval_population: sample needs eval_clients >= 1 (S), got {self.eval_clients}",
            )
        else:
            check(
                self.eval_clients is None,
                f"{p}eval_clients",
                f"is only used with eval_population: sample (got {self.eval_population!r})",
            )

    def _validate_epochs(self, p: str) -> None:
        if self.local_epochs is None:
            return
        check(
            self.local_steps is None,
            f"{p}local_epochs",
            "set either local_steps (K) or local_epochs (E), not both",
        )
        check(
            math.isfinite(self.local_epochs) and self.local_epochs > 0,
            f"{p}local_epochs",
            f"must be a finite number > 0, got {self.local_epochs}",
        )
        check(
            self.batch_sampling != "full",
            f"{p}local_epochs",
            "needs batch_sampling with_replacement or shuffle ('full' uses every example at "
            "every step, so an epoch is not a number of batches)",
        )


@dataclass(frozen=True)
class DecayConfig:
    """LocalUpdateDecay (Charles & Konečný 2020 §9, docs/explanation/algorithms.md §2); paper
    defaults.

    ``semantics``: ``paper`` (eq. 25 as written) or ``reference`` (the TFF research code the
    paper's experiments ran, google-research/federated ``adaptive_lr_decay``); see
    :mod:`fedtune.trainers.decay` for the exact rules of each.
    """

    enabled: bool = False
    semantics: Literal["paper", "reference"] = "paper"
    mode: Literal["min", "max"] = "min"  # max: the monitored value should grow (e.g. accuracy)
    window: int = 100  # W
    patience: int = 100  # P (0 acts as 1: decay at the first non-improving round)
    cooldown: int = 100  # C (also applied at the start of training)
    threshold: float = 1e-4  # Δ (min_delta of the reference code)
    client_decay: float = 0.1  # factor applied to γ
    server_decay: float = 0.9  # factor applied to η
    min_lr: float = 0.0  # no rate is decayed below this (γ and η alike, as the reference)
    reset_min_after_decay: bool = False  # paper semantics only

    def validate(self, path: str = "decay") -> None:
        p = f"{path}." if path else ""
        check(self.window >= 1, f"{p}window", "must be >= 1")
        check(self.patience >= 0, f"{p}patience", "must be >= 0")
        check(self.cooldown >= 0, f"{p}cooldown", "must be >= 0")
        check(self.threshold >= 0, f"{p}threshold", "must be >= 0")
        for name in ("client_decay", "server_decay"):
            value = getattr(self, name)
            check(0 < value <= 1, f"{p}{name}", f"must be in (0, 1], got {value}")
        check(
            math.isfinite(self.min_lr) and self.min_lr >= 0,
            f"{p}min_lr",
            f"must be >= 0, got {self.min_lr}",
        )
        check(
            not (self.reset_min_after_decay and self.semantics == "reference"),
            f"{p}reset_min_after_decay",
            "has no meaning with semantics: reference (its best is never reset)",
        )


@dataclass(frozen=True)
class TaskConfig:
    """A task name, its data seed and its own parameters (validated by the task builder)."""

    name: str
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str, path: str = "task") -> TaskConfig:
        """Build a task from a spec's ``task:`` (a name, or a mapping with a name).

        Args:
            data: The task name, or ``{name, seed, **params}``.
            path: The dotted path of ``data`` in errors ("" for a relative path).

        Returns:
            The task; its own parameters are validated when the task is built.

        Raises:
            ConfigError: ``data`` is no mapping, or its name or seed is invalid.
        """
        p = f"{path}." if path else ""
        if isinstance(data, str):
            data = {"name": data}
        data = as_mapping(data, path, what=" with at least `name`")
        if "name" not in data or not isinstance(data["name"], str):
            raise ConfigError(f"{p}name", "is required (a task name, e.g. digits)")
        seed = data.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{p}seed", f"must be an integer, got {seed!r}")
        rest = {k: v for k, v in data.items() if k not in ("name", "seed")}
        return cls(name=data["name"], seed=seed, params=rest)

    def to_dict(self, given: Collection[str] | None = None) -> dict[str, Any]:
        """Give the task as plain data, accepted back by :meth:`from_dict`.

        Args:
            given: Write only these keys, in this order (the ones a user wrote; None: every
                key).

        Returns:
            ``{name, seed, **params}``.
        """
        out = {"name": self.name, "seed": self.seed, **copy.deepcopy(dict(self.params))}
        return out if given is None else {k: out[k] for k in given if k in out}


@dataclass(frozen=True)
class TrialConfig:
    """One training run. ``hparams``: the hyperparameters the user gave (validated, typed)."""

    task: TaskConfig
    algorithm: str
    train: TrainConfig = field(default_factory=TrainConfig)
    hparams: Mapping[str, Any] = field(default_factory=dict)
    decay: DecayConfig = field(default_factory=DecayConfig)
    seed: int = 0
    code: CodeSpec | None = None

    @property
    def hparams_set(self) -> frozenset[str]:
        """Names of the hyperparameters the user gave."""
        return frozenset(self.hparams)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "task": self.task.to_dict(),
            "algorithm": self.algorithm,
            "train": to_dict(self.train),
            "hparams": {k: to_dict(self.hparams[k]) for k in sorted(self.hparams)},
            "decay": to_dict(self.decay),
            "seed": self.seed,
        }
        if self.code is not None:
            out["code"] = self.code.model_dump()
        return out
