"""Chapter 7, FlashAttention-3 on Hopper — chapter 5's forward with FlashAttention-3's schedule, in Gluon.

The algorithm is chapter 5's (Q tile outside, K/V tiles inside, online softmax, one division at the
end); what changes is who does what, and when (FlashAttention-3, Shah et al. 2024, §3.1–3.2):

* warp specialisation: one loader warp moves Q and K/V tiles by TMA into a ring of shared-memory
  stages, each guarded by a "full" and an "empty" mbarrier; two consumer warpgroups (64 query rows
  each) only compute, each releasing a stage when done, so one may run ahead of the other;
* inside a consumer: issue S_t = Q K_tᵀ and O += P̃_{t-1} V_{t-1} asynchronously, wait for S_t only,
  and compute its softmax while the previous product is still on the tensor cores;
* persistent programs: a program runs one work item (a 128-row query tile of one head) after
  another with the same barriers and ring; causal items go longest first (`_work_item`,
  `_dealt_item`), and `runs_persistent` says when this beats one program per item;
* the output leaves through shared memory, so its stores are 16 bytes wide.

Q, K and V are read in place through 4-D TMA descriptors with their own strides ((B, H, N, d) or
the (B, N, H, d) layout of transformers' attention layers), rows past n_q or n_k filled with zeros.

Scope: the forward (with each row's log-sum-exp for training: `flash_attn_hopper_with_lse`; the
backward is `ch07_hopper_backward`), float16/bfloat16, head_dim 64, 128 or 256, compute capability 9.x, the head
dimension contiguous and the other strides multiples of 16 bytes; `hopper_kernel_unavailable` says why
a call does not qualify. Gluon kernels do not run in Triton's CPU interpreter. What each choice bought on
an H100: docs/how-the-numbers-were-obtained.md, chapter 7.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tutorial_kernels.perf.launch_plan import LaunchPlans, attention_call_key
from tutorial_kernels.tiling import LOG2_E
from tutorial_kernels.validation import UnsupportedShape, check_attention_inputs, check_out, check_window_size

# Triton 3.6 names the TMA load async_copy_global_to_shared; later versions async_load.
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared

# --8<-- [start:tile_sizes]
ROWS_PER_WARPGROUP = 64  # one wgmma covers 64 rows; two consumer warpgroups make a 128-row Q tile


class Tiles(NamedTuple):
    block_n: int  # keys per K/V tile
    stages: int  # K/V tiles in flight


# Per head dimension, within the 227 KiB of shared memory an SM gives one program (16-bit elements):
TILES = {
    64: Tiles(block_n=128, stages=4),  # Q 16 KiB + 4 × 32 KiB of K/V = 144 KiB
    128: Tiles(block_n=128, stages=3),  # Q 32 KiB + 3 × 64 KiB = 224 KiB
    256: Tiles(block_n=64, stages=2),  # Q 64 KiB + 2 × 64 KiB = 192 KiB; and O alone is 128 registers a thread
}
HEAD_DIMS = tuple(TILES)
CONSUMER_REGS, LOADER_REGS = 240, 24  # registers per thread: the loader needs few, the consumers many
# --8<-- [end:tile_sizes]


# --8<-- [start:work_item]
@gluon.jit
def _work_item(w, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, CAUSAL: gl.constexpr,
               WINDOW: gl.constexpr, block_m: gl.constexpr, block_n: gl.constexpr):
    """Work item w: one 128-row query tile of one (batch, head), as (batch, head, kv_head, first_row,
    lo, left_full, n_full, n_tiles). Query i sees key j when i + edge ≤ j and, CAUSAL, j ≤ i + diag
    (`band_offsets`: plain causal attention is diag = n_k − n_q with no left edge; a sliding window
    adds one). The item visits key tiles [lo, n_tiles) only; of them [left_full, n_full) are visible
    to every row of it, the others cross the window's left edge, the causal diagonal or the end of
    the keys and are masked. Without WINDOW (no left edge: `band_offsets` puts edge so far left that
    no row's keys reach it) lo = left_full = 0, known to the compiler.

    The (batch, head) pairs are cut into sections of `section` consecutive pairs, whose keys and
    values fit in L2 together; items go section by section, and within a section query tile by
    query tile, every pair of one tile before the next. So the programs running at any moment
    share one section's K/V through L2; and, causal, a section's tiles that see the most keys come
    first (longest-processing-time-first, Graham 1969), which `_dealt_item` turns into nearly equal
    sums per program."""
    n_m = gl.cdiv(n_q, block_m)
    first_bh = (w // (section * n_m)) * section
    pairs = gl.minimum(section, n_bh - first_bh)  # the last section may be smaller
    within = w - first_bh * n_m
    m_rank = within // pairs
    bh = first_bh + within % pairs
    if CAUSAL:
        pid_m = n_m - 1 - m_rank
        first_row_sees = pid_m * block_m + diag + 1  # keys the tile's first row sees
        last_row_sees = (pid_m + 1) * block_m + diag  # … and its last row
        n_full = gl.maximum(gl.minimum(first_row_sees, n_k), 0) // block_n
        n_tiles = gl.cdiv(gl.maximum(gl.minimum(last_row_sees, n_k), 0), block_n)
    else:
        pid_m = m_rank
        n_full = n_k // block_n
        n_tiles = gl.cdiv(n_k, block_n)
    first_row = pid_m * block_m
    if WINDOW:  # the left edge: the first row sees keys from first_row + edge on, the last row from … + block_m − 1
        lo = gl.minimum(gl.maximum(first_row + edge, 0) // block_n, n_tiles)
        left_full = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(first_row + block_m - 1 + edge, 0), block_n), lo),
                               n_tiles)
    else:
        lo = 0
        left_full = 0
    head = bh % n_heads
    # one description for both sides: the loader uses kv_head and the tile range, the consumers all of it
    return bh // n_heads, head, head // group_size, first_row, lo, left_full, n_full, n_tiles  # H_kv = H / group_size
# --8<-- [end:work_item]


# --8<-- [start:dealt_item]
@gluon.jit
def _dealt_item(deal):
    """The work item this program takes in deal number `deal`: items are dealt to the P programs like
    cards, forwards in even deals and backwards in odd ones (program 0 gets items 0, 2P−1, 2P, 4P−1, …).
    With the longest items first, a program that drew a long item in one deal draws a short one in
    the next, and the sums come out nearly equal; dealt round-robin (w, w + P, …), program 0 would
    get the longest item of every deal. An item past the last one means: nothing this deal."""
    program, programs = gl.program_id(0), gl.num_programs(0)
    backwards = deal % 2
    return deal * programs + program + backwards * (programs - 1 - 2 * program)
# --8<-- [end:dealt_item]


# --8<-- [start:loader]
@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
            n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, CAUSAL: gl.constexpr,
            WINDOW: gl.constexpr):
    """One warp, for each of this program's work items: the item's first K/V tile into the next stage
    of the ring; both halves of its Q tile, once both consumer warpgroups have staged the previous
    item's output in the Q buffer and read it back out; then the item's other K/V tiles, each as
    soon as both consumers have released the tile that was in its stage. The ring runs on across items:
    the next item's first K/V tile arrives while the consumers are still on this item's last tiles.
    Coordinates are (batch, head, row, column) in the tensors' own shapes, so the copy engine fills
    rows past n_q or n_k with zeros instead of reading another head's."""
    rows_per_wg: gl.constexpr = q_smem.shape[3]
    block_n: gl.constexpr = k_smem.shape[3]
    loaded = 0  # K/V tiles this program has loaded: tile number `loaded` goes to stage loaded % stages
    started = 0  # work items this program has begun
    for deal in range(gl.cdiv(n_items, gl.num_programs(0))):
        w = _dealt_item(deal)
        if w < n_items:
            batch, head, kv_head, first_row, lo, left_full, n_full, n_tiles = _work_item(
                w, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, CAUSAL, WINDOW, 2 * rows_per_wg, block_n)
            if n_tiles > lo:  # the first tile first: it need not wait for the previous item's output
                _load_kv_tile(k_desc, v_desc, k_smem, v_smem, full_bars, empty_bars, loaded, batch, kv_head, lo)
                loaded += 1
            mbarrier.wait(q_empty, (started + 1) & 1, pred=started > 0)  # the previous O has left the buffer
            mbarrier.expect(q_full, 2 * q_desc.block_type.nbytes)
            tma_load(q_desc, [batch, head, first_row, 0], q_full, q_smem.index(0))
            tma_load(q_desc, [batch, head, first_row + rows_per_wg, 0], q_full, q_smem.index(1))
            for t in range(lo + 1, n_tiles):
                _load_kv_tile(k_desc, v_desc, k_smem, v_smem, full_bars, empty_bars, loaded, batch, kv_head, t)
                loaded += 1
            started += 1


# --8<-- [start:load_kv_tile]
@gluon.jit
def _load_kv_tile(k_desc, v_desc, k_smem, v_smem, full_bars, empty_bars, loaded, batch, kv_head, t):
    """Key/value tile t of one (batch, kv_head) into stage loaded % stages of the ring, which is the
    program's tile number `loaded`: from the second round of the ring on, once both consumers have
    released the tile `stages` numbers earlier, which held that stage."""
    stages: gl.constexpr = k_smem.shape[0]
    block_n: gl.constexpr = k_smem.shape[3]
    stage = loaded % stages
    mbarrier.wait(empty_bars.index(stage), ((loaded // stages) + 1) & 1, pred=loaded >= stages)
    full = full_bars.index(stage)
    mbarrier.expect(full, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [batch, kv_head, t * block_n, 0], full, k_smem.index(stage))
    tma_load(v_desc, [batch, kv_head, t * block_n, 0], full, v_smem.index(stage))
# --8<-- [end:load_kv_tile]
# --8<-- [end:loader]


# --8<-- [start:consumer]
@gluon.jit
def _hide_invisible(s, t, offs_m, n_k, diag, edge, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, block_n: gl.constexpr,
                    cols_layout: gl.constexpr):
    """Scores of key tile t with −∞ where a key lies past n_k (the copy engine's zeros), WINDOW, left
    of the window (j < i + edge) or, CAUSAL, past the diagonal (j > i + diag)."""
    cols = t * block_n + gl.arange(0, block_n, cols_layout)
    visible = cols[None, :] < n_k
    if WINDOW:
        visible = visible & (cols[None, :] >= offs_m[:, None] + edge)
    if CAUSAL:
        visible = visible & (cols[None, :] <= offs_m[:, None] + diag)
    return gl.where(visible, s, float("-inf"))


# --8<-- [start:overlapped_step]
@gluon.jit
def _overlapped_step(t, ring_t, q, k_smem, v_smem, full_bars, empty_bars, acc, p_prev, m_i, l_i, no_scores,
                     offs_m, n_k, diag, edge, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                     WINDOW: gl.constexpr):
    """Key tile t (the program's ring_t-th) in FA3's order: issue S_t = Q K_tᵀ and O += P̃_{t-1}
    V_{t-1}, wait for S_t only, compute P̃_t while P̃_{t-1} V_{t-1} is still on the tensor cores,
    then wait for it, release tile t-1 and rescale O by α_t. MASKED for tiles on the causal diagonal,
    the window's left edge or past n_k."""
    stages: gl.constexpr = k_smem.shape[0]
    block_n: gl.constexpr = k_smem.shape[3]
    head_dim: gl.constexpr = k_smem.shape[4]
    stage = ring_t % stages
    prev = (ring_t - 1) % stages
    mbarrier.wait(full_bars.index(stage), (ring_t // stages) & 1)
    k_t = k_smem.index(stage).reshape([block_n, head_dim]).permute((1, 0))
    s = warpgroup_mma(q, k_t, no_scores, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_prev, v_smem.index(prev).reshape([block_n, head_dim]), acc, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=[s])  # S_t is done; P̃_{t-1} V_{t-1} may still run
    if MASKED:
        cols_layout: gl.constexpr = gl.SliceLayout(0, no_scores.type.layout)
        s = _hide_invisible(s * qk_scale, t, offs_m, n_k, diag, edge, CAUSAL, WINDOW, block_n, cols_layout)
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        shift = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet
        p = gl.exp2(s - shift[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        shift = m_new
        p = gl.exp2(s * qk_scale - shift[:, None])  # scale and shift fuse into one FMA
    alpha = gl.exp2(m_i - shift)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_prev])
    mbarrier.arrive(empty_bars.index(prev), count=1)  # this warpgroup is done with tile t-1
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]  # O ← diag(α_t) O
    p_prev = gl.convert_layout(p.to(p_prev.dtype), p_prev.type.layout)
    return acc, p_prev, m_new, l_i
# --8<-- [end:overlapped_step]


@gluon.jit
def _attend_item(q, k_smem, v_smem, full_bars, empty_bars, used, row0, lo, left_full, n_full, n_tiles, n_k, diag,
                 edge, qk_scale, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """One warpgroup's 64 query rows from row0 on against the key tiles [lo, n_tiles) of one work item,
    which are the program's ring tiles used, used + 1, …: tiles [left_full, n_full) unmasked, those
    before (the window's left edge, only WINDOW) and after (the diagonal and the ragged end) masked,
    all in FA3's overlapped order. Returns the un-normalised O, the row sums ℓ and the row maxima m (log₂ units of
    the scaled scores)."""
    dtype: gl.constexpr = k_smem.dtype
    rows_per_wg: gl.constexpr = q.shape[0]
    stages: gl.constexpr = k_smem.shape[0]
    block_n: gl.constexpr = k_smem.shape[3]
    head_dim: gl.constexpr = k_smem.shape[4]
    # register layouts of the wgmma results: S (rows × keys) and O (rows × head_dim); P̃ enters the
    # second product from registers, as its A operand
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, block_n, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, head_dim, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)

    offs_m = row0 + gl.arange(0, rows_per_wg, s_rows)
    no_scores = gl.zeros([rows_per_wg, block_n], gl.float32, s_layout)  # S starts empty (use_acc=False)
    m_i = gl.full([rows_per_wg], float("-inf"), gl.float32, s_rows)  # running max, log₂ units
    l_i = gl.zeros([rows_per_wg], gl.float32, s_rows)  # running Σ 2^(s − m)
    acc = gl.zeros([rows_per_wg, head_dim], gl.float32, o_layout)  # un-normalised O
    if n_tiles > lo:
        # the first tile on its own: its P̃ V is issued together with the next tile's scores
        mbarrier.wait(full_bars.index(used % stages), (used // stages) & 1)
        k_0 = k_smem.index(used % stages).reshape([block_n, head_dim]).permute((1, 0))
        s = warpgroup_mma(q, k_0, no_scores, use_acc=False) * qk_scale
        if WINDOW:
            first_masked = (lo < left_full) | (lo >= n_full)
        else:
            first_masked = n_full == 0
        if first_masked:
            s = _hide_invisible(s, lo, offs_m, n_k, diag, edge, CAUSAL, WINDOW, block_n, gl.SliceLayout(0, s_layout))
        m_i = gl.max(s, axis=1)
        p = gl.exp2(s - gl.where(m_i == float("-inf"), 0.0, m_i)[:, None])
        l_i = gl.sum(p, axis=1)
        p_prev = gl.convert_layout(p.to(dtype), p_layout)
        ring0 = used - lo  # tile t is the program's ring tile ring0 + t
        # --8<-- [start:window_stages]
        if WINDOW:
            for t in range(lo + 1, left_full):  # the window's left edge
                acc, p_prev, m_i, l_i = _overlapped_step(t, ring0 + t, q, k_smem, v_smem, full_bars, empty_bars, acc,
                                                         p_prev, m_i, l_i, no_scores, offs_m, n_k, diag, edge,
                                                         qk_scale, True, CAUSAL, WINDOW)
            after_edge = gl.maximum(left_full, lo + 1)
        else:
            after_edge = 1
        for t in range(after_edge, n_full):  # tiles every row sees in full: no mask
            acc, p_prev, m_i, l_i = _overlapped_step(t, ring0 + t, q, k_smem, v_smem, full_bars, empty_bars, acc,
                                                     p_prev, m_i, l_i, no_scores, offs_m, n_k, diag, edge, qk_scale,
                                                     False, CAUSAL, WINDOW)
        for t in range(gl.maximum(n_full, after_edge), n_tiles):  # the diagonal and the ragged end
            acc, p_prev, m_i, l_i = _overlapped_step(t, ring0 + t, q, k_smem, v_smem, full_bars, empty_bars, acc,
                                                     p_prev, m_i, l_i, no_scores, offs_m, n_k, diag, edge, qk_scale,
                                                     True, CAUSAL, WINDOW)
        # --8<-- [end:window_stages]
        last = (ring0 + n_tiles - 1) % stages
        acc = warpgroup_mma(p_prev, v_smem.index(last).reshape([block_n, head_dim]), acc)
        mbarrier.arrive(empty_bars.index(last), count=1)
    return acc, l_i, m_i


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh,
              stride_om, lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale,
              WG: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """One warpgroup, for each work item dealt to this program: its 64 query rows (the WG-th half of
    the item's Q tile) through `_attend_item`, then O / ℓ to memory, by way of its half of the Q
    buffer, after which the loader may refill that buffer."""
    dtype: gl.constexpr = k_smem.dtype
    rows_per_wg: gl.constexpr = q_smem.shape[3]
    block_n: gl.constexpr = k_smem.shape[3]
    head_dim: gl.constexpr = k_smem.shape[4]
    q = q_smem.index(WG).reshape([rows_per_wg, head_dim])  # TMA's (1, 1, rows, d) block as a matrix
    used = 0  # K/V tiles of the ring this program has used, counted as the loader counts them
    started = 0  # work items this program has begun
    for deal in range(gl.cdiv(n_items, gl.num_programs(0))):
        w = _dealt_item(deal)
        if w < n_items:
            batch, head, kv_head, first_row, lo, left_full, n_full, n_tiles = _work_item(
                w, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, CAUSAL, WINDOW, 2 * rows_per_wg, block_n)
            row0 = first_row + WG * rows_per_wg
            mbarrier.wait(q_full, started & 1)
            acc, l_i, m_i = _attend_item(q, k_smem, v_smem, full_bars, empty_bars, used, row0, lo, left_full,
                                         n_full, n_tiles, n_k, diag, edge, qk_scale, CAUSAL, WINDOW)
            used += n_tiles - lo
            started += 1

            # --8<-- [start:stage_output]
            l_o = gl.convert_layout(l_i, gl.SliceLayout(1, acc.type.layout))
            out = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]  # a row that sees no key: 0
            # Straight from wgmma's layout each thread holds pairs of adjacent columns, so every store
            # would write 4 bytes per thread and fill half of each 32-byte sector it touches. Staged
            # through this warpgroup's half of the Q buffer (every product that reads it is done), it
            # comes back as 8 adjacent columns per thread: 16-byte stores, whole sectors. (Triton puts
            # a barrier of this warpgroup's warps between the write and the read.)
            o_stage = q
            o_stage.store(out.to(dtype))
            # 8 columns (16 bytes) per thread, head_dim / 8 threads per row: a warp writes whole rows
            store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // head_dim, head_dim // 8], [4, 1],
                                                          [1, 0])
            o_rows = o_stage.load(store_layout)
            fence_async_shared()  # our accesses to the buffer come before the loader's next TMA write to it
            mbarrier.arrive(q_empty, count=1)  # the loader may bring the next item's Q
            rows = row0 + gl.arange(0, rows_per_wg, gl.SliceLayout(1, store_layout))
            cols_d = gl.arange(0, head_dim, gl.SliceLayout(0, store_layout))
            o_base = batch.to(gl.int64) * stride_ob + head.to(gl.int64) * stride_oh
            ptrs = o_ptr + o_base + rows[:, None].to(gl.int64) * stride_om + cols_d[None, :]
            gl.store(ptrs, o_rows, mask=(rows < n_q)[:, None])
            # --8<-- [end:stage_output]
            if write_lse:  # for the backward: lse = log Σ_j e^{τ s_j} = ln 2 · (m + log₂ ℓ), −∞ if ℓ = 0
                lse = gl.where(l_i > 0.0, (m_i + gl.log2(l_i)) * 0.6931471805599453, float("-inf"))
                lse_rows = row0 + gl.arange(0, rows_per_wg, l_i.type.layout)
                gl.store(lse_ptr + (batch * n_heads + head).to(gl.int64) * n_q + lse_rows, lse, mask=lse_rows < n_q)
# --8<-- [end:consumer]


# Worker partitions take no compile-time arguments (Triton 3.6), so the second consumer warpgroup
# and the loader get one small wrapper per value of (CAUSAL, WINDOW).
@gluon.jit
def _consumer_1_causal(
        q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
        lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale):
    _consumer(q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
              lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale, 1,
              True, False)


@gluon.jit
def _consumer_1_full(
        q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
        lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale):
    _consumer(q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
              lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale, 1,
              False, False)


@gluon.jit
def _consumer_1_causal_window(
        q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
        lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale):
    _consumer(q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
              lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale, 1,
              True, True)


@gluon.jit
def _consumer_1_full_window(
        q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
        lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale):
    _consumer(q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
              lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale, 1,
              False, True)


@gluon.jit
def _consumer_0(
        q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
        lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale,
        CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    _consumer(q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh, stride_om,
              lse_ptr, write_lse, n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale, 0,
              CAUSAL, WINDOW)


@gluon.jit
def _loader_causal(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
        n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge):
    _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
            n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, True, False)


@gluon.jit
def _loader_full(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
        n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge):
    _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
            n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, False, False)


@gluon.jit
def _loader_causal_window(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
        n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge):
    _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
            n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, True, True)


@gluon.jit
def _loader_full_window(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
        n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge):
    _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars,
            n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, False, True)


# --8<-- [start:kernel]
@gluon.jit(do_not_specialize=("n_q", "n_k", "diag", "edge"))  # one binary for every length (chapter 5 says why)
def _flash_hopper_fwd(q_desc, k_desc, v_desc, o_ptr, stride_ob, stride_oh, stride_om, lse_ptr, write_lse,
                      n_bh, section, n_heads, group_size, n_q, n_k, diag, edge, qk_scale,
                      CAUSAL: gl.constexpr, WINDOW: gl.constexpr, STAGES: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    """A persistent program: a loader warp and two consumer warpgroups that run work items (128-row
    query tiles of one (batch, head), see `_work_item`) as they are dealt to it (`_dealt_item`), with
    one set of barriers and one ring of K/V stages for all of them. Query i sees key j when
    i + edge ≤ j (WINDOW: compiled only for calls with a left edge) and, CAUSAL, j ≤ i + diag
    (`band_offsets`). Q, K and V arrive
    through 4-D TMA descriptors over the (B, H, N, d) tensors as they are, strides and all: one
    (1, 1, rows, d) block per copy."""
    rows_per_wg: gl.constexpr = q_desc.block_type.shape[2]
    block_n: gl.constexpr = k_desc.block_type.shape[2]
    head_dim: gl.constexpr = k_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    n_items = gl.cdiv(n_q, 2 * rows_per_wg) * n_bh

    # --8<-- [start:barriers]
    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, rows_per_wg, head_dim], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, block_n, head_dim], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, block_n, head_dim], v_desc.layout)
    q_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_full, count=1)  # completed by the Q tile's bytes arriving
    mbarrier.init(q_empty, count=2)  # completed when both consumers are done with the Q buffer (O included)
    for i in gl.static_range(STAGES):
        mbarrier.init(full_bars.index(i), count=1)  # completed by the TMA bytes arriving
        mbarrier.init(empty_bars.index(i), count=2)  # completed when both consumers release the stage
    fence_async_shared()  # the barriers' initialisation, visible to the TMA unit before it signals them
    # --8<-- [end:barriers]

    items = (n_items, n_bh, section, n_heads, group_size, n_q, n_k, diag, edge)
    consumer_args = (q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars, o_ptr, stride_ob, stride_oh,
                     stride_om, lse_ptr, write_lse) + items + (qk_scale,)
    loader_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, full_bars, empty_bars) + items
    # --8<-- [start:warp_specialize]
    # the default partition (this program's 4 warps) is consumer 0; the workers are consumer 1 (4
    # warps) and the loader (1 warp), each with its own register budget
    if CAUSAL and WINDOW:
        gl.warp_specialize([(_consumer_0, consumer_args + (CAUSAL, WINDOW)), (_consumer_1_causal_window, consumer_args),
                            (_loader_causal_window, loader_args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    elif CAUSAL:
        gl.warp_specialize([(_consumer_0, consumer_args + (CAUSAL, WINDOW)), (_consumer_1_causal, consumer_args),
                            (_loader_causal, loader_args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    elif WINDOW:
        gl.warp_specialize([(_consumer_0, consumer_args + (CAUSAL, WINDOW)), (_consumer_1_full_window, consumer_args),
                            (_loader_full_window, loader_args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([(_consumer_0, consumer_args + (CAUSAL, WINDOW)), (_consumer_1_full, consumer_args),
                            (_loader_full, loader_args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    # --8<-- [end:warp_specialize]
# --8<-- [end:kernel]

_launches = LaunchPlans(_flash_hopper_fwd)  # launches repeated without Triton's dispatch (launch_plan.py)


@functools.lru_cache(maxsize=None)
def _compute_capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def hopper_kernel_unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor | None = None,
                              *, head_dims: tuple[int, ...] = HEAD_DIMS) -> str | None:
    """None if `flash_attn_hopper` can run these (already validated) inputs, else why not. `do`: the
    same rules for it too; `head_dims`: the head dimensions accepted, the forward's by default (the
    backward's question, with its head dimension, is `ch07_hopper_backward.hopper_backward_unavailable`).
    Cheap enough for every layer of a model to ask: the properties of a call first, the device's last
    and remembered."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"runs torch.float16 and torch.bfloat16 only, got {q.dtype}"
    if q.shape[3] not in head_dims:
        built = ", ".join(map(str, head_dims[:-1])) + " or " * (len(head_dims) > 1) + str(head_dims[-1])
        return f"is built for head_dim {built}, got {q.shape[3]}"
    for name, t in (("q", q), ("k", k), ("v", v)) + ((("do", do),) if do is not None else ()):
        # TMA: the innermost stride 1, the others multiples of 16 bytes, the base 16-byte aligned
        if t.stride(3) != 1 or any(st * t.element_size() % 16 for st in t.stride()[:3]):
            return (f"needs {name}'s head dimension contiguous and its other strides multiples of 16 bytes, got "
                    f"strides {t.stride()}")
        if t.data_ptr() % 16:
            return f"needs {name} 16-byte aligned for TMA, got address {t.data_ptr():#x}"
    if not (q.is_cuda and _compute_capability(q.device.index)[0] == 9):
        where = f"compute capability {_compute_capability(q.device.index)}" if q.is_cuda else "the CPU"
        return f"needs CUDA tensors on a GPU of compute capability 9.x (Hopper), got {q.device} ({where})"
    return None


def check_runnable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, instead: str,
                   do: torch.Tensor | None = None, head_dims: tuple[int, ...] = HEAD_DIMS) -> None:
    """For inputs that passed `check_attention_inputs`: TypeError for a dtype other than float16 and
    bfloat16, UnsupportedShape saying why else this chapter's kernel (with `do`, the backward) cannot
    run them (`hopper_kernel_unavailable`, with `head_dims` the head dimensions accepted); both point
    to `instead`."""
    what = "the Hopper kernel" if do is None else "the Hopper backward"
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q.dtype: {what} runs torch.float16 and torch.bfloat16, got {q.dtype}; use {instead} "
                        "for float32")
    why_not = hopper_kernel_unavailable(q, k, v, do, head_dims=head_dims)
    if why_not is not None:
        names = "q, k, v" if do is None else "q, k, v, do"
        raise UnsupportedShape(f"{names}: {what} {why_not}; use {instead} for these inputs")


def flash_attn_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      sm_scale: float | None = None, *, out: torch.Tensor | None = None,
                      window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    """softmax(sm_scale · Q Kᵀ) V, FA3's schedule on a Hopper GPU (see the module docstring).

    q is (B, H, n_q, d), k and v (B, H_kv, n_k, d) with d 64, 128 or 256 and H_kv dividing H (grouped-query
    attention), float16 or bfloat16, any strides with the head dimension contiguous (the copy engine
    needs the others to be multiples of 16 bytes). Causal masks are aligned to the bottom-right
    corner, as in chapter 5. `out`, if given, is written in place: any dense layout of shape
    (B, H, n_q, d) with the head dimension contiguous. window_size: chapter 9's sliding window
    (left, right) around that diagonal, −1 for no bound (`band_offsets`); the key tiles outside it
    are never loaded. Raises TypeError for another dtype and
    ValueError (UnsupportedShape) for anything else this kernel does not run, saying why; chapter 5's
    `flash_attn_v2_tuned` runs those."""
    # a call like an earlier one launches directly (a window's offsets are not in the key: not remembered)
    plan = attention_call_key(q, k, v, out, causal, sm_scale) if window_size in ((-1, -1), [-1, -1]) else None
    if plan is not None and plan in _launches:
        out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
        if _launches.relaunch(plan, q, k, v, out, out):  # the descriptors' tensors; out again: no lse written
            return out
    # runs_triton=False: the device rules are this kernel's own (hopper_kernel_unavailable)
    shape = check_attention_inputs(q, k, v, causal, sm_scale, min_head_dim=1, max_head_dim=1 << 30,
                                   allow_gqa=True, runs_triton=False)
    check_runnable(q, k, v, instead="flash_attn_v2_tuned")
    window_size = check_window_size(window_size)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    else:
        out = check_out(out, "out", tuple(q.shape), q, any_dense_layout=True)
        if out.stride(3) != 1:
            raise ValueError(f"out: the Hopper kernel writes rows of head_dim contiguous elements, got strides "
                             f"{out.stride()}")
    return _launch(q, k, v, causal, shape.sm_scale, out, plan=plan, window_size=window_size)


def remembered_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None, causal: bool,
                   sm_scale: float) -> Hashable | None:
    """The key under which `flash_attn_hopper(q, k, v, causal, sm_scale, out=out)` remembers its launch,
    for a caller that knows the call repeats (the front door) and relaunches it with `relaunch_remembered`."""
    return attention_call_key(q, k, v, out, causal, sm_scale)


def relaunch_remembered(plan: Hashable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> bool:
    """Repeat the launch remembered under `plan` (`remembered_key`) with these tensors, writing `out`:
    for a caller that already knows the key (the front door) and so need not have it computed twice.
    False, having launched nothing, if nothing is remembered under `plan`. Nothing is checked: `plan`
    must be the key these very tensors give, for the remembered TMA descriptors keep the first call's
    shapes and strides (another signature would have the copy engine read and write out of bounds)."""
    return _launches.relaunch(plan, q, k, v, out, out)


def flash_attn_hopper_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                               sm_scale: float | None = None, *,
                               window_size: tuple[int, int] = (-1, -1)) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse): `flash_attn_hopper`'s output and the log-sum-exp of every query row, (B, H, n_q)
    float32, log Σ_j e^{sm_scale · S_ij} (−∞ for a row that sees no key), which the backward needs.
    The same inputs, conventions and errors as `flash_attn_hopper`."""
    plain = window_size in ((-1, -1), [-1, -1])
    plan = attention_call_key(q, k, v, None, causal, sm_scale, "lse") if plain else None
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    if plan is not None and plan in _launches and _launches.relaunch(plan, q, k, v, out, lse):
        return out, lse
    shape = check_attention_inputs(q, k, v, causal, sm_scale, min_head_dim=1, max_head_dim=1 << 30,
                                   allow_gqa=True, runs_triton=False)
    check_runnable(q, k, v, instead="chapter 5's flash_attn_v2_with_lse")
    window_size = check_window_size(window_size)
    return _launch(q, k, v, causal, shape.sm_scale, out, lse=lse, plan=plan, window_size=window_size), lse


@functools.lru_cache(maxsize=None)
def _sm_count_and_l2_bytes(device_index: int) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(device_index)
    return props.multi_processor_count, props.L2_cache_size


def l2_bytes(device: torch.device) -> int:
    """The L2 cache's size of a CUDA device in bytes, which the launch rule (`runs_persistent`) weighs K and V against."""
    return _sm_count_and_l2_bytes(device.index)[1]


# --8<-- [start:launch_rule]
# Persistent programs over many heads go section by section, each section the query heads of as many
# key/value heads as have their K and V in this share of the L2 cache (an eighth and a sixteenth
# measured level on the H100, a quarter behind, all heads in one section far behind: docs/how-the-numbers-were-obtained.md).
SECTION_L2_SHARE = 1 / 8


def runs_persistent(kv_bytes: int, kv_heads: int, causal: bool, l2_bytes: int) -> bool:
    """`_launch`'s choice for K and V of `kv_bytes` together over `kv_heads` (batch, key/value head)
    pairs: persistent programs for causal attention whose K and V fit in the L2 cache, and wherever
    one key/value head's K and V fit in SECTION_L2_SHARE of it; one program per work item otherwise."""
    return (causal and kv_bytes <= l2_bytes) or kv_bytes / kv_heads <= SECTION_L2_SHARE * l2_bytes


def pairs_per_section(kv_bytes: int, kv_heads: int, causal: bool, l2_bytes: int, group_size: int) -> int:
    """How many (batch, query head) pairs one section of a persistent launch holds: all of them for
    causal attention within the L2 cache, so that the longest-first order is global; otherwise the
    query heads of as many whole key/value heads as fill SECTION_L2_SHARE of the L2 (at least one).
    Not causal, the items are equal and need no global order."""
    if causal and kv_bytes <= l2_bytes:
        return kv_heads * group_size
    return max(1, int(SECTION_L2_SHARE * l2_bytes // (kv_bytes / kv_heads))) * group_size
# --8<-- [end:launch_rule]


@functools.lru_cache(maxsize=None)
def _blocks(dtype: torch.dtype, head_dim: int) -> tuple:
    """The TMA block shapes of Q and of K/V with their shared-memory layouts (the swizzle wgmma reads
    without bank conflicts), computed once per dtype and head_dim: each costs microseconds, paid by
    every layer."""
    element = gl.float16 if dtype == torch.float16 else gl.bfloat16
    blocks = ([1, 1, ROWS_PER_WARPGROUP, head_dim], [1, 1, TILES[head_dim].block_n, head_dim])
    return tuple((block, gl.NVMMASharedLayout.get_default_for(block, element)) for block in blocks)


def _descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """The TMA descriptors of Q, K and V: the copy engine fetches a 64-row (Q) or block_n-row (K, V)
    × head_dim block of one (batch, head) per request, swizzled as wgmma reads it."""
    (q_block, q_layout), (kv_block, kv_layout) = _blocks(q.dtype, q.shape[3])
    return (TensorDescriptor.from_tensor(q, q_block, q_layout), TensorDescriptor.from_tensor(k, kv_block, kv_layout),
            TensorDescriptor.from_tensor(v, kv_block, kv_layout))


# --8<-- [start:band_offsets]
def band_offsets(causal: bool, window_size: tuple[int, int], n_q: int, n_k: int, pad: int = 256) -> tuple[bool, int, int]:
    """(bounded on the right, diag, edge): query i sees key j when i + edge ≤ j and, if bounded, j ≤ i + diag.

    The keys of a window (left, right) around the bottom-right diagonal (chapter 9; −1 for no bound,
    causal is right = 0) lie between i + (n_k − n_q) − left and i + (n_k − n_q) + right. Without a
    left bound, edge lies so far left (by n_q + `pad`, more than any tile's rows) that no tile of
    any row crosses it. A right bound uses the causal code path with its diagonal moved."""
    left, right = window_size
    right = 0 if causal else right
    edge = (n_k - n_q) - left if left >= 0 else -(n_q + pad)
    return right >= 0, (n_k - n_q) + max(right, 0), edge
# --8<-- [end:band_offsets]


def _launch(q, k, v, causal: bool, sm_scale: float, out: torch.Tensor, lse: torch.Tensor | None = None,
            programs: int | None = None, section: int | None = None, plan: Hashable | None = None,
            window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    """The kernel launch for inputs `flash_attn_hopper` (or a caller that made the same checks) accepted.

    Causal, with the K and V of all heads within the L2 cache: one program per SM (the shared memory
    of one fills an SM), every item in one section, so the longest-first order is global and the
    dealing balances it. Otherwise, where one key/value head's K and V fit in an eighth of the L2: one
    program per SM as well, with sections of the heads that fill that eighth, so the programs running
    at once share their K and V through the L2. Otherwise (a head's K and V larger than that: long
    sequences; persistent programs took a quarter to a third longer there at 16,384 tokens causal,
    for a reason not established) one program per item and sections of one (batch, head):
    the GPU starts each program as an SM frees up, in order, which balances causal items of one head
    as well. `programs` and `section` override the choice (tests, probes). `plan`: the key under
    which to remember the launch (`launch_plan.py`), None not to. `lse`, if given, (B, H, n_q) float32,
    receives each row's log-sum-exp. `window_size`: as `flash_attn_hopper`'s."""
    if programs is not None or section is not None:
        plan = None  # a forced schedule is not the one the key stands for
    batch, heads, n_q, _ = q.shape
    group_size, n_k = heads // k.shape[1], k.shape[2]
    causal, diag, edge = band_offsets(causal, window_size, n_q, n_k)
    window = window_size[0] >= 0  # a left edge: the kernel compiled with it
    sm_count, l2_bytes = _sm_count_and_l2_bytes(q.device.index)
    n_items = triton.cdiv(n_q, 2 * ROWS_PER_WARPGROUP) * batch * heads
    kv_bytes, kv_heads = 2 * k.numel() * k.element_size(), batch * k.shape[1]  # K and V
    persistent = runs_persistent(kv_bytes, kv_heads, causal, l2_bytes)
    programs = min(n_items, programs or (sm_count if persistent else n_items))
    if not section:
        section = pairs_per_section(kv_bytes, kv_heads, causal, l2_bytes, group_size) if persistent else 1
    section = max(1, min(section, batch * heads))
    _launches.launch(
        plan, (programs,),
        *_descriptors(q, k, v), out, out.stride(0), out.stride(1), out.stride(2),
        out if lse is None else lse, int(lse is not None),  # without lse, out stands in: never written
        batch * heads, section, heads, group_size, n_q, n_k, diag, edge, sm_scale * LOG2_E,
        CAUSAL=causal, WINDOW=window, STAGES=TILES[q.shape[3]].stages, CONSUMER_REGS=CONSUMER_REGS, LOADER_REGS=LOADER_REGS, num_warps=4,
    )
    return out


__all__ = ["flash_attn_hopper", "flash_attn_hopper_with_lse", "hopper_kernel_unavailable", "check_runnable", "l2_bytes",
           "runs_persistent", "pairs_per_section", "band_offsets", "remembered_key", "relaunch_remembered", "tma_load", "TILES", "HEAD_DIMS"]
