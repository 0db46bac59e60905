"""Shared test configuration: small, float64 engine configurations."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
torch.set_num_threads(1)


def quadratic_config(algorithm: str = "fedavg", **overrides) -> dict:
    """A tiny heterogeneous quadratic trial in float64 (exact checks)."""
    cfg = {
        "task": {
            "name": "quadratic",
            "clients": 6,
            "dim": 3,
            "examples": 8,
            "noise": 0.5,
            "L": 4.0,
            "init_scale": 3.0,
            "seed": 1,
        },
        "algorithm": algorithm,
        "train": {
            "rounds": 4,
            "clients_per_round": 3,
            "local_steps": 3,
            "batch_size": 2,
            "eval_every": 2,
            "dtype": "float64",
        },
        "hparams": {},
        "seed": 7,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


@pytest.fixture
def qconfig():
    return quadratic_config
