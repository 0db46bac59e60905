"""The parameters of the built-in tasks: one frozen dataclass per task (type, default,
``validate(path)`` for ranges), as :func:`~.registry.register_task` takes them.

They live here, apart from the tasks' builders, because a study spec's ``task:`` is checked
against them when the spec is read: this module imports neither torch nor a task's data code,
so validating a spec does not (docs/explanation/architecture.md §1). Each task's module
re-exports its parameters (``fedtune.trainers.tasks.quadratic.QuadraticParams``, …).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..models import model_names
from ..typed import check

__all__ = [
    "Cifar100Params",
    "DigitsParams",
    "EmnistParams",
    "LeafParams",
    "LeafShakespeareParams",
    "LinRegParams",
    "MixedLabelsParams",
    "MixedQuadraticParams",
    "QuadraticParams",
    "ShakespeareTffParams",
    "StackOverflowNwpParams",
    "StackOverflowTpParams",
    "SyntheticParams",
    "TffParams",
    "check_model",
]


# -- quadratic
@dataclass(frozen=True)
class QuadraticParams:
    clients: int = 20
    dim: int = 10
    mu: float = 1.0
    L: float = 10.0
    radius: float = 1.0
    heterogeneity: float = 1.0
    examples: int = 40
    examples_max: int | None = None  # unequal sizes: n_i uniform in [examples, examples_max]
    noise: float = 0.0
    init_scale: float = 10.0

    def validate(self, path: str) -> None:
        check(self.clients >= 1, f"{path}.clients", "must be >= 1")
        check(self.dim >= 1, f"{path}.dim", "must be >= 1")
        check(0 < self.mu <= self.L, f"{path}.mu", "need 0 < mu <= L")
        check(self.radius > 0, f"{path}.radius", "must be > 0")
        check(0 <= self.heterogeneity <= 1, f"{path}.heterogeneity", "must be in [0, 1]")
        check(self.examples >= 1, f"{path}.examples", "must be >= 1")
        check(
            self.examples_max is None or self.examples_max >= self.examples,
            f"{path}.examples_max",
            "must be >= examples",
        )
        check(self.noise >= 0, f"{path}.noise", "must be >= 0")


# -- linreg
@dataclass(frozen=True)
class LinRegParams:
    clients: int = 10
    dim: int = 20
    examples: int = 50
    var_min: float = 1.0
    var_max: float = 10.0
    init_scale: float = 0.0

    def validate(self, path: str) -> None:
        p = f"{path}." if path else ""
        for name in ("clients", "dim", "examples"):
            check(getattr(self, name) >= 1, f"{p}{name}", "must be >= 1")
        check(0 < self.var_min <= self.var_max, f"{p}var_min", "need 0 < var_min <= var_max")
        check(self.init_scale >= 0, f"{p}init_scale", "must be >= 0")


# -- synthetic
def check_model(model: str, path: str) -> None:
    """ConfigError at ``<path>.model`` unless ``model`` is a registered model."""
    known = model_names()
    check(model in known, f"{path}.model", f"unknown model {model!r} (known: {', '.join(known)})")


@dataclass(frozen=True)
class SyntheticParams:
    clients: int = 30
    alpha: float = 1.0
    beta: float = 1.0
    dim: int = 60
    classes: int = 10
    iid: bool = False
    min_examples: int = 50
    log_mean_examples: float = 4.0
    log_std_examples: float = 2.0
    max_examples: int | None = None
    test_fraction: float = 0.1
    model: str = "linear"

    def validate(self, path: str) -> None:
        p = f"{path}." if path else ""
        check(self.clients >= 1, f"{p}clients", "must be at least 1")
        check(self.alpha >= 0, f"{p}alpha", "must be non-negative")
        check(self.beta >= 0, f"{p}beta", "must be non-negative")
        check(self.dim >= 1, f"{p}dim", "must be at least 1")
        check(self.classes >= 2, f"{p}classes", "must be at least 2")
        check(self.min_examples >= 1, f"{p}min_examples", "must be at least 1")
        check(self.log_std_examples >= 0, f"{p}log_std_examples", "must be non-negative")
        check(
            self.max_examples is None or self.max_examples >= self.min_examples,
            f"{p}max_examples",
            "must be at least min_examples",
        )
        check(0 <= self.test_fraction < 1, f"{p}test_fraction", "must be in [0, 1)")
        check_model(self.model, path)


# -- digits
@dataclass(frozen=True)
class DigitsParams:
    clients: int = 50
    dirichlet: float = 0.5
    model: str = "mlp"
    test_fraction: float = 0.2
    size_skew: float | None = None  # unequal sizes: shares of the examples ~ Dir(size_skew)

    def validate(self, path: str) -> None:
        check(2 <= self.clients <= 500, f"{path}.clients", "must be in [2, 500]")
        check(self.dirichlet > 0, f"{path}.dirichlet", "must be > 0")
        check(0 < self.test_fraction < 0.9, f"{path}.test_fraction", "must be in (0, 0.9)")
        check(self.size_skew is None or self.size_skew > 0, f"{path}.size_skew", "must be > 0")
        check(self.model in ("mlp", "cnn", "linear"), f"{path}.model", "must be mlp, cnn or linear")


# -- mixed
@dataclass(frozen=True)
class MixedLabelsParams:
    clients: int = 20
    examples: int = 50  # label-1 examples per client
    central_examples: int = 1000  # label-0 examples on the server
    test_examples: int = 2000  # balanced
    dim: int = 5
    separation: float = 1.0  # class means ±s·u
    central_weight: float = 0.5  # w_c (w_f = 1 − w_c)
    oracle: bool = False
    model: str = "linear"

    def validate(self, path: str) -> None:
        p = f"{path}." if path else ""
        for name in ("clients", "examples", "central_examples", "dim"):
            check(getattr(self, name) >= 1, f"{p}{name}", "must be >= 1")
        check(self.test_examples >= 2, f"{p}test_examples", "must be >= 2")
        check(self.separation > 0, f"{p}separation", "must be > 0")
        check(0 < self.central_weight < 1, f"{p}central_weight", "must be in (0, 1)")
        check_model(self.model, path)


@dataclass(frozen=True)
class MixedQuadraticParams:
    clients: int = 10
    dim: int = 5
    mu: float = 1.0
    L: float = 10.0
    examples: int = 20
    noise: float = 0.0
    iid: bool = True
    shared_hessian: bool = False
    heterogeneity: float = 0.0
    central_examples: int = 100
    central_noise: float = 0.0
    central_distance: float = 1.0
    central_weight: float = 0.5
    federated_weight: float = 0.5
    init_scale: float = 10.0

    def validate(self, path: str) -> None:
        p = f"{path}." if path else ""
        for name in ("clients", "dim", "examples", "central_examples"):
            check(getattr(self, name) >= 1, f"{p}{name}", "must be >= 1")
        check(0 < self.mu <= self.L, f"{p}mu", "need 0 < mu <= L")
        for name in ("noise", "heterogeneity", "central_noise", "central_distance", "init_scale"):
            check(getattr(self, name) >= 0, f"{p}{name}", "must be >= 0")
        for name in ("central_weight", "federated_weight"):
            check(getattr(self, name) > 0, f"{p}{name}", "must be > 0")


# -- leaf
@dataclass(frozen=True)
class LeafParams:
    path: str = ""
    max_clients: int | None = None
    model: str = "femnist_cnn"
    lazy: bool = False  # keep users in the files, read per cohort (LeafClientData)

    def validate(self, path: str) -> None:
        check(bool(self.path), f"{path}.path", "required: the LEAF data directory")
        check(
            self.max_clients is None or self.max_clients >= 1,
            f"{path}.max_clients",
            "must be at least 1",
        )
        check_model(self.model, path)


@dataclass(frozen=True)
class LeafShakespeareParams(LeafParams):
    model: str = "char_lstm"
    seq_len: int = 80

    def validate(self, path: str) -> None:
        super().validate(path)
        check(self.seq_len >= 1, f"{path}.seq_len", "must be at least 1")


# -- tff
@dataclass(frozen=True)
class TffParams:
    """Parameters shared by every HDF5 task (each task adds its sizes in a subclass)."""

    train_path: str = ""
    test_path: str | None = None
    max_clients: int | None = None
    max_examples_per_client: int | None = None
    model: str = ""
    lazy: bool = False  # keep clients on disk, read per cohort (HDF5ClientData)

    def validate(self, path: str) -> None:
        check(bool(self.train_path), f"{path}.train_path", "required: the training HDF5 file")
        for key in ("max_clients", "max_examples_per_client", *self._sizes):
            value = getattr(self, key)
            check(value is None or value >= 1, f"{path}.{key}", "must be at least 1")
        check_model(self.model, path)

    _sizes: ClassVar[tuple[str, ...]] = ()


@dataclass(frozen=True)
class EmnistParams(TffParams):
    model: str = "femnist_cnn"
    classes: int = 62
    _sizes: ClassVar[tuple[str, ...]] = ("classes",)


@dataclass(frozen=True)
class Cifar100Params(TffParams):
    model: str = "resnet18_gn"
    classes: int = 100
    crop: int = 24
    _sizes: ClassVar[tuple[str, ...]] = ("classes",)

    def validate(self, path: str) -> None:
        super().validate(path)
        check(1 <= self.crop <= 32, f"{path}.crop", "must be in 1..32")


@dataclass(frozen=True)
class ShakespeareTffParams(TffParams):
    model: str = "char_lstm"
    seq_len: int = 80
    _sizes: ClassVar[tuple[str, ...]] = ("seq_len",)


@dataclass(frozen=True)
class StackOverflowTpParams(TffParams):
    model: str = "bow_logistic"
    vocab_size: int = 10000
    num_tags: int = 500
    _sizes: ClassVar[tuple[str, ...]] = ("vocab_size", "num_tags")


@dataclass(frozen=True)
class StackOverflowNwpParams(TffParams):
    model: str = "word_lstm"
    max_examples_per_client: int | None = 128
    vocab_size: int = 10000
    seq_len: int = 20
    _sizes: ClassVar[tuple[str, ...]] = ("vocab_size", "seq_len")
