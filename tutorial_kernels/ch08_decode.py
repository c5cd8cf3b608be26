"""Chapter 8 — attention at inference: a KV cache, decoding, Flash-Decoding and a paged cache, in Triton.

A model that generates text runs attention with a few new query rows (one per sequence while decoding)
against every key and value it has cached. Three ideas make that fast, each a change to chapter 5's
kernel rather than a new one:

* **Grouped-query packing.** The G = H / H_kv query heads that share a key/value head are rows of one
  tile, so each cached key and value is read once per KV head, not once per query head:

      row r of a tile  →  query i = r // G,  head h = kv_head · G + r mod G

* **Split-KV** (Flash-Decoding, Dao et al. 2023). One (batch, KV head) has too few rows to fill a GPU,
  so the keys are cut into `num_splits` ranges, each reduced by its own program to a partial output
  O_s (already divided by its own sum) and its log-sum-exp lse_s. A second kernel merges them with
  chapter 3's rule:

      lse = log Σ_s e^{lse_s},    O = Σ_s e^{lse_s − lse} · O_s

* **A paged cache** (vLLM's PagedAttention, Kwon et al. 2023). Keys live in fixed-size blocks of
  `block_size` tokens anywhere in a pool; sequence b's key j is in block `block_table[b, j // block_size]`
  at row `j mod block_size`. The kernel reads an address per key instead of a stride per key.

Lengths differ per sequence (`cache_seqlens`), new keys and values are appended in place before
attending, and n_q > 1 (a chunk of a prompt, speculative tokens) uses the bottom-right causal mask:
query i of n_q sees key j when j ≤ i + n_k − n_q. A row that sees no key gives 0 (lse = −∞).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable

import torch
import triton
import triton.language as tl

from tutorial_kernels.perf.launch_plan import LaunchPlans, tensor_signature
from tutorial_kernels.precision import dot_precision
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.tiling import LOG2_E, from_log2_units, head_dim_block
from tutorial_kernels.validation import SUPPORTED_DTYPES, check_triton_tensor


# --8<-- [start:partial_kernel]
@triton.jit
def _decode_partial_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, seqlens_ptr, table_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,  # contiguous cache: b is the sequence; paged: the block
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_os, stride_od,  # O (B, H, n_q[, split], d)
    stride_lb, stride_lh, stride_lm, stride_ls,  # lse (B, H, n_q[, split])
    stride_tb, stride_tn,  # the block table (B, blocks per sequence)
    n_kv_heads, group_size, n_q, head_dim, n_splits, qk_scale,
    PAGED: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr, PARTIAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program: one tile of packed rows (query × head of a group) of one (batch, KV head), against
    the keys of one split: split s of n_splits covers keys [s·c, (s + 1)·c) of its sequence, c the
    sequence's length over n_splits in whole key tiles. PARTIAL: write O_s = acc / ℓ and lse_s (log₂
    units) of the split; else the final O (the only split) and lse in natural units."""
    pid_bk = tl.program_id(0).to(tl.int64)  # (batch, KV head) on the x axis: any number of them
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    batch = pid_bk // n_kv_heads
    kv_head = pid_bk % n_kv_heads

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_q * group_size
    query = rows // group_size  # grouped-query packing: the group's heads share every key tile
    head = kv_head * group_size + rows % group_size
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(q_ptr + batch * stride_qb + head[:, None] * stride_qh + query[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    n_k = tl.load(seqlens_ptr + batch)  # this sequence's keys, cached and new
    keys_per_split = tl.cdiv(tl.cdiv(n_k, n_splits), BLOCK_N) * BLOCK_N  # its own length, split in whole tiles
    start = split * keys_per_split
    end = tl.minimum(start + keys_per_split, n_k)
    if CAUSAL:  # the tile's last query sees keys up to (its index) + n_k − n_q
        last_query = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // group_size, n_q - 1)
        end = tl.minimum(end, last_query + n_k - n_q + 1)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log₂ units
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running Σ 2^{s − m}
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < end
        rows_n = offs_n.to(tl.int64)  # × a token stride, which may be large (a (tokens, B, H_kv, d) cache)
        if PAGED:  # key j: row j mod PAGE of block block_table[b, j // PAGE] (PAGE a constant: shifts, not divisions)
            if PAGE % BLOCK_N == 0:  # the tile lies in one block: one entry of the table
                block = tl.load(table_ptr + batch * stride_tb + (start_n // PAGE) * stride_tn).to(tl.int64)
            else:
                block = tl.load(table_ptr + batch * stride_tb + (offs_n // PAGE) * stride_tn, mask=key_ok, other=0)
                block = block.to(tl.int64)
            k_rows = block * stride_kb + (rows_n % PAGE) * stride_kn
            v_rows = block * stride_vb + (rows_n % PAGE) * stride_vn
        else:
            k_rows = batch * stride_kb + rows_n * stride_kn
            v_rows = batch * stride_vb + rows_n * stride_vn
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv_head * stride_kh + k_rows[:, None] + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_head * stride_vh + v_rows[:, None] + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # τ log₂e · Q Kᵀ
        visible = key_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= query[:, None] + (n_k - n_q))  # bottom-right causal
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: 2^{−∞ − 0} = 0
        p = tl.math.exp2(s - shift[:, None])  # P̃ = 2^{S − m_new}
        alpha = tl.math.exp2(m_i - shift)  # α = 2^{m_old − m_new}
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    seen = l_i > 0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]  # O_s = acc / ℓ: 0 for a row that saw no key
    lse2 = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    o_rows = batch * stride_ob + head * stride_oh + query * stride_om
    l_rows = batch * stride_lb + head * stride_lh + query * stride_lm
    if PARTIAL:
        o_rows += split * stride_os
        l_rows += split * stride_ls
        tl.store(lse_ptr + l_rows, lse2, mask=row_ok)
    else:
        tl.store(lse_ptr + l_rows, from_log2_units(lse2), mask=row_ok)  # natural units: lse = lse₂ · ln 2
    tl.store(o_ptr + o_rows[:, None] + offs_d[None, :] * stride_od, o.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
# --8<-- [end:partial_kernel]


# --8<-- [start:combine_kernel]
@triton.jit
def _decode_combine_kernel(
    part_ptr, part_lse_ptr, o_ptr, lse_ptr,
    stride_pr, stride_ps, stride_pd,  # partial O (rows, splits, d); rows = (b, h, i) flattened
    stride_lr, stride_ls,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, n_q, head_dim, n_splits,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (batch, head, query): lse = log₂ Σ_s 2^{lse_s}, O = Σ_s 2^{lse_s − lse} O_s."""
    row = tl.program_id(0).to(tl.int64)
    batch = row // (n_heads * n_q)
    head = (row // n_q) % n_heads
    query = row % n_q
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < n_splits
    lse_s = tl.load(part_lse_ptr + row * stride_lr + offs_s * stride_ls, mask=s_ok, other=float("-inf"))
    top = tl.max(lse_s, 0)
    shift = tl.where(top == float("-inf"), 0.0, top)  # no split saw a key: every weight is 0
    w = tl.math.exp2(lse_s - shift)  # 2^{lse_s − max}
    total = tl.sum(w, 0)
    o_s = tl.load(part_ptr + row * stride_pr + offs_s[:, None] * stride_ps + offs_d[None, :] * stride_pd,
                  mask=s_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    o = tl.sum(o_s * (w / tl.where(total > 0, total, 1.0))[:, None], 0)  # Σ_s 2^{lse_s − lse} O_s
    lse2 = tl.where(total > 0, shift + tl.math.log2(tl.where(total > 0, total, 1.0)), float("-inf"))
    tl.store(o_ptr + batch * stride_ob + head * stride_oh + query * stride_om + offs_d * stride_od,
             o.to(o_ptr.dtype.element_ty), mask=offs_d < head_dim)
    tl.store(lse_ptr + row, from_log2_units(lse2))  # natural units
# --8<-- [end:combine_kernel]


MAX_SPLITS = 128  # the combine holds every split of a row in one program


@functools.cache
def choose_num_splits(batch: int, kv_heads: int, row_tiles: int, max_keys: int, sm_count: int, block_n: int,
                      resident: int = 4, busy_waves: int = 3, min_keys_per_split: int = 256,
                      program_cost_keys: int = 256) -> int:
    """Flash-Decoding's split count, with the GPU's waves counted. P = batch × KV heads × row tiles
    programs, each cut into s splits, run in waves of sm_count × `resident` programs (as many as the SMs
    hold at once, `resident_programs`). The memory is kept busy only by at least busy_waves × sm_count
    programs loading at once, so a wave of fewer takes as long as one of that many; each program also
    pays a fixed cost worth `program_cost_keys` keys (its start, its partial's write, its merge). The s
    from 1 to the cap that minimises Σ_waves max(programs, busy) · (max_keys / s + program_cost_keys)
    wins. Caps: no split shorter than `min_keys_per_split` keys, at most MAX_SPLITS."""
    programs = max(batch * kv_heads * row_tiles, 1)
    wave, busy = sm_count * resident, busy_waves * sm_count
    most = max(1, min(max_keys // max(min_keys_per_split, block_n), MAX_SPLITS))
    best_time, best = math.inf, 1
    for splits in range(1, most + 1):
        full, last = divmod(programs * splits, wave)  # whole waves, and the programs of a last partial one
        slots = full * max(wave, busy) + (max(last, busy) if last else 0)
        time = slots * (max_keys / splits + program_cost_keys)
        if time < best_time:
            best_time, best = time, splits
    return best


def resident_programs(tiles: dict, head_dim: int, itemsize: int, registers: int = 128) -> int:
    """How many partial-kernel programs of `tiles` an SM holds at once, estimated before compiling: the
    shared memory of the key and value tiles the pipeline keeps in flight (stages − 1 of each) and Q's
    tile, out of 227 KiB; and the registers, `registers` per thread (an estimate), out of 64 Ki."""
    block_d = head_dim_block(head_dim)
    shared = (2 * max(tiles["num_stages"] - 1, 1) * tiles["BLOCK_N"] + tiles["BLOCK_M"]) * block_d * itemsize + 1024
    by_registers = 65536 // (registers * 32 * tiles["num_warps"])
    return max(1, min(227 * 1024 // shared, by_registers))


SHARED_BYTES = 160 * 2**10  # what the key and value tiles of every stage may take (an H100 has 227 KiB)


def decode_tiles(n_q: int, group: int, head_dim: int, itemsize: int = 2) -> dict:
    """The partial kernel's tile here: `gpu_decode_tiles`, or one small tile in Triton's interpreter."""
    if interpreter_active():
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    return gpu_decode_tiles(n_q, group, head_dim, itemsize)


def gpu_decode_tiles(n_q: int, group: int, head_dim: int, itemsize: int = 2) -> dict:
    """The partial kernel's tile on a GPU: BLOCK_M packed rows (at least tl.dot's 16), BLOCK_N keys, warps,
    stages; BLOCK_N halved until the stages' key and value tiles fit in SHARED_BYTES."""
    tiles = dict(BLOCK_M=max(16, min(64, triton.next_power_of_2(n_q * group))), BLOCK_N=64, num_warps=4, num_stages=3)
    while tiles["BLOCK_N"] > 16 and 2 * tiles["num_stages"] * tiles["BLOCK_N"] * head_dim_block(head_dim) * itemsize > SHARED_BYTES:
        tiles["BLOCK_N"] //= 2
    return tiles


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


_empty = torch.empty  # every buffer the launcher allocates (tests poison them: unwritten elements stay NaN)


def _check(name: str, t, dims: int, dtype=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    if dtype is not None and t.dtype not in dtype:
        raise TypeError(f"{name}.dtype must be one of {[str(d)[6:] for d in dtype]}, got {t.dtype}")


def _append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            seqlens: torch.Tensor, block_table: torch.Tensor | None) -> None:
    """Write k, v (B, H_kv, n_new, d) into the cache at positions cache_seqlens[b] + 0 … n_new − 1, in place."""
    batch, _, n_new, _ = k.shape
    positions = seqlens[:, None].long() + torch.arange(n_new, device=k.device)  # (B, n_new)
    if block_table is None:
        sequences = torch.arange(batch, device=k.device)[:, None].expand(batch, n_new)
        rows = positions
    else:
        block_size = k_cache.shape[2]
        sequences = torch.gather(block_table.long(), 1, positions // block_size)  # the blocks
        rows = positions % block_size
    # cache[seq, :, row, :] = new[b, :, t, :]: advanced indices first, then the heads and d
    k_cache[sequences, :, rows] = k.permute(0, 2, 1, 3).to(k_cache.dtype)
    v_cache[sequences, :, rows] = v.permute(0, 2, 1, 3).to(v_cache.dtype)


def _key_counts(cache_seqlens: torch.Tensor, n_new: int) -> torch.Tensor:
    """Every sequence's keys after the append, (B,) int32 with unit stride (the kernel reads entry b at b)."""
    if not n_new and cache_seqlens.dtype == torch.int32 and cache_seqlens.stride(0) == 1:
        return cache_seqlens
    return (cache_seqlens + n_new).int()  # a new tensor, contiguous even from an expanded one


def check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, sm_scale,
                         num_splits) -> tuple[torch.Tensor, float]:
    """Validate `flash_attention_with_kvcache`'s arguments (its docstring states them); return
    cache_seqlens as a (B,) tensor and the scale. Raises TypeError / ValueError naming the argument."""
    _check("q", q, 4, SUPPORTED_DTYPES)
    _check("k_cache", k_cache, 4, (q.dtype,))
    _check("v_cache", v_cache, 4, (q.dtype,))
    check_triton_tensor(q, "q")  # a device the kernels run on (bfloat16 not in the interpreter)
    batch, heads, n_q, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    if not 16 <= head_dim <= 256:
        raise ValueError(f"q's head_dim must be between 16 and 256, got {head_dim}")
    if k_cache.shape[1:] != v_cache.shape[1:] or k_cache.shape[0] != v_cache.shape[0] or k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache and v_cache must have one shape (…, H_kv, tokens, {head_dim}), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"k_cache's heads ({kv_heads}) must divide q's ({heads})")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if isinstance(cache_seqlens, bool):
        raise TypeError(f"cache_seqlens must be an int or a (B,) integer tensor, got {cache_seqlens!r}")
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    _check("cache_seqlens", cache_seqlens, 1, (torch.int32, torch.int64))
    if cache_seqlens.shape[0] != batch or cache_seqlens.device != q.device:
        raise ValueError(f"cache_seqlens must be ({batch},) on {q.device}, got {tuple(cache_seqlens.shape)} "
                         f"on {cache_seqlens.device}")
    if block_table is not None:
        _check("block_table", block_table, 2, (torch.int32, torch.int64))
        if block_table.shape[0] != batch or block_table.device != q.device:
            raise ValueError(f"block_table must be ({batch}, blocks per sequence) on {q.device}, got "
                             f"{tuple(block_table.shape)} on {block_table.device}")
        capacity = block_table.shape[1] * k_cache.shape[2]
    else:
        if k_cache.shape[0] != batch:
            raise ValueError(f"k_cache must hold one sequence per batch entry ({batch}) without a block_table, "
                             f"got {k_cache.shape[0]}")
        capacity = k_cache.shape[2]
    n_new = 0
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (new keys and values to append) or both be None")
    if k is not None:
        _check("k", k, 4, (q.dtype,))
        _check("v", v, 4, (q.dtype,))
        for name, t in (("k", k), ("v", v)):
            if t.device != q.device:
                raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
        if k.shape != v.shape or k.shape[0] != batch or k.shape[1] != kv_heads or k.shape[3] != head_dim:
            raise ValueError(f"k and v must be ({batch}, {kv_heads}, n_new, {head_dim}), got {tuple(k.shape)} "
                             f"and {tuple(v.shape)}")
        n_new = k.shape[2]
    if not q.is_cuda and not torch.compiler.is_compiling() and batch:  # free on the CPU; a GPU would wait
        shortest, longest = int(cache_seqlens.min()), int(cache_seqlens.max()) + n_new
        if shortest < 0 or longest > capacity:
            raise ValueError(f"cache_seqlens + n_new must be within 0 … {capacity} (the cache's capacity), "
                             f"got {shortest} … {longest}")
        if block_table is not None and longest:
            used = block_table[:, :triton.cdiv(longest, k_cache.shape[2])]
            if int(used.min()) < 0 or int(used.max()) >= k_cache.shape[0]:
                raise ValueError(f"block_table's entries must be blocks of the pool, 0 … {k_cache.shape[0] - 1}, "
                                 f"got {int(used.min())} … {int(used.max())}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be None or a positive int, got {num_splits!r}")
    if sm_scale is not None and (isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float))):
        raise TypeError(f"sm_scale must be None or a number, got {type(sm_scale).__name__} {sm_scale!r}")
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        raise ValueError("flash_attention_with_kvcache computes no gradients (it is for inference): q, k or v "
                         "requires grad; call it under torch.no_grad() or torch.inference_mode(), or train with "
                         "flash_attention")
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    return cache_seqlens, scale


# --8<-- [start:launcher]
def flash_attention_with_kvcache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None = None,
    v: torch.Tensor | None = None, *, cache_seqlens: torch.Tensor | int, block_table: torch.Tensor | None = None,
    causal: bool = True, sm_scale: float | None = None, num_splits: int | None = None, return_lse: bool = False,
):
    """softmax(τ Q Kᵀ) V of new queries against a KV cache (after appending k and v to it, in place).

    q: (B, H, n_q, d). Contiguous cache: k_cache, v_cache (B, H_kv, capacity, d). Paged cache:
    k_cache, v_cache (num_blocks, H_kv, block_size, d) and block_table (B, blocks per sequence) int32,
    sequence b's key j in block block_table[b, j // block_size]. Any strides (flash-attn's
    (…, tokens, H_kv, d) layout as `.transpose(1, 2)`). cache_seqlens: (B,) int32/int64 or an int, the keys
    already cached per sequence; k, v: (B, H_kv, n_new, d) or None, appended at cache_seqlens. Each
    sequence then attends over its cache_seqlens[b] + n_new keys; causal masks bottom-right. H_kv
    divides H; 16 ≤ d ≤ 256; float16, bfloat16 or float32. num_splits: None chooses (`choose_num_splits`),
    at most MAX_SPLITS; each sequence divides its own keys among them. block_table int32 or int64.
    Inference only: an input that requires grad is refused.
    Returns O (B, H, n_q, d) in q's dtype, and with return_lse the log-sum-exp (B, H, n_q) float32.
    Positions past a sequence's capacity are not checked on the GPU (as flash-attn); raises ValueError
    or TypeError naming the argument for bad shapes, dtypes or devices.
    """
    cache_seqlens, scale = check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal,
                                                sm_scale, num_splits)
    out, lse = run_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, num_splits)
    return (out, lse) if return_lse else out


def run_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal: bool, scale: float,
                num_splits: int | None, plan: Hashable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The launches of `flash_attention_with_kvcache` on checked inputs: (O, lse). With `plan`
    (`kvcache_call_key`), the launches are remembered for `relaunch_kvcache`."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    capacity = k_cache.shape[2] * (block_table.shape[1] if block_table is not None else 1)
    n_new = 0 if k is None else k.shape[2]
    if n_new:
        _append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    n_keys = _key_counts(cache_seqlens, n_new)
    out = _empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse

    group = heads // kv_heads
    tiles = decode_tiles(n_q, group, head_dim, q.element_size())
    block_m, block_n = tiles["BLOCK_M"], tiles["BLOCK_N"]
    block_d = head_dim_block(head_dim)
    row_tiles = triton.cdiv(n_q * group, block_m)
    if num_splits is None:  # chosen for the longest sequence the cache holds; each sequence divides its own
        # a paged read waits on its table entry before its keys: it needs more programs loading at once
        num_splits = choose_num_splits(batch, kv_heads, row_tiles, capacity, _sm_count(q.device), block_n,
                                       resident_programs(tiles, head_dim, q.element_size()),
                                       busy_waves=4 if block_table is not None else 3)
    num_splits = max(1, min(num_splits, MAX_SPLITS, triton.cdiv(max(capacity, 1), block_n)))
    table = block_table if block_table is not None else n_keys  # (unread without PAGED)
    table_strides = block_table.stride() if block_table is not None else (0, 0)
    common = dict(PAGED=block_table is not None, PAGE=k_cache.shape[2] if block_table is not None else 1, CAUSAL=causal, BLOCK_D=block_d, DOT_PRECISION=dot_precision(q.dtype),
                  **tiles)
    sizes = (kv_heads, group, n_q, head_dim, num_splits, scale * LOG2_E)
    grid = (batch * kv_heads, row_tiles, num_splits)
    if plan is not None:
        if len(_SPLITS) >= MAX_PLANS:  # a server's shapes are few; a sweep's are not: start again
            _SPLITS.clear(), _PARTIAL.clear(), _COMBINE.clear()
        _SPLITS[plan] = (num_splits, causal, scale, cache_seqlens)
    if num_splits == 1:  # _decode_partial_kernel[grid](…), remembered under `plan` (perf/launch_plan.py)
        _PARTIAL.launch(
            plan, grid, q, k_cache, v_cache, out, lse, n_keys, table, *q.stride(), *k_cache.stride(), *v_cache.stride(),
            out.stride(0), out.stride(1), out.stride(2), 0, out.stride(3), *lse.stride(), 0, *table_strides,
            *sizes, PARTIAL=False, **common)
    else:
        part = _empty((batch, heads, n_q, num_splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = _empty((batch, heads, n_q, num_splits), dtype=torch.float32, device=q.device)
        _PARTIAL.launch(
            plan, grid, q, k_cache, v_cache, part, part_lse, n_keys, table, *q.stride(), *k_cache.stride(), *v_cache.stride(),
            *part.stride(), *part_lse.stride(), *table_strides, *sizes, PARTIAL=True, **common)
        _COMBINE.launch(
            plan, (batch * heads * n_q,), part, part_lse, out, lse, part.stride(2), part.stride(3), part.stride(4), part_lse.stride(2),
            part_lse.stride(3), *out.stride(), heads, n_q, head_dim, num_splits,
            BLOCK_S=max(2, triton.next_power_of_2(num_splits)), BLOCK_D=block_d)
    return out, lse
# --8<-- [end:launcher]


# Launches repeated without Triton's dispatch (perf/launch_plan.py): a decode step is a few
# microseconds of GPU work, and Triton's Python per launch costs more than that.
_PARTIAL = LaunchPlans(_decode_partial_kernel)
_COMBINE = LaunchPlans(_decode_combine_kernel)
_SPLITS: dict = {}  # plan → (the number of splits its launches use, causal, the scale, the (B,) lengths)
MAX_PLANS = 1024


def kvcache_call_key(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, sm_scale,
                     num_splits) -> Hashable | None:
    """A key equal for two calls of `flash_attention_with_kvcache` that every check treats alike and
    that launch the same kernels with the same scalars: the tensors' shapes, strides, dtypes, devices
    and alignment, the flags, float32's matmul precision, and an int cache_seqlens's value (a model's
    layers repeat it within a step). None where the full path must run: on the CPU (its checks read the
    lengths), for an input that requires grad, or arguments of a kind the checks would refuse."""
    if not (type(causal) is bool and (sm_scale is None or type(sm_scale) is float)
            and (num_splits is None or type(num_splits) is int) and isinstance(q, torch.Tensor) and q.is_cuda
            and isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor)
            and (isinstance(cache_seqlens, torch.Tensor) or type(cache_seqlens) is int)
            and (block_table is None or isinstance(block_table, torch.Tensor))
            and ((k is None and v is None) or (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)))):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or (k is not None and (k.requires_grad or v.requires_grad))):
        return None
    try:
        # float32's tl.dot precision follows torch.get_float32_matmul_precision(): a setting, not a tensor
        return (causal, sm_scale, num_splits, dot_precision(q.dtype), tensor_signature(q), tensor_signature(k_cache),
                tensor_signature(v_cache),
                ("length", cache_seqlens) if type(cache_seqlens) is int else tensor_signature(cache_seqlens),
                None if block_table is None else tensor_signature(block_table),
                None if k is None else (tensor_signature(k), tensor_signature(v)))
    except RuntimeError:  # a tensor without strides (sparse, nested): the checks will say so
        return None


def relaunch_kvcache(plan: Hashable, q, k_cache, v_cache, k, v, cache_seqlens,
                     block_table) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(O, lse) of a call whose key is `plan`, by the launches `run_kvcache` remembered under it,
    without checks or Triton's dispatch; None, having done nothing, when none are remembered for
    the current device. Nothing is checked: `plan` must be the key these very arguments give."""
    remembered = _SPLITS.get(plan)
    if remembered is None:
        return None
    num_splits, causal, scale, lengths = remembered
    if not isinstance(cache_seqlens, torch.Tensor):  # an int, part of the key: the tensor made from it then
        cache_seqlens = lengths
    if not _PARTIAL.ready(plan) or (num_splits > 1 and not _COMBINE.ready(plan)):
        return None
    n_new = 0 if k is None else k.shape[2]
    if n_new:
        _append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    n_keys = _key_counts(cache_seqlens, n_new)
    batch, heads, n_q, head_dim = q.shape
    out = _empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    table = block_table if block_table is not None else n_keys
    if num_splits == 1:
        if _PARTIAL.relaunch(plan, q, k_cache, v_cache, out, lse, n_keys, table):
            return out, lse
    else:
        part = _empty((batch, heads, n_q, num_splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = _empty((batch, heads, n_q, num_splits), dtype=torch.float32, device=q.device)
        if _PARTIAL.relaunch(plan, q, k_cache, v_cache, part, part_lse, n_keys, table) and \
                _COMBINE.relaunch(plan, part, part_lse, out, lse):
            return out, lse
    # the plans were cleared since `ready` (another thread filled them): launch anew, the append done
    return run_kvcache(q, k_cache, v_cache, None, None, n_keys, block_table, causal, scale, num_splits)


__all__ = ["flash_attention_with_kvcache", "check_kvcache_inputs", "run_kvcache", "choose_num_splits",
           "resident_programs", "decode_tiles", "gpu_decode_tiles",
           "kvcache_call_key", "relaunch_kvcache"]
