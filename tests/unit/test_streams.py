"""fedtune.trainers.streams: many seeded generators at once, each drawing exactly what
``np.random.default_rng(entropy)`` draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedtune.trainers.sampling import (
    _BATCH_STREAM,
    _bounded_rows,
    _local_draws,
    cohort_batch_indices,
    trials_batch_indices,
)
from fedtune.trainers.streams import generators, prepared


def _rows(n: int, width: int, seed: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 2**32, size=(n, width)).tolist()
    rows[:4] = [[0] * width, [2**32 - 1] * width, [1] + [0] * (width - 1), [7] * width]
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_each_generator_draws_what_default_rng_draws(width):
    rows = _rows(1500, width, width)
    for row, gen in zip(rows, generators(rows), strict=True):
        ref = np.random.default_rng(list(row))
        assert gen.bit_generator.state == ref.bit_generator.state, row
        assert (gen.integers(0, 97, size=64) == ref.integers(0, 97, size=64)).all()
        assert (gen.permutation(13) == ref.permutation(13)).all()


def test_entropy_past_32_bits_falls_back_to_numpy():
    rows = [(_BATCH_STREAM, 2**40 + 3, 5, 1), (_BATCH_STREAM, -1 + 2**32, 5, 2)]
    for row, gen in zip(rows, generators(rows), strict=True):
        assert (
            gen.integers(0, 50, 20) == np.random.default_rng(list(row)).integers(0, 50, 20)
        ).all()


def test_two_calls_at_once_do_not_share_a_generator():
    a_rows, b_rows = _rows(5, 4, 1), _rows(5, 4, 2)
    for a, b, ra, rb in zip(generators(a_rows), generators(b_rows), a_rows, b_rows, strict=True):
        assert a is not b
        assert (
            a.integers(0, 9, 8).tolist()
            == np.random.default_rng(list(ra)).integers(0, 9, 8).tolist()
        )
        assert (
            b.integers(0, 9, 8).tolist()
            == np.random.default_rng(list(rb)).integers(0, 9, 8).tolist()
        )


@pytest.mark.parametrize("mode", ["with_replacement", "shuffle"])
def test_cohort_rows_equal_each_clients_own_stream(mode):
    clients = torch.tensor([3, 8, 40, 99])
    counts = torch.tensor([5, 17, 2, 30])
    offsets = torch.tensor([100, 200, 300, 400])
    rows = cohort_batch_indices(11, 6, clients, offsets, counts, 4, 3, mode)
    for i, (c, n, o) in enumerate(
        zip(clients.tolist(), counts.tolist(), offsets.tolist(), strict=True)
    ):
        own = _local_draws(11, 6, c, n, 12, mode).reshape(4, 3) + o
        assert rows[i].tolist() == own.tolist()


@pytest.mark.parametrize("mode", ["with_replacement", "shuffle"])
def test_several_trials_rows_equal_each_trials_own_cohort_rows(mode):
    clients = torch.tensor([3, 8, 40, 99])
    counts = torch.tensor([5, 17, 2, 30])
    offsets = torch.tensor([100, 200, 300, 400])
    seeds, steps = [11, 0, 2**32 - 1, 11, 2**33], [4, 1, 6, 2, 3]  # a seed past 32 bits too
    together = trials_batch_indices(seeds, 6, clients, offsets, counts, steps, 3, mode)
    assert len(together) == len(seeds)
    for seed, k, rows in zip(seeds, steps, together, strict=True):
        assert rows.shape == (4, k, 3)
        for i, (c, n, o) in enumerate(
            zip(clients.tolist(), counts.tolist(), offsets.tolist(), strict=True)
        ):
            own = _local_draws(seed, 6, c, n, 3 * k, mode).reshape(k, 3) + o
            assert rows[i].tolist() == own.tolist(), (seed, c)


def test_several_trials_full_batches_are_every_row():
    clients, counts, offsets = torch.tensor([1, 4]), torch.tensor([3, 3]), torch.tensor([0, 9])
    rows = trials_batch_indices([5, 6], 2, clients, offsets, counts, [2, 1], 3, "full")
    assert [r.tolist() for r in rows] == [
        [[[0, 1, 2], [0, 1, 2]], [[9, 10, 11], [9, 10, 11]]],
        [[[0, 1, 2]], [[9, 10, 11]]],
    ]


def test_prepared_rows_draw_the_same_and_big_seeds_fall_back():
    small = [(_BATCH_STREAM, s, 3, c) for s in (0, 9) for c in (1, 2, 50)]
    big = [(_BATCH_STREAM, 2**33, 3, 1)]
    with prepared(small + big):
        for rows in (small, big, small[:2] + big):
            for row, gen in zip(rows, generators(rows), strict=True):
                ref = np.random.default_rng(list(row))
                assert gen.integers(0, 30, 16).tolist() == ref.integers(0, 30, 16).tolist()


@pytest.mark.parametrize("need", [1, 7, 200])
def test_bounded_rows_draw_what_generator_integers_draws(need):
    """Lemire's draws of every row at once equal NumPy's own where no candidate is rejected; a
    count just above 2³¹ rejects about half its candidates, and those rows say so."""
    counts = np.array([1, 2, 3, 97, 150, 1000, 2**31 + 1, 2**32 - 1, 2**32] * 40, dtype=np.int64)
    rows = _rows(counts.size, 4, need)
    raw = np.empty((counts.size, (need + 1) // 2), dtype=np.uint64)
    for i, gen in enumerate(generators(rows)):
        raw[i] = gen.bit_generator.random_raw(raw.shape[1])
    values, rejected = _bounded_rows(raw.view(np.uint32)[:, :need], counts)
    for i, (row, n) in enumerate(zip(rows, counts.tolist(), strict=True)):
        if not rejected[i]:
            ref = np.random.default_rng(list(row)).integers(0, n, size=need)
            assert values[i].tolist() == ref.tolist(), (i, n)
    assert not rejected[counts < 2**31].any()
    half = rejected[counts == 2**31 + 1]
    assert half.any() and (need > 1 or not half.all())  # one candidate: about half of 40 rows


def test_rows_with_a_rejection_are_drawn_by_numpy_itself():
    clients, offsets = torch.tensor([2, 5]), torch.tensor([0, 10])
    counts = torch.tensor([2**31 + 1, 30])
    seeds, steps = [3, 4, 5, 6], [1, 1, 1, 2]  # a count above 2³¹ rejects half its candidates
    together = trials_batch_indices(
        seeds, 1, clients, offsets, counts, steps, 4, "with_replacement"
    )
    for seed, k, rows in zip(seeds, steps, together, strict=True):
        for i, (c, n, o) in enumerate(zip([2, 5], counts.tolist(), [0, 10], strict=True)):
            own = _local_draws(seed, 1, c, n, 4 * k, "with_replacement").reshape(k, 4) + o
            assert rows[i].tolist() == own.tolist(), (seed, c)
