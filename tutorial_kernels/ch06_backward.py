"""Chapter 6 — the FlashAttention backward pass (Dao 2023, Algorithm 2), in Triton.

The forward of chapter 5 saves only O and one log-sum-exp per query row. The backward recomputes
every tile of S and P from Q, K and that log-sum-exp instead of reading a stored N × N matrix:

    P   = exp(τ Q Kᵀ − lse)          (recomputed, tile by tile)
    dV  = Pᵀ dO
    dP  = dO Vᵀ
    dS  = P ∘ (dP − Δ),  Δ_i = rowsum(dO_i ∘ O_i)
    dQ  = τ dS K
    dK  = τ dSᵀ Q

Three kernels:

* `_attn_bwd_preprocess_kernel`: Δ, one float32 number per query row;
* `_attn_bwd_dkdv_kernel`: one program per (key tile, batch × key/value head). K_j and V_j stay on
  chip; the program loops over the query heads of its group and their query tiles, so dK and dV
  of a grouped-query head are summed in registers — no atomics, no per-query-head buffer;
* `_attn_bwd_dq_kernel`: one program per (query tile, batch × query head), looping over key tiles.
  Computing dQ in its own kernel recomputes P once more, but every element of dQ is written by one
  program in a fixed order: the gradients are bit-for-bit deterministic (atomic additions into dQ
  from the dK/dV programs would sum in whatever order the programs happen to run).

Causal masks (bottom-right aligned, as in the forward) are applied only when `causal=True`, and
only on the tiles that cross the diagonal; without `causal` no score is masked. Queries that see
no key (lse = −∞) get P = 0 and contribute nothing. P = e^{τS − lse} is at most 1 in exact
arithmetic; the kernels cap its exponent at 0, so that the rounding of lse at very large scores
never makes it ∞.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl

from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse
from tutorial_kernels.perf import tile_table
from tutorial_kernels.perf.autotune import TunedKernel, loaded
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.precision import autotunes, dot_precision, tiles_for
from tutorial_kernels.tiling import (
    INTERPRETER_TILES, LOG2_E, causal_key_stages, causal_query_stages, head_dim_block, to_log2_units, tuning_tiles)
from tutorial_kernels.validation import check_attention_inputs

log = logging.getLogger(__name__)


# --8<-- [start:preprocess]
@triton.jit
def _attn_bwd_preprocess_kernel(
    o_ptr, do_ptr, delta_ptr,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    n_heads, n_q, head_dim,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Δ_i = Σ_d dO_id · O_id = Σ_j P_ij dP_ij, for one tile of query rows of one (batch, head)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    batch = pid_bh // n_heads
    head = pid_bh % n_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim)
    o = tl.load(o_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=mask, other=0.0)
    do = tl.load(do_ptr + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # Δ = rowsum(dO ∘ O), float32
    tl.store(delta_ptr + pid_bh * n_q + offs_m, delta, mask=offs_m < n_q)
# --8<-- [end:preprocess]


# --8<-- [start:dkdv_inner]
@triton.jit
def _dkdv_from_query_tiles(
    dk, dv, k, v,
    q_src, do_src, lse_src, delta_src, stride_qm, stride_qd, stride_dom, stride_dod,
    offs_n, offs_d, n_q, n_k, head_dim, qk_scale,
    lo, hi,
    MASKED: tl.constexpr, BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Add the query tiles [lo, hi) of one query head to the (dK, dV) of one key tile.

    MASKED=True is for the query tiles that cross the causal diagonal; the others need no mask.
    Rows past n_q load Q = dO = 0 and lse = +∞, so their P is 0 and they add nothing.
    """
    d_ok = offs_d < head_dim
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < n_q
        # Qᵢᵀ (d × BLOCK_M), loaded transposed so that every product below is "registers × shared
        # memory" without moving a computed tile between layouts: Sᵀ and Pᵀ come out of K Qᵀ already
        # in the shape the dV and dK products consume.
        q_t = tl.load(q_src + offs_d[:, None] * stride_qd + offs_m[None, :] * stride_qm,
                      mask=d_ok[:, None] & m_ok[None, :], other=0.0)
        do = tl.load(do_src + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        lse = tl.load(lse_src + offs_m, mask=m_ok, other=float("inf"))
        # a query that sees no key has lse = −∞; +∞ instead makes its P = 2^(s − ∞) = 0, not ∞·0 = NaN
        lse2 = tl.where(lse == float("-inf"), float("inf"), to_log2_units(lse))
        delta = tl.load(delta_src + offs_m, mask=m_ok, other=0.0)

        s_t = tl.dot(k, q_t, input_precision=DOT_PRECISION)  # Sᵀ = K_j Qᵢᵀ, (BLOCK_N, BLOCK_M), float32
        # Pᵀ = e^{τSᵀ − lse}, recomputed; τS ≤ lse exactly, but at scores of 10¹¹ a rounding of lse
        # could push the exponent above 0 and P to ∞: the exponent is capped at 0 (P ≤ 1)
        p_t = tl.math.exp2(tl.minimum(s_t * qk_scale - lse2[None, :], 0.0))
        if MASKED:
            visible = offs_n[:, None] <= offs_m[None, :] + (n_k - n_q)  # bottom-right causal
            p_t = tl.where(visible, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # dV_j ← dV_j + Pᵀ dOᵢ
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # dPᵀ = V_j dOᵢᵀ, float32
        ds_t = p_t * (dp_t - delta[None, :])  # dSᵀ = Pᵀ ∘ (dPᵀ − Δ); 0 wherever P is 0
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=DOT_PRECISION)  # dK_j ← dK_j + dSᵀ Qᵢ (τ: later)
    return dk, dv
# --8<-- [end:dkdv_inner]


# --8<-- [start:dkdv_kernel]
@triton.jit
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    n_heads, group_size, n_q, n_k, head_dim, sm_scale, qk_scale, length_bucket,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "tf32x3" or "tf32" for float32 operands: `precision.dot_precision`
):
    """One program: one BLOCK_N tile of keys of one (batch, key/value head), against every query of
    every query head in its group that can see it."""
    pid_n = tl.program_id(0)
    pid_bkv = tl.program_id(1).to(tl.int64)
    n_kv_heads = n_heads // group_size
    batch = pid_bkv // n_kv_heads
    kv_head = pid_bkv % n_kv_heads

    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < head_dim)
    k = tl.load(k_ptr + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)  # K_j, on chip for the whole program
    v = tl.load(v_ptr + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)  # V_j, likewise
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # Which query tiles see this key tile. Query i sees key j when j ≤ i + δ, δ = n_k − n_q, so
    # rows i ≥ start_n − δ see some key of the tile and rows i ≥ start_n + BLOCK_N − 1 − δ see all.
    if CAUSAL:
        masked_start, unmasked_start = causal_query_stages(start_n, n_q, n_k, BLOCK_N, BLOCK_M)
        masked_end = tl.minimum(unmasked_start, n_q)
    else:
        masked_start = 0
        masked_end = 0
        unmasked_start = 0  # no causal mask: every query tile is unmasked

    # Grouped-query attention: the query heads kv_head·g … kv_head·g + g − 1 all read this K_j, V_j,
    # so their contributions are summed here, in registers, in a fixed order.
    for h in range(group_size):
        head = kv_head * group_size + h
        q_src = q_ptr + batch * stride_qb + head * stride_qh
        do_src = do_ptr + batch * stride_dob + head * stride_doh
        lse_src = lse_ptr + (batch * n_heads + head) * n_q
        delta_src = delta_ptr + (batch * n_heads + head) * n_q
        # the query tiles that cross the diagonal — masked
        dk, dv = _dkdv_from_query_tiles(
            dk, dv, k, v, q_src, do_src, lse_src, delta_src, stride_qm, stride_qd, stride_dom, stride_dod,
            offs_n, offs_d, n_q, n_k, head_dim, qk_scale, masked_start, masked_end,
            MASKED=True, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION,
        )
        # the query tiles that see the whole key tile (all of them when not causal) — no mask
        dk, dv = _dkdv_from_query_tiles(
            dk, dv, k, v, q_src, do_src, lse_src, delta_src, stride_qm, stride_qd, stride_dom, stride_dod,
            offs_n, offs_d, n_q, n_k, head_dim, qk_scale, unmasked_start, n_q,
            MASKED=False, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION,
        )

    dk = dk * sm_scale  # dK = τ dSᵀ Q
    tl.store(dk_ptr + batch * stride_dkb + kv_head * stride_dkh + offs_n[:, None] * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + batch * stride_dvb + kv_head * stride_dvh + offs_n[:, None] * stride_dvn
             + offs_d[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)
# --8<-- [end:dkdv_kernel]


# --8<-- [start:dq_kernel]
@triton.jit
def _dq_from_key_tiles(
    dq, q, do, lse2, delta,
    k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, n_q, n_k, head_dim, qk_scale,
    lo, hi,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Add the key tiles [lo, hi) to dQ_i. MASKED=True is for the tiles that cross the causal diagonal
    or run past n_k: keys past n_k load K = V = 0, which still gives them P = e^{0 − lse}, as large as
    e^{−lse} (it overflows float16 when a row's lse is very negative, and ∞ · 0 = NaN), so they are
    masked to P = 0 like the hidden ones."""
    d_ok = offs_d < head_dim
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_ok[None, :]
        k = tl.load(k_src + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_src + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        p = tl.math.exp2(tl.minimum(s * qk_scale - lse2[:, None], 0.0))  # P = e^{min(τS − lse, 0)} ≤ 1
        if MASKED:
            if CAUSAL:  # (a key past n_k is visible only to rows past n_q, whose P is 0 already)
                visible = offs_n[None, :] <= offs_m[:, None] + (n_k - n_q)  # bottom-right causal
            else:
                visible = offs_n[None, :] < n_k  # the ragged end of the keys
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # dP = dO_i V_jᵀ
        ds = p * (dp - delta[:, None])  # dS = P ∘ (dP − Δ)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # dQ_i ← dQ_i + dS K_j  (τ: at the end)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    n_heads, group_size, n_q, n_k, head_dim, sm_scale, qk_scale, length_bucket,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "tf32x3" or "tf32" for float32 operands: `precision.dot_precision`
):
    """One program: one BLOCK_M tile of queries of one (batch, head); the only writer of its dQ rows."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    batch = pid_bh // n_heads
    head = pid_bh % n_heads
    kv_head = head // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < n_q
    qd_mask = m_ok[:, None] & (offs_d[None, :] < head_dim)
    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=qd_mask, other=0.0)
    do = tl.load(do_ptr + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=qd_mask, other=0.0)
    lse = tl.load(lse_ptr + pid_bh * n_q + offs_m, mask=m_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), to_log2_units(lse))  # P = 0 for unseeing rows
    delta = tl.load(delta_ptr + pid_bh * n_q + offs_m, mask=m_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_src = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_src = v_ptr + batch * stride_vb + kv_head * stride_vh

    # The key tiles this query tile sees: the forward's two stages (chapter 5).
    if CAUSAL:
        unmasked_end, masked_end = causal_key_stages(pid_m * BLOCK_M, n_q, n_k, BLOCK_M, BLOCK_N)
    else:
        unmasked_end = n_k // BLOCK_N * BLOCK_N  # whole tiles: no mask
        masked_end = n_k  # the ragged last tile, if any: keys past n_k masked
    dq = _dq_from_key_tiles(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                            offs_m, offs_d, n_q, n_k, head_dim, qk_scale, 0, unmasked_end,
                            MASKED=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    dq = _dq_from_key_tiles(dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                            offs_m, offs_d, n_q, n_k, head_dim, qk_scale, unmasked_end, masked_end,
                            MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    dq = dq * sm_scale  # dQ = τ dS K
    tl.store(dq_ptr + batch * stride_dqb + head * stride_dqh + offs_m[:, None] * stride_dqm
             + offs_d[None, :] * stride_dqd, dq.to(dq_ptr.dtype.element_ty), mask=qd_mask)
# --8<-- [end:dq_kernel]


def _backward_config(head_dim: int, dtype: torch.dtype = torch.float16) -> dict:
    """The teaching configuration: 64 × 64 tiles on the GPU (32 × 32 above d = 128, where K_j, V_j,
    dK_j and dV_j alone fill the registers; `precision.full_float32_tiles` for float32 in full
    precision); the interpreter's small tiles on the CPU."""
    if interpreter_active():
        return dict(INTERPRETER_TILES)
    if head_dim <= 128:
        return tiles_for(dtype, head_dim, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    return tiles_for(dtype, head_dim, BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)


def _configs(tiles) -> list[triton.Config]:
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in tuning_tiles(tiles)]


# (BLOCK_M, BLOCK_N, warps, stages). The dK/dV kernel keeps a key tile and its two accumulators on
# chip and streams query tiles past it, so it favours a wide BLOCK_N and a narrow BLOCK_M; the dQ
# kernel is the mirror image. Configs that do not fit (d = 256) fail to compile and are skipped.
_TUNE_KEY = ["length_bucket", "head_dim", "CAUSAL", "BLOCK_D"]


def _by_table(kernel: str) -> dict:
    """A tuned kernel's rule (the tile table's row for its tuning key), fallback (the teaching
    configuration) and record of an autotuner choice. Tuning key: (length bucket, head_dim, causal,
    BLOCK_D, dtype), `flash_attn_backward`'s."""
    return dict(
        rule=lambda key: tile_table.rule(kernel, key[1], key[2], key[4], key[0]),
        fallback=lambda key: _backward_config(key[1], key[4]),
        on_tuned=lambda key, best, timings: tile_table.record_tuned(kernel, key[1], key[2], key[4], key[0], best,
                                                                    timings),
    )


DKDV_TILES = [(32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (16, 64, 4, 2), (32, 32, 4, 2)]
DQ_TILES = [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3), (64, 16, 4, 2), (32, 32, 4, 2)]
TUNED_DKDV = TunedKernel(_attn_bwd_dkdv_kernel, _configs(DKDV_TILES), key=_TUNE_KEY, **_by_table("flash_v2_bwd_dkdv"))
TUNED_DQ = TunedKernel(_attn_bwd_dq_kernel, _configs(DQ_TILES), key=_TUNE_KEY, **_by_table("flash_v2_bwd_dq"))


def tuned_backward_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> dict | None:
    """The configurations chosen for these inputs (after a tuned backward), for reports."""
    bucket = triton.next_power_of_2(max(q.shape[2], k.shape[2]))
    chosen = {name: tuned.choice_for(bucket, q.shape[3], causal, dtype=q.dtype)
              for name, tuned in (("dkdv", TUNED_DKDV), ("dq", TUNED_DQ))}
    return {name: c for name, c in chosen.items() if c is not None} or None


_DELTA_ROWS = 64  # query rows per program of the Δ kernel


def attention_delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """Δ = rowsum(dO ∘ O), (B, H, n_q) float32, from O and dO (B, H, n_q, d) of any strides."""
    batch, heads, n_q, head_dim = o.shape
    delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=o.device)
    _attn_bwd_preprocess_kernel[(triton.cdiv(n_q, _DELTA_ROWS), batch * heads)](
        o, do, delta, *o.stride(), *do.stride(), heads, n_q, head_dim, BLOCK_M=_DELTA_ROWS,
        BLOCK_D=head_dim_block(head_dim))
    return delta


# --8<-- [start:backward_launcher]
def flash_attn_backward(q, k, v, o, lse, do, causal: bool, sm_scale: float | None = None, *, tuned: bool = False,
                        configs: tuple[triton.Config, triton.Config] | None = None):
    """(dQ, dK, dV) of O = softmax(τ Q Kᵀ) V given dO, from the forward's O and log-sum-exp.

    tuned=True takes each kernel's tiles per shape bucket from the tile table of this GPU (Triton's
    autotuner's where asked for: `perf.tile_table`); tuned=False
    runs the one teaching configuration of `_backward_config`, or `configs` = (dK/dV's, dQ's)."""
    shape = check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=256, allow_gqa=True)
    if do.shape != q.shape or do.dtype != q.dtype:
        raise ValueError(f"do must have q's shape {tuple(q.shape)} and dtype {q.dtype}, "
                         f"got {tuple(do.shape)} {do.dtype}")
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)  # (B, H_kv, n_k, d): summed over each group
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    lse = lse.contiguous()  # (B, H, n_q), indexed as one row per (batch, head)
    delta = attention_delta(o, do)
    dkdv_args, dq_args, constexprs, tuning_key = _kernel_arguments(shape, q, k, v, do, lse, delta, dq, dk, dv, causal)
    grid_n = lambda meta: (triton.cdiv(shape.n_k, meta["BLOCK_N"]), shape.batch * shape.kv_heads)  # noqa: E731
    grid_m = lambda meta: (triton.cdiv(shape.n_q, meta["BLOCK_M"]), shape.batch * shape.heads)  # noqa: E731
    if tuned and autotunes(q):  # full-precision float32 runs the teaching configuration
        _wait_for_compiles_ahead(tuning_key)  # kernels the forward began to compile (`compile_backward_ahead`)
        TUNED_DKDV.launch(grid_n, tuning_key, None, *dkdv_args, **constexprs)
        TUNED_DQ.launch(grid_m, tuning_key, None, *dq_args, **constexprs)
    else:
        teaching = _backward_config(shape.head_dim, q.dtype)
        dkdv_config, dq_config = (teaching, teaching) if configs is None else (c.all_kwargs() for c in configs)
        _attn_bwd_dkdv_kernel[grid_n](*dkdv_args, **constexprs, **dkdv_config)
        _attn_bwd_dq_kernel[grid_m](*dq_args, **constexprs, **dq_config)
    return dq, dk, dv


def _kernel_arguments(shape, q, k, v, do, lse, delta, dq, dk, dv, causal: bool):
    """The dK/dV and the dQ kernels' arguments, their compile-time constants and the tuning key
    (length bucket, head_dim, causal, BLOCK_D, q's dtype: what the tile table is looked up by)."""
    length_bucket = triton.next_power_of_2(max(shape.n_q, shape.n_k))  # a key for the tile table only
    common = (shape.heads, shape.group_size, shape.n_q, shape.n_k, shape.head_dim, shape.sm_scale,
              shape.sm_scale * LOG2_E, length_bucket)
    dkdv_args = (q, k, v, do, lse, delta, dk, dv,
                 *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(), *common)
    dq_args = (q, k, v, do, lse, delta, dq,
               *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), *common)
    block_d = head_dim_block(shape.head_dim)
    # float32 products as torch's matmul setting says
    constexprs = dict(CAUSAL=causal, BLOCK_D=block_d, DOT_PRECISION=dot_precision(q.dtype))
    return dkdv_args, dq_args, constexprs, (length_bucket, shape.head_dim, causal, block_d, q.dtype)
# --8<-- [end:backward_launcher]


def _dense(shape, dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous tensor's shape, dtype and strides, with no memory (what Triton compiles it as)."""
    return torch.empty(shape, dtype=dtype, device="meta")


_AHEAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tutorial_kernels-compile")
_PENDING: dict = {}  # tuning key → the future of its kernels' compilation
_AHEAD_OF: set = set()  # what `compile_backward_ahead` has compiled for (or begun to)


def compile_backward_ahead(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                           sm_scale: float | None = None) -> None:
    """Start compiling, in a background thread, the three kernels a tuned `flash_attn_backward` of
    these inputs will launch (with a contiguous dO), while the forward runs: the first backward at a
    new shape then finds them compiled. Returns at once; nothing on the CPU, for float32, while
    autotuning (which compiles every candidate itself) or with TUTORIAL_KERNELS_COMPILE_AHEAD=0."""
    if (not q.is_cuda or not autotunes(q) or tile_table.autotuning_requested()
            or os.environ.get("TUTORIAL_KERNELS_COMPILE_AHEAD", "1") == "0"):
        return
    # what decides the binaries: the tuning key of `_kernel_arguments`, and how Triton specialises the
    # integers (equal to 1, divisible by 16) among the lengths and q's, k's and v's strides
    head_dim = q.shape[3]
    tuning_key = (triton.next_power_of_2(max(q.shape[2], k.shape[2])), head_dim, causal, head_dim_block(head_dim),
                  q.dtype)
    dense_q, dense_k = _dense(q.shape, q.dtype), _dense(k.shape, k.dtype)  # dO and dQ; dK and dV
    seen = (tuning_key, *((n == 1, n % 16 == 0) for n in (
        q.shape[2], k.shape[2], *q.stride(), *k.stride(), *v.stride(), *dense_q.stride(), *dense_k.stride(),
        q.data_ptr(), k.data_ptr(), v.data_ptr())))
    if seen in _AHEAD_OF:
        return  # compiled ahead already (or the call is the same but for its data): one lookup
    if len(_AHEAD_OF) >= 4096:
        _AHEAD_OF.clear()
    _AHEAD_OF.add(seen)
    shape = check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=256, allow_gqa=True)
    rows = _dense((shape.batch, shape.heads, shape.n_q), torch.float32)  # lse and Δ
    dkdv_args, dq_args, constexprs, _ = _kernel_arguments(shape, q, k, v, dense_q, rows, rows, dense_q, dense_k,
                                                          _dense(v.shape, v.dtype), causal)
    # q, k and v themselves (their addresses' alignment is compiled in); a tensor not made yet as its dtype
    as_dtypes = lambda args: tuple(a.dtype if isinstance(a, torch.Tensor) and a.is_meta else a for a in args)  # noqa: E731
    device = q.device

    def compile_all() -> None:
        with torch.cuda.device(device):  # Triton compiles for the current device of this thread
            loaded(_attn_bwd_preprocess_kernel.warmup(
                q.dtype, q.dtype, torch.float32, *dense_q.stride(), *dense_q.stride(), shape.heads, shape.n_q,
                shape.head_dim, grid=(1,), BLOCK_M=_DELTA_ROWS, BLOCK_D=head_dim_block(shape.head_dim)))
            TUNED_DKDV.compile_ahead(tuning_key, *as_dtypes(dkdv_args), **constexprs)
            TUNED_DQ.compile_ahead(tuning_key, *as_dtypes(dq_args), **constexprs)

    previous = _PENDING.get(tuning_key)  # a compile for another specialisation, not yet waited for
    _PENDING[tuning_key] = _AHEAD.submit(compile_all) if previous is None else _AHEAD.submit(
        lambda: (previous.exception(), compile_all()))  # one worker: the previous one has finished first


def _wait_for_compiles_ahead(tuning_key) -> None:
    """Let a compilation started by `compile_backward_ahead` finish (a failed one is only logged: the
    launch compiles, and reports, for itself)."""
    future = _PENDING.pop(tuning_key, None)
    if future is not None:
        try:
            future.result()
        except Exception as error:  # noqa: BLE001 — the launch that follows compiles and raises for itself
            log.debug("compiling the backward ahead for %s failed: %r", tuning_key, error)


# --8<-- [start:autograd]
class FlashAttentionFunction(torch.autograd.Function):
    """Chapter 5's forward, this chapter's backward. Saves q, k, v, O and the log-sum-exp — O(N d)
    numbers, never the (n_q × n_k) matrix P."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, tuned):
        o, lse = flash_attn_v2_with_lse(q, k, v, causal, sm_scale, tuned=tuned)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.tuned = causal, sm_scale, tuned
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        # dO comes with whatever strides autograd built (an expanded tensor after .sum() has stride
        # 0); the kernels honour any strides, but a dense copy reads faster on the GPU.
        do = do.contiguous()
        dq, dk, dv = flash_attn_backward(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale, tuned=ctx.tuned)
        return dq, dk, dv, None, None, None
# --8<-- [end:autograd]


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, tuned: bool = False,
) -> torch.Tensor:
    """softmax(scale · Q Kᵀ) V, differentiable: trains like `F.scaled_dot_product_attention`.

    q: (B, H, n_q, d); k, v: (B, H_kv, n_k, d) with H_kv dividing H; 16 ≤ d ≤ 256; any strides;
    float16, bfloat16 or float32. Causal masks are bottom-right aligned (chapter 2's convention).
    tuned=False (as in every chapter) runs the teaching configurations; tuned=True takes the forward's
    and both backward kernels' configurations per shape bucket from the tile table (`perf.tile_table`). A model calls `tutorial_kernels.flash_attention`,
    which chooses for it.
    """
    check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=256, allow_gqa=True)
    if not isinstance(tuned, bool):
        raise TypeError(f"tuned must be a bool, got {type(tuned).__name__} {tuned!r}")
    return FlashAttentionFunction.apply(q, k, v, causal, sm_scale, tuned)


__all__ = ["flash_attention", "flash_attn_backward", "compile_backward_ahead", "attention_delta", "FlashAttentionFunction", "tuned_backward_choice",
           "TUNED_DKDV", "TUNED_DQ", "DKDV_TILES", "DQ_TILES"]
