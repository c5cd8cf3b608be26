"""Chapter 9 — attention as models use it: sliding windows, softcap, ALiBi, variable lengths.

Each variant is a small change to chapter 5's minimal kernel, and to chapter 6's backward:

* **a window** (Mistral, Gemma 2): query i sees key j when −left ≤ j − (i + n_k − n_q) ≤ right
  (flash-attn's `window_size=(left, right)`, −1 for no bound; causal is right = 0). The key tiles
  wholly outside a query tile's band are never visited, so a window of w keys costs O(N·w), not O(N²);
* **softcap** (Gemma 2): S = c · tanh(τ Q Kᵀ / c) keeps every score within (−c, c); its derivative
  1 − tanh² scales dS in the backward;
* **ALiBi** (BLOOM, MPT): a bias −slope_h · |i + n_k − n_q − j| added to the scores, one slope per head;
* **variable lengths** (packed batches, as `flash_attn_varlen_func`): q, k, v packed as
  (total tokens, heads, d) with `cu_seqlens` marking where each sequence starts; a program finds its
  sequence's rows from them, and no padding is computed.

Scores follow flash-attn's own tests: softcap first, then the ALiBi bias, then the mask.
The calls: `flash_attn_variants(q, k, v, causal, sm_scale, window_size=…, softcap=…, alibi_slopes=…)`
on (B, H, N, d) tensors and `flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
max_seqlen_k, …)` on packed ones, both differentiable; the front door (`flash_attention`) sends a call
with a window, a softcap or ALiBi slopes here.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tutorial_kernels.precision import dot_precision, full_float32_tiles
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.tiling import head_dim_block
from tutorial_kernels.validation import check_attention_inputs, check_window_size


# --8<-- [start:scores]
@triton.jit
def _tanh(x):
    """tanh x = 1 − 2 / (e^{2x} + 1): ±1 at the extremes, no overflow to NaN."""
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)  # e^{2x} = 2^{2x·log₂e}


@triton.jit
def _variant_scores(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right,
                    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """The scores of a tile in log₂ units, −∞ where hidden, and dS_capped/dS (1 − tanh², or 1).

    qk: Q_i K_jᵀ of rows × cols of one sequence (n_q queries, n_k keys)."""
    x = qk * sm_scale  # τ Q Kᵀ
    if SOFTCAP:
        t = _tanh(x / softcap)
        x = softcap * t  # c · tanh(τ Q Kᵀ / c)
        slope_of_cap = 1.0 - t * t  # d(c tanh(u/c))/du
    else:
        slope_of_cap = 1.0
    distance = cols[None, :] - (rows[:, None] + (n_k - n_q))  # j − (i + n_k − n_q): 0 on the diagonal
    if ALIBI:
        x = x - slope * tl.abs(distance).to(tl.float32)  # − slope_h · |i + n_k − n_q − j|
    seen = (rows[:, None] < n_q) & (cols[None, :] < n_k)
    if HAS_LEFT:
        seen = seen & (distance >= -left)
    if HAS_RIGHT:
        seen = seen & (distance <= right)
    return tl.where(seen, x * 1.4426950408889634, float("-inf")), slope_of_cap  # × log₂e
# --8<-- [end:scores]


@triton.jit
def _sequence(cu_ptr, batch, n_dense, VARLEN: tl.constexpr):
    """(first token, length) of sequence `batch`: from cu_seqlens when packed, else (0, n_dense)."""
    if VARLEN:
        start = tl.load(cu_ptr + batch).to(tl.int64)
        length = (tl.load(cu_ptr + batch + 1).to(tl.int64) - start).to(tl.int32)
    else:
        start = batch * 0  # an int64 zero
        length = n_dense
    return start, length


# --8<-- [start:attn_mask]
@triton.jit
def _tile_live(live_ptr, tile_m, tile_n, stride_tm, stride_tn, MASK_KIND: tl.constexpr):
    """Whether tile (tile_m, tile_n) of this (batch, head) has a pair attn_mask keeps: a tile it hides
    whole is skipped, neither loaded nor computed. Always true without a mask."""
    if MASK_KIND == 0:
        return True
    return tl.load(live_ptr + tile_m * stride_tm + tile_n * stride_tn) != 0


@triton.jit
def _with_attn_mask(s, mask_ptr, rows, cols, n_q, n_k, stride_mm, stride_mn, MASK_KIND: tl.constexpr):
    """PyTorch's attn_mask on a tile of scores in log₂ units: a float mask added (× log₂e, MASK_KIND 1), a
    boolean one −∞ where False (2). mask_ptr: this (batch, head)'s mask, broadcast dimensions stride 0."""
    if MASK_KIND == 0:
        return s
    inside = (rows[:, None] < n_q) & (cols[None, :] < n_k)
    ptrs = mask_ptr + rows[:, None].to(tl.int64) * stride_mm + cols[None, :].to(tl.int64) * stride_mn
    if MASK_KIND == 1:
        return s + tl.load(ptrs, mask=inside, other=0.0).to(tl.float32) * 1.4426950408889634  # S + mask
    return tl.where(tl.load(ptrs, mask=inside, other=0) != 0, s, float("-inf"))
# --8<-- [end:attn_mask]


# --8<-- [start:hooks]
@triton.jit
def _modded_scores(qk, rows, cols, batch, head, n_q, n_k, sm_scale, left, right, HAS_LEFT: tl.constexpr,
                   HAS_RIGHT: tl.constexpr, SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr):
    """A score_mod's scores in log₂ units, −∞ outside the window and the sequence, and dS_mod/dS: the
    hook is any @triton.jit function of (score, batch, head, q_idx, kv_idx), its derivative another."""
    x = qk * sm_scale  # τ Q Kᵀ, natural units, as the hook expects
    q_idx, kv_idx = rows[:, None], cols[None, :]
    y = SCORE_MOD(x, batch, head, q_idx, kv_idx)
    if SCORE_GRAD is None:
        slope_of_mod = 1.0  # the forward needs none; the backward refuses a hook without it
    else:
        slope_of_mod = SCORE_GRAD(x, batch, head, q_idx, kv_idx)
    distance = kv_idx - (q_idx + (n_k - n_q))
    seen = (q_idx < n_q) & (kv_idx < n_k)
    if HAS_LEFT:
        seen = seen & (distance >= -left)
    if HAS_RIGHT:
        seen = seen & (distance <= right)
    return tl.where(seen, y * 1.4426950408889634, float("-inf")), slope_of_mod
# --8<-- [end:hooks]


# --8<-- [start:hook_examples]
@triton.jit
def gemma2_softcap(score, batch, head, q_idx, kv_idx):
    """Gemma 2's attention softcap as a score_mod: 50 · tanh(score / 50)."""
    return 50.0 * _tanh(score / 50.0)


@triton.jit
def gemma2_softcap_grad(score, batch, head, q_idx, kv_idx):
    """Its derivative in score: 1 − tanh²(score / 50)."""
    t = _tanh(score / 50.0)
    return 1.0 - t * t


@triton.jit
def prefix_lm_mask(batch, head, q_idx, kv_idx):
    """A prefix-LM mask_mod: the first 64 tokens (the prefix) see each other both ways, the rest causally."""
    return (kv_idx <= q_idx) | (kv_idx < 64)


@triton.jit
def documents_of_64_mask(batch, head, q_idx, kv_idx):
    """A mask_mod for documents of 64 tokens packed end to end: causal within a document, nothing across."""
    return (kv_idx <= q_idx) & (q_idx // 64 == kv_idx // 64)
# --8<-- [end:hook_examples]


@triton.jit
def _tile_scores(qk, rows, cols, batch, head, n_q, n_k, sm_scale, softcap, slope, left, right, mask_head,
                 stride_mm, stride_mn, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
                 HAS_RIGHT: tl.constexpr, MASK_KIND: tl.constexpr, SCORE_MOD: tl.constexpr,
                 SCORE_GRAD: tl.constexpr, MASK_MOD: tl.constexpr):
    """A tile's scores in log₂ units and their factor in the backward: the variants' (`_variant_scores`) or
    a score_mod's (`_modded_scores`), then PyTorch's attn_mask (MASK_KIND 1, 2) or a mask_mod (3)."""
    if SCORE_MOD is None:
        s, slope_of_mod = _variant_scores(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right,
                                          SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT)
    else:
        s, slope_of_mod = _modded_scores(qk, rows, cols, batch, head, n_q, n_k, sm_scale, left, right, HAS_LEFT,
                                         HAS_RIGHT, SCORE_MOD, SCORE_GRAD)
    if MASK_KIND == 3:
        s = tl.where(MASK_MOD(batch, head, rows[:, None], cols[None, :]), s, float("-inf"))
    else:
        s = _with_attn_mask(s, mask_head, rows, cols, n_q, n_k, stride_mm, stride_mn, MASK_KIND)
    return s, slope_of_mod


@triton.jit
def _mask_mod_tiles_kernel(live_ptr, n_heads, n_q, n_k, MASK_MOD: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    """live[b, h, i, j] = whether mask_mod keeps a pair of tile (i, j): one program per tile, evaluated once
    per mask and shape (the block mask), so that the attention kernels skip the tiles it hides whole."""
    pid_bh, tile_m, tile_n = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)  # B·H·T_r·T_c may pass 2³¹
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (rows[:, None] < n_q) & (cols[None, :] < n_k)
    kept = MASK_MOD(pid_bh // n_heads, pid_bh % n_heads, rows[:, None], cols[None, :]) & inside
    tl.store(live_ptr + (pid_bh * tl.num_programs(1) + tile_m) * tl.num_programs(2) + tile_n,
             tl.max(tl.max(kept.to(tl.int32), axis=1), axis=0).to(tl.uint8))


# --8<-- [start:ranges]
@triton.jit
def _key_range(start_m, n_q, n_k, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[lo, hi): the keys the query tile [start_m, start_m + BLOCK_M) may see, lo on a tile boundary."""
    lo = 0
    hi = n_k
    if HAS_LEFT:
        lo = tl.maximum(start_m + (n_k - n_q) - left, 0) // BLOCK_N * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(start_m + BLOCK_M + (n_k - n_q) + right, n_k)
    return lo, hi


@triton.jit
def _query_range(start_n, n_q, n_k, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """[lo, hi): the queries that may see the key tile [start_n, start_n + BLOCK_N), lo on a tile boundary."""
    lo = 0
    hi = n_q
    if HAS_RIGHT:  # i ≥ j − (n_k − n_q) − right
        lo = tl.maximum(start_n - (n_k - n_q) - right, 0) // BLOCK_M * BLOCK_M
    if HAS_LEFT:  # i ≤ j − (n_k − n_q) + left
        hi = tl.minimum(start_n + BLOCK_N - (n_k - n_q) + left, n_q)
    return lo, hi
# --8<-- [end:ranges]


# --8<-- [start:forward_kernel]
@triton.jit
def _variants_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, slopes_ptr, mask_ptr, live_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_lm, stride_sb, stride_sh,
    stride_mb, stride_mh, stride_mm, stride_mn, stride_tb, stride_th, stride_tm, stride_tn,
    n_heads, group_size, n_q_dense, n_k_dense, head_dim, sm_scale, softcap, left, right,
    VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, MASK_KIND: tl.constexpr = 0, SCORE_MOD: tl.constexpr = None,
    SCORE_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
):
    """Chapter 5's minimal kernel with the variants: one program per query tile of one (sequence, head),
    over the key tiles of its band only; writes O and the rows' log-sum-exp (natural units)."""
    pid_bh = tl.program_id(0).to(tl.int64)  # (sequence, head) on the x axis: any number of them
    pid_m = tl.program_id(1)
    batch, head = pid_bh // n_heads, pid_bh % n_heads
    kv_head = head // group_size
    q_start, n_q = _sequence(cu_q_ptr, batch, n_q_dense, VARLEN)
    k_start, n_k = _sequence(cu_k_ptr, batch, n_k_dense, VARLEN)
    if pid_m * BLOCK_M >= n_q:  # a packed batch's shorter sequences need fewer query tiles
        return

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)  # × a token stride: a long packed batch passes 2³¹ elements
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh + (q_start + rows)[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=(rows[:, None] < n_q) & d_ok[None, :], other=0.0)
    k_head = k_ptr + batch * stride_kb + kv_head * stride_kh + k_start * stride_kn
    v_head = v_ptr + batch * stride_vb + kv_head * stride_vh + k_start * stride_vn
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes_ptr + batch * stride_sb + head * stride_sh)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    mask_head = mask_ptr + batch * stride_mb + head * stride_mh  # attn_mask, if any (MASK_KIND)
    live_row = live_ptr + batch * stride_tb + head * stride_th
    lo, hi = _key_range(pid_m * BLOCK_M, n_q, n_k, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):  # only the tiles of the band: the others cost nothing
        if _tile_live(live_row, pid_m, start_n // BLOCK_N, stride_tm, stride_tn, MASK_KIND):
            cols = start_n + offs_n
            k_t = tl.load(k_head + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                          mask=(cols[None, :] < n_k) & d_ok[:, None], other=0.0)
            s, _ = _tile_scores(tl.dot(q, k_t, input_precision=DOT_PRECISION), rows, cols, batch, head, n_q, n_k,
                                sm_scale, softcap, slope, left, right, mask_head, stride_mm, stride_mn, SOFTCAP, ALIBI,
                                HAS_LEFT, HAS_RIGHT, MASK_KIND, SCORE_MOD, SCORE_GRAD, MASK_MOD)
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - shift[:, None])
            alpha = tl.math.exp2(m_i - shift)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_head + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                        mask=(cols[:, None] < n_k) & d_ok[None, :], other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
            m_i = m_new

    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]  # a row with no key in its band: O = 0
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    row_ok = rows < n_q
    tl.store(o_ptr + batch * stride_ob + head * stride_oh + (q_start + rows)[:, None] * stride_om
             + offs_d[None, :] * stride_od, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + batch * stride_lb + head * stride_lh + (q_start + rows) * stride_lm, lse, mask=row_ok)
# --8<-- [end:forward_kernel]


# --8<-- [start:dkdv_kernel]
@triton.jit
def _variants_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_q_ptr, cu_k_ptr, slopes_ptr, mask_ptr, live_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,  # dO's
    stride_gb, stride_gh, stride_gn, stride_gd,  # dK's and dV's (allocated alike)
    stride_lb, stride_lh, stride_lm, stride_sb, stride_sh,
    stride_mb, stride_mh, stride_mm, stride_mn, stride_tb, stride_th, stride_tm, stride_tn,
    n_kv_heads, group_size, n_q_dense, n_k_dense, head_dim, sm_scale, softcap, left, right,
    VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, MASK_KIND: tl.constexpr = 0, SCORE_MOD: tl.constexpr = None,
    SCORE_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
):
    """Chapter 6's dK/dV kernel with the variants: one program per key tile of one (sequence, KV head),
    over the query tiles of every head of its group that may see it. P is recomputed from the forward's
    log-sum-exp; dS = P ∘ (dP − Δ), times 1 − tanh² under a softcap (the bias and the mask carry no gradient)."""
    pid_bk = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    batch, kv_head = pid_bk // n_kv_heads, pid_bk % n_kv_heads
    q_start, n_q = _sequence(cu_q_ptr, batch, n_q_dense, VARLEN)
    k_start, n_k = _sequence(cu_k_ptr, batch, n_k_dense, VARLEN)
    if pid_n * BLOCK_N >= n_k:
        return

    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    kv_mask = (cols[:, None] < n_k) & d_ok[None, :]
    k = tl.load(k_ptr + batch * stride_kb + kv_head * stride_kh + (k_start + cols)[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + batch * stride_vb + kv_head * stride_vh + (k_start + cols)[:, None] * stride_vn
                + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo, hi = _query_range(pid_n * BLOCK_N, n_q, n_k, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_N, BLOCK_M)
    for g in range(0, group_size):  # every query head that reads this K/V head
        head = kv_head * group_size + g
        slope = 0.0
        if ALIBI:
            slope = tl.load(slopes_ptr + batch * stride_sb + head * stride_sh)
        mask_head = mask_ptr + batch * stride_mb + head * stride_mh
        live_col = live_ptr + batch * stride_tb + head * stride_th
        for start_m in range(lo, hi, BLOCK_M):
            if _tile_live(live_col, start_m // BLOCK_M, pid_n, stride_tm, stride_tn, MASK_KIND):
                rows = start_m + offs_m
                row_ok = rows < n_q
                q_mask = row_ok[:, None] & d_ok[None, :]
                q = tl.load(q_ptr + batch * stride_qb + head * stride_qh + (q_start + rows)[:, None] * stride_qm
                            + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
                do = tl.load(do_ptr + batch * stride_ob + head * stride_oh + (q_start + rows)[:, None] * stride_om
                             + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
                row_at = batch * stride_lb + head * stride_lh + (q_start + rows) * stride_lm
                lse = tl.load(lse_ptr + row_at, mask=row_ok, other=0.0) * 1.4426950408889634  # log₂ units
                lse = tl.where(lse == float("-inf"), 0.0, lse)  # a row that sees nothing: its P is 0 anyway
                delta = tl.load(delta_ptr + row_at, mask=row_ok, other=0.0)
                s, cap = _tile_scores(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), rows, cols, batch,
                                      head, n_q, n_k, sm_scale, softcap, slope, left, right, mask_head, stride_mm,
                                      stride_mn, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, MASK_KIND, SCORE_MOD,
                                      SCORE_GRAD, MASK_MOD)
                p = tl.math.exp2(tl.minimum(s - lse[:, None], 0.0))  # P = e^{S − lse} ≤ 1, as in exact arithmetic
                dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT_PRECISION)  # dV += Pᵀ dO
                dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # dP = dO Vᵀ
                ds = p * (dp - delta[:, None]) * cap  # dS = P ∘ (dP − Δ), through the softcap
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PRECISION)  # dK += dSᵀ Q
    g_at = batch * stride_gb + kv_head * stride_gh + (k_start + cols)[:, None] * stride_gn + offs_d[None, :] * stride_gd
    tl.store(dk_ptr + g_at, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)  # τ: S = τ Q Kᵀ
    tl.store(dv_ptr + g_at, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)
# --8<-- [end:dkdv_kernel]


@triton.jit
def _variants_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_q_ptr, cu_k_ptr, slopes_ptr, mask_ptr, live_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,  # dO's
    stride_gb, stride_gh, stride_gm, stride_gd,  # dQ's
    stride_lb, stride_lh, stride_lm, stride_sb, stride_sh,
    stride_mb, stride_mh, stride_mm, stride_mn, stride_tb, stride_th, stride_tm, stride_tn,
    n_heads, group_size, n_q_dense, n_k_dense, head_dim, sm_scale, softcap, left, right,
    VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, MASK_KIND: tl.constexpr = 0, SCORE_MOD: tl.constexpr = None,
    SCORE_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
):
    """dQ = τ Σ_j dS K_j over the key tiles of the band: one program per query tile of one (sequence, head)."""
    pid_bh = tl.program_id(0).to(tl.int64)  # (sequence, head) on the x axis: any number of them
    pid_m = tl.program_id(1)
    batch, head = pid_bh // n_heads, pid_bh % n_heads
    kv_head = head // group_size
    q_start, n_q = _sequence(cu_q_ptr, batch, n_q_dense, VARLEN)
    k_start, n_k = _sequence(cu_k_ptr, batch, n_k_dense, VARLEN)
    if pid_m * BLOCK_M >= n_q:
        return

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    row_ok = rows < n_q
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh + (q_start + rows)[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    do = tl.load(do_ptr + batch * stride_ob + head * stride_oh + (q_start + rows)[:, None] * stride_om
                 + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    row_at = batch * stride_lb + head * stride_lh + (q_start + rows) * stride_lm
    lse = tl.load(lse_ptr + row_at, mask=row_ok, other=0.0) * 1.4426950408889634
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    delta = tl.load(delta_ptr + row_at, mask=row_ok, other=0.0)
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes_ptr + batch * stride_sb + head * stride_sh)
    k_head = k_ptr + batch * stride_kb + kv_head * stride_kh + k_start * stride_kn
    v_head = v_ptr + batch * stride_vb + kv_head * stride_vh + k_start * stride_vn

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, hi = _key_range(pid_m * BLOCK_M, n_q, n_k, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    mask_head = mask_ptr + batch * stride_mb + head * stride_mh
    live_row = live_ptr + batch * stride_tb + head * stride_th
    for start_n in range(lo, hi, BLOCK_N):
        if _tile_live(live_row, pid_m, start_n // BLOCK_N, stride_tm, stride_tn, MASK_KIND):
            cols = start_n + offs_n
            kv_mask = (cols[:, None] < n_k) & d_ok[None, :]
            k = tl.load(k_head + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
            v = tl.load(v_head + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
            s, cap = _tile_scores(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), rows, cols, batch, head,
                                  n_q, n_k, sm_scale, softcap, slope, left, right, mask_head, stride_mm, stride_mn,
                                  SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, MASK_KIND, SCORE_MOD, SCORE_GRAD, MASK_MOD)
            p = tl.math.exp2(tl.minimum(s - lse[:, None], 0.0))
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            ds = p * (dp - delta[:, None]) * cap
            dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)  # dQ += dS K_j
    tl.store(dq_ptr + batch * stride_gb + head * stride_gh + (q_start + rows)[:, None] * stride_gm
             + offs_d[None, :] * stride_gd, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=q_mask)


def band(window_size: tuple[int, int], causal: bool) -> tuple[int | None, int | None]:
    """(left, right) bounds of a query's keys around the diagonal, None where unbounded: the call's
    arguments as the kernels read them (causal is right = 0)."""
    left, right = window_size
    right = 0 if causal else right
    return (left if left >= 0 else None), (right if right >= 0 else None)


def key_range(start_m: int, n_q: int, n_k: int, left: int | None, right: int | None, block_m: int,
              block_n: int) -> tuple[int, int]:
    """`_key_range` on the host: [lo, hi) of the keys the query tile at start_m visits (lo on a tile
    boundary), for pictures and tests."""
    lo = 0 if left is None else max(start_m + (n_k - n_q) - left, 0) // block_n * block_n
    hi = n_k if right is None else min(start_m + block_m + (n_k - n_q) + right, n_k)
    return lo, hi


# --- launchers ---------------------------------------------------------------------------------------

# The forward's 16-bit configuration on a GPU when set, in place of _tiles' own (the benchmark times a
# wider one against the readable default this way: bench/providers.py, "ch09-front-door-wide").
FORWARD_TILES: dict | None = None


def _tiles(head_dim: int, dtype: torch.dtype, forward: bool = False) -> dict:
    """One readable configuration (not tuned): 16 × 16 in the interpreter; on a GPU 64 × 64, halved at
    head_dim above 128 so the tiles fit in shared memory; float32, in either matmul precision, on
    `precision.full_float32_tiles` (its operands take twice a 16-bit tile's room, and its three-pass
    products more: the backward's 64-row tiles would not fit)."""
    if interpreter_active():
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    if dtype == torch.float32:
        return full_float32_tiles(head_dim)
    if forward and FORWARD_TILES is not None and head_dim <= 128:
        return dict(FORWARD_TILES)
    block = 64 if head_dim <= 128 else 32
    return dict(BLOCK_M=block, BLOCK_N=block, num_warps=4, num_stages=2)


class _Problem:
    """A checked call: how the kernels address it (dense (B, H, N, d), or packed (tokens, H, d) with
    cu_seqlens), and the variants' arguments as the kernels take them."""

    def __init__(self, q, k, v, cu_q, cu_k, batch, n_q, n_k, sm_scale, causal, window_size, softcap, alibi_slopes,
                 attn_mask=None, score_mod=None, score_mod_grad=None, mask_mod=None):
        self.varlen = cu_q is not None
        self.batch, self.n_q, self.n_k = batch, n_q, n_k
        self.heads, self.kv_heads, self.head_dim = q.shape[1], k.shape[1], q.shape[-1]  # (tokens, H, d) or (B, H, N, d)
        self.sm_scale, self.softcap = sm_scale, softcap
        left, right = window_size
        right = 0 if causal else right
        self.left, self.right = max(left, 0), max(right, 0)
        self.flags = dict(VARLEN=self.varlen, SOFTCAP=softcap > 0, ALIBI=alibi_slopes is not None,
                          HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, BLOCK_D=head_dim_block(self.head_dim),
                          DOT_PRECISION=dot_precision(q.dtype))
        dummy = torch.zeros(2, dtype=torch.int32, device=q.device)
        self.cu_q = cu_q if cu_q is not None else dummy
        self.cu_k = cu_k if cu_k is not None else dummy
        if alibi_slopes is None:
            self.slopes, self.slope_strides = dummy.float(), (0, 0)
        elif alibi_slopes.dim() == 1:
            self.slopes, self.slope_strides = alibi_slopes, (0, alibi_slopes.stride(0))
        else:
            self.slopes, self.slope_strides = alibi_slopes, alibi_slopes.stride()
        # attn_mask: (B, H, n_q, n_k) with broadcast dimensions of stride 0; a boolean one read as bytes
        self.mask = attn_mask
        self.mask_kind = 0 if attn_mask is None else (2 if attn_mask.dtype == torch.bool else 1)
        self.dummy = dummy
        self.score_mod, self.score_mod_grad, self.mask_mod = score_mod, score_mod_grad, mask_mod
        if mask_mod is not None:
            self.mask_kind = 3
        self.hooks = dict(MASK_KIND=self.mask_kind, SCORE_MOD=score_mod, SCORE_GRAD=score_mod_grad, MASK_MOD=mask_mod)

    def mask_args(self, block_m: int, block_n: int) -> tuple[tuple, tuple]:
        """The kernels' attn_mask arguments for tiles of block_m × block_n, as (pointers, strides): the mask
        and which tiles have a pair it keeps (computed here, once per launch); placeholders without a mask."""
        if self.mask_mod is not None:
            live = _mask_mod_tiles(self.mask_mod, self.batch, self.heads, self.n_q, self.n_k, block_m, block_n,
                                   self.dummy.device)
            return (self.dummy, live), (0, 0, 0, 0, *live.stride())
        if self.mask is None:
            return (self.dummy, self.dummy), (0,) * 8
        mask = self.mask.view(torch.uint8) if self.mask_kind == 2 else self.mask
        live = _live_tiles(self.mask, block_m, block_n).view(torch.uint8)
        return (mask, live), (*mask.stride(), *live.stride())

    def strides(self, t: torch.Tensor) -> tuple[int, int, int, int]:
        """(batch, head, token, column) strides: a packed (tokens, H, d) tensor has no batch stride."""
        if self.varlen:
            return 0, t.stride(1), t.stride(0), t.stride(2)
        return t.stride(0), t.stride(1), t.stride(2), t.stride(3)

    def row_strides(self, rows: torch.Tensor) -> tuple[int, int, int]:
        """lse and Δ: (B, H, n_q) dense, (H, tokens) packed."""
        return (0, rows.stride(0), rows.stride(1)) if self.varlen else rows.stride()

    def rows(self, q: torch.Tensor) -> torch.Tensor:
        shape = (self.heads, q.shape[0]) if self.varlen else q.shape[:3]
        return torch.empty(shape, dtype=torch.float32, device=q.device)

    def scalars(self, heads: int) -> tuple:
        return (heads, self.heads // self.kv_heads, self.n_q, self.n_k, self.head_dim, self.sm_scale,
                self.softcap, self.left, self.right)


def _live_tiles(mask: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """(B, H, T_r, T_c) bool: whether tile (i, j) of attn_mask `mask` (B, H, n_q, n_k, any strides) keeps a pair
    (True, or a float other than −∞); rows and columns past the end count as hidden. A broadcast batch, head or
    query dimension (stride 0) is read once and stays a broadcast: a padding mask (B, 1, 1, n_k) costs n_k per
    sequence, not n_q · n_k per head."""
    b, h, n_q, n_k = mask.shape
    once = [1 if st == 0 else size for size, st in zip((b, h, n_q), mask.stride()[:3])]
    mask = mask[: once[0], : once[1], : once[2]]
    keeps = (mask if mask.dtype == torch.bool else mask != float("-inf")).to(torch.uint8)
    rows = triton.cdiv(once[2], block_m) * block_m
    cols = triton.cdiv(n_k, block_n) * block_n
    padded = torch.nn.functional.pad(keeps, (0, cols - n_k, 0, rows - once[2]))
    tiles = padded.view(*once[:2], rows // block_m, block_m, cols // block_n, block_n).amax(dim=(3, 5)) != 0
    return tiles.expand(b, h, triton.cdiv(n_q, block_m), cols // block_n)  # one row of tiles serves them all


_BLOCK_MASKS: dict = {}  # (mask_mod, B, H, n_q, n_k, tiles, device) → its live-tile table, computed once
MAX_BLOCK_MASKS = 64


def _mask_mod_tiles(mask_mod, batch: int, heads: int, n_q: int, n_k: int, block_m: int, block_n: int,
                    device: torch.device) -> torch.Tensor:
    """(B, H, T_r, T_c) uint8: which tiles of block_m × block_n mask_mod keeps a pair of (the block mask),
    computed by `_mask_mod_tiles_kernel` once per mask and shape and remembered."""
    key = (mask_mod, batch, heads, n_q, n_k, block_m, block_n, device)
    if key not in _BLOCK_MASKS:
        if len(_BLOCK_MASKS) >= MAX_BLOCK_MASKS:
            _BLOCK_MASKS.clear()
        live = torch.empty(batch, heads, triton.cdiv(n_q, block_m), triton.cdiv(n_k, block_n), dtype=torch.uint8,
                           device=device)
        if live.numel():
            _mask_mod_tiles_kernel[(batch * heads, live.shape[2], live.shape[3])](
                live, heads, n_q, n_k, MASK_MOD=mask_mod, BLOCK_M=block_m, BLOCK_N=block_n)
        _BLOCK_MASKS[key] = live
    return _BLOCK_MASKS[key]


def _forward(p: _Problem, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    # a packed batch's rows start as 0 and −∞: what a max_seqlen too small for some sequence (not
    # checked on the GPU, where reading cu_seqlens would wait for it) leaves, never uninitialised memory
    out = (torch.zeros_like if p.varlen else torch.empty_like)(q, memory_format=torch.contiguous_format)
    lse = p.rows(q)
    if p.varlen:
        lse.fill_(-math.inf)
    if out.numel() == 0:
        return out, lse.fill_(-math.inf)
    tiles = _tiles(p.head_dim, q.dtype, forward=True)
    grid = (p.batch * p.heads, triton.cdiv(max(p.n_q, 1), tiles["BLOCK_M"]))
    masks, mask_strides = p.mask_args(tiles["BLOCK_M"], tiles["BLOCK_N"])
    _variants_fwd_kernel[grid](
        q, k, v, out, lse, p.cu_q, p.cu_k, p.slopes, *masks, *p.strides(q), *p.strides(k), *p.strides(v),
        *p.strides(out), *p.row_strides(lse), *p.slope_strides, *mask_strides, *p.scalars(p.heads), **p.flags,
        **p.hooks, **tiles)
    return out, lse


def _backward(p: _Problem, q, k, v, out, lse, do) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if p.score_mod is not None and p.score_mod_grad is None:
        raise RuntimeError(f"score_mod: the gradient through {getattr(p.score_mod, '__name__', 'the score_mod')} "
                           "needs its derivative; pass score_mod_grad=, a @triton.jit function of (score, batch, "
                           "head, q_idx, kv_idx) returning d score_mod / d score")
    do = do.contiguous()
    # Δ_i = Σ_d O_id dO_id (chapter 6), laid out as lse is
    delta = (out.float() * do.float()).sum(-1)
    delta = delta.transpose(0, 1).contiguous() if p.varlen else delta
    dq, dk, dv = (torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    if q.numel() == 0 or k.numel() == 0:
        return dq, dk, dv
    tiles = _tiles(p.head_dim, q.dtype)
    masks, mask_strides = p.mask_args(tiles["BLOCK_M"], tiles["BLOCK_N"])
    common = (*p.row_strides(lse), *p.slope_strides, *mask_strides)
    grid = (p.batch * p.kv_heads, triton.cdiv(max(p.n_k, 1), tiles["BLOCK_N"]))
    _variants_dkdv_kernel[grid](
        q, k, v, do, lse, delta, dk, dv, p.cu_q, p.cu_k, p.slopes, *masks, *p.strides(q), *p.strides(k), *p.strides(v),
        *p.strides(do), *p.strides(dk), *common, *p.scalars(p.kv_heads), **p.flags, **p.hooks, **tiles)
    grid = (p.batch * p.heads, triton.cdiv(max(p.n_q, 1), tiles["BLOCK_M"]))
    _variants_dq_kernel[grid](
        q, k, v, do, lse, delta, dq, p.cu_q, p.cu_k, p.slopes, *masks, *p.strides(q), *p.strides(k), *p.strides(v),
        *p.strides(do), *p.strides(dq), *common, *p.scalars(p.heads), **p.flags, **p.hooks, **tiles)
    return dq, dk, dv


MAX_TILES = 65535  # programs along a grid's y axis, where the kernels put a sequence's tiles


def _check_grid(n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> None:
    tiles = _tiles(head_dim, dtype)
    longest = max(n_q, n_k)
    if max(triton.cdiv(n_q, tiles["BLOCK_M"]), triton.cdiv(n_k, tiles["BLOCK_N"])) > MAX_TILES:
        raise ValueError(f"q, k: a sequence of {longest} tokens is more than one launch runs in tiles of "
                         f"{tiles['BLOCK_M']} ({MAX_TILES} tiles)")


class _VariantAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, problem):
        out, lse = _forward(problem, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.problem = problem
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, _dlse):
        return *_backward(ctx.problem, *ctx.saved_tensors, do), None


# --- the calls and their checks ----------------------------------------------------------------------

def _check_variants(heads: int, batch: int, device: torch.device, window_size, softcap, alibi_slopes) -> None:
    """TypeError / ValueError naming the argument for a variant outside the contract."""
    check_window_size(window_size)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap >= 0 or math.isinf(softcap):
        raise ValueError(f"softcap must be a finite number ≥ 0 (0: none), got {softcap!r}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
        if alibi_slopes.dtype != torch.float32 or alibi_slopes.shape not in ((heads,), (batch, heads)):
            raise ValueError(f"alibi_slopes must be float32 of shape ({heads},) or ({batch}, {heads}), got "
                             f"{alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != device:
            raise ValueError(f"alibi_slopes must be on q's device {device}, got {alibi_slopes.device}")


def _checked_mask(attn_mask, q: torch.Tensor, n_k: int) -> torch.Tensor:
    """attn_mask as PyTorch's SDPA takes it, as a (B, H, n_q, n_k) view (broadcast dimensions of stride 0);
    TypeError / ValueError naming it for what PyTorch refuses, or for a mask that needs a gradient."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype not in (torch.bool, torch.float32, q.dtype):
        raise ValueError(f"attn_mask: expected dtype bool, float32 or the query's {q.dtype}, as PyTorch does, got "
                         f"{attn_mask.dtype}")
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask must be on the query's device {q.device}, got {attn_mask.device}")
    if attn_mask.requires_grad:
        raise ValueError("attn_mask: this kernel gives no gradient for the mask; pass attn_mask.detach() or call "
                         "torch.nn.functional.scaled_dot_product_attention")
    want = (*q.shape[:3], n_k)
    try:
        return attn_mask.expand(want)
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the attention's "
                         f"(batch, heads, L, S) = {want}") from None


def _check_hooks(score_mod, score_mod_grad, mask_mod, softcap, alibi_slopes, attn_mask) -> None:
    """TypeError / ValueError naming the hook that is not a @triton.jit function or clashes with an argument."""
    for name, fn in (("score_mod", score_mod), ("score_mod_grad", score_mod_grad), ("mask_mod", mask_mod)):
        if fn is not None and not isinstance(fn, triton.runtime.KernelInterface):
            raise TypeError(f"{name} must be a @triton.jit function, got {type(fn).__name__}")
        if fn is not None and interpreter_active() and type(fn).__name__ != "InterpretedFunction":
            raise TypeError(f"{name} was compiled for a GPU, but the kernels run in Triton's interpreter here: "
                            "import tutorial_kernels before decorating it (it switches the interpreter on)")
    if score_mod_grad is not None and score_mod is None:
        raise ValueError("score_mod_grad: the derivative of a score_mod, given without score_mod")
    if score_mod is not None and (softcap > 0 or alibi_slopes is not None):
        raise ValueError("score_mod: with softcap or alibi_slopes as well, write them into the score_mod (chapter 9 "
                         "shows both as hooks)")
    if mask_mod is not None and attn_mask is not None:
        raise ValueError("mask_mod: pass either attn_mask or mask_mod, not both")


# --8<-- [start:call]
def flash_attn_variants(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        sm_scale: float | None = None, *, window_size: tuple[int, int] = (-1, -1),
                        softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                        return_lse: bool = False, attn_mask: torch.Tensor | None = None, score_mod=None,
                        score_mod_grad=None, mask_mod=None):
    """softmax(S) V with chapter 9's variants (module docstring), differentiable.

    q: (B, H, n_q, d); k, v: (B, H_kv, n_k, d), H_kv dividing H; 16 ≤ d ≤ 256; float16, bfloat16 or
    float32; any strides. window_size: (left, right) keys around the bottom-right diagonal, −1 for no
    bound (causal: right = 0); softcap: c > 0 caps the scores at c · tanh(S / c); alibi_slopes: float32
    (H,) or (B, H); attn_mask: PyTorch's SDPA mask, broadcastable to (B, H, n_q, n_k), boolean (False
    hides a pair) or float (added to the scores), no gradient; the tiles it hides whole are skipped. A
    float entry near float32's lowest (transformers' padding value) overflows to −∞ in the kernel's base-2
    units and hides its pair: a row hidden entirely gets 0, where PyTorch's own softmax averages V.
    Hooks, @triton.jit functions as FlexAttention's: score_mod(score, batch, head, q_idx, kv_idx) → the
    score used (from τ q·k, natural units), score_mod_grad its derivative in score (needed for gradients:
    without it the backward raises RuntimeError); mask_mod(batch, head, q_idx, kv_idx) → keep, its whole
    tiles skipped by a block mask computed once per mask and shape. Returns O (B, H, n_q, d), and with
    return_lse the rows' log-sum-exp (B, H, n_q) float32 (−∞ for a row that sees no key). Raises
    TypeError / ValueError naming the argument."""
    shape = check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=256, allow_gqa=True, allow_empty=True)
    _check_variants(shape.heads, shape.batch, q.device, window_size, softcap, alibi_slopes)
    _check_grid(shape.n_q, shape.n_k, shape.head_dim, q.dtype)
    _check_hooks(score_mod, score_mod_grad, mask_mod, softcap, alibi_slopes, attn_mask)
    mask = None if attn_mask is None else _checked_mask(attn_mask, q, shape.n_k)
    problem = _Problem(q, k, v, None, None, shape.batch, shape.n_q, shape.n_k, shape.sm_scale, bool(causal),
                       tuple(window_size), float(softcap), alibi_slopes, mask, score_mod, score_mod_grad, mask_mod)
    out, lse = _VariantAttention.apply(q, k, v, problem)
    return (out, lse) if return_lse else out
# --8<-- [end:call]


def flash_attn_variants_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 o: torch.Tensor, lse: torch.Tensor, causal: bool = False,
                                 sm_scale: float | None = None, *, window_size: tuple[int, int] = (-1, -1),
                                 softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None):
    """(dQ, dK, dV) of `flash_attn_variants(q, k, v, ...)` for the given dO, from its O and its rows'
    log-sum-exp (B, H, n_q) float32 — computed by this module or by any kernel of the same variant
    (the front door pairs chapter 7's windowed forward with it). Raises as `flash_attn_variants`."""
    shape = check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=256, allow_gqa=True, allow_empty=True)
    _check_variants(shape.heads, shape.batch, q.device, window_size, softcap, alibi_slopes)
    for name, t, want in (("do", do, q.shape), ("o", o, q.shape), ("lse", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor) or t.shape != want:
            raise ValueError(f"{name} must be a tensor of shape {tuple(want)}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if do.dtype != q.dtype or o.dtype != q.dtype or lse.dtype != torch.float32:
        raise ValueError(f"do and o must have q's dtype {q.dtype} and lse float32, got {do.dtype}, {o.dtype}, "
                         f"{lse.dtype}")
    if not (do.device == o.device == lse.device == q.device):
        raise ValueError(f"do, o and lse must be on q's device {q.device}, got {do.device}, {o.device}, {lse.device}")
    _check_grid(shape.n_q, shape.n_k, shape.head_dim, q.dtype)
    problem = _Problem(q, k, v, None, None, shape.batch, shape.n_q, shape.n_k, shape.sm_scale, bool(causal),
                       tuple(window_size), float(softcap), alibi_slopes)
    return _backward(problem, q, k, v, o, lse, do)


def flash_attn_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                      sm_scale: float | None = None, *, window_size: tuple[int, int] = (-1, -1),
                      softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None, return_lse: bool = False):
    """Attention over a packed batch of sequences of different lengths, as flash-attn's
    `flash_attn_varlen_func`: sequence b is tokens [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and
    [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v; no padding is computed. Differentiable.

    q: (total_q, H, d); k, v: (total_k, H_kv, d); cu_seqlens_*: int32 (B + 1,), from 0, non-decreasing,
    ending at total_*; max_seqlen_*: at least the longest sequence (ints, sizing the grid). Both checked
    on the CPU only (reading a GPU tensor would wait for the GPU); on a GPU a too-small max_seqlen
    leaves the rows it misses at 0 (lse −∞). Variants as `flash_attn_variants`. Returns O
    (total_q, H, d), and with return_lse the log-sum-exp (H, total_q) float32, flash-attn's layout."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a packed (total tokens, heads, head_dim) tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    # the dense checks on a (1, H, tokens, d) view: dtypes, devices, head counts, head_dim, sm_scale
    shape = check_attention_inputs(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal,
                                   sm_scale, max_head_dim=256, allow_gqa=True, allow_empty=True)
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]), ("cu_seqlens_k", cu_seqlens_k, k.shape[0])):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1:
            raise ValueError(f"{name} must be an int32 tensor of shape (batch + 1,), got "
                             f"{cu.dtype if isinstance(cu, torch.Tensor) else type(cu).__name__} "
                             f"{tuple(cu.shape) if isinstance(cu, torch.Tensor) else ''}")
        if cu.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {cu.device}")
        if cu.device.type == "cpu" and (cu[0] != 0 or (cu.diff() < 0).any() or cu[-1] != total):
            raise ValueError(f"{name} must start at 0, never decrease and end at the {total} tokens, got "
                             f"{cu.tolist()}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe as many sequences, got "
                         f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_k.numel() - 1}")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if type(n) is not int or n < 0:
            raise ValueError(f"{name} must be an int ≥ 0, got {n!r}")
    for name, cu, n in (("max_seqlen_q", cu_seqlens_q, max_seqlen_q), ("max_seqlen_k", cu_seqlens_k, max_seqlen_k)):
        if cu.device.type == "cpu" and cu.numel() > 1 and int(cu.diff().max()) > n:
            raise ValueError(f"{name} must be at least the longest sequence, {int(cu.diff().max())}, got {n}")
    batch = cu_seqlens_q.numel() - 1
    _check_variants(shape.heads, batch, q.device, window_size, softcap, alibi_slopes)
    _check_grid(max_seqlen_q, max_seqlen_k, shape.head_dim, q.dtype)
    problem = _Problem(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, shape.sm_scale,
                       bool(causal), tuple(window_size), float(softcap), alibi_slopes)
    out, lse = _VariantAttention.apply(q, k, v, problem)
    return (out, lse) if return_lse else out


__all__ = ["flash_attn_variants", "flash_attn_variants_backward", "flash_attn_varlen", "band", "key_range",
           "gemma2_softcap", "gemma2_softcap_grad", "prefix_lm_mask", "documents_of_64_mask"]
