"""Checks shared by the contract tables (tests/unit/test_engine_contract.py,
tests/unit/test_extensions_contract.py)."""

from __future__ import annotations

import torch

from fedtune.trainers import Trainer
from fedtune.trainers.algorithms import Cohort


def assert_reorders_distinct_clients(trainer: Trainer, cohort: Cohort, permuted: Cohort) -> None:
    """A client-order test proves something only if the cohort has >= 2 clients whose data
    differ and the permutation really moves them."""
    assert cohort.size >= 2, "a one-client cohort has no order to change"
    assert sorted(cohort.clients.tolist()) == sorted(permuted.clients.tolist())
    assert not torch.equal(cohort.clients, permuted.clients), "the permutation is the identity"
    moved = (cohort.clients != permuted.clients).nonzero().flatten().tolist()
    assert len(moved) >= 2
    view = trainer._view(cohort.clients.cpu())
    rows = [view.inputs[cohort.batches[i].flatten().cpu()] for i in range(cohort.size)]
    for i in range(cohort.size):
        for j in range(i + 1, cohort.size):
            assert not torch.equal(rows[i], rows[j]), "two clients hold the same batches"
