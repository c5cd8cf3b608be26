"""Chapter 10: ring and all-to-all attention over real process groups (gloo on the CPU, 2 and 4 ranks;
NCCL on a machine with the GPUs), forward and backward, against the float64 reference with the peers'
rule — causal and not, grouped-query heads, a length the ranks divide and lengths they do not — and the
pieces the chapter teaches (the zig-zag map, the merge, which blocks a ring step computes) on their own."""

from __future__ import annotations

import math

import pytest
import torch

from tutorial_kernels.ch10_context_parallel import (context_parallel_attention, merge_partials, prefers_all_to_all,
                                                    ring_attention, ring_blocks, shard_sequence, ulysses_attention,
                                                    unshard_sequence, zigzag_chunks, zigzag_positions)
from tutorial_kernels.ranks import ranks_unavailable, run_ranks
from tutorial_kernels.reference import reference_attention
from tutorial_kernels.testing import (PEER_GRAD_FACTOR, PEER_OUTPUT_FACTOR, assert_within_peer_rule, default_device,
                                      fresh_seed, torch_attention_same_dtype)

# (name, method, causal, dtype, B, H, H_kv, N, d): each runs forward and backward on every rank count
CASES = [
    ("ring-causal", "ring", True, torch.float32, 1, 2, 2, 40, 16),
    ("ring-gqa-uneven", "ring", False, torch.float16, 2, 4, 2, 37, 32),
    ("ring-causal-gqa-uneven", "ring", True, torch.float16, 1, 4, 2, 29, 16),
    ("ulysses-causal-gqa", "ulysses", True, torch.float16, 1, 4, 4, 24, 16),
    ("ulysses-uneven", "ulysses", False, torch.float32, 1, 4, 4, 27, 16),
    ("ring-large-logits", "ring", True, torch.float16, 1, 2, 1, 32, 16),
    ("ring-shorter-than-ranks", "ring", True, torch.float32, 1, 2, 2, 3, 16),  # on 4 ranks one shard is empty
]


def _cases_on_rank(rank: int, world: int, seed: int) -> dict[str, str]:
    """Every case on this rank: the whole inputs drawn alike everywhere, this rank's shards through the
    distributed call and its backward, the whole results gathered and judged on rank 0."""
    device = default_device()
    verdicts = {}
    for name, method, causal, dtype, batch, heads, kv_heads, n, d in CASES:
        if method == "ulysses" and (heads % world or kv_heads % world):
            continue
        g = torch.Generator().manual_seed(seed)
        scale = 4.0 if "large-logits" in name else 1.0  # scores of ±50 and more: the merge's exponents
        q, k, v, do = (torch.randn(batch, h, n, d, generator=g) * (scale if i < 2 else 1.0)
                       for i, h in enumerate((heads, kv_heads, kv_heads, heads)))
        local = [shard_sequence(t.to(device, dtype), group=None).requires_grad_() for t in (q, k, v)]
        call = ring_attention if method == "ring" else ulysses_attention
        seq_len = n if n % (2 * world) else None  # only ranks of unequal shards need the whole length
        out = call(*local, causal, seq_len=seq_len)
        out.backward(shard_sequence(do.to(device, dtype)))
        results = [unshard_sequence(t.detach(), n) for t in (out, *(x.grad for x in local))]
        if rank != 0:
            continue
        leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
        ref = reference_attention(*leaves64, causal)
        ref.backward(do.double())
        same = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        base = torch_attention_same_dtype(*same, causal)
        base.backward(do.to(dtype))
        try:
            assert_within_peer_rule(results[0].cpu(), ref.detach(), base.detach(), factor=PEER_OUTPUT_FACTOR,
                                    seed=seed, what=f"{name} on {world} ranks: out")
            for what, got, r64, b in zip(("dq", "dk", "dv"), results[1:], leaves64, same):
                assert_within_peer_rule(got.cpu(), r64.grad, b.grad, factor=PEER_GRAD_FACTOR, seed=seed,
                                        what=f"{name} on {world} ranks: {what}")
            verdicts[name] = "ok"
        except AssertionError as e:
            verdicts[name] = str(e)
    return verdicts


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}-ranks")
def verdicts(request):
    world = request.param
    if ranks_unavailable(world):
        pytest.skip(ranks_unavailable(world))
    return world, run_ranks(_cases_on_rank, world, fresh_seed())


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_context_parallel_matches_the_reference(verdicts, name):
    world, found = verdicts
    if name not in found:
        assert name.startswith("ulysses"), f"{name} did not run on {world} ranks"
        pytest.skip(f"{name}: heads not divisible by {world} ranks (ulysses_attention refuses it; tested below)")
    assert found[name] == "ok", found[name]


def _refusals_on_rank(rank: int, world: int) -> list[str]:
    q = torch.randn(1, 3, 8, 16)
    messages = []
    for call in (lambda: ulysses_attention(q, q, q), lambda: ring_attention(q, q, q, seq_len=5 * world + 3)):
        try:
            call()
            messages.append("no error")
        except ValueError as e:
            messages.append(str(e))
    return messages


def test_bad_distributed_calls_name_the_argument():
    heads, seq_len = run_ranks(_refusals_on_rank, 2, backend="gloo")  # CPU tensors: refusals need no GPU
    assert "heads divisible by the 2 ranks, got 3 heads" in heads and "ring_attention" in heads
    assert "rank 0 of 2 holds 7 of seq_len=13 positions" in seq_len and "got a shard of 8" in seq_len


@pytest.mark.parametrize("n, world", [(16, 2), (37, 4), (3, 4), (0, 2), (29, 3)])
def test_zigzag_shards_cover_the_sequence_once(n, world):
    held = torch.cat([zigzag_positions(n, world, r) for r in range(world)])
    assert sorted(held.tolist()) == list(range(n))
    lengths = [b - a for a, b in zigzag_chunks(n, world)]
    assert max(lengths) - min(lengths) <= 1 and sum(lengths) == n


def test_zigzag_balances_causal_work():
    """Pairs (query, key) each ring step computes, per rank: equal under the zig-zag cut (and the work
    counted is exactly the causal triangle), where the contiguous cut gives the last rank P times more."""
    n, world = 64, 4
    chunks = [b - a for a, b in zigzag_chunks(n, world)]
    total = 0
    for step in range(world):
        work = []
        for rank in range(world):
            source = (rank - step) % world
            pairs = 0
            for rows, keys, causal in ring_blocks(rank, source, True, (chunks[rank], chunks[-1 - rank]),
                                                  (chunks[source], chunks[-1 - source])):
                m, k = rows.stop - rows.start, keys.stop - keys.start
                pairs += m * (m + 1) // 2 + m * (k - m) if causal else m * k
            work.append(pairs)
        assert len(set(work)) == 1, f"step {step}: {work}"
        total += sum(work)
    # the diagonal steps count each of the 2 chunks' own triangle plus the early-late block
    assert total == n * (n + 1) // 2


def test_merge_of_two_halves_is_the_whole_softmax():
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    s = q @ k.transpose(-1, -2)
    o = torch.zeros(2, 3, 5, 8, dtype=torch.float64)
    lse = torch.full((2, 3, 5), -math.inf, dtype=torch.float64)
    for part in (slice(0, 2), slice(2, 5), slice(5, 5)):  # the last part sees no key: −∞, weight 0
        sp = s[..., part]
        lse_p = torch.logsumexp(sp, -1) if sp.shape[-1] else torch.full((2, 3, 5), -math.inf, dtype=torch.float64)
        o_p = torch.softmax(sp, -1) @ v[..., part, :] if sp.shape[-1] else torch.zeros(2, 3, 5, 8, dtype=torch.float64)
        merge_partials(o, lse, o_p, lse_p)
    torch.testing.assert_close(o, torch.softmax(s, -1) @ v, msg=lambda m: f"{m}; seed={seed}")
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))


def test_one_rank_is_the_front_door():
    """Without a process group every call is one rank's: the whole sequence, the front door's kernel."""
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g).to(default_device()) for _ in range(3))
    ref = reference_attention(q.double(), k.double(), v.double(), True)
    for method in ("ring", "ulysses", "auto"):
        out = context_parallel_attention(q, k, v, True, method=method)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="method must be 'auto', 'ring' or 'ulysses', got 'tree'"):
        context_parallel_attention(q, k, v, method="tree")
    with pytest.raises(ValueError, match=r"k and v must hold the same positions as q"):
        ring_attention(q, k[:, :, :5], v)


@pytest.mark.parametrize("heads, kv_heads, world, expected", [
    (32, 32, 1, False),  # one rank: nothing to exchange
    (32, 32, 2, False),  # equal volume: the ring, whose hops hide
    (32, 32, 4, True),
    (32, 8, 4, False),   # grouped-query: the ring's shards are 4 times smaller, it moves less
    (32, 8, 8, True),
    (32, 8, 16, False),  # 8 key/value heads do not divide among 16 ranks
    (12, 12, 8, False),
])
def test_the_rule_between_ring_and_all_to_all(heads, kv_heads, world, expected):
    assert prefers_all_to_all(heads, kv_heads, world) is expected


def test_the_front_doors_block_calls_refuse_by_name():
    """flash_attention_forward / flash_attention_backward, what the ring calls per block: the inputs'
    contract checked with the front door's messages, and the given O and lse checked by name."""
    from tutorial_kernels.attention import flash_attention_backward, flash_attention_forward

    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = (torch.randn(1, 2, 20, 16, generator=g).to(default_device()) for _ in range(3))
    o, lse = flash_attention_forward(q, k, v, True)
    with pytest.raises(ValueError, match=r"lse must be a tensor of shape \(1, 2, 20\), got \(1, 2, 19\)"):
        flash_attention_backward(o, q, k, v, o, lse[..., :19], True)
    with pytest.raises(ValueError, match=r"do and o must have q's dtype torch.float32 and lse float32"):
        flash_attention_backward(o.half(), q, k, v, o, lse, True)
    with pytest.raises(ValueError, match="head_dim"):
        flash_attention_forward(q[..., :8], k[..., :8], v[..., :8])
    dq, dk, dv = flash_attention_backward(torch.ones_like(o), q, k, v, o, lse, True)
    assert dq.shape == q.shape and dk.shape == k.shape and torch.isfinite(dv).all()


def test_run_ranks_says_why_the_ranks_cannot_run_here(monkeypatch):
    """Without a backend named, run_ranks refuses where `ranks_unavailable` says the group cannot form (here
    pretended: a machine with fewer GPUs than ranks), with that reason, before starting any process."""
    from tutorial_kernels import ranks

    monkeypatch.setattr(ranks, "ranks_unavailable", lambda world: f"{world} ranks need {world} GPUs, this one has 1")
    with pytest.raises(RuntimeError, match="run_ranks: 2 ranks need 2 GPUs, this one has 1"):
        ranks.run_ranks(_refusals_on_rank, 2)
