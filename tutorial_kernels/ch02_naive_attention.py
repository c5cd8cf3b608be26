"""Chapter 2 — naive attention: the schedule that FlashAttention exists to beat.

Two implementations of O = softmax(scale · Q Kᵀ) V, both of which store the full n_q × n_k score
matrix S and probability matrix P in HBM:

1. `eager_attention`: a few lines of PyTorch, the "eager SDPA" of the ROCm blog that the
   benchmark chapter compares against (each line is a separate kernel launched by PyTorch).
2. `naive_attention`: the same schedule written as three Triton kernels, so that every byte it
   moves is visible:

       _scores_kernel   S = scale · Q Kᵀ   reads Q, K        writes S   (n_q·n_k elements)
       _softmax_kernel  P = softmax(S)     reads S           writes P   (n_q·n_k elements)
       _pv_kernel       O = P V            reads P, V        writes O

   Per head that is Θ(n_q·n_k) HBM traffic for S and P against Θ((n_q + n_k)·d) for Q, K, V and O,
   which is why naive attention is limited by memory bandwidth, not arithmetic, once n ≫ d.

Dtype convention: S and P are stored in the input dtype, as eager PyTorch does; every dot product
and every softmax sum accumulates in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tutorial_kernels.precision import dot_precision, tiles_for
from tutorial_kernels.reference import causal_mask
from tutorial_kernels.tiling import head_dim_block
from tutorial_kernels.validation import check_attention_inputs, check_out, check_triton_tensor


# --8<-- [start:eager]
def eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """softmax(scale · Q Kᵀ) V in plain PyTorch; every intermediate is a full tensor in memory."""
    shape = check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=256, runs_triton=False)
    # Scale and mask in place (the ROCm blog masks in place too): one N² buffer instead of three.
    scores = (q @ k.transpose(-2, -1)).mul_(shape.sm_scale)  # (B, H, n_q, n_k): the first N² tensor
    if causal:
        visible = causal_mask(shape.n_q, shape.n_k, q.device)  # (n_q, n_k), bottom-right aligned
        scores.masked_fill_(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # (B, H, n_q, n_k): the second N² tensor
    if causal and shape.n_q > shape.n_k:
        # The first n_q − n_k queries see no key: softmax of an all −∞ row is NaN; define it as 0.
        probs = probs.nan_to_num(0.0)
    return probs @ v  # (B, H, n_q, d)
# --8<-- [end:eager]


# --8<-- [start:scores_kernel]
@triton.jit
def _scores_kernel(
    q_ptr, k_ptr, s_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    n_heads, n_q, n_k, head_dim, sm_scale,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "tf32x3" or "tf32" for float32 operands: `precision.dot_precision`
):
    """One program computes one BLOCK_M × BLOCK_N tile of S = scale · Q Kᵀ for one (batch, head)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2).to(tl.int64)  # 64-bit: batch · stride_qb passes 2³¹ on large inputs
    batch = pid_bh // n_heads
    head = pid_bh % n_heads

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this tile
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # key columns of this tile
    offs_d = tl.arange(0, BLOCK_D)  # BLOCK_D = head_dim rounded up to a power of two; the rest is masked

    q_tile_ptr = q_ptr + batch * stride_qb + head * stride_qh
    q = tl.load(
        q_tile_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_D)
    # K is loaded already transposed, (BLOCK_D, BLOCK_N), so the tile product is a plain dot.
    k_tile_ptr = k_ptr + batch * stride_kb + head * stride_kh
    k_t = tl.load(
        k_tile_ptr + offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kn,
        mask=(offs_d[:, None] < head_dim) & (offs_n[None, :] < n_k),
        other=0.0,
    )  # (BLOCK_D, BLOCK_N)

    s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * sm_scale  # S_ij = scale · q_i · k_j, accumulated in float32
    if CAUSAL:
        # bottom-right alignment: key j is visible to query i when j ≤ i + (n_k − n_q)
        visible = offs_n[None, :] <= offs_m[:, None] + (n_k - n_q)
        s = tl.where(visible, s, float("-inf"))

    # S is contiguous (B·H, n_q, n_k). It passes 2³¹ elements at long sequences (and one head's
    # slab does once n_q·n_k ≥ 2³¹), so every offset into it is computed in 64-bit integers.
    s_head_ptr = s_ptr + pid_bh * n_q * n_k
    tl.store(
        s_head_ptr + offs_m[:, None].to(tl.int64) * n_k + offs_n[None, :],
        s.to(s_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < n_q) & (offs_n[None, :] < n_k),
    )
# --8<-- [end:scores_kernel]


# --8<-- [start:softmax_kernel]
@triton.jit
def _softmax_kernel(s_ptr, p_ptr, n_cols, BLOCK: tl.constexpr):
    """One program turns one row of S into one row of P, in three passes over the row.

    Safe softmax: P_ij = exp(S_ij − m_i) / Σ_j exp(S_ij − m_i) with m_i = max_j S_ij, so that no
    exponent is positive and nothing overflows. The row may be longer than BLOCK, so each pass
    walks it in chunks: pass 1 finds m_i, pass 2 sums the exponentials, pass 3 writes P.
    """
    row = tl.program_id(0).to(tl.int64)  # rows · n_cols exceeds 2³¹ at long sequences
    s_row_ptr = s_ptr + row * n_cols
    p_row_ptr = p_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)

    # Pass 1: m_i = max_j S_ij, kept as BLOCK running maxima and reduced once at the end.
    running_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_row_ptr + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_max = tl.maximum(running_max, x.to(tl.float32))
    row_max = tl.max(running_max, axis=0)
    # A fully masked row (causal, n_q > n_k) has m_i = −∞ and would compute exp(−∞ − (−∞)) = NaN.
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)

    # Pass 2: l_i = Σ_j exp(S_ij − m_i).
    running_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_row_ptr + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_sum += tl.exp(x.to(tl.float32) - row_max)
    row_sum = tl.sum(running_sum, axis=0)
    # A row that sees no key has l_i = 0: scale by 0 instead of dividing by it, so the row becomes zeros.
    inv_sum = tl.where(row_sum > 0.0, 1.0 / tl.maximum(row_sum, 1e-30), 0.0)

    # Pass 3: P_ij = exp(S_ij − m_i) / l_i.
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(s_row_ptr + start + cols, mask=mask, other=float("-inf"))
        p = tl.exp(x.to(tl.float32) - row_max) * inv_sum
        tl.store(p_row_ptr + start + cols, p.to(p_ptr.dtype.element_ty), mask=mask)
# --8<-- [end:softmax_kernel]


# --8<-- [start:pv_kernel]
@triton.jit
def _pv_kernel(
    p_ptr, v_ptr, o_ptr,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, n_q, n_k, head_dim,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "tf32x3" or "tf32" for float32 operands: `precision.dot_precision`
):
    """One program computes BLOCK_M full rows of O = P V, walking the key axis in BLOCK_N steps."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets, as in _scores_kernel
    batch = pid_bh // n_heads
    head = pid_bh % n_heads

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    p_rows_ptr = p_ptr + pid_bh * n_q * n_k + offs_m[:, None].to(tl.int64) * n_k  # P is contiguous
    v_head_ptr = v_ptr + batch * stride_vb + head * stride_vh

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, n_k, BLOCK_N):
        cols = start_n + offs_n
        p = tl.load(p_rows_ptr + cols[None, :], mask=(offs_m[:, None] < n_q) & (cols[None, :] < n_k), other=0.0)
        v = tl.load(
            v_head_ptr + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=(cols[:, None] < n_k) & (offs_d[None, :] < head_dim),
            other=0.0,
        )  # (BLOCK_N, BLOCK_D)
        acc = tl.dot(p, v, acc, input_precision=DOT_PRECISION)  # O_i += P_ij V_j, float32 accumulator

    o_head_ptr = o_ptr + batch * stride_ob + head * stride_oh
    tl.store(
        o_head_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
        acc.to(o_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim),
    )
# --8<-- [end:pv_kernel]


# Tile sizes. 64 × 64 tiles keep the interpreter fast on a laptop and are a fair, untuned baseline
# on a GPU; later chapters tune theirs.
BLOCK_M = 64
BLOCK_N = 64
SOFTMAX_BLOCK = 1024


# --8<-- [start:stages]
def attention_scores(
    q: torch.Tensor, k: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stage 1: S = scale · Q Kᵀ, (B, H, n_q, n_k) in q's dtype, −∞ where the causal mask hides a key."""
    shape = check_attention_inputs(q, k, k, causal, sm_scale)
    B, H, n_q, n_k, d = shape.batch, shape.heads, shape.n_q, shape.n_k, shape.head_dim
    s_shape = (B, H, n_q, n_k)
    s = torch.empty(s_shape, dtype=q.dtype, device=q.device) if out is None else check_out(out, "out", s_shape, q)
    tiles = tiles_for(q.dtype, d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)  # smaller for full-precision float32
    grid = (triton.cdiv(n_q, tiles["BLOCK_M"]), triton.cdiv(n_k, tiles["BLOCK_N"]), B * H)
    _scores_kernel[grid](
        q, k, s,
        *q.stride(), *k.stride(),
        H, n_q, n_k, d, shape.sm_scale,
        CAUSAL=causal, BLOCK_D=head_dim_block(d), DOT_PRECISION=dot_precision(q.dtype), **tiles,
    )
    return s


def row_softmax(s: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Stage 2: P = softmax(S) over the last axis; a row that is all −∞ becomes all zeros."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"s must be a torch.Tensor, got {type(s).__name__}")
    if s.dim() < 1 or s.numel() == 0 or not s.is_contiguous():
        raise ValueError(f"s must be non-empty and contiguous, got shape {tuple(s.shape)}, strides {s.stride()}")
    check_triton_tensor(s, "s")
    p = torch.empty_like(s) if out is None else check_out(out, "out", tuple(s.shape), s)
    n_cols = s.shape[-1]
    n_rows = s.numel() // n_cols
    _softmax_kernel[(n_rows,)](s, p, n_cols, BLOCK=min(SOFTMAX_BLOCK, triton.next_power_of_2(n_cols)))
    return p


def probs_times_values(
    p: torch.Tensor, v: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Stage 3: O = P V, (B, H, n_q, head_dim) in v's dtype."""
    for name, t in (("p", p), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D torch.Tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if p.device != v.device:
        raise ValueError(f"p must be on v's device ({v.device}), got {p.device}")
    check_triton_tensor(v, "v")
    B, H, n_k, d = v.shape
    n_q = p.shape[2]
    if not p.is_contiguous() or tuple(p.shape) != (B, H, n_q, n_k) or p.dtype != v.dtype:
        raise ValueError(
            f"p must be a contiguous ({B}, {H}, n_q, {n_k}) tensor of dtype {v.dtype}, "
            f"got shape {tuple(p.shape)}, dtype {p.dtype}"
        )
    o_shape = (B, H, n_q, d)
    o = torch.empty(o_shape, dtype=v.dtype, device=v.device) if out is None else check_out(out, "out", o_shape, v)
    tiles = tiles_for(v.dtype, d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)  # smaller for full-precision float32
    grid = (triton.cdiv(n_q, tiles["BLOCK_M"]), B * H)
    _pv_kernel[grid](
        p, v, o,
        *v.stride(), *o.stride(),
        H, n_q, n_k, d,
        BLOCK_D=head_dim_block(d), DOT_PRECISION=dot_precision(v.dtype), **tiles,
    )
    return o
# --8<-- [end:stages]


# --8<-- [start:naive_attention]
def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(scale · Q Kᵀ) V through three kernels, with S and P materialised in HBM.

    q: (B, H, n_q, d); k, v: (B, H, n_k, d); any strides; float16, bfloat16 or float32; 16 ≤ d ≤ 128.
    Causal masks are aligned to the bottom-right (see `tutorial_kernels.reference`).
    """
    shape = check_attention_inputs(q, k, v, causal, sm_scale)
    if out is not None:
        check_out(out, "out", tuple(q.shape), q)
    s = attention_scores(q, k, causal, shape.sm_scale)  # HBM: write n_q·n_k elements per head
    p = row_softmax(s)  # HBM: read S, write P
    del s  # give S's memory back before the third kernel, as eager PyTorch would
    return probs_times_values(p, v, out=out)  # HBM: read P and V, write O
# --8<-- [end:naive_attention]


def naive_hbm_bytes(batch: int, heads: int, n_q: int, n_k: int, head_dim: int, element_size: int) -> int:
    """Bytes the three kernels must move at the least: Q, K, V read, S written and read, P written and read, O written."""
    qkvo = (2 * n_q + 2 * n_k) * head_dim  # read Q, K (stage 1) and V (stage 3), write O
    scores_and_probs = 4 * n_q * n_k  # write S, read S, write P, read P
    return batch * heads * (qkvo + scores_and_probs) * element_size


__all__ = [
    "eager_attention",
    "naive_attention",
    "attention_scores",
    "row_softmax",
    "probs_times_values",
    "naive_hbm_bytes",
]
