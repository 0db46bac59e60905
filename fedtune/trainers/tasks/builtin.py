"""The built-in tasks: name, description, parameters and builder of each, registered when the
task registry is first used.

A task's parameters (:mod:`.params`) are what a study spec's ``task:`` is checked against; its
builder, and with it the task's module and torch, is imported when the task is built
(:class:`~fedtune.trainers.plugins.Deferred`), so that validating a spec imports neither.
"""

from __future__ import annotations

from ..plugins import Deferred
from . import params as p
from .registry import TaskInfo

__all__ = ["TASKS"]

_HERE = __name__.rsplit(".", 1)[0]

#: (name, description, parameters, module, builder): in the order they have always been listed
_TABLE = (
    (
        "quadratic",
        "random quadratic clients with exact A_i, c_i (theory of 000/001)",
        p.QuadraticParams,
        "quadratic",
        "build",
    ),
    (
        "synthetic",
        "LEAF/FedProx synthetic(α, β) multinomial logistic regression",
        p.SyntheticParams,
        "synthetic",
        "build_synthetic",
    ),
    (
        "digits",
        "scikit-learn handwritten digits split non-IID with a Dirichlet prior",
        p.DigitsParams,
        "digits",
        "build",
    ),
    (
        "femnist",
        "LEAF FEMNIST from local JSON files (62-class handwritten characters)",
        p.LeafParams,
        "leaf",
        "build_femnist",
    ),
    (
        "shakespeare",
        "LEAF Shakespeare next-character prediction from local JSON files",
        p.LeafShakespeareParams,
        "leaf",
        "build_shakespeare",
    ),
    (
        "emnist",
        "TFF federated EMNIST (62 or 10 classes) from a local HDF5 file",
        p.EmnistParams,
        "tff",
        "build_emnist",
    ),
    (
        "cifar100",
        "TFF federated CIFAR-100 from a local HDF5 file (centre crop)",
        p.Cifar100Params,
        "tff",
        "build_cifar100",
    ),
    (
        "shakespeare_tff",
        "TFF Shakespeare next-character prediction from local HDF5",
        p.ShakespeareTffParams,
        "tff",
        "build_shakespeare_tff",
    ),
    (
        "stackoverflow_tp",
        "TFF Stack Overflow tag prediction (bag of words) from HDF5",
        p.StackOverflowTpParams,
        "tff",
        "build_stackoverflow_tp",
    ),
    (
        "stackoverflow_nwp",
        "TFF Stack Overflow next-word prediction from HDF5",
        p.StackOverflowNwpParams,
        "tff",
        "build_stackoverflow_nwp",
    ),
    (
        "mixed_labels",
        "Mixed FL label shift: clients hold label 1, the server label 0 (003)",
        p.MixedLabelsParams,
        "mixed",
        "build_mixed_labels",
    ),
    (
        "mixed_quadratic",
        "quadratic clients plus a quadratic central loss (Mixed FL checks, 003)",
        p.MixedQuadraticParams,
        "mixed",
        "build_mixed_quadratic",
    ),
    (
        "linreg_interp",
        "interpolating noiseless linear regression (FedAvg-MaSS, 004)",
        p.LinRegParams,
        "linreg",
        "build_linreg",
    ),
)

#: the built-in tasks, their builders deferred
TASKS: tuple[TaskInfo, ...] = tuple(
    TaskInfo(name, Deferred(f"{_HERE}.{module}", builder), description, params)
    for name, description, params, module, builder in _TABLE
)
