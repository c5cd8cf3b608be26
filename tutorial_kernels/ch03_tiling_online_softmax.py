"""Chapter 3 — tiling and the online softmax: the two ideas FlashAttention is built from.

1. `matmul`: a tiled matrix product, written twice: with explicit pointer tiles and masks, and with
   tensor descriptors — the successor of the block pointers (`tl.make_block_ptr`, `tl.advance`) that
   Triton 3.9 removed. Each program owns one BLOCK_M × BLOCK_N tile of C and walks the K axis, so A
   and B are read from HBM in tiles that fit in SRAM and C is written once.
2. Softmax three ways over rows of any length:
   * three passes (chapter 2's `row_softmax`): find the max, sum the exponentials, write;
   * `online_softmax`: the max and the sum in ONE pass, rescaling the running sum whenever the
     running max grows (Milakov & Gimelshein 2018), then one pass to write;
   * `online_softmax_attention`: one block of queries attends to all keys, applying the same
     rescaling to the running output P·V, so neither S nor P ever reaches HBM. This is the core of
     FlashAttention (chapters 4 and 5 make it fast).

The online update, for a row split into tiles x⁽¹⁾, x⁽²⁾, …:

    m_t = max(m_{t−1}, max_j x⁽ᵗ⁾_j)
    l_t = l_{t−1} · e^{m_{t−1} − m_t} + Σ_j e^{x⁽ᵗ⁾_j − m_t}
    o_t = o_{t−1} · e^{m_{t−1} − m_t} + Σ_j e^{x⁽ᵗ⁾_j − m_t} v_j          (attention only)

and softmax(x) = e^{x − m_T} / l_T, attention output = o_T / l_T.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tutorial_kernels.ch02_naive_attention import row_softmax as three_pass_softmax
from tutorial_kernels.perf.descriptors import rows_describable, use_descriptor_scratch
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.precision import dot_precision, tiles_for
from tutorial_kernels.tiling import head_dim_block
from tutorial_kernels.validation import SUPPORTED_DTYPES, check_attention_inputs, check_out, check_triton_tensor


# --8<-- [start:tile_order]
@triton.jit
def _tile_coordinates(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Which tile (pid_m, pid_n) of C program `pid` computes, in grouped order.

    Consecutive programs take GROUP_M tiles down a column of C before moving right, so the B tiles
    they share are still in L2 when the next program asks for them (row-major order would stream
    all of B through L2 for every row of tiles).
    """
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    first_m = (pid // tiles_per_group) * GROUP_M
    group_rows = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    pid_m = first_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows
    return pid_m, pid_n
# --8<-- [end:tile_order]


# --8<-- [start:matmul_pointers]
@triton.jit
def _matmul_pointer_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """C = A B with explicit pointer tiles and masks: works for any sizes and strides."""
    pid_m, pid_n = _tile_coordinates(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BLOCK_M, BLOCK_K) addresses
    b_tile = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # (BLOCK_K, BLOCK_N) addresses

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # rows past M, columns past N and the ragged end of K load as 0 and add nothing
        a = tl.load(a_tile, mask=(offs_m[:, None] < M) & (k0 + offs_k[None, :] < K), other=0.0)
        b = tl.load(b_tile, mask=(k0 + offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)  # C_tile += A_tile B_tile on the tensor cores, float32 accumulator
        a_tile += BLOCK_K * stride_ak  # slide the A window right along K
        b_tile += BLOCK_K * stride_bk  # slide the B window down along K

    c_tile = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_tile, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
# --8<-- [end:matmul_pointers]


# --8<-- [start:matmul_descriptors]
@triton.jit
def _matmul_descriptor_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_bk, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """C = A B through tensor descriptors, the successor of block pointers (`tl.make_block_ptr`).

    A descriptor knows the whole matrix (shape, strides) and the tile shape; `desc.load([row, col])`
    fetches the tile at that offset and fills whatever lies outside the matrix with zeros, so no
    masks are written. On Hopper the load becomes one TMA bulk copy into shared memory.
    """
    pid_m, pid_n = _tile_coordinates(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([pid_m * BLOCK_M, k0])  # what make_block_ptr + tl.advance(…, (0, BLOCK_K)) did
        b = b_desc.load([k0, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))  # clipped at the edges
# --8<-- [end:matmul_descriptors]


def _matmul_configs() -> list[triton.Config]:
    if interpreter_active():  # the autotuner would run every config once per shape: keep one, small
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}, num_warps=4)]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in [
            (128, 256, 64, 8, 3),
            (256, 128, 64, 8, 3),
            (128, 128, 64, 8, 4),
            (128, 128, 64, 4, 4),
            (64, 128, 64, 4, 4),
            (64, 64, 64, 4, 4),
        ]
    ]


_matmul_pointer_tuned = triton.autotune(configs=_matmul_configs(), key=["M", "N", "K"])(_matmul_pointer_kernel)
_matmul_descriptor_tuned = triton.autotune(configs=_matmul_configs(), key=["M", "N", "K"])(_matmul_descriptor_kernel)


# --8<-- [start:matmul]
def matmul(a: torch.Tensor, b: torch.Tensor, *, method: str = "auto") -> torch.Tensor:
    """C = A B for 2-D A (M, K) and B (K, N) of one dtype (float16, bfloat16, float32); any sizes and strides.

    method: "descriptors" (tensor descriptors; needs row-major, 16-byte aligned rows), "pointers"
    (explicit pointer tiles; any layout), or "auto" (descriptors when the layout allows).
    On a GPU float32 operands are multiplied in TF32 on the tensor cores whatever torch's float32
    matmul setting (this chapter is about tensor-core tiles; the attention kernels follow the setting).
    """
    _check_matmul_inputs(a, b)
    if method not in ("auto", "descriptors", "pointers"):
        raise ValueError(f"method must be 'auto', 'descriptors' or 'pointers', got {method!r}")
    fits = rows_describable(a) and rows_describable(b)
    if method == "descriptors" and not fits:
        raise ValueError(
            "method='descriptors' needs a and b row-major with rows a multiple of 16 bytes, got strides "
            f"{a.stride()} and {b.stride()} for {a.dtype}; use method='pointers' or 'auto'"
        )
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    use_descriptors = method == "descriptors" or (method == "auto" and fits and rows_describable(c))
    if use_descriptors:
        if a.is_cuda:
            use_descriptor_scratch()  # for this thread; the kernel makes its descriptors in global memory
        _matmul_descriptor_tuned[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    else:
        _matmul_pointer_tuned[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
    return c
# --8<-- [end:matmul]


def _check_matmul_inputs(a: object, b: object) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name}.dtype must be torch.float16, torch.bfloat16 or torch.float32, got {t.dtype}")
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    if a.dtype != b.dtype:
        raise TypeError(f"b.dtype must equal a.dtype ({a.dtype}), got {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"b must be on a's device ({a.device}), got {b.device}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a's columns ({a.shape[1]}) must equal b's rows ({b.shape[0]})")
    if 0 in a.shape or 0 in b.shape:
        raise ValueError(f"a and b must be non-empty, got {tuple(a.shape)} and {tuple(b.shape)}")
    check_triton_tensor(a, "a")


# --8<-- [start:online_softmax_kernel]
@triton.jit
def _online_softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    """One row of softmax: running max and sum in one sweep, then one sweep to write."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    y_row = y_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)

    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)  # m_0 = −∞ (a scalar tensor)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)  # l_0 = 0
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))  # m_t = max(m_{t−1}, max_j x_j)
        # While every entry seen so far is −∞, m_new is −∞ too; shift by 0 instead so e^{−∞ − (−∞)}
        # (NaN) is never formed and the −∞ entries contribute e^{−∞} = 0.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)  # l_t = l_{t−1}·e^{m_{t−1}−m_t} + Σ e^{x_j−m_t}
        m = m_new

    shift = tl.where(m == float("-inf"), 0.0, m)
    inv_l = tl.where(l > 0.0, 1.0 / tl.maximum(l, 1e-30), 0.0)  # an all −∞ row becomes zeros
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(y_row + start + cols, (tl.exp(x - shift) * inv_l).to(y_ptr.dtype.element_ty), mask=mask)
# --8<-- [end:online_softmax_kernel]

SOFTMAX_BLOCK = 1024


def online_softmax(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis of a contiguous tensor, statistics gathered in one pass."""
    _check_rows(x)
    y = torch.empty_like(x) if out is None else check_out(out, "out", tuple(x.shape), x)
    n_cols = x.shape[-1]
    block = min(SOFTMAX_BLOCK, triton.next_power_of_2(n_cols))
    _online_softmax_kernel[(x.numel() // n_cols,)](x, y, n_cols, BLOCK=block)
    return y


def three_pass_softmax_rows(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Chapter 2's three-pass safe softmax, with the same input checks as `online_softmax`."""
    _check_rows(x)
    return three_pass_softmax(x, out=out)


def _check_rows(x: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x.dtype must be torch.float16, torch.bfloat16 or torch.float32, got {x.dtype}")
    if x.dim() < 1 or x.numel() == 0:
        raise ValueError(f"x must have at least one non-empty axis, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous (call .contiguous()), got strides {x.stride()}")
    check_triton_tensor(x, "x")


# --8<-- [start:attention_kernel]
@triton.jit
def _online_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, n_q, n_k, head_dim, sm_scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "tf32x3" or "tf32" for float32 operands: `precision.dot_precision`
):
    """BLOCK_M queries attend to all keys; S and P live in registers, one BLOCK_N tile at a time."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)  # 64-bit: batch · stride_qb passes 2³¹ on large inputs
    batch = pid_bh // n_heads
    head = pid_bh % n_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q = tl.load(
        q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim), other=0.0,
    )  # (BLOCK_M, BLOCK_D), loaded once, reused for every key tile
    k_head = k_ptr + batch * stride_kb + head * stride_kh
    v_head = v_ptr + batch * stride_vb + head * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running row sum of e^{s − m}
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # running un-normalised output
    for start_n in range(0, n_k, BLOCK_N):
        cols = start_n + offs_n
        k_t = tl.load(
            k_head + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn,
            mask=(offs_d[:, None] < head_dim) & (cols[None, :] < n_k), other=0.0,
        )  # (BLOCK_D, BLOCK_N)
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * sm_scale  # one tile of S, never stored
        visible = cols[None, :] < n_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))  # bottom-right aligned
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # m ← max(m, rowmax(S_tile))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp(m_i - shift)  # e^{m_old − m_new}: how much the old statistics shrink
        p = tl.exp(s - shift[:, None])  # P_tile, un-normalised
        l_i = l_i * alpha + tl.sum(p, axis=1)  # l ← l·α + rowsum(P_tile)
        v = tl.load(
            v_head + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=(cols[:, None] < n_k) & (offs_d[None, :] < head_dim), other=0.0,
        )  # (BLOCK_N, BLOCK_D)
        acc = acc * alpha[:, None]  # O ← O·α  (rescale what was summed under the old max)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # O ← O + P_tile V_tile
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # O = o_T / l_T; a query with no key keeps 0
    tl.store(
        o_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
        out.to(o_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim),
    )
# --8<-- [end:attention_kernel]


def online_softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(scale · Q Kᵀ) V with the online softmax: no N × N tensor is ever stored.

    Same contract as chapter 2's `naive_attention`: q (B, H, n_q, d), k and v (B, H, n_k, d), any
    strides, float16/bfloat16/float32, 16 ≤ d ≤ 128, causal masks aligned to the bottom-right.
    """
    shape = check_attention_inputs(q, k, v, causal, sm_scale)
    o = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else check_out(out, "out", tuple(q.shape), q)
    block_d = head_dim_block(shape.head_dim)
    tiles = tiles_for(q.dtype, shape.head_dim, BLOCK_M=64, BLOCK_N=64)  # smaller for full-precision float32
    grid = (triton.cdiv(shape.n_q, tiles["BLOCK_M"]), shape.batch * shape.heads)
    _online_attention_kernel[grid](
        q, k, v, o,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        shape.heads, shape.n_q, shape.n_k, shape.head_dim, shape.sm_scale,
        CAUSAL=causal, BLOCK_D=block_d, DOT_PRECISION=dot_precision(q.dtype), **tiles,
    )
    return o


# --8<-- [start:online_trace]
def online_softmax_trace(scores: torch.Tensor, values: torch.Tensor, block: int) -> list[dict]:
    """The online update for ONE row, step by step, in float64 PyTorch: the specification the kernels follow.

    scores: (n,) one row of S; values: (n,) one column of V. Returns one dict per tile with the
    tile's bounds, the running max m, the rescale factor α = e^{m_old − m_new}, the running sum l,
    the running output o and the normalised partial output o / l (equal to the exact answer after
    the last tile).
    """
    s, v = scores.double(), values.double()
    m, l, o = float("-inf"), 0.0, 0.0
    steps = []
    for start in range(0, s.numel(), block):
        tile, v_tile = s[start:start + block], v[start:start + block]
        m_new = max(m, tile.max().item())
        shift = 0.0 if m_new == float("-inf") else m_new
        alpha = 0.0 if m == float("-inf") else math.exp(m - shift)
        p = torch.exp(tile - shift)
        l = l * alpha + p.sum().item()
        o = o * alpha + (p * v_tile).sum().item()
        m = m_new
        steps.append(dict(start=start, stop=start + tile.numel(), m=m, alpha=alpha, l=l, o=o,
                          partial=o / l if l > 0 else 0.0))
    return steps
# --8<-- [end:online_trace]


__all__ = ["matmul", "online_softmax", "three_pass_softmax_rows", "online_softmax_attention", "online_softmax_trace"]
