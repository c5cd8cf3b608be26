"""Chapter 4 — FlashAttention-1: Algorithm 1 of Dao et al. (2022), with its loop order.

One program per (batch, head). The program walks the tiles of K and V in its OUTER loop and, for
each of them, every tile of Q in its INNER loop. The running output O, row sums ℓ and row maxima m
live in HBM, not on chip: each inner step reads O_i, ℓ_i, m_i, applies the online-softmax update of
chapter 3 with tile (i, j), and writes them back, keeping O_i normalised as Algorithm 1 does:

    m̃ = rowmax(S_ij)        P̃ = e^{S_ij − m̃}          ℓ̃ = rowsum(P̃)
    m_new = max(m_i, m̃)     ℓ_new = e^{m_i − m_new} ℓ_i + e^{m̃ − m_new} ℓ̃
    O_i ← diag(ℓ_new)⁻¹ (diag(ℓ_i) e^{m_i − m_new} O_i + e^{m̃ − m_new} P̃ V_j)

S and P never reach HBM (chapter 2's 4N² elements are gone), but Q, O, ℓ and m make one round trip
per K/V tile: Θ(N² d² / M) traffic for on-chip memory M (Theorem 2), counted exactly for this
schedule by `instruments.hbm_model.flash_v1_hbm_bytes`.

Public functions, with chapter 2's contract (q (B, H, n_q, d), k and v (B, H, n_k, d), any strides,
float16/bfloat16/float32, 16 ≤ d ≤ 128, bottom-right causal masks):

* `flash_attn_v1(q, k, v, causal=False, sm_scale=None, *, out=None) -> o`
* `flash_attn_v1_with_lse(...) -> (o, lse)` also returns the saved row statistic
  lse = m + log ℓ (float32, (B, H, n_q); −∞ for a query that sees no key), what a backward pass keeps.
* `flash_v1_schedule(...)`: the (K/V tile, Q tile) pairs one program visits, in order.

`instruments.timeline.flash_v1_timeline` records which SM each program ran on, and when (GPU only).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tutorial_kernels import recorder
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.precision import dot_precision, full_float32, full_float32_tiles
from tutorial_kernels.tiling import causal_query_stages, head_dim_block, query_stages
from tutorial_kernels.validation import check_attention_inputs, check_out


@triton.jit
def _finite_or_zero(x):
    """The shift to subtract before exponentiating: x itself, or 0 where x = −∞ (nothing visible yet),
    so that e^{−∞ − (−∞)} = NaN is never formed (chapter 3's guard)."""
    return tl.where(x == float("-inf"), 0.0, x)


# --8<-- [start:kernel_head]
@triton.jit
def _flash_v1_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,  # inputs (B, H, n, d), any strides; the output, in the inputs' dtype
    acc_ptr, l_ptr, m_ptr,  # Algorithm 1's state in HBM: O (B·H, n_q, d), ℓ and m (B·H, n_q), float32
    lse_ptr, trace_ptr,  # out: lse (B, H, n_q) float32; (B·H, 3) int64 timeline rows when TRACE
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, n_q, n_k, head_dim, sm_scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    TRACE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "tf32x3" or "tf32" for float32 operands: `precision.dot_precision`
):
    """Algorithm 1 for one (batch, head): K/V tiles outside, Q tiles inside, O, ℓ, m in HBM."""
    if TRACE:
        started = recorder.program_start()
    pid_bh = tl.program_id(0).to(tl.int64)  # one program per (batch, head); 64-bit offsets below
    batch = pid_bh // n_heads
    head = pid_bh % n_heads
    q_head = q_ptr + batch * stride_qb + head * stride_qh
    k_head = k_ptr + batch * stride_kb + head * stride_kh
    v_head = v_ptr + batch * stride_vb + head * stride_vh
    # This head's slice of the state. No other program reads or writes it, so programs never race.
    acc_head = acc_ptr + pid_bh * n_q * head_dim
    l_head = l_ptr + pid_bh * n_q
    m_head = m_ptr + pid_bh * n_q
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim  # BLOCK_D is head_dim rounded up to a power of two
# --8<-- [end:kernel_head]

# --8<-- [start:outer_loop]
    for start_n in range(0, n_k, BLOCK_N):  # line 5: for 1 ≤ j ≤ T_c
        cols = start_n + offs_n
        k_t = tl.load(
            k_head + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn,
            mask=d_ok[:, None] & (cols[None, :] < n_k), other=0.0,
        )  # line 6: load K_j (as K_jᵀ, (BLOCK_D, BLOCK_N)); it stays on chip for the whole inner loop
        v = tl.load(
            v_head + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=(cols[:, None] < n_k) & d_ok[None, :], other=0.0,
        )  # line 6: load V_j, (BLOCK_N, BLOCK_D)
        first_m = 0
        if CAUSAL:
            # Query i sees key j when j ≤ i + (n_k − n_q). The first query that sees key start_n is
            # start_n − (n_k − n_q); Q tiles that end before it would see only −∞: skip them.
            first_m, _ = causal_query_stages(start_n, n_q, n_k, BLOCK_N, BLOCK_M)
        for start_m in range(first_m, n_q, BLOCK_M):  # line 7: for 1 ≤ i ≤ T_r
# --8<-- [end:outer_loop]
# --8<-- [start:inner_step]
            rows = start_m + offs_m
            row_ok = rows < n_q
            tile_ok = row_ok[:, None] & d_ok[None, :]
            # line 8: load Q_i, O_i, ℓ_i, m_i from HBM
            q = tl.load(q_head + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=tile_ok, other=0.0)
            o_i = tl.load(acc_head + rows[:, None] * head_dim + offs_d[None, :], mask=tile_ok, other=0.0)
            l_i = tl.load(l_head + rows, mask=row_ok, other=0.0)
            m_i = tl.load(m_head + rows, mask=row_ok, other=float("-inf"))

            s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * sm_scale  # line 9: S_ij = τ Q_i K_jᵀ, on chip only
            visible = cols[None, :] < n_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + (n_k - n_q))  # bottom-right aligned
            s = tl.where(visible, s, float("-inf"))

            m_tile = tl.max(s, axis=1)  # line 10: m̃_ij = rowmax(S_ij)
            p = tl.exp(s - _finite_or_zero(m_tile)[:, None])  # line 10: P̃_ij = e^{S_ij − m̃_ij}
            l_tile = tl.sum(p, axis=1)  # line 10: ℓ̃_ij = rowsum(P̃_ij)

            m_new = tl.maximum(m_i, m_tile)  # line 11: m_new = max(m_i, m̃_ij)
            shift = _finite_or_zero(m_new)
            alpha = tl.exp(m_i - shift)  # e^{m_i − m_new}: shrinks what was summed under the old max
            beta = tl.exp(m_tile - shift)  # e^{m̃_ij − m_new}: brings this tile to the new max
            l_new = alpha * l_i + beta * l_tile  # line 11: ℓ_new = e^{m_i − m_new} ℓ_i + e^{m̃ − m_new} ℓ̃

            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)  # P̃_ij V_j, float32 accumulation
            o_i = (l_i * alpha)[:, None] * o_i + beta[:, None] * pv  # diag(ℓ_i) e^{m_i − m_new} O_i + e^{…} P̃ V
            o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]  # line 12: × diag(ℓ_new)⁻¹ (0 stays 0)

            tl.store(acc_head + rows[:, None] * head_dim + offs_d[None, :], o_i, mask=tile_ok)  # line 12: write O_i
            tl.store(l_head + rows, l_new, mask=row_ok)  # line 13: write ℓ_i ← ℓ_new
            tl.store(m_head + rows, m_new, mask=row_ok)  # line 13: write m_i ← m_new
            # The next visit to this Q tile may load an element in another thread than the one that
            # stored it: a barrier makes every thread's stores visible to the whole program first.
            tl.debug_barrier()
# --8<-- [end:inner_step]

# --8<-- [start:epilogue]
    # line 16: return O. O is already normalised; round it to the output dtype once, and keep one
    # number per query, lse = m + log ℓ, which is all a backward pass needs of the softmax.
    for start_m in range(0, n_q, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < n_q
        tile_ok = row_ok[:, None] & d_ok[None, :]
        o_i = tl.load(acc_head + rows[:, None] * head_dim + offs_d[None, :], mask=tile_ok, other=0.0)
        tl.store(
            o_ptr + batch * stride_ob + head * stride_oh + rows[:, None] * stride_om + offs_d[None, :] * stride_od,
            o_i.to(o_ptr.dtype.element_ty), mask=tile_ok,
        )
        l_i = tl.load(l_head + rows, mask=row_ok, other=0.0)
        m_i = tl.load(m_head + rows, mask=row_ok, other=float("-inf"))
        lse = tl.where(l_i > 0.0, m_i + tl.log(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))  # no key: −∞
        tl.store(lse_ptr + pid_bh * n_q + rows, lse, mask=row_ok)
    if TRACE:
        recorder.program_end(trace_ptr, started)
# --8<-- [end:epilogue]


# --8<-- [start:blocks]
def default_blocks(head_dim: int, dtype: torch.dtype = torch.float16) -> dict:
    """Tile sizes and warps for a head dimension and input dtype (under the interpreter: 64 × 64)."""
    if interpreter_active():  # cost ∝ programs × loop steps: large tiles, few steps
        return {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 1}
    return gpu_blocks(head_dim, dtype)


def gpu_blocks(head_dim: int, dtype: torch.dtype = torch.float16) -> dict:
    """The GPU configuration.

    Algorithm 1 sets B_c = ⌈M / 4d⌉ keys and B_r = min(B_c, d) queries per tile, M being the on-chip
    memory in elements: the four tiles K_j, V_j, Q_i, O_i then fill it. B_c sets how many times Q and O
    travel (T_c = ⌈N / B_c⌉), so it should be as large as the chip allows. On an H100 (M ≈ 116k fp16
    elements) that is 454 keys at d = 64 and 227 at d = 128; Triton tiles are powers of two, and of the
    configurations timed on an H100 (data/ch04_tiles.json) 64 queries × 256 keys with 4 warps was the
    fastest at both. float32 tiles take twice the shared memory, and 256 float32 keys no longer fit;
    float32 in full precision (three TF32 products) takes `precision.full_float32_tiles`.
    """
    if full_float32(dtype):
        return {name.lower(): value for name, value in full_float32_tiles(head_dim).items()}
    if dtype == torch.float32:
        return {"block_m": 64, "block_n": 128, "num_warps": 4 if head_dim <= 64 else 8, "num_stages": 2}
    return {"block_m": 64, "block_n": 256, "num_warps": 4, "num_stages": 2}
# --8<-- [end:blocks]


def _check_block(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value > 256 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two between 16 and 256, got {value!r}")
    return value


# --8<-- [start:launch]
def flash_attn_v1_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None, trace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-1 forward: (o, lse) with o = softmax(scale · Q Kᵀ) V and lse = log Σ_j e^{S_ij}.

    lse is float32 of shape (B, H, n_q), −∞ for a query that sees no key. block_m / block_n (powers
    of two, 16..256), num_warps and num_stages override `default_blocks`. trace, a (B·H, 3) buffer from
    `recorder.new_trace` (GPU only), receives each program's SM and start and end times.
    """
    shape = check_attention_inputs(q, k, v, causal, sm_scale)
    B, H, n_q, n_k, d = shape.batch, shape.heads, shape.n_q, shape.n_k, shape.head_dim
    o = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else check_out(out, "out", tuple(q.shape), q)
    config = default_blocks(d, q.dtype)
    block_m = _check_block("block_m", config["block_m"] if block_m is None else block_m)
    block_n = _check_block("block_n", config["block_n"] if block_n is None else block_n)
    if trace is not None:
        recorder.check_trace(trace, B * H, q.device)

    # Lines 1–4 of Algorithm 1: O = 0, ℓ = 0, m = −∞, in HBM. O is kept in float32, not in the output
    # dtype: it is rewritten after every K/V tile, and rounding it to 16 bits T_c times would add
    # T_c rounding errors (the original CUDA code kept a float32 O too, when keys took several tiles).
    acc = torch.zeros((B * H, n_q, d), dtype=torch.float32, device=q.device)
    l = torch.zeros((B * H, n_q), dtype=torch.float32, device=q.device)
    m = torch.full((B * H, n_q), float("-inf"), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)

    _flash_v1_kernel[(B * H,)](  # grid: one program per (batch, head), B·H programs in all
        q, k, v, o, acc, l, m, lse, trace,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, n_q, n_k, d, shape.sm_scale,
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=head_dim_block(d),
        TRACE=trace is not None, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps or config["num_warps"], num_stages=num_stages or config["num_stages"],
    )
    return o, lse


def flash_attn_v1(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(scale · Q Kᵀ) V by FlashAttention-1's schedule; chapter 2's contract."""
    return flash_attn_v1_with_lse(q, k, v, causal, sm_scale, out=out)[0]
# --8<-- [end:launch]


# --- the schedule, counted -----------------------------------------------------------------------

# --8<-- [start:schedule]
def flash_v1_schedule(n_q: int, n_k: int, block_m: int, block_n: int, causal: bool = False) -> list[tuple[int, int]]:
    """The (j, i) tile pairs one program visits, in order: K/V tile j outside, Q tile i inside.

    With `causal`, Q tiles that lie entirely above the diagonal for K/V tile j are skipped, exactly
    as the kernel's inner loop starts at `first_m`.
    """
    visits = []
    for j, start_n in enumerate(range(0, n_k, block_n)):
        first_m = query_stages(start_n, n_q, n_k, block_n, block_m)[0] if causal else 0
        visits += [(j, start_m // block_m) for start_m in range(first_m, n_q, block_m)]
    return visits
# --8<-- [end:schedule]


def theorem2_block_n(sram_bytes: int, head_dim: int, element_size: int) -> int:
    """Algorithm 1's B_c = ⌈M / 4d⌉ for on-chip memory M counted in elements of `element_size` bytes."""
    return math.ceil(sram_bytes / element_size / (4 * head_dim))


__all__ = ["flash_attn_v1", "flash_attn_v1_with_lse", "default_blocks", "gpu_blocks", "flash_v1_schedule",
           "theorem2_block_n"]
