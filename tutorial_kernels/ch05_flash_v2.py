"""Chapter 5 — FlashAttention-2 forward (Dao 2023, Algorithm 1), in Triton.

The loop order of chapter 3's online-softmax attention, made complete and fast:

* grid = (query tiles, batch × heads): every query tile of every head is its own program, so even
  one sequence of one head fills the GPU when it is long (FlashAttention-1 used batch × heads
  programs only);
* Q tile in the outer position, loaded once; K/V tiles in the inner loop; the output accumulator,
  the running max m and the running sum l stay in registers until the end — one division by l
  per row instead of a rescale-and-store per step;
* `exp2` with log₂e folded into the scale (one MUFU.EX2 instruction instead of exp's extra multiply);
* causal attention in two stages: key tiles wholly visible to the query tile need no mask; only
  the tiles that cross the diagonal are masked; tiles wholly hidden are never visited;
* the log-sum-exp of every row is written for the backward pass (chapter 6);
* grouped-query / multi-query attention (k and v with fewer heads), n_q ≠ n_k (bottom-right causal
  alignment), any head_dim from 16 to 256, any strides, float16 / bfloat16 / float32.

Two launchers share the kernel: `flash_attn_v2` with one fixed, readable configuration (the
teaching version), and `flash_attn_v2_tuned`, which launches with the tile sizes, warps and pipeline
depth measured fastest for the shape on this GPU (the tile table, `perf.tile_table`; Triton's
autotuner where asked for, `tutorial_kernels.tune`).
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
import triton
import triton.language as tl

from tutorial_kernels import recorder
from tutorial_kernels.perf import tile_table
from tutorial_kernels.perf.autotune import TunedKernel
from tutorial_kernels.perf.descriptors import rows_describable, use_descriptor_scratch
from tutorial_kernels.perf.launch_plan import attention_call_key
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.precision import autotunes, dot_precision, tiles_for
from tutorial_kernels.tiling import (
    INTERPRETER_TILES, LOG2_E, from_log2_units, head_dim_block, tuning_tiles)
from tutorial_kernels.validation import check_attention_inputs, check_out

# --- the minimal kernel: FlashAttention-2 and nothing else -------------------------------------------

# --8<-- [start:minimal_kernel]
@triton.jit
def _flash_v2_minimal_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, group_size, n_q, n_k, head_dim, qk_scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "tf32x3" or "tf32" for float32 operands: `precision.dot_precision`
):
    """One program: rows [pid_m·BLOCK_M, +BLOCK_M) of the queries of one (batch, head), against every
    key they may see. BLOCK_D is head_dim rounded up to a power of two; the extra columns load as 0."""
    pid_m = tl.program_id(0)  # i: which tile of queries (grid axis 0: parallel over the sequence)
    pid_bh = tl.program_id(1).to(tl.int64)  # which (batch, head); 64-bit before it meets a stride
    batch, head = pid_bh // n_heads, pid_bh % n_heads
    kv_head = head // group_size  # grouped-query attention: group_size query heads share K and V

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh
                + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < n_q) & d_ok[None, :], other=0.0)  # Q_i, loaded once
    k_head = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_head = v_ptr + batch * stride_vb + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # m_i = −∞, in log₂ units
    l_i = tl.zeros([BLOCK_M], tl.float32)  # ℓ_i = 0
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # O_i = 0, un-normalised, in registers

    # causal, bottom-right: query r sees key c when c ≤ r + (n_k − n_q); no key past the last row's
    hi = tl.minimum((pid_m + 1) * BLOCK_M + (n_k - n_q), n_k) if CAUSAL else n_k
    for start_n in range(0, hi, BLOCK_N):  # j = 1 … T_c: the K/V tiles this query tile may see
        cols = start_n + offs_n
        k_t = tl.load(k_head + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                      mask=(cols[None, :] < n_k) & d_ok[:, None], other=0.0)  # K_jᵀ
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale  # S = τ·log₂e · Q_i K_jᵀ, log₂ units
        visible = cols[None, :] < n_k  # the ragged last tile
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # m_new = max(m_i, rowmax S)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees no key yet: no −∞ − (−∞)
        p = tl.math.exp2(s - shift[:, None])  # P̃ = 2^{S − m_new} = e^{τ·QKᵀ − m_new·ln2}
        alpha = tl.math.exp2(m_i - shift)  # α = 2^{m_i − m_new}
        l_i = l_i * alpha + tl.sum(p, axis=1)  # ℓ_i ← α ℓ_i + rowsum P̃
        v = tl.load(v_head + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=(cols[:, None] < n_k) & d_ok[None, :], other=0.0)  # V_j
        acc = acc * alpha[:, None]  # O_i ← diag(α) O_i
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # O_i ← O_i + P̃ V_j, on the tensor cores
        m_i = m_new

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # O_i ← diag(ℓ_i)⁻¹ O_i, once; ℓ_i = 0: no key, O_i = 0
    tl.store(o_ptr + batch * stride_ob + head * stride_oh
             + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             o.to(o_ptr.dtype.element_ty), mask=(offs_m[:, None] < n_q) & d_ok[None, :])
# --8<-- [end:minimal_kernel]


# --8<-- [start:minimal_launcher]
def flash_attn_v2_minimal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FlashAttention-2 forward, the minimal kernel: softmax(scale · Q Kᵀ) V.

    q: (B, H, n_q, d); k, v: (B, H_kv, n_k, d) with H_kv dividing H (grouped-query attention);
    16 ≤ d ≤ 256; any strides; float16, bfloat16 or float32. Causal masks are bottom-right aligned.
    out: an optional (B, H, n_q, d) buffer, contiguous or a permuted view of a contiguous tensor.
    Raises ValueError / TypeError naming the argument for inputs outside this contract."""
    shape = check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=256, allow_gqa=True)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else check_out(
        out, "out", tuple(q.shape), q, any_dense_layout=True)
    config = teaching_config(shape.head_dim, q.dtype)  # 64 × 64 tiles, 4 warps, 2 stages (32 × 32 on the CPU)
    grid = (triton.cdiv(shape.n_q, config["BLOCK_M"]), shape.batch * shape.heads)  # (T_r, B·H)
    _flash_v2_minimal_kernel[grid](
        q, k, v, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        shape.heads, shape.group_size, shape.n_q, shape.n_k, shape.head_dim,
        shape.sm_scale * LOG2_E,  # fold log₂e into the scale: e^{τs} = 2^{τ·log₂e·s}
        CAUSAL=causal, BLOCK_D=head_dim_block(shape.head_dim), DOT_PRECISION=dot_precision(q.dtype), **config)
    return o
# --8<-- [end:minimal_launcher]


# --- the teaching and tuned kernel: the minimal one, with the extras that made it fast ---------------

# --8<-- [start:inner_loop]
@triton.jit
def _load_kv_tile(ptrs, key_ok, col_ok, MASK_KEYS: tl.constexpr, EVEN_COLS: tl.constexpr):
    """One K or V tile through pointers, masked only along the axes that can run past the tensor: keys
    past n_k in the masked stage (MASK_KEYS), columns past head_dim unless EVEN_COLS. An unmasked
    load compiles to 16-byte vector loads, a masked one may be split into narrower ones. (Whole
    columns must not be masked in the masked stage: with Triton 3.6 that made ptxas crash at
    head_dim 16 with one query: docs/how-the-numbers-were-obtained.md, chapter 5.)"""
    if MASK_KEYS and not EVEN_COLS:
        tile = tl.load(ptrs, mask=key_ok & col_ok, other=0.0)
    elif MASK_KEYS:
        tile = tl.load(ptrs, mask=key_ok, other=0.0)
    elif not EVEN_COLS:
        tile = tl.load(ptrs, mask=col_ok, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _attend_to_key_tiles(
    acc, acc_tail, l_i, m_i, q, q_tail,
    k_src, v_src, kv_row0, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, offs_dt, n_q, n_k, head_dim, qk_scale,
    lo, hi,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_D: tl.constexpr, SPLIT_D: tl.constexpr, USE_DESCRIPTORS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Fold key tiles [lo, hi) into the running (acc, l, m) of one query tile.

    MASKED=False is the fast path for tiles every row of the query tile may see in full: no causal
    mask and no bounds check on the key axis. MASKED=True handles the tiles that cross the causal
    diagonal or hang over the end of the keys.

    k_src and v_src are this head's K and V: pointers to row 0 (teaching path), or, with
    USE_DESCRIPTORS, tensor descriptors over all rows of K and V viewed as (rows, head_dim) matrices,
    this head starting at row kv_row0 — each tile then arrives by one TMA copy on Hopper.

    With SPLIT_D the head dimension is two blocks, columns offs_d and offs_dt (d = 80 as 64 + 16),
    both within head_dim: q_tail and acc_tail are the second block's query and output columns.
    Otherwise they are placeholders that no instruction reads, and the compiler drops them.
    """
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < head_dim
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if USE_DESCRIPTORS:
            # rows past this head's n_k belong to the next head (or are zero past the end): the
            # masked stage gives them −∞ scores and zeroes their V rows, so they add nothing, even
            # where the next head holds infinities. Columns past head_dim load as 0.
            k_t = tl.trans(k_src.load([kv_row0 + start_n, 0]))
        else:
            k_t = _load_kv_tile(k_src + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn,
                                cols[None, :] < n_k, d_ok[:, None], MASKED, EVEN_D)
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) raw scores q·k, float32
        if SPLIT_D:  # the head dimension's second block adds its share of every q·k
            k_tail_t = _load_kv_tile(k_src + offs_dt[:, None] * stride_kd + cols[None, :] * stride_kn,
                                     cols[None, :] < n_k, None, MASKED, True)
            s = tl.dot(q_tail, k_tail_t, s, input_precision=DOT_PRECISION)

        if MASKED:
            visible = cols[None, :] < n_k  # the ragged end of the keys
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))  # bottom-right aligned
            s = tl.where(visible, s * qk_scale, float("-inf"))  # now in log₂ units
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet
            p = tl.math.exp2(s - shift[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            shift = m_new
            p = tl.math.exp2(s * qk_scale - shift[:, None])  # scale and shift fuse into one FMA

        alpha = tl.math.exp2(m_i - shift)  # 2^(m_old − m_new): rescales what was summed before
        l_i = l_i * alpha + tl.sum(p, axis=1)  # l ← l·α + rowsum(P̃)
        if USE_DESCRIPTORS:
            v = v_src.load([kv_row0 + start_n, 0])
            if MASKED:  # rows past n_k hold the next head's values: weight 0, but 0 · inf would be NaN
                v = tl.where(cols[:, None] < n_k, v, 0.0)
        else:
            v = _load_kv_tile(v_src + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                              cols[:, None] < n_k, d_ok[None, :], MASKED, EVEN_D)
        acc = acc * alpha[:, None]  # O ← diag(α) O
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # O ← O + P̃ V
        if SPLIT_D:
            v_tail = _load_kv_tile(v_src + cols[:, None] * stride_vn + offs_dt[None, :] * stride_vd,
                                   cols[:, None] < n_k, None, MASKED, True)
            acc_tail = tl.dot(p.to(v_tail.dtype), v_tail, acc_tail * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, acc_tail, l_i, m_i
# --8<-- [end:inner_loop]


# --8<-- [start:forward_kernel]
# Triton compiles an integer argument equal to 1 or divisible by 16 into a binary of its own; the
# lengths change from call to call and gain nothing from it, so one binary serves every length.
@triton.jit(do_not_specialize=("n_q", "n_k", "length_bucket"))
def _flash_v2_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, trace_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, group_size, n_q, n_k, head_dim, qk_scale, length_bucket, load_choice,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr, SPLIT_D: tl.constexpr, BLOCK_DT: tl.constexpr,
    USE_DESCRIPTORS: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TRACE: tl.constexpr = False,
):
    """One program: one BLOCK_M tile of queries of one (batch, head), against all the keys it may see.

    The head dimension is covered by columns [0, BLOCK_D), and, with SPLIT_D, a second block
    [BLOCK_D, BLOCK_D + BLOCK_DT) that ends exactly at head_dim (see `_head_dim_blocks`). EVEN_D says
    that the first block ends within head_dim, so its loads need no column mask. WRITE_LSE stores each row's log-sum-exp for
    the backward pass. TRACE records the program's SM and start/end times into trace_ptr (chapter 1's
    timeline)."""
    if TRACE:
        started = recorder.program_start()
    # Causal tiles near the end of the sequence see the most keys: launch them first so the long
    # programs start early and the short ones fill the gaps at the end (less tail imbalance).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    batch = pid_bh // n_heads
    head = pid_bh % n_heads
    kv_head = head // group_size  # grouped-query attention: query heads share a key/value head

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dt = BLOCK_D + tl.arange(0, BLOCK_DT)  # the head dimension's second block (if SPLIT_D)
    q_rows = q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qm
    row_ok = offs_m[:, None] < n_q
    q = tl.load(q_rows + offs_d[None, :] * stride_qd, mask=row_ok & (offs_d[None, :] < head_dim), other=0.0)
    q_tail = tl.load(q_rows + offs_dt[None, :] * stride_qd, mask=row_ok & (offs_dt[None, :] < head_dim), other=0.0)
    # q and q_tail are loaded once, reused against every key tile. Without SPLIT_D, q_tail's columns
    # all lie past head_dim: an all-masked load no instruction reads, which the compiler drops.
    if USE_DESCRIPTORS:  # K and V contiguous: (B·H_kv·n_k, head_dim) matrices, this head from kv_row0
        # TMA coordinates are 32-bit: fine up to 2³¹ rows of K (B·H_kv·n_k)
        kv_rows = (n_heads // group_size) * n_k * (tl.num_programs(1) // n_heads)
        kv_row0 = ((batch * (n_heads // group_size) + kv_head) * n_k).to(tl.int32)
        k_src = tl.make_tensor_descriptor(k_ptr, shape=[kv_rows, head_dim], strides=[stride_kn, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_ptr, shape=[kv_rows, head_dim], strides=[stride_vn, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        tl.static_assert(not SPLIT_D, "a descriptor loads one block of columns: launch with SPLIT_D=False")
    else:
        kv_row0 = 0
        k_src = k_ptr + batch * stride_kb + kv_head * stride_kh
        v_src = v_ptr + batch * stride_vb + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, in log₂ units
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running Σ 2^(s − m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # running un-normalised output
    acc_tail = tl.zeros([BLOCK_M, BLOCK_DT], tl.float32)  # the output's columns of the second block

    # Which key tiles this query tile sees. Query i sees keys j ≤ i + (n_k − n_q) when causal.
    if CAUSAL:  # `tiling.causal_key_stages`, written out: ptxas (CUDA 13) crashed on the helper's
        # inlined form at head_dim 16 with one query, where Triton folds n_q = 1 into the code
        first_row_sees = pid_m * BLOCK_M + (n_k - n_q) + 1  # keys [0, this) are visible to every row
        last_row_sees = (pid_m + 1) * BLOCK_M + (n_k - n_q)  # no row sees a key at or past this
        unmasked_end = tl.maximum(tl.minimum(first_row_sees, n_k) // BLOCK_N * BLOCK_N, 0)
        masked_end = tl.maximum(tl.minimum(last_row_sees, n_k), 0)
    else:
        unmasked_end = n_k // BLOCK_N * BLOCK_N  # whole tiles
        masked_end = n_k  # the ragged last tile, if any
    # Stage 1: tiles every row sees in full — no mask.
    acc, acc_tail, l_i, m_i = _attend_to_key_tiles(
        acc, acc_tail, l_i, m_i, q, q_tail, k_src, v_src, kv_row0, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, offs_dt, n_q, n_k, head_dim, qk_scale, 0, unmasked_end,
        MASKED=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, EVEN_D=EVEN_D, SPLIT_D=SPLIT_D,
        USE_DESCRIPTORS=USE_DESCRIPTORS, DOT_PRECISION=DOT_PRECISION,
    )
    # Stage 2: the tiles on the causal diagonal and the ragged end of the keys — masked.
    acc, acc_tail, l_i, m_i = _attend_to_key_tiles(
        acc, acc_tail, l_i, m_i, q, q_tail, k_src, v_src, kv_row0, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, offs_dt, n_q, n_k, head_dim, qk_scale, unmasked_end, masked_end,
        MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, EVEN_D=EVEN_D, SPLIT_D=SPLIT_D,
        USE_DESCRIPTORS=USE_DESCRIPTORS, DOT_PRECISION=DOT_PRECISION,
    )

    # Epilogue: one division per row (FlashAttention-2 defers it to here), and the log-sum-exp.
    seen = l_i > 0.0  # False for a query that sees no key: output 0, lse −∞
    inv_l = 1.0 / tl.where(seen, l_i, 1.0)
    o_rows = o_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_om
    tl.store(o_rows + offs_d[None, :] * stride_od, (acc * inv_l[:, None]).to(o_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim))
    if SPLIT_D:
        tl.store(o_rows + offs_dt[None, :] * stride_od, (acc_tail * inv_l[:, None]).to(o_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < n_q) & (offs_dt[None, :] < head_dim))
    if WRITE_LSE:
        # lse = ln Σ_j e^{S_ij} = (m + log₂ l) · ln 2, since m and the exponents are in log₂ units
        lse = tl.where(seen, from_log2_units(m_i + tl.math.log2(tl.where(seen, l_i, 1.0))), float("-inf"))
        tl.store(lse_ptr + pid_bh * n_q + offs_m, lse, mask=offs_m < n_q)
    if TRACE:
        recorder.program_end(trace_ptr, started)
# --8<-- [end:forward_kernel]


def _head_dim_blocks(head_dim: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_DT): the head dimension as one block (BLOCK_DT = 0), or as two power-of-two
    blocks when it is exactly their sum and below 128. Every padded column costs as much tensor-core
    work as a real one: d = 80 as one block of 128 spends 37.5 % of every Q Kᵀ and P̃ V product on
    zeros, as 64 + 16 none; likewise 48 = 32 + 16 and 96 = 64 + 32. Other sizes run as one padded
    block: a second block that itself needs padding (72 = 64 + 8) gave wrong outputs on the H100,
    and 160 = 128 + 32 an out-of-range shared-memory access (docs/how-the-numbers-were-obtained.md,
    chapter 5)."""
    first = 1 << (head_dim.bit_length() - 1)  # the largest power of two ≤ head_dim (≥ 16: checked before)
    second = head_dim - first
    if head_dim < 128 and second >= 16 and second & (second - 1) == 0:  # a power of two ≥ tl.dot's 16
        return first, second
    return head_dim_block(head_dim), 0


def teaching_config(head_dim: int, dtype: torch.dtype = torch.float16) -> dict:
    """One readable configuration: 64 × 64 tiles (32-wide key tiles for the largest heads, whose
    Q tile and accumulator already take 64 × 256 × 4 bytes of registers), 4 warps, 2 stages; the
    smaller `precision.full_float32_tiles` for float32 in full precision."""
    if interpreter_active():
        return dict(INTERPRETER_TILES)
    return tiles_for(dtype, head_dim, BLOCK_M=64, BLOCK_N=64 if head_dim <= 128 else 32, num_warps=4, num_stages=2)


# What a launch allows for K/V loads; the autotuner reads it (a key, so a choice made for contiguous
# K/V is never reused for a strided one) and `_allowed_loads` prunes by it.
POINTERS_ONLY, DESCRIPTORS_ONLY, EITHER = 0, 1, 2


def _descriptors_apply(k: torch.Tensor, v: torch.Tensor) -> bool:
    """TMA needs K and V as row-major matrices with 16-byte aligned rows. Descriptors are also kept
    to 16-bit dtypes, the ones tested on the GPU: float32 at head_dim 256 gave wrong outputs through
    descriptors on the H100 with Triton 3.6 (docs/how-the-numbers-were-obtained.md, chapter 5)."""
    return all(t.is_contiguous() and t.element_size() == 2 and rows_describable(t) for t in (k, v))


# --8<-- [start:launcher]
def _prepare(q, k, v, causal, sm_scale, out, *, with_lse: bool, tuned: bool, descriptors: bool | None, trace=None):
    """Check the inputs, allocate O (and lse) and lay out the kernel's arguments.

    descriptors: True/False forces TMA descriptors / pointer loads for K and V; None lets a tuned
    launch use descriptors where they apply (pointers for the teaching launch). Returns
    (o, lse, args, constexprs, grid(meta), the autotuner's key). `out`, if given, may be any permutation of a contiguous
    layout: the kernel writes through its strides (a model's (B, N, H, d) buffer seen as (B, H, N, d))."""
    shape = check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=256, allow_gqa=True)
    if descriptors is not None and not isinstance(descriptors, bool):
        raise TypeError(f"descriptors must be None, True or False, got {type(descriptors).__name__} {descriptors!r}")
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else check_out(
        out, "out", tuple(q.shape), q, any_dense_layout=True)
    lse = torch.empty((shape.batch, shape.heads, shape.n_q), dtype=torch.float32, device=q.device) if with_lse else None
    if descriptors and not _descriptors_apply(k, v):
        raise ValueError("descriptors=True needs contiguous float16 or bfloat16 k and v with 16-byte aligned "
                         f"rows; got k strides {k.stride()}, head_dim {k.shape[-1]}, {k.dtype}")
    block_d, block_dt = _head_dim_blocks(shape.head_dim)
    if descriptors is None:  # the tuned launch may use TMA where K and V allow it (not for a head
        # dimension in two blocks: one descriptor loads one block of columns), keeping the faster
        choice = EITHER if tuned and k.is_cuda and not block_dt and _descriptors_apply(k, v) else POINTERS_ONLY
    else:
        choice = DESCRIPTORS_ONLY if descriptors else POINTERS_ONLY
    if choice == DESCRIPTORS_ONLY:
        block_d, block_dt = head_dim_block(shape.head_dim), 0
    if choice != POINTERS_ONLY and k.is_cuda:
        use_descriptor_scratch()
    if trace is not None:
        recorder.check_trace(trace, triton.cdiv(shape.n_q, teaching_config(shape.head_dim, q.dtype)["BLOCK_M"])
                             * shape.batch * shape.heads, q.device)
    length_bucket = triton.next_power_of_2(max(shape.n_q, shape.n_k))
    args = (
        q, k, v, o, lse, trace,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        shape.heads, shape.group_size, shape.n_q, shape.n_k, shape.head_dim,
        shape.sm_scale * LOG2_E,  # fold log₂e into the scale: e^{τs} = 2^{τ·log₂e·s}
        length_bucket,  # only the autotuner reads it
        choice,  # likewise
    )
    constexprs = dict(
        CAUSAL=causal, BLOCK_D=block_d,
        EVEN_D=block_d <= shape.head_dim,  # the first block has no column past head_dim: no mask along d
        SPLIT_D=block_dt > 0, BLOCK_DT=max(block_dt, 16),  # 16: the placeholder's width when not split
        WRITE_LSE=with_lse, TRACE=trace is not None,
        DOT_PRECISION=dot_precision(q.dtype),  # float32 products as torch's matmul setting says
    )
    grid = lambda meta: (triton.cdiv(shape.n_q, meta["BLOCK_M"]), shape.batch * shape.heads)  # noqa: E731
    # the autotuner's key: its `key` arguments (length_bucket, head_dim, CAUSAL, BLOCK_D, load_choice),
    # then the dtypes of the tensor arguments (q's for q, k, v and o; lse's only when it is written)
    tuning_key = (length_bucket, shape.head_dim, causal, block_d, choice, q.dtype, with_lse)
    return o, lse, args, constexprs, grid, tuning_key


def _launch_teaching(q, k, v, causal, sm_scale, out, *, with_lse=False, config=None, trace=None):
    """One launch with the teaching configuration, or with `config` (one of the tuned candidates,
    `TUNED.configs`, for tests and probes)."""
    if config is not None and not isinstance(config, triton.Config):
        raise TypeError(f"config must be a triton.Config or None, got {type(config).__name__} {config!r}")
    descriptors = bool(config.kwargs.get("USE_DESCRIPTORS", False)) if config is not None else False
    if descriptors and not _descriptors_apply(k, v):
        raise ValueError("config: USE_DESCRIPTORS needs contiguous float16 or bfloat16 k and v with 16-byte aligned "
                         f"rows; got k strides {k.stride()}, head_dim {k.shape[-1]}, {k.dtype}")
    if config is not None and trace is not None:
        raise ValueError("trace: a timeline is recorded with the teaching configuration; pass config=None")
    o, lse, args, constexprs, grid, _ = _prepare(q, k, v, causal, sm_scale, out, with_lse=with_lse, tuned=False,
                                                 descriptors=descriptors, trace=trace)
    meta = dict(USE_DESCRIPTORS=False) | (config.all_kwargs() if config is not None else teaching_config(k.shape[-1], q.dtype))
    _flash_v2_fwd_kernel[grid(meta)](*args, **constexprs, **meta)
    return o, lse
# --8<-- [end:launcher]


def flash_attn_v2(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None, config: triton.Config | None = None, trace: torch.Tensor | None = None,
) -> torch.Tensor:
    """FlashAttention-2 forward, teaching configuration: softmax(scale · Q Kᵀ) V.

    q: (B, H, n_q, d); k, v: (B, H_kv, n_k, d) with H_kv dividing H (grouped-query attention);
    16 ≤ d ≤ 256; any strides; float16, bfloat16 or float32. Causal masks are bottom-right aligned.
    out: an optional (B, H, n_q, d) buffer to write into, contiguous or a permuted view of a contiguous
    tensor (e.g. (B, n_q, H, d) memory transposed, the layout a model's output projection reads).
    config: one of `TUNED.configs` instead of the teaching configuration. trace: a buffer from
    `recorder.new_trace` that receives each program's SM and times (GPU only).
    Raises ValueError / TypeError naming the argument for inputs outside this contract.
    """
    return _launch_teaching(q, k, v, causal, sm_scale, out, config=config, trace=trace)[0]


# --- the tuned launch ---------------------------------------------------------------------------------

# (BLOCK_M, BLOCK_N, num_warps, num_stages) the autotuner may pick on a GPU (data/ch05_fwd_probe.json).
# The last is the teaching tile: the only one whose shared memory fits float32 at head_dim 256.
TILE_CONFIGS = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)]


def _allowed_loads(configs, named_args, **kwargs):
    """Keep the configs whose K/V load method the launch allows (pointers, descriptors or both)."""
    allowed = {POINTERS_ONLY: (False,), DESCRIPTORS_ONLY: (True,), EITHER: (False, True)}[named_args["load_choice"]]
    return [c for c in configs if c.kwargs["USE_DESCRIPTORS"] in allowed]


def _table_kernel(with_lse: bool) -> str:
    return "flash_v2_fwd_lse" if with_lse else "flash_v2_fwd"


def _table_rule(key) -> dict | None:
    """The tile table's configuration for a tuning key (`_prepare`'s): the fastest, or the fastest
    with the loads the launch allows; for the training forward (with the log-sum-exp) the inference
    forward's where the table has no row of its own."""
    length_bucket, head_dim, causal, block_d, load_choice, dtype, with_lse = key
    which = {POINTERS_ONLY: "pointers", DESCRIPTORS_ONLY: "descriptors", EITHER: "best"}[load_choice]
    # the columns the kernel computes: head_dim where it splits exactly into two blocks (80 = 64 + 16),
    # else the one padded block (72 runs 128 wide, and must not take d = 80's 80-wide tiles)
    width = head_dim if block_d < head_dim else block_d
    return (tile_table.rule(_table_kernel(with_lse), width, causal, dtype, length_bucket, which)
            or tile_table.rule(_table_kernel(False), width, causal, dtype, length_bucket, which))


def _teaching_fallback(key) -> dict:
    return dict(USE_DESCRIPTORS=key[4] == DESCRIPTORS_ONLY) | teaching_config(key[1], key[5])


def _record_tuned(key, best, timings) -> None:
    length_bucket, head_dim, causal, _, _, dtype, with_lse = key
    tile_table.record_tuned(_table_kernel(with_lse), head_dim, causal, dtype, length_bucket, best, timings)


# One configuration per (length bucket, head_dim, causal, dtype, load choice), not per exact length:
# the tile table's (`perf.tile_table`), or the autotuner's where asked for (`tutorial_kernels.tune`).
TUNED = TunedKernel(
    _flash_v2_fwd_kernel,
    [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "USE_DESCRIPTORS": tma}, num_warps=w, num_stages=s)
     for bm, bn, w, s in tuning_tiles(TILE_CONFIGS) for tma in (False, True)],
    key=["length_bucket", "head_dim", "CAUSAL", "BLOCK_D", "load_choice"],
    prune=_allowed_loads,
    # descriptors made in a kernel need scratch memory, on a GPU (the interpreter makes none)
    makes_descriptors=lambda config: config.kwargs["USE_DESCRIPTORS"] and not interpreter_active(),
    rule=_table_rule, fallback=_teaching_fallback, on_tuned=_record_tuned,
)


def _tuned_key(q, k, v, out, causal, sm_scale, with_lse: bool) -> Hashable | None:
    """A tuned launch's key: the call's, and what else decides the kernel (lse or not, tl.dot's precision)."""
    return attention_call_key(q, k, v, out, causal, sm_scale, with_lse, dot_precision(q.dtype))


# --8<-- [start:tuned_launch]
def _launch_tuned(q, k, v, causal, sm_scale, out, *, with_lse=False, descriptors: bool | None = None):
    if descriptors is None and isinstance(q, torch.Tensor) and not autotunes(q):  # full-precision float32
        return _launch_teaching(q, k, v, causal, sm_scale, out, with_lse=with_lse)
    # A call like an earlier one (same shapes, strides, dtypes, alignment, flags) passed the same
    # checks, chose the same configuration and compiled the same kernel: repeat that launch directly.
    plan = (_tuned_key(q, k, v, out, causal, sm_scale, with_lse)
            if descriptors is None and isinstance(q, torch.Tensor) else None)
    if plan in TUNED.plans:
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if with_lse else None
        if TUNED.relaunch(plan, q, k, v, o, *((lse,) if with_lse else ())):
            return o, lse
    o, lse, args, constexprs, grid, tuning_key = _prepare(q, k, v, causal, sm_scale, out, with_lse=with_lse,
                                                          tuned=True, descriptors=descriptors)
    TUNED.launch(grid, tuning_key, plan, *args, **constexprs)
    return o, lse
# --8<-- [end:tuned_launch]


def flash_attn_v2_tuned(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None, descriptors: bool | None = None,
) -> torch.Tensor:
    """The same kernel with tile sizes, warps, pipeline depth and the way K/V tiles are loaded chosen
    per shape bucket on the GPU: from the tile table measured for this GPU (`perf.tile_table`), or by
    Triton's autotuner inside `tile_table.autotuning()` / with TUTORIAL_KERNELS_AUTOTUNE=1 (the first
    call at a new bucket then pays for the timing). With `descriptors=None` K/V may come through tensor
    descriptors (TMA on Hopper) when k and v are contiguous float16/bfloat16 CUDA tensors with 16-byte
    rows, whichever was measured faster; `descriptors=False` forces pointer loads, `True` descriptors.
    Contract as `flash_attn_v2`."""
    return _launch_tuned(q, k, v, causal, sm_scale, out, descriptors=descriptors)[0]


def remembered_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None, causal: bool,
                   sm_scale: float) -> Hashable | None:
    """The key under which `flash_attn_v2_tuned(q, k, v, causal, sm_scale, out=out)` remembers its launch,
    for a caller that knows the call repeats (the front door) and relaunches it with `relaunch_remembered`.
    None for float32, whose kernel follows torch's matmul precision, a setting such a caller's key may
    not see."""
    if q.dtype == torch.float32:
        return None
    return _tuned_key(q, k, v, out, causal, sm_scale, False)


def relaunch_remembered(plan: Hashable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> bool:
    """Repeat the launch remembered under `plan` (`remembered_key`) with these tensors, writing `out`.
    False, having launched nothing, if none is remembered (the autotuner's own call remembers nothing).
    Nothing is checked: `plan` must be the key these very tensors give."""
    return TUNED.relaunch(plan, q, k, v, out)


def flash_attn_v2_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, tuned: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse): the output and each row's log Σ_j e^{S_ij} (float32, (B, H, n_q); −∞ where a query
    sees no key), from the teaching launch or (tuned=True) the tuned one."""
    if not isinstance(tuned, bool):
        raise TypeError(f"tuned must be a bool, got {type(tuned).__name__} {tuned!r}")
    launch = _launch_tuned if tuned else _launch_teaching
    return launch(q, k, v, causal, sm_scale, None, with_lse=True)


def tuned_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> dict | None:
    """The configuration the autotuner settled on for these inputs (after a tuned call), for reports."""
    return TUNED.choice_for(triton.next_power_of_2(max(q.shape[2], k.shape[2])), q.shape[3], causal, dtype=q.dtype)


__all__ = ["flash_attn_v2_minimal", "flash_attn_v2", "flash_attn_v2_tuned", "flash_attn_v2_with_lse",
           "teaching_config", "tuned_choice", "remembered_key", "relaunch_remembered", "TILE_CONFIGS", "TUNED"]
