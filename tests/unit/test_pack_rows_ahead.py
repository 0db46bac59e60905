"""A pack's batch rows drawn a round ahead (fedtune.trainers.pack_batches.BatchRows).

On a GPU the next round's rows are drawn while the local steps run; here what is checked is
that they are the rows the round would have drawn itself: every curve bit for bit the one of a
pack that draws each round's rows when it opens, through divergence, refills and stops, and
that the rows drawn ahead are the ones used.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedtune.errors import ConfigError
from fedtune.trainers import pack_batches
from fedtune.trainers.packed import PackedTrainer
from fedtune.trainers.records import Outcome
from fedtune.trainers.tasks.lazy import CallableData
from tests.unit.test_pack_graph import STEP_CASES, fixed_k, same_records, step_configs
from tests.unit.test_packed_exactness import digits


def run(pack: PackedTrainer) -> PackedTrainer:
    while not pack.done:
        pack.step()
    return pack


def assert_same_results(pack: PackedTrainer, plain: PackedTrainer, members: int) -> None:
    for i in range(members):
        assert pack.result(i).outcome == plain.result(i).outcome
        same_records(pack.result(i).records, plain.result(i).records)


@pytest.mark.parametrize(("name", "steps"), STEP_CASES)
def test_rows_drawn_ahead_are_the_rows_of_their_round(name, steps):
    """Fixed K (one vectorised draw), members of different K, local epochs (per-client
    streams); member 1 diverges, so its last rows drawn ahead are never taken."""
    configs = step_configs(name, steps)
    plain = run(PackedTrainer(configs, rows_ahead=False))
    pack = run(PackedTrainer(configs))
    assert pack.result(1).outcome == Outcome.DIVERGED
    assert_same_results(pack, plain, len(configs))
    # every round but each member's first took the rows drawn during the round before it
    assert pack._rows.taken == plain._rows.taken > len(configs)
    assert pack._rows.reused == pack._rows.taken - len(configs)
    assert plain._rows.reused == 0


def test_rows_ahead_with_refills_stops_and_members_at_three_rounds():
    """A member joins after steps 1 and 3 (three round indices, three cohorts in a step) and
    one is stopped: the new members' first rows are drawn when their round opens."""
    configs = [digits(j, rounds=5) for j in range(4)]

    def staggered(pack: PackedTrainer) -> PackedTrainer:
        pack.step()
        pack.add(configs[2])
        pack.step()
        pack.step()
        pack.stop(0)
        pack.add(configs[3])
        return run(pack)

    plain = staggered(PackedTrainer(configs[:2], rows_ahead=False))
    pack = staggered(PackedTrainer(configs[:2]))
    assert pack.result(0).outcome == Outcome.STOPPED
    assert_same_results(pack, plain, len(configs))
    assert pack._rows.reused == pack._rows.taken - len(configs) > 0


def test_equal_draw_keys_share_one_draw_and_a_different_k_does_not():
    """Members whose draws read the same (seed, K, sampling) get the same rows; one of the
    same seed with another K draws its own."""
    configs = fixed_k([digits(0), digits(1)], k=2) + fixed_k([digits(2)], k=3)
    for cfg in configs:
        cfg["seed"] = 0
    plain = run(PackedTrainer(configs, rows_ahead=False))
    pack = run(PackedTrainer(configs))
    assert_same_results(pack, plain, 3)
    keys = [pack_batches.draw_key(m, 1) for m in pack._members]
    assert keys[0] == keys[1] != keys[2]
    assert pack._rows.reused == pack._rows.taken - 3 > 0


def test_rows_wait_for_their_round_when_the_data_is_not_in_memory():
    """A file-backed store would have to load the next cohort to draw its rows: none ahead."""
    configs = fixed_k([digits(0), digits(1)], k=2)
    plain = run(PackedTrainer(configs, rows_ahead=False))  # builds the task from the configs
    data = plain.task.train
    lazy = CallableData(data.counts, lambda i: (data.client(i).inputs, data.client(i).targets))
    pack = run(PackedTrainer(configs, task=dataclasses.replace(plain.task, train=lazy)))
    assert pack._rows.data is None and pack._rows.reused == 0 and pack._rows.taken > 2
    for i in range(2):  # lazy and in-memory data give the same curves
        records = pack.result(i).records
        assert [r.client_loss for r in records] == [r.client_loss for r in plain.result(i).records]


def test_a_draw_ahead_that_fails_is_left_to_its_round(monkeypatch):
    """The error is raised by the round it belongs to, after the round before has its records."""
    draw = pack_batches.draw_rows

    def refuses_round_2(members, t, *args):
        if t == 2:
            raise ConfigError("train.batch_sampling", "round 2 cannot be drawn")
        return draw(members, t, *args)

    monkeypatch.setattr(pack_batches, "draw_rows", refuses_round_2)
    configs = fixed_k([digits(0), digits(1)], k=2)
    configs = [{**c, "train": {**c["train"], "rounds": 5}} for c in configs]
    pack = PackedTrainer(configs)
    pack.step()
    records = pack.step()  # drew round 2 ahead, which failed: round 1's records still come
    assert [r.round for r in records] == [2, 2]
    with pytest.raises(ConfigError, match="round 2 cannot be drawn"):
        pack.step()
    assert [len(pack.result(i).records) for i in range(2)] == [2, 2]
    assert torch.is_tensor(pack.params[next(iter(pack.params))])
