"""Lab 10's grader can tell typical mistakes apart: each planted slip in the zig-zag map or the merge is caught
with its own hint, a wrong block rule is refused at the first pair computed wrongly, and the solutions are
chapter 10's own functions."""

from __future__ import annotations

import math

import pytest
import torch

from tutorial_kernels import ch10_context_parallel
from tutorial_kernels.labs import check
from tutorial_kernels.labs.ch10 import merge, ring_blocks, zigzag_positions
from tutorial_kernels.tests.planted import assert_caught_with_its_hint


def _chunks(n, world, base_only=False):
    base, extra = divmod(n, 2 * world)
    starts = [0]
    for c in range(2 * world):
        starts.append(starts[-1] + base + (0 if base_only else c < extra))
    return starts


def _zz_contiguous(n, world, rank):
    return torch.tensor_split(torch.arange(n), world)[rank]


def _zz_mirror(n, world, rank):
    s = _chunks(n, world)
    return torch.cat([torch.arange(s[rank], s[rank + 1]), torch.arange(s[2 * world - 2 - rank], s[2 * world - 1 - rank])])


def _zz_order(n, world, rank):
    s = _chunks(n, world)
    return torch.cat([torch.arange(s[2 * world - 1 - rank], s[2 * world - rank]), torch.arange(s[rank], s[rank + 1])])


def _zz_remainder(n, world, rank):
    s = _chunks(n, world, base_only=True)
    return torch.cat([torch.arange(s[rank], s[rank + 1]), torch.arange(s[2 * world - 1 - rank], s[2 * world - rank])])


def _merge_unweighted(o, lse, o_part, lse_part):
    return o + o_part, torch.logaddexp(lse, lse_part)


def _merge_max(o, lse, o_part, lse_part):
    new = torch.maximum(lse, lse_part)
    seen = new > -math.inf
    return (torch.where(seen, torch.exp(lse - new), 0.0)[..., None] * o
            + torch.where(seen, torch.exp(lse_part - new), 0.0)[..., None] * o_part, new)


def _merge_overflow(o, lse, o_part, lse_part):
    new = torch.log(torch.exp(lse) + torch.exp(lse_part))
    seen = new > -math.inf
    return (torch.where(seen, torch.exp(lse - new), 0.0)[..., None] * o
            + torch.where(seen, torch.exp(lse_part - new), 0.0)[..., None] * o_part, new)


def _merge_no_guard(o, lse, o_part, lse_part):
    new = torch.logaddexp(lse, lse_part)
    return torch.exp(lse - new)[..., None] * o + torch.exp(lse_part - new)[..., None] * o_part, new


PLANTED = [("ch10.zigzag", _zz_contiguous, "contiguous"), ("ch10.zigzag", _zz_mirror, "mirror"),
           ("ch10.zigzag", _zz_order, "order"), ("ch10.zigzag", _zz_remainder, "remainder"),
           ("ch10.merge", _merge_unweighted, "unweighted"), ("ch10.merge", _merge_max, "max"),
           ("ch10.merge", _merge_overflow, "overflow"), ("ch10.merge", _merge_no_guard, "no_guard")]


@pytest.mark.parametrize("step, fn, mistake", PLANTED, ids=[f"{s}-{m}" for s, _, m in PLANTED])
def test_a_planted_lab10_mistake_is_caught_with_its_hint(step, fn, mistake):
    assert_caught_with_its_hint(step, fn, mistake)


def _blocks_all_keys(rank, source, causal, q_chunks, kv_chunks):  # every visitor's keys, whole
    return [(slice(0, sum(q_chunks)), slice(0, sum(kv_chunks)), causal and source == rank)]


def _blocks_swapped(rank, source, causal, q_chunks, kv_chunks):  # the two cases of another GPU's keys exchanged
    if not causal or source == rank:
        return ring_blocks(rank, source, causal, q_chunks, kv_chunks)
    return ring_blocks(source, rank, causal, q_chunks, kv_chunks)


def _blocks_own_full(rank, source, causal, q_chunks, kv_chunks):  # its own keys without the causal mask
    return [(r, k, False) for r, k, _ in ring_blocks(rank, source, causal, q_chunks, kv_chunks)]


@pytest.mark.parametrize("fn, says", [(_blocks_all_keys, "the key is later"), (_blocks_own_full, "the key is later"),
                                      (_blocks_swapped, "computed")])
def test_a_wrong_block_rule_is_refused_at_its_first_wrong_pair(fn, says):
    report = check("ch10.blocks", fn, quiet=True)
    assert not report.passed and says in report.message and "query position" in report.message


def test_the_solutions_are_the_chapters_functions():
    for n, world in ((37, 4), (12, 3), (5, 4)):
        for rank in range(world):
            assert torch.equal(zigzag_positions(n, world, rank), ch10_context_parallel.zigzag_positions(n, world, rank))
            for source in range(world):
                for causal in (False, True):
                    chunks = [b - a for a, b in ch10_context_parallel.zigzag_chunks(n, world)]
                    args = (rank, source, causal, (chunks[rank], chunks[-1 - rank]),
                            (chunks[source], chunks[-1 - source]))
                    assert ring_blocks(*args) == ch10_context_parallel.ring_blocks(*args)
    g = torch.Generator().manual_seed(3)
    o, o_part = torch.randn(2, 4, 8, generator=g), torch.randn(2, 4, 8, generator=g)
    lse, lse_part = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
    expected_o, expected_lse = o.clone(), lse.clone()
    ch10_context_parallel.merge_partials(expected_o, expected_lse, o_part, lse_part)
    got_o, got_lse = merge(o, lse, o_part, lse_part)
    torch.testing.assert_close(got_o, expected_o)
    torch.testing.assert_close(got_lse, expected_lse)
