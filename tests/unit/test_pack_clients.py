"""Each member's sum over its clients, read in the messages' own memory order
(fedtune.trainers.pack_clients.member_sums)."""

from __future__ import annotations

import pytest
import torch

from fedtune.trainers.pack_clients import member_sums

#: (logical shape [G·M, …], the order of its dimensions in memory, outermost first)
LAYOUTS = [
    ((160, 128, 128), (0, 2, 1)),  # a batched weight's gradient: stored [in, out]
    ((160, 10, 128), (0, 2, 1)),
    ((160, 128, 10), (0, 2, 1)),
    ((160, 128), (0, 1)),  # a bias
    ((160,), (0,)),
    ((160, 4, 5, 6), (0, 3, 1, 2)),
    ((160, 4, 5, 6), (0, 1, 2, 3)),
    ((160, 1, 7), (0, 2, 1)),
]


def laid_out(shape: tuple[int, ...], order: tuple[int, ...]) -> torch.Tensor:
    """A float64 tensor of ``shape`` whose dimensions lie in memory in ``order``."""
    gen = torch.Generator().manual_seed(len(shape) * 1000 + shape[-1])
    base = torch.randn(*[shape[d] for d in order], dtype=torch.float64, generator=gen)
    return base.permute(*[order.index(d) for d in range(len(shape))])


@pytest.mark.parametrize(("shape", "order"), LAYOUTS)
def test_member_sums_is_the_sum_over_clients_in_the_messages_layout(shape, order) -> None:
    v = laid_out(shape, order)
    assert v.shape == shape
    got = member_sums(v, 16, 10)
    want = v.unflatten(0, (16, 10)).sum(1)
    assert got.shape == want.shape == (16, *shape[1:])
    # the same sum up to the order of its additions: within M rounding errors of Σ|v_i|
    bound = 10 * torch.finfo(torch.float64).eps * v.abs().unflatten(0, (16, 10)).sum(1)
    assert bool(((got - want).abs() <= bound).all())
    # the result keeps the trailing dimensions' memory order (what the server step reads next)
    trailing = sorted(range(1, len(shape)), key=lambda d: -got.stride(d))
    assert [d for d in order if d > 0] == trailing or min(shape[1:] or (2,)) == 1


def test_member_sums_reads_a_transposed_gradient_without_a_contiguous_copy() -> None:
    v = laid_out((160, 128, 64), (0, 2, 1))
    got = member_sums(v, 16, 10)
    assert got.stride() == (128 * 64, 1, 128)
    assert torch.equal(got, v.contiguous().unflatten(0, (16, 10)).sum(1))
