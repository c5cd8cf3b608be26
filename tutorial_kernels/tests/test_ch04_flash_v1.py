"""Chapter 4: FlashAttention-1 (K/V outer, Q inner, O/ℓ/m in HBM), its saved statistics and its byte count.

`flash_attn_v1`'s output on every shape, dtype, layout and bad input is checked by `test_conformance.py`."""

import math

import pytest
import torch

from tutorial_kernels.ch04_flash_v1 import (
    flash_attn_v1_with_lse,
    flash_v1_schedule,
    theorem2_block_n,
)
from tutorial_kernels.reference import reference_attention, reference_log_sum_exp, reference_scores
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.testing import KERNEL_DTYPES, assert_close, random_qkv


def lse_tolerance(dtype: torch.dtype) -> float:
    """Bound on |lse − lse_ref| (absolute: lse is a log). The statistics are float32 sums of e^{S − m};
    only S's rounding matters, and on a GPU float32 inputs go through TF32 dot products."""
    if dtype == torch.float32 and not interpreter_active():
        return 2e-2
    return 1e-3


def assert_lse_close(lse: torch.Tensor, q, k, causal: bool, sm_scale=None, *, dtype, seed) -> None:
    ref = reference_log_sum_exp(reference_scores(q, k, causal, sm_scale))  # (B, H, n_q) float64
    assert lse.shape == ref.shape and lse.dtype == torch.float32
    empty = torch.isinf(ref)
    assert torch.all(lse[empty] == float("-inf")), f"queries that see no key need lse = −∞; seed={seed}"
    assert torch.isfinite(lse[~empty]).all(), f"lse has NaN or ±∞ where a key is visible; seed={seed}"
    err = (lse[~empty].double() - ref[~empty]).abs().max().item() if (~empty).any() else 0.0
    assert err <= lse_tolerance(dtype), f"lse: max error {err:.2e} > {lse_tolerance(dtype):.0e} for {dtype}; seed={seed}"


# --- the saved statistics -------------------------------------------------------------------------

LSE_CASES = [(2, 3, 100, 100, 64), (1, 2, 257, 128, 32), (2, 2, 17, 100, 80), (1, 2, 100, 17, 16)]


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", LSE_CASES, ids=lambda s: "b{}h{}-nq{}-nk{}-d{}".format(*s))
def test_log_sum_exp_matches_reference(shape, causal, dtype):
    x = random_qkv(*shape, dtype)
    o, lse = flash_attn_v1_with_lse(x.q, x.k, x.v, causal)
    assert_close(o, reference_attention(x.q, x.k, x.v, causal), dtype, seed=x.seed)
    assert_lse_close(lse, x.q, x.k, causal, dtype=dtype, seed=x.seed)


def test_strides_scale_and_empty_rows():
    # (B, N, H, d) layout, a non-default scale, and n_q > n_k causal: the first 50 queries see no key
    x = random_qkv(2, 3, 90, 40, 48, torch.float16, layout="bnhd")
    o, lse = flash_attn_v1_with_lse(x.q, x.k, x.v, True, sm_scale=0.2)
    assert torch.all(o[:, :, :50] == 0), "queries that see no key must output zeros"
    assert_close(o, reference_attention(x.q, x.k, x.v, True, 0.2), torch.float16, seed=x.seed)
    assert_lse_close(lse, x.q, x.k, True, 0.2, dtype=torch.float16, seed=x.seed)


def test_large_scores_keep_rescaling_exact():
    # scores of several hundred: every new maximum rescales O by e^{m_old − m_new} ≈ 0, never overflows.
    # float16 inputs: their products are exact in the float32 accumulator (TF32 would round the scores
    # themselves, by more than the lse bound once they are this large)
    x = random_qkv(1, 2, 150, 200, 32, torch.float16)
    o, lse = flash_attn_v1_with_lse(x.q, x.k, x.v, False, sm_scale=30.0)
    assert_close(o, reference_attention(x.q, x.k, x.v, False, 30.0), torch.float16, seed=x.seed)
    assert_lse_close(lse, x.q, x.k, False, 30.0, dtype=torch.float16, seed=x.seed)


# --- the schedule does not depend on the tile sizes -----------------------------------------------

BLOCKS = [(16, 16), (16, 64), (64, 16), (32, 128), (128, 32)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("block_m,block_n", BLOCKS, ids=lambda b: str(b))
def test_any_tile_sizes(block_m, block_n, causal):
    # n_q ≠ n_k, neither a multiple of a tile; with (128, 32) all of Q is one tile (T_r = 1), so every
    # outer step rereads the O_i, ℓ_i, m_i it has just written
    x = random_qkv(1, 2, 75, 130, 64, torch.float32)
    o, lse = flash_attn_v1_with_lse(x.q, x.k, x.v, causal, block_m=block_m, block_n=block_n)
    assert_close(o, reference_attention(x.q, x.k, x.v, causal), torch.float32, seed=x.seed)
    assert_lse_close(lse, x.q, x.k, causal, dtype=torch.float32, seed=x.seed)


def test_rejects_bad_tile_sizes():
    # the arguments every implementation takes are checked by test_conformance.py; these are chapter 4's own
    x = random_qkv(1, 1, 8, 8, 16, torch.float32)
    with pytest.raises(ValueError, match=r"block_n must be a power of two between 16 and 256, got 48"):
        flash_attn_v1_with_lse(x.q, x.k, x.v, block_n=48)
    with pytest.raises(ValueError, match=r"block_m must be a power of two between 16 and 256, got 512"):
        flash_attn_v1_with_lse(x.q, x.k, x.v, block_m=512)
    with pytest.raises(ValueError, match=r"block_m must be a power of two between 16 and 256, got True"):
        flash_attn_v1_with_lse(x.q, x.k, x.v, block_m=True)


# --- the byte count of the IO model ---------------------------------------------------------------

def test_schedule_is_kv_outer_q_inner():
    visits = flash_v1_schedule(200, 200, 64, 64)
    assert visits[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)], "j (K/V tile) outside, i (Q tile) inside"
    assert len(visits) == 4 * 4
    causal = flash_v1_schedule(256, 256, 64, 64, causal=True)
    assert causal == [(j, i) for j in range(4) for i in range(j, 4)], "tiles above the diagonal are skipped"
    # n_q > n_k, bottom-right: the first 64 queries see nothing and their tile is never visited
    assert all(i >= 1 for _, i in flash_v1_schedule(128, 64, 64, 64, causal=True))


def test_theorem2_block_size():
    # B_c = ⌈M / 4d⌉ with M counted in elements: 228 KB of shared memory, fp16, d = 128
    assert theorem2_block_n(228 * 1024, 128, 2) == math.ceil(228 * 1024 / 2 / 512)
