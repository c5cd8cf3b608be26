"""Chapter 7, the backward on Hopper — chapter 6's gradients with FlashAttention-3's schedule, in Gluon.

The mathematics is chapter 6's (P recomputed from the saved log-sum-exp, Δ = rowsum(dO ∘ O),
dV = Pᵀ dO, dS = P ∘ (dP − Δ), dK = τ dSᵀ Q, dQ = τ dS K); what changes is who does what
(FlashAttention-3, Shah et al. 2024, §3 and Appendix B):

* one program per 128-key tile of one (batch, key/value head), K and V loaded once by TMA and kept
  in shared memory; it runs down the query tiles (64 rows at d = 128, 128 at d = 64) of every query
  head of its group;
* warp specialisation: one loader warp brings each query tile's Q and dO (and its rows' log-sum-exp
  and Δ, which the consumers read where they need them) by TMA into a ring of shared-memory stages
  ("full"/"empty" mbarriers, as in the forward); two consumer warpgroups, one per 64-key half of the
  tile, compute Sᵀ = K Qᵀ and dPᵀ = V dOᵀ with wgmma, Pᵀ and dSᵀ in
  registers, and accumulate dV += Pᵀ dO and dK += dSᵀ Q with Pᵀ and dSᵀ as register operands;
* dQ: every key tile adds dS K to the dQ of the query tile, so programs for different key tiles
  add into the same rows. Chapter 6 gave dQ its own kernel (deterministic, but S, P and dP are
  computed twice: 7 matrix products per tile pair instead of 5). Here, as in FlashAttention-2's and
  -3's own backward, both warpgroups write their halves of dSᵀ to shared memory, each computes half
  of the columns of dS K from the whole tile and leaves it in shared memory, and a dQ writer warp
  adds it into a float32 accumulator with atomic additions (vector reductions, 16 bytes each) while
  the warpgroups go on; τ is applied once, to dS, and a last pass rounds dQ to the input's dtype.

Determinism: dK and dV have one writer each and sum in a fixed order, bit for bit reproducible;
dQ's float32 sums run in whatever order the programs reach them, so dQ can differ between two runs
in its last bits (float32 rounding, before the one rounding to float16/bfloat16). Under
`torch.use_deterministic_algorithms(True)` the front door runs chapter 6's kernels instead.

Scope: float16/bfloat16, head_dim 64 or 128 (the forward runs 256 as well), compute capability 9.x,
TMA-compatible strides; `hopper_backward_unavailable(q, k, v, do)` says why a call does not qualify.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tutorial_kernels.ch06_backward import attention_delta
from tutorial_kernels.ch07_hopper import band_offsets, check_runnable, hopper_kernel_unavailable, tma_load
from tutorial_kernels.validation import check_attention_inputs, check_window_size


# --8<-- [start:tile_sizes]
# query rows per step (the N of Sᵀ = K Qᵀ, the K of dV += Pᵀ dO), per head dimension: at d = 64 a tile
# of 128 rows fits and does more work per wait (measured 0.93–1.04 × cuDNN against 0.90–0.98 with 64
# rows: docs/how-the-numbers-were-obtained.md, chapter 7)
BLOCK_M_FOR = {64: 128, 128: 64}
HEAD_DIMS = tuple(BLOCK_M_FOR)  # the head dimensions this schedule is built and measured for
BLOCK_N = 128  # keys per program, 64 per consumer warpgroup (one wgmma's M)
STAGES = 2  # Q/dO tiles in flight. At d = 128: K and V 64 KiB, the ring 2 × 32 (+ 2 × 0.5 for lse and Δ),
# dSᵀ 2 × 16, dS K (float32) 2 × 32: 225 of the 227 KiB allowed. At d = 64 (128 rows): K and V 32,
# the ring 2 × 32 (+ 2 × 1), dSᵀ 2 × 32, dS K 2 × 32: 226
CONSUMER_REGS, LOADER_REGS, WRITER_REGS = 240, 24, 24  # the loader and the writer share a warpgroup
# --8<-- [end:tile_sizes]


# --8<-- [start:key_tile]
@gluon.jit
def _key_tile(n_heads, group_size, n_q, n_k, diag, edge, CAUSAL: gl.constexpr, block_m: gl.constexpr,
              block_n: gl.constexpr):
    """This program's key tile, as (batch, kv_head, first_key, m_lo, m_full, m_mid, m_hi, n_m). Query i
    sees key j when i + edge ≤ j and, CAUSAL, j ≤ i + diag (`ch07_hopper.band_offsets`): the query
    tiles [m_lo, m_hi) see some key of the tile; of them [m_lo, m_full) cross the diagonal (or the
    tile runs past n_k), [m_full, m_mid) see all of it, [m_mid, m_hi) cross a window's left edge."""
    first_key = gl.program_id(0) * block_n
    pid_bkv = gl.program_id(1)
    kv_heads = n_heads // group_size
    n_m = gl.cdiv(n_q, block_m)
    # the left edge: rows up to first_key + block_n − 1 − edge see a key of the tile, rows up to
    # first_key − edge see all of it (on that side)
    m_hi = gl.minimum(gl.cdiv(gl.maximum(first_key + block_n - edge, 0), block_m), n_m)
    m_left = gl.minimum(gl.maximum(first_key - edge + 1, 0) // block_m, m_hi)
    if CAUSAL:
        # rows from first_key − diag see a key of the tile, rows from first_key + block_n − 1 − diag all of it
        m_lo = gl.minimum(gl.maximum(first_key - diag, 0) // block_m, m_hi)
        m_full = gl.minimum(gl.cdiv(gl.maximum(first_key + block_n - 1 - diag, 0), block_m), m_hi)
    else:
        m_lo = 0
        m_full = 0
    m_full = gl.where(first_key + block_n > n_k, m_hi, gl.maximum(m_full, m_lo))  # a ragged last tile: all masked
    m_mid = gl.maximum(m_full, m_left)
    return pid_bkv // kv_heads, pid_bkv % kv_heads, first_key, m_lo, m_full, m_mid, m_hi, n_m
# --8<-- [end:key_tile]


# --8<-- [start:loader]
@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, stats_desc, k_smem, v_smem, q_smem, do_smem, stats_smem, kv_full,
            full_bars, empty_bars, n_heads, group_size, n_q, n_k, diag, edge, CAUSAL: gl.constexpr):
    """One warp: the key tile's K and V (each consumer's 64-key half), once; then, for every query
    head of the group and every query tile that sees the key tile, Q, dO, lse and Δ into the next
    stage of the ring, once both consumers have released what it held."""
    stages: gl.constexpr = q_smem.shape[0]
    block_m: gl.constexpr = q_smem.shape[3]
    block_n: gl.constexpr = k_smem.shape[2]
    batch, kv_head, first_key, m_lo, m_full, m_mid, m_hi, n_m = _key_tile(n_heads, group_size, n_q, n_k, diag, edge, CAUSAL, block_m,
                                                             block_n)
    mbarrier.expect(kv_full, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [batch, kv_head, first_key, 0], kv_full, k_smem)  # rows past n_k arrive as zeros
    tma_load(v_desc, [batch, kv_head, first_key, 0], kv_full, v_smem)
    step = 0
    for h in range(group_size):
        head = kv_head * group_size + h
        for m in range(m_lo, m_hi):
            stage = step % stages
            mbarrier.wait(empty_bars.index(stage), ((step // stages) + 1) & 1, pred=step >= stages)
            full = full_bars.index(stage)
            mbarrier.expect(full, q_desc.block_type.nbytes + do_desc.block_type.nbytes
                            + 2 * stats_desc.block_type.nbytes)
            tma_load(q_desc, [batch, head, m * block_m, 0], full, q_smem.index(stage))
            tma_load(do_desc, [batch, head, m * block_m, 0], full, do_smem.index(stage))
            bh = batch * n_heads + head
            tma_load(stats_desc, [0, bh, m * block_m], full, stats_smem.index(2 * stage))  # lse (log₂ units)
            tma_load(stats_desc, [1, bh, m * block_m], full, stats_smem.index(2 * stage + 1))  # Δ
            step += 1
# --8<-- [end:loader]


# --8<-- [start:step]
@gluon.jit
def _step(step, m, k_w, v_w, k_cols, q_smem, do_smem, stats_smem, ds_smem, dq_smem, full_bars, empty_bars, ds_full,
          ds_empty, dq_full, dq_empty, dk, dv, key0, n_q, n_k, diag, edge, qk_scale, sm_scale, WG: gl.constexpr,
          MASKED: gl.constexpr, CAUSAL: gl.constexpr):
    """One query tile m (of one query head) against this warpgroup's 64 keys: the five products of chapter 6,
    dQ's shared with the other warpgroup through dSᵀ in shared memory, and its result handed to the
    dQ writer through shared memory."""
    dtype: gl.constexpr = k_w.dtype
    stages: gl.constexpr = q_smem.shape[0]
    block_m: gl.constexpr = q_smem.shape[3]
    head_dim: gl.constexpr = q_smem.shape[4]
    half: gl.constexpr = k_w.shape[0]
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, block_m, 16])  # keys × queries
    kv_layout: gl.constexpr = dk.type.layout  # keys × head_dim
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, head_dim // 2, 16])  # queries × d/2
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)

    stage = step % stages
    mbarrier.wait(full_bars.index(stage), (step // stages) & 1)
    q = q_smem.index(stage).reshape([block_m, head_dim])
    do = do_smem.index(stage).reshape([block_m, head_dim])
    no_scores = gl.zeros([half, block_m], gl.float32, st_layout)
    s_t = warpgroup_mma(k_w, q.permute((1, 0)), no_scores, use_acc=False, is_async=True)  # K_w Qᵀ = Sᵀ / τ
    dp_t = warpgroup_mma(v_w, do.permute((1, 0)), no_scores, use_acc=False, is_async=True)  # dPᵀ = V_w dOᵀ
    s_t = warpgroup_mma_wait(num_outstanding=1, deps=[s_t])  # K_w Qᵀ is done, dPᵀ may still run
    # the query tile's log-sum-exp (log₂ units) and Δ, one per column of Sᵀ, read from shared memory
    # where they are needed (the loader brought them with Q and dO): held in registers across the step
    # they would cost 32 of each thread's 240
    lse2 = stats_smem.index(2 * stage).reshape([block_m]).load(gl.SliceLayout(0, st_layout))
    # Pᵀ = e^{τ K Qᵀ − lse}, recomputed (qk_scale = τ log₂ e); the exponent capped at 0, as chapter 6's
    p_t = gl.exp2(gl.minimum(s_t * qk_scale - lse2[None, :], 0.0))
    if MASKED:
        # Sᵀ's row r is key key0 + r, its column c query m·block_m + c. Keys past n_k: a zero key would
        # still get P = e^{−lse}. Causal, key ≤ query + diag, written as r − c ≤ one number per
        # step: r − c depends on the thread alone, and holds no registers across the loop.
        rows = gl.arange(0, half, gl.SliceLayout(1, st_layout))
        cols = gl.arange(0, block_m, gl.SliceLayout(0, st_layout))
        # a window's left edge, key ≥ query + edge: r − c ≥ one number per step
        p_t = gl.where((rows < n_k - key0)[:, None] & (rows[:, None] - cols[None, :] >= m * block_m + edge - key0),
                       p_t, 0.0)
        if CAUSAL:
            p_t = gl.where(rows[:, None] - cols[None, :] <= m * block_m + diag - key0, p_t, 0.0)
    dp_t = warpgroup_mma_wait(num_outstanding=0, deps=[dp_t])
    delta = stats_smem.index(2 * stage + 1).reshape([block_m]).load(gl.SliceLayout(0, st_layout))
    # τ dSᵀ = τ Pᵀ ∘ (dPᵀ − Δ): τ applied once, here, for both dK = (τ dSᵀ) Q and dQ = (τ dS) K
    ds_t = p_t * (dp_t - delta[None, :]) * sm_scale
    dv = warpgroup_mma(gl.convert_layout(p_t.to(dtype), a_layout), do, dv, is_async=True)  # dV_w += Pᵀ dO
    dk = warpgroup_mma(gl.convert_layout(ds_t.to(dtype), a_layout), q, dk, is_async=True)  # dK_w += dSᵀ Q

    # dQ = dS K needs dS for all 128 keys: each warpgroup puts its 64 rows of dSᵀ into one of two
    # buffers, waits for the other's, and computes its half of dQ's columns from the whole tile.
    buf = step % 2
    mbarrier.wait(ds_empty.index(buf), ((step // 2) + 1) & 1, pred=step >= 2)  # both done with it 2 steps ago
    ds_smem.index(buf).slice(WG * half, half, dim=0).store(ds_t.to(dtype))
    fence_async_shared()  # the store, visible to the other warpgroup's wgmma (the async proxy)
    mbarrier.arrive(ds_full.index(buf), count=1)
    mbarrier.wait(ds_full.index(buf), (step // 2) & 1)
    ds = ds_smem.index(buf).permute((1, 0))  # dS: queries × keys
    no_dq = gl.zeros([block_m, head_dim // 2], gl.float32, dq_layout)
    dq = warpgroup_mma(ds, k_cols, no_dq, use_acc=False, is_async=True)  # dQ[:, cols of WG] = dS K[:, cols]
    dq, dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=[dq, dv, dk])
    mbarrier.arrive(ds_empty.index(buf), count=1)
    mbarrier.arrive(empty_bars.index(stage), count=1)  # Q and dO of this stage are no longer read
    # the atomic additions of dQ into memory would hold this warpgroup for as long as the products
    # take (measured): the dQ writer warp issues them while the warpgroups go on to the next tile
    mbarrier.wait(dq_empty.index(buf), ((step // 2) + 1) & 1, pred=step >= 2)  # written out 2 steps ago
    dq_smem.index(2 * buf + WG).store(dq)
    mbarrier.arrive(dq_full.index(buf), count=1)
    return dk, dv
# --8<-- [end:step]


@gluon.jit
def _consumer(k_smem, v_smem, q_smem, do_smem, stats_smem, ds_smem, dq_smem, kv_full, full_bars, empty_bars, ds_full,
              ds_empty, dq_full, dq_empty, dk_ptr, dv_ptr, n_heads, group_size, n_q, n_k, diag, edge, qk_scale,
              sm_scale, WG: gl.constexpr, CAUSAL: gl.constexpr):
    """One warpgroup: keys first_key + 64·WG … + 63 against every query tile that sees the key tile,
    masked steps first; then dK = τ dSᵀ Q and dV = Pᵀ dO of its 64 keys to memory."""
    dtype: gl.constexpr = k_smem.dtype
    block_m: gl.constexpr = q_smem.shape[3]
    block_n: gl.constexpr = k_smem.shape[2]
    head_dim: gl.constexpr = k_smem.shape[3]
    half: gl.constexpr = block_n // 2
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, head_dim, 16])
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, block_m, 16])
    batch, kv_head, first_key, m_lo, m_full, m_mid, m_hi, n_m = _key_tile(n_heads, group_size, n_q, n_k, diag, edge, CAUSAL, block_m,
                                                             block_n)
    k_tile = k_smem.reshape([block_n, head_dim])  # TMA's (1, 1, keys, d) block as a matrix
    k_w = k_tile.slice(WG * half, half, dim=0)  # this warpgroup's 64 keys
    v_w = v_smem.reshape([block_n, head_dim]).slice(WG * half, half, dim=0)
    k_cols = k_tile.slice(WG * (head_dim // 2), head_dim // 2, dim=1)  # its half of the columns, all keys
    key0 = first_key + WG * half  # this warpgroup's first key
    dk = gl.zeros([half, head_dim], gl.float32, kv_layout)
    dv = gl.zeros([half, head_dim], gl.float32, kv_layout)
    mbarrier.wait(kv_full, 0)
    step = 0
    for h in range(group_size):
        for m in range(m_lo, m_full):  # the diagonal and the ragged end
            dk, dv = _step(step, m, k_w, v_w, k_cols, q_smem, do_smem, stats_smem, ds_smem, dq_smem, full_bars,
                           empty_bars, ds_full, ds_empty, dq_full, dq_empty, dk, dv, key0, n_q, n_k, diag, edge,
                           qk_scale, sm_scale, WG, True, CAUSAL)
            step += 1
        for m in range(m_full, m_mid):  # query tiles that see every key of the tile
            dk, dv = _step(step, m, k_w, v_w, k_cols, q_smem, do_smem, stats_smem, ds_smem, dq_smem, full_bars,
                           empty_bars, ds_full, ds_empty, dq_full, dq_empty, dk, dv, key0, n_q, n_k, diag, edge,
                           qk_scale, sm_scale, WG, False, CAUSAL)
            step += 1
        for m in range(m_mid, m_hi):  # a window's left edge
            dk, dv = _step(step, m, k_w, v_w, k_cols, q_smem, do_smem, stats_smem, ds_smem, dq_smem, full_bars,
                           empty_bars, ds_full, ds_empty, dq_full, dq_empty, dk, dv, key0, n_q, n_k, diag, edge,
                           qk_scale, sm_scale, WG, True, CAUSAL)
            step += 1

    # dK and dV of these 64 keys: one writer each, sums in a fixed order. dk and dv are (B, H_kv, n_k,
    # head_dim), contiguous (the launcher allocates them).
    rows = first_key + WG * half + gl.arange(0, half, gl.SliceLayout(1, kv_layout))
    cols = gl.arange(0, head_dim, gl.SliceLayout(0, kv_layout))
    first = (batch * (n_heads // group_size) + kv_head) * n_k
    offsets = (first + rows[:, None]).to(gl.int64) * head_dim + cols[None, :]
    gl.store(dk_ptr + offsets, dk.to(dtype), mask=(rows < n_k)[:, None])  # dK = (τ dSᵀ) Q
    gl.store(dv_ptr + offsets, dv.to(dtype), mask=(rows < n_k)[:, None])


# --8<-- [start:dq_writer]
@gluon.jit
def _red_add_f32x4(addresses, values):
    """*address += value for groups of 4 consecutive float32 (16-byte aligned), one vector reduction
    each (`red.global.add.v4.f32`, Hopper): Triton 3.6's atomic_add issues one scalar atom per float."""
    return gl.inline_asm_elementwise(
        "red.global.add.v4.f32 [$4], {$8, $9, $10, $11}; mov.u32 $0, 0; mov.u32 $1, 0; mov.u32 $2, 0; mov.u32 $3, 0;",
        "=r,=r,=r,=r,l,l,l,l,r,r,r,r", [addresses.to(gl.int64, bitcast=True), values], dtype=gl.int32,
        is_pure=False, pack=4)


@gluon.jit
def _dq_writer(k_smem, dq_smem, dq_full, dq_empty, dq_acc_ptr, n_heads, group_size, n_q, n_k, diag, edge, CAUSAL: gl.constexpr):
    """One warp: each step's block_m × head_dim tile of dS K, which the consumers leave in shared memory,
    added into the float32 dQ accumulator (its rows padded to whole tiles: no mask), a few rows at a
    time; then the buffer goes back to the consumers."""
    block_n: gl.constexpr = k_smem.shape[2]
    block_m: gl.constexpr = dq_smem.shape[1]
    cols_per_wg: gl.constexpr = dq_smem.shape[2]
    chunk: gl.constexpr = 4  # rows per load (the swizzle repeats every 4): 4 × d/2 floats
    lanes_per_row: gl.constexpr = cols_per_wg // 4  # 4 consecutive floats per lane: 16 lanes at d = 128, 8 at 64
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // lanes_per_row, lanes_per_row], [1, 1], [1, 0])
    batch, kv_head, first_key, m_lo, m_full, m_mid, m_hi, n_m = _key_tile(n_heads, group_size, n_q, n_k, diag, edge, CAUSAL, block_m,
                                                             block_n)
    offsets = (gl.arange(0, chunk, gl.SliceLayout(1, layout))[:, None] * (2 * cols_per_wg)
               + gl.arange(0, cols_per_wg, gl.SliceLayout(0, layout))[None, :])
    step = 0
    for h in range(group_size):
        bh = (batch * n_heads + kv_head * group_size + h).to(gl.int64)
        for m in range(m_lo, m_hi):
            buf = step % 2
            mbarrier.wait(dq_full.index(buf), (step // 2) & 1)
            tile = dq_acc_ptr + (bh * n_m + m) * (block_m * 2 * cols_per_wg)  # query rows m·block_m … of head bh
            for w in gl.static_range(2):
                for r in gl.static_range(0, block_m, chunk):
                    part = dq_smem.index(2 * buf + w).slice(r, chunk, dim=0).load(layout)
                    _red_add_f32x4(tile + (r * 2 * cols_per_wg + w * cols_per_wg) + offsets, part)
            mbarrier.arrive(dq_empty.index(buf), count=1)
            step += 1
# --8<-- [end:dq_writer]


# Worker partitions take no compile-time arguments (Triton 3.6): one wrapper per value of CAUSAL.
@gluon.jit
def _consumer_1_causal(k_smem, v_smem, q_smem, do_smem, stats_smem, ds_smem, dq_smem, kv_full, full_bars, empty_bars,
                       ds_full, ds_empty, dq_full, dq_empty, dk_ptr, dv_ptr, n_heads, group_size, n_q, n_k, diag, edge, qk_scale,
                       sm_scale):
    _consumer(k_smem, v_smem, q_smem, do_smem, stats_smem, ds_smem, dq_smem, kv_full, full_bars, empty_bars, ds_full,
              ds_empty, dq_full, dq_empty, dk_ptr, dv_ptr, n_heads, group_size, n_q, n_k, diag, edge, qk_scale, sm_scale, 1, True)


@gluon.jit
def _consumer_1_full(k_smem, v_smem, q_smem, do_smem, stats_smem, ds_smem, dq_smem, kv_full, full_bars, empty_bars,
                     ds_full, ds_empty, dq_full, dq_empty, dk_ptr, dv_ptr, n_heads, group_size, n_q, n_k, diag, edge, qk_scale,
                     sm_scale):
    _consumer(k_smem, v_smem, q_smem, do_smem, stats_smem, ds_smem, dq_smem, kv_full, full_bars, empty_bars, ds_full,
              ds_empty, dq_full, dq_empty, dk_ptr, dv_ptr, n_heads, group_size, n_q, n_k, diag, edge, qk_scale, sm_scale, 1, False)


@gluon.jit
def _loader_causal(q_desc, k_desc, v_desc, do_desc, stats_desc, k_smem, v_smem, q_smem, do_smem, stats_smem, kv_full,
                   full_bars, empty_bars, n_heads, group_size, n_q, n_k, diag, edge):
    _loader(q_desc, k_desc, v_desc, do_desc, stats_desc, k_smem, v_smem, q_smem, do_smem, stats_smem, kv_full,
            full_bars, empty_bars, n_heads, group_size, n_q, n_k, diag, edge, True)


@gluon.jit
def _loader_full(q_desc, k_desc, v_desc, do_desc, stats_desc, k_smem, v_smem, q_smem, do_smem, stats_smem, kv_full,
                 full_bars, empty_bars, n_heads, group_size, n_q, n_k, diag, edge):
    _loader(q_desc, k_desc, v_desc, do_desc, stats_desc, k_smem, v_smem, q_smem, do_smem, stats_smem, kv_full,
            full_bars, empty_bars, n_heads, group_size, n_q, n_k, diag, edge, False)


@gluon.jit
def _dq_writer_causal(k_smem, dq_smem, dq_full, dq_empty, dq_acc_ptr, n_heads, group_size, n_q, n_k, diag, edge):
    _dq_writer(k_smem, dq_smem, dq_full, dq_empty, dq_acc_ptr, n_heads, group_size, n_q, n_k, diag, edge, True)


@gluon.jit
def _dq_writer_full(k_smem, dq_smem, dq_full, dq_empty, dq_acc_ptr, n_heads, group_size, n_q, n_k, diag, edge):
    _dq_writer(k_smem, dq_smem, dq_full, dq_empty, dq_acc_ptr, n_heads, group_size, n_q, n_k, diag, edge, False)


# --8<-- [start:kernel]
@gluon.jit(do_not_specialize=("diag", "edge"))  # a window's offsets: no binary of their own
def _flash_hopper_bwd(q_desc, k_desc, v_desc, do_desc, stats_desc, dq_acc_ptr, dk_ptr, dv_ptr,
                      n_heads, group_size, n_q, n_k, diag, edge, qk_scale, sm_scale,
                      CAUSAL: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                      LOADER_REGS: gl.constexpr, WRITER_REGS: gl.constexpr):
    """One program per (128-key tile, batch × key/value head): a loader warp, two consumer
    warpgroups (64 keys each) and a dQ writer warp, over every query tile of the group's heads that
    sees the tile."""
    block_m: gl.constexpr = q_desc.block_type.shape[2]
    block_n: gl.constexpr = k_desc.block_type.shape[2]
    head_dim: gl.constexpr = k_desc.block_type.shape[3]
    half: gl.constexpr = block_n // 2
    dtype: gl.constexpr = q_desc.dtype

    k_smem = gl.allocate_shared_memory(dtype, [1, 1, block_n, head_dim], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, 1, block_n, head_dim], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, block_m, head_dim], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, block_m, head_dim], do_desc.layout)
    stats_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, 1, 1, block_m], stats_desc.layout)  # lse, Δ
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * half, block_m], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, 2 * half, block_m], ds_layout)  # dSᵀ, double-buffered
    # dS K, double-buffered, as two d/2-column halves (one per consumer); rows of d/2 floats swizzled
    dq_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=4, order=[1, 0])
    dq_smem = gl.allocate_shared_memory(gl.float32, [4, block_m, head_dim // 2], dq_layout)  # [2 · buffer + half]
    kv_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_full, count=1)  # completed by K's and V's bytes arriving
    for i in gl.static_range(STAGES):
        mbarrier.init(full_bars.index(i), count=1)  # completed by Q's, dO's, lse's and Δ's bytes arriving
        mbarrier.init(empty_bars.index(i), count=2)  # completed when both consumers release the stage
    for i in gl.static_range(2):
        mbarrier.init(ds_full.index(i), count=2)  # both halves of dSᵀ written
        mbarrier.init(ds_empty.index(i), count=2)  # both dQ products done reading it
        mbarrier.init(dq_full.index(i), count=2)  # both halves of dS K written
        mbarrier.init(dq_empty.index(i), count=1)  # the writer done adding it into memory
    fence_async_shared()

    consumer_args = (k_smem, v_smem, q_smem, do_smem, stats_smem, ds_smem, dq_smem, kv_full, full_bars, empty_bars,
                     ds_full, ds_empty, dq_full, dq_empty, dk_ptr, dv_ptr, n_heads, group_size, n_q, n_k, diag, edge, qk_scale,
                     sm_scale)
    loader_args = (q_desc, k_desc, v_desc, do_desc, stats_desc, k_smem, v_smem, q_smem, do_smem, stats_smem, kv_full,
                   full_bars, empty_bars, n_heads, group_size, n_q, n_k, diag, edge)
    writer_args = (k_smem, dq_smem, dq_full, dq_empty, dq_acc_ptr, n_heads, group_size, n_q, n_k, diag, edge)
    # the default partition (4 warps) is consumer 0; the workers are consumer 1, the loader and the writer
    if CAUSAL:
        gl.warp_specialize([(_consumer, consumer_args + (0, CAUSAL)), (_consumer_1_causal, consumer_args),
                            (_loader_causal, loader_args), (_dq_writer_causal, writer_args)], [4, 1, 1],
                           [CONSUMER_REGS, LOADER_REGS, WRITER_REGS])
    else:
        gl.warp_specialize([(_consumer, consumer_args + (0, CAUSAL)), (_consumer_1_full, consumer_args),
                            (_loader_full, loader_args), (_dq_writer_full, writer_args)], [4, 1, 1],
                           [CONSUMER_REGS, LOADER_REGS, WRITER_REGS])
# --8<-- [end:kernel]


def hopper_backward_unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor) -> str | None:
    """None if this backward can run these (already validated) inputs, else why not: the forward's
    rules (`ch07_hopper.hopper_kernel_unavailable`) for q, k, v and do, at head_dim 64 or 128."""
    return hopper_kernel_unavailable(q, k, v, do, head_dims=HEAD_DIMS)


@functools.lru_cache(maxsize=None)
def _tile_layouts(dtype: torch.dtype, head_dim: int):
    """The shared-memory layouts of the TMA blocks: BLOCK_M rows × head_dim (Q, dO) and 128 (K, V)."""
    element = gl.float16 if dtype == torch.float16 else gl.bfloat16
    return tuple(gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], element)
                 for rows in (BLOCK_M_FOR[head_dim], BLOCK_N))


# lse and Δ of one query tile: BLOCK_M float32 in a row, unswizzled (read as a vector, not by wgmma)
STATS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)


def query_tile_stats(lse: torch.Tensor, delta: torch.Tensor, block_m: int) -> torch.Tensor:
    """(2, B·H, n_q rounded up to block_m) float32: the log-sum-exp in log₂ units, then Δ, for the
    loader to bring by TMA with each query tile. A query that sees no key (lse = −∞) and the padding
    get +∞, which makes their P = 2^(s − ∞) = 0; Δ's padding is 0."""
    batch, heads, n_q = lse.shape
    lse, delta = lse.detach(), delta.detach()  # written into a buffer with out=, which autograd refuses
    stats = torch.empty((2, batch * heads, triton.cdiv(n_q, block_m) * block_m), dtype=torch.float32,
                        device=lse.device)
    stats[0, :, n_q:] = float("inf")
    stats[1, :, n_q:] = 0.0
    lse2 = stats[0, :, :n_q].view(batch, heads, n_q)
    torch.mul(lse, 1.4426950408889634, out=lse2).masked_fill_(lse == float("-inf"), float("inf"))
    stats[1, :, :n_q].view(batch, heads, n_q).copy_(delta)
    return stats


# --8<-- [start:launcher]
def flash_attn_hopper_backward(q, k, v, o, lse, do, causal: bool, sm_scale: float | None = None, *,
                               window_size: tuple[int, int] = (-1, -1)):
    """(dQ, dK, dV) of O = softmax(τ Q Kᵀ) V given dO, from the forward's O and log-sum-exp (B, H, n_q).

    Shapes and conventions as chapter 6's `flash_attn_backward` (grouped-query attention: dK and dV
    summed over each group; bottom-right causal alignment); the inputs, and chapter 9's window_size,
    as `flash_attn_hopper` takes them. Raises TypeError for another dtype, ValueError for a do, o or lse unlike the forward's, and
    ValueError (UnsupportedShape) naming what else the kernel does not run."""
    shape = check_attention_inputs(q, k, v, causal, sm_scale, min_head_dim=1, max_head_dim=1 << 30,
                                   allow_gqa=True, runs_triton=False)
    if do.shape != q.shape or do.dtype != q.dtype:
        raise ValueError(f"do must have q's shape {tuple(q.shape)} and dtype {q.dtype}, "
                         f"got {tuple(do.shape)} {do.dtype}")
    if o.shape != q.shape:
        raise ValueError(f"o must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
    if lse.shape != q.shape[:3] or lse.dtype != torch.float32:
        raise ValueError(f"lse must be the forward's log-sum-exp, shape {tuple(q.shape[:3])} float32, "
                         f"got {tuple(lse.shape)} {lse.dtype}")
    check_runnable(q, k, v, instead="chapter 6's flash_attn_backward", do=do, head_dims=HEAD_DIMS)
    window_size = check_window_size(window_size)
    batch, heads, n_q, head_dim = q.shape
    block_m = BLOCK_M_FOR[head_dim]
    stats = query_tile_stats(lse, attention_delta(o, do), block_m)  # lse and Δ = rowsum(dO ∘ O), per query tile
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    q_layout, kv_layout = _tile_layouts(q.dtype, head_dim)
    q_block, kv_block = [1, 1, block_m, head_dim], [1, 1, BLOCK_N, head_dim]
    descs = (TensorDescriptor.from_tensor(q, q_block, q_layout), TensorDescriptor.from_tensor(k, kv_block, kv_layout),
             TensorDescriptor.from_tensor(v, kv_block, kv_layout), TensorDescriptor.from_tensor(do, q_block, q_layout),
             TensorDescriptor.from_tensor(stats, [1, 1, block_m], STATS_LAYOUT))
    # dQ's float32 accumulator, its rows padded to whole query tiles so that the writer needs no mask
    dq_acc = torch.zeros((batch, heads, triton.cdiv(n_q, block_m) * block_m, head_dim), dtype=torch.float32,
                         device=q.device)
    grid = (triton.cdiv(shape.n_k, BLOCK_N), batch * shape.kv_heads)
    bounded, diag, edge = band_offsets(causal, window_size, n_q, shape.n_k)
    _flash_hopper_bwd[grid](
        *descs, dq_acc, dk, dv, heads, shape.group_size, n_q, shape.n_k, diag, edge,
        shape.sm_scale * 1.4426950408889634, shape.sm_scale, CAUSAL=bounded, STAGES=STAGES,
        CONSUMER_REGS=CONSUMER_REGS, LOADER_REGS=LOADER_REGS, WRITER_REGS=WRITER_REGS, num_warps=4,
    )
    dq = dq_acc[:, :, :n_q].to(q.dtype)  # one rounding
    return dq, dk, dv
# --8<-- [end:launcher]


__all__ = ["flash_attn_hopper_backward", "hopper_backward_unavailable", "query_tile_stats",
           "STAGES", "HEAD_DIMS", "BLOCK_M_FOR", "BLOCK_N", "CONSUMER_REGS"]
