"""Chapter 7's backward on Hopper (`tutorial_kernels.ch07_hopper_backward`) and the forward's
log-sum-exp it starts from (`ch07_hopper.flash_attn_hopper_with_lse`).

The kernels run on a Hopper GPU only (tests marked as the forward's, see test_ch07_hopper.py); what
runs everywhere: both Gluon kernels compile for sm_90a on this machine (Triton's own compiler and
ptxas, no GPU), the refusals, and the rule that says when the front door takes this backward."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tutorial_kernels.attention import backward_kernel_for, flash_attention
from tutorial_kernels.ch07_hopper import flash_attn_hopper_with_lse, hopper_kernel_unavailable
from tutorial_kernels.ch07_hopper_backward import (HEAD_DIMS, flash_attn_hopper_backward, hopper_backward_unavailable,
                                                   query_tile_stats)
from tutorial_kernels.dispatch import RULES, hopper_backward_preferred
from tutorial_kernels.reference import reference_attention, reference_log_sum_exp, reference_scores, relative_error
from tutorial_kernels.testing import assert_close, grad_tolerance, random_qkv, tolerance
from tutorial_kernels.tests.test_ch07_hopper import needs_hopper
from tutorial_kernels.validation import UnsupportedShape

SHARED_MEMORY_LIMIT = 227 * 1024  # bytes a program may allocate on an H100


def test_the_gluon_kernels_compile_for_hopper_without_a_gpu():
    env = dict(os.environ, TRITON_INTERPRET="0")  # compiled, not interpreted (see gluon_offline.py)
    run = subprocess.run([sys.executable, "-m", "tutorial_kernels.tests.gluon_offline"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    tags = ("full", "causal")
    assert {r["kernel"] for r in reports} == ({f"forward-d{d}-{tag}" for d in (64, 128, 256) for tag in tags}
                                              | {f"forward-d128-{tag}-window" for tag in tags}
                                              | {f"backward-d{d}-{tag}" for d in (64, 128) for tag in tags})
    for r in reports:
        assert 0 < r["shared_bytes"] <= SHARED_MEMORY_LIMIT, r


def test_cpu_tensors_are_refused_with_the_reason():
    q = torch.randn(1, 2, 8, 128, dtype=torch.float16)
    assert "compute capability 9.x" in hopper_backward_unavailable(q, q, q, q)
    columns_apart = q.transpose(2, 3).contiguous().transpose(2, 3)  # the head dimension with stride 8
    assert "needs do's head dimension contiguous" in hopper_kernel_unavailable(q, q, q, columns_apart)
    with pytest.raises(UnsupportedShape, match=r"Hopper backward needs CUDA tensors .* got cpu"):
        flash_attn_hopper_backward(q, q, q, q, q[..., 0].float(), q, False)
    with pytest.raises(ValueError, match="do must have q's shape"):
        flash_attn_hopper_backward(q, q, q, q, q[..., 0].float(), q[:, :1], False)
    with pytest.raises(ValueError, match=r"lse must be the forward's log-sum-exp, shape \(1, 2, 8\) float32"):
        flash_attn_hopper_backward(q, q, q, q, q[..., 0], q, False)
    with pytest.raises(TypeError, match="float16 and torch.bfloat16, got torch.float32"):
        flash_attn_hopper_backward(*(t.float() for t in (q, q, q, q)), q[..., 0].float(), q.float(), False)
    # the forward runs head_dim 256 as well; this backward 64 and 128 only
    q256 = torch.randn(1, 2, 8, 256, dtype=torch.float16)
    assert "head_dim 64 or 128, got 256" in hopper_backward_unavailable(q256, q256, q256, q256)
    with pytest.raises(UnsupportedShape, match="Hopper backward is built for head_dim 64 or 128, got 256"):
        flash_attn_hopper_backward(q256, q256, q256, q256, q256[..., 0].float(), q256, False)


@pytest.mark.parametrize("block_m", [64, 128])
def test_the_loaders_per_query_statistics_are_lse_in_log2_units_and_delta_padded_to_whole_tiles(block_m):
    n_q = block_m + 6  # one whole query tile and a ragged one
    lse = torch.randn(2, 3, n_q, dtype=torch.float32)
    lse[0, 1, 5] = float("-inf")  # a query that sees no key
    delta = torch.randn(2, 3, n_q, dtype=torch.float32)
    stats = query_tile_stats(lse, delta, block_m)
    assert stats.shape == (2, 6, 2 * block_m) and stats.dtype == torch.float32
    lse2, d = stats[0, :, :n_q].reshape(2, 3, n_q), stats[1, :, :n_q].reshape(2, 3, n_q)
    seen = lse > float("-inf")
    assert torch.allclose(lse2[seen], lse[seen] / torch.log(torch.tensor(2.0)))
    assert lse2[0, 1, 5] == float("inf")  # its P = 2^(s − ∞) = 0
    assert torch.equal(d, delta)
    assert torch.all(stats[0, :, n_q:] == float("inf")) and torch.all(stats[1, :, n_q:] == 0)
    whole = query_tile_stats(lse[..., :block_m], delta[..., :block_m], block_m)  # no padding to write
    assert whole.shape == (2, 6, block_m) and torch.equal(whole[1].reshape(2, 3, block_m), delta[..., :block_m])


def test_the_front_door_takes_it_where_it_was_measured_faster():
    # From backward_min_keys[head_dim][mask] keys and queries on (the rules table, perf/rules_sm90.json).
    def qk(n_q, n_k, head_dim):
        return (torch.empty(1, 8, n_q, head_dim, dtype=torch.bfloat16, device="meta"),
                torch.empty(1, 8, n_k, head_dim, dtype=torch.bfloat16, device="meta"))

    table = RULES["backward_min_keys"]
    assert {int(d) for d in table} == set(HEAD_DIMS) and all(set(v) == {"full", "causal"} for v in table.values())
    for head_dim, by_mask in table.items():
        for mask, min_keys in by_mask.items():
            causal = mask == "causal"
            assert hopper_backward_preferred(*qk(min_keys, min_keys, int(head_dim)), causal=causal)
            assert not hopper_backward_preferred(*qk(min_keys - 1, 16384, int(head_dim)), causal=causal)
            assert not hopper_backward_preferred(*qk(16384, min_keys - 1, int(head_dim)), causal=causal)
    assert table["64"]["causal"] > table["64"]["full"]  # causal d = 64 was level at 2048 (bf16 behind)
    assert not hopper_backward_preferred(*qk(16384, 16384, 256), causal=False)  # a head_dim it does not run
    q = torch.randn(1, 2, 8, 128, dtype=torch.float16)
    assert backward_kernel_for(q, q, q, q, False) == "triton-interpreter"


def _gradients(q, k, v, causal, seed):
    """(out, lse, dq, dk, dv) of the two Hopper kernels for a random dO, and the float64 reference's."""
    gen = torch.Generator(device=q.device).manual_seed(seed + 1)
    do = torch.randn(q.shape, generator=gen, device=q.device).to(q.dtype)  # never zeros
    out, lse = flash_attn_hopper_with_lse(q, k, v, causal)
    dq, dk, dv = flash_attn_hopper_backward(q, k, v, out, lse, do, causal)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(q64, k64, v64, causal)
    ref.backward(do.double())
    return (out, lse, dq, dk, dv), (ref.detach(), q64.grad, k64.grad, v64.grad)


# (batch, heads, kv_heads, n_q, n_k): N = 1; ragged tiles; n_q ≠ n_k both ways, causal with queries
# that see no key (n_q > n_k); grouped- and multi-query attention (dK, dV summed over each group)
SHAPES = [(1, 1, 1, 1, 1), (2, 4, 2, 300, 300), (1, 3, 1, 200, 517), (1, 2, 2, 517, 200), (1, 4, 1, 1000, 1000)]


@needs_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}h{}kv{}-nq{}-nk{}".format(*s))
def test_gradients_match_float64_autograd(shape, causal, dtype, head_dim):
    batch, heads, kv_heads, n_q, n_k = shape
    x = random_qkv(batch, heads, n_q, n_k, head_dim, dtype, "cuda", layout="bnhd")  # strided, as models pass them
    k, v = x.k[:, :kv_heads], x.v[:, :kv_heads]
    (out, lse, dq, dk, dv), (ref, rq, rk, rv) = _gradients(x.q, k, v, causal, x.seed)
    assert_close(out, ref, dtype, seed=x.seed)
    ref_lse = reference_log_sum_exp(reference_scores(x.q, k, causal))
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), ~seen), f"rows that see no key: lse = −∞; seed={x.seed}"
    assert relative_error(lse[seen], ref_lse[seen]) <= tolerance(dtype), f"lse; seed={x.seed}"
    for name, got, want in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert_close(got, want, dtype, seed=x.seed, what=name, bound=grad_tolerance(dtype))


@needs_hopper
def test_dk_and_dv_are_reproducible_bit_for_bit_and_dq_to_its_last_bits():
    # dK and dV have one writer each; dQ is summed by atomic additions in whatever order the
    # programs reach them: float32 sums that may differ in their last bits, rounded once to bfloat16.
    x = random_qkv(2, 4, 1000, 1000, 128, torch.bfloat16, "cuda")
    do = torch.randn_like(x.q)
    out, lse = flash_attn_hopper_with_lse(x.q, x.k, x.v, False)
    first = flash_attn_hopper_backward(x.q, x.k, x.v, out, lse, do, False)
    for _ in range(3):
        again = flash_attn_hopper_backward(x.q, x.k, x.v, out, lse, do, False)
        assert torch.equal(again[1], first[1]) and torch.equal(again[2], first[2]), f"dK, dV; seed={x.seed}"
        torch.testing.assert_close(again[0], first[0], rtol=2 ** -7, atol=1e-6)  # one bfloat16 ulp


@needs_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_front_door_trains_through_the_hopper_kernels(causal, head_dim):
    # Long enough for both Hopper kernels; ragged (4100 = 32 tiles of 128 + 4); grouped-query attention
    x = random_qkv(1, 4, 4100, 4100, head_dim, torch.bfloat16, "cuda")
    k, v = x.k[:, :2], x.v[:, :2]
    assert backward_kernel_for(x.q, k, v, x.q, causal) == "hopper"
    _front_door_gradients_match_float64(x, k, v, causal)


def _front_door_gradients_match_float64(x, k, v, causal: bool) -> None:
    """dQ, dK, dV of `flash_attention(q, k, v)` for a random dO against float64 autograd, bfloat16 bounds."""
    q, k, v = (t.detach().requires_grad_() for t in (x.q, k, v))
    do = torch.randn_like(x.q)
    flash_attention(q, k, v, causal).backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    reference_attention(q64, k64, v64, causal).backward(do.double())
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert_close(got, want, torch.bfloat16, seed=x.seed, what=name, bound=grad_tolerance(torch.bfloat16))


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 300, 300), (1, 2, 2, 517, 200), (1, 1, 1, 1, 1)],
                         ids=lambda s: "b{}h{}kv{}-nq{}-nk{}".format(*s))
def test_the_forward_writes_the_log_sum_exp_at_head_dim_256(shape, causal):
    # what training at d = 256 starts from (the backward's own head dims check lse in their gradient
    # test): O and lse (−∞ for rows that see no key)
    head_dim = 256
    batch, heads, kv_heads, n_q, n_k = shape
    x = random_qkv(batch, heads, n_q, n_k, head_dim, torch.bfloat16, "cuda", layout="bnhd")
    k, v = x.k[:, :kv_heads], x.v[:, :kv_heads]
    out, lse = flash_attn_hopper_with_lse(x.q, k, v, causal)
    group = heads // kv_heads
    assert_close(out, reference_attention(x.q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal),
                 torch.bfloat16, seed=x.seed)
    ref_lse = reference_log_sum_exp(reference_scores(x.q, k, causal))
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), ~seen), f"rows that see no key: lse = −∞; seed={x.seed}"
    assert relative_error(lse[seen], ref_lse[seen]) <= tolerance(torch.bfloat16), f"lse; seed={x.seed}"


@needs_hopper
def test_the_front_door_trains_at_head_dim_256_through_the_hopper_forward():
    # the Hopper forward (with lse) at d = 256, chapter 6's backward (the Hopper one runs 64 and 128 only)
    x = random_qkv(1, 4, 2100, 2100, 256, torch.bfloat16, "cuda")
    k, v = x.k[:, :2], x.v[:, :2]
    from tutorial_kernels.attention import kernel_for

    assert kernel_for(x.q, k, v, True) == "hopper" and backward_kernel_for(x.q, k, v, x.q, True) == "triton-tuned"
    _front_door_gradients_match_float64(x, k, v, True)
