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
schedule by `flash_v1_hbm_bytes`.

Public functions, with chapter 2's contract (q (B, H, n_q, d), k and v (B, H, n_k, d), any strides,
float16/bfloat16/float32, 16 ≤ d ≤ 128, bottom-right causal masks):

* `flash_attn_v1(q, k, v, causal=False, sm_scale=None, *, out=None) -> o`
* `flash_attn_v1_with_stats(...) -> (o, lse)` also returns the saved row statistic
  lse = m + log ℓ (float32, (B, H, n_q); −∞ for a query that sees no key), what a backward pass keeps.
* `flash_v1_timeline(...)` (GPU only) records which SM each program ran on, and when.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tutorial_kernels import timeline
from tutorial_kernels.runtime import interpreter_active
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
):
    """Algorithm 1 for one (batch, head): K/V tiles outside, Q tiles inside, O, ℓ, m in HBM."""
    if TRACE:
        started = timeline.program_start()
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
            first_m = (tl.maximum(start_n - (n_k - n_q), 0) // BLOCK_M) * BLOCK_M
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

            s = tl.dot(q, k_t) * sm_scale  # line 9: S_ij = τ Q_i K_jᵀ, on chip only
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

            pv = tl.dot(p.to(v.dtype), v)  # P̃_ij V_j, float32 accumulation
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
        timeline.program_end(trace_ptr, started)
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
    fastest at both. float32 tiles take twice the shared memory, and 256 float32 keys no longer fit.
    """
    if dtype == torch.float32:
        return {"block_m": 64, "block_n": 128, "num_warps": 4 if head_dim <= 64 else 8, "num_stages": 2}
    return {"block_m": 64, "block_n": 256, "num_warps": 4, "num_stages": 2}
# --8<-- [end:blocks]


def _check_block(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value > 256 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two between 16 and 256, got {value!r}")
    return value


# --8<-- [start:launch]
def flash_attn_v1_with_stats(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None, trace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-1 forward: (o, lse) with o = softmax(scale · Q Kᵀ) V and lse = log Σ_j e^{S_ij}.

    lse is float32 of shape (B, H, n_q), −∞ for a query that sees no key. block_m / block_n (powers
    of two, 16..256), num_warps and num_stages override `default_blocks`. trace, a (B·H, 3) buffer from
    `timeline.new_trace` (GPU only), receives each program's SM and start and end times.
    """
    shape = check_attention_inputs(q, k, v, causal, sm_scale)
    B, H, n_q, n_k, d = shape.batch, shape.heads, shape.n_q, shape.n_k, shape.head_dim
    o = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else check_out(out, "out", tuple(q.shape), q)
    config = default_blocks(d, q.dtype)
    block_m = _check_block("block_m", config["block_m"] if block_m is None else block_m)
    block_n = _check_block("block_n", config["block_n"] if block_n is None else block_n)

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
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        TRACE=trace is not None,
        num_warps=num_warps or config["num_warps"], num_stages=num_stages or config["num_stages"],
    )
    return o, lse


def flash_attn_v1(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
    *, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(scale · Q Kᵀ) V by FlashAttention-1's schedule; chapter 2's contract."""
    return flash_attn_v1_with_stats(q, k, v, causal, sm_scale, out=out)[0]
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
        first_m = (max(start_n - (n_k - n_q), 0) // block_m) * block_m if causal else 0
        visits += [(j, start_m // block_m) for start_m in range(first_m, n_q, block_m)]
    return visits
# --8<-- [end:schedule]


# --8<-- [start:hbm_model]
def flash_v1_hbm_bytes(
    batch: int, heads: int, n_q: int, n_k: int, head_dim: int, element_size: int,
    block_m: int, block_n: int, causal: bool = False,
) -> dict[str, int]:
    """Bytes this schedule reads and writes in HBM if no cache helps: every access of Algorithm 1 counted.

    init    writes O (float32), ℓ and m once: torch.zeros / torch.full before the launch;
    kernel  reads K and V once; on every visit (j, i) reads Q_i, O_i, ℓ_i, m_i and writes O_i, ℓ_i,
            m_i; at the end reads O, ℓ, m once more and writes o (input dtype) and lse.
    """
    b, f32 = element_size, 4
    d = head_dim
    rows_visited = 0  # Σ over visits of the Q tile's real rows (the masked tail moves nothing)
    for start_n in range(0, n_k, block_n):
        first_m = (max(start_n - (n_k - n_q), 0) // block_m) * block_m if causal else 0
        rows_visited += max(n_q - first_m, 0)
    per_head = {
        "init_write": n_q * (d + 2) * f32,
        "kernel_read": 2 * n_k * d * b  # K and V, once each
        + rows_visited * (d * b + d * f32 + 2 * f32)  # Q_i, O_i, ℓ_i, m_i on every visit
        + n_q * (d + 2) * f32,  # epilogue: O, ℓ, m
        "kernel_write": rows_visited * (d * f32 + 2 * f32)  # O_i, ℓ_i, m_i on every visit
        + n_q * (d * b + f32),  # epilogue: o and lse
    }
    return {key: batch * heads * value for key, value in per_head.items()}


def naive_kernel_bytes(batch: int, heads: int, n_q: int, n_k: int, head_dim: int, element_size: int) -> dict[str, int]:
    """Chapter 2's three kernels, each tensor moved once (its `naive_hbm_bytes`, split by kernel)."""
    bh, b, d = batch * heads, element_size, head_dim
    return {
        "_scores_kernel_read": bh * (n_q + n_k) * d * b, "_scores_kernel_write": bh * n_q * n_k * b,
        "_softmax_kernel_read": bh * n_q * n_k * b, "_softmax_kernel_write": bh * n_q * n_k * b,
        "_pv_kernel_read": bh * (n_q * n_k + n_k * d) * b, "_pv_kernel_write": bh * n_q * d * b,
    }
# --8<-- [end:hbm_model]


def theorem2_block_n(sram_bytes: int, head_dim: int, element_size: int) -> int:
    """Algorithm 1's B_c = ⌈M / 4d⌉ for on-chip memory M counted in elements of `element_size` bytes."""
    return math.ceil(sram_bytes / element_size / (4 * head_dim))


# --- where the programs ran (GPU only) --------------------------------------------------------------

def flash_v1_timeline(
    batch: int, heads: int, n: int, head_dim: int, causal: bool = False, dtype: torch.dtype = torch.float16,
    *, seed: int = 0,
) -> timeline.Timeline:
    """Run FlashAttention-1 once on random inputs and record, per program, its SM and start/end time.

    Needs a CUDA GPU (the recorder reads %smid and %globaltimer with inline assembly).
    """
    timeline.require_recording()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=gen, device="cuda", dtype=dtype) for _ in range(3))
    flash_attn_v1(q, k, v, causal)  # compile first: the recorded launch is a warm one
    trace = timeline.new_trace(batch * heads)
    flash_attn_v1_with_stats(q, k, v, causal, trace=trace)
    torch.cuda.synchronize()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    config = default_blocks(head_dim, dtype)
    return timeline.Timeline.from_trace(
        trace, f"FlashAttention-1, B·H = {batch * heads}", sm_count=sm_count,
        grid=batch * heads, batch=batch, heads=heads, n=n, head_dim=head_dim, causal=causal,
        dtype=str(dtype).removeprefix("torch."), **config,
    )


TIMELINE_SHAPES = [  # (batch, heads, n, head_dim): 8 programs, then enough to cover (almost) every SM
    (1, 8, 4096, 64),
    (4, 32, 4096, 64),
]


def record_timelines() -> dict:
    """The chapter's timeline experiment: B·H = 8 and B·H = 128 at N = 4096, d = 64, fp16."""
    runs = [flash_v1_timeline(*shape) for shape in TIMELINE_SHAPES]
    return {
        "description": "Chapter 4: where FlashAttention-1's programs ran (one per (batch, head)), fp16, not causal",
        "notes": ["One launch per timeline, after a warm-up launch of the same shape.",
                  "Times are %globaltimer stamps at each program's start and end, relative to the first start."],
        "timelines": [r.to_dict() for r in runs],
    }


# (block_m, block_n, num_warps, num_stages) timed per head dimension; `default_blocks` picked from them
TILE_CONFIGS = {
    64: [(64, 128, 4, 2), (64, 128, 8, 2), (64, 256, 4, 2), (64, 256, 8, 2), (128, 128, 8, 2), (128, 256, 8, 2),
         (32, 256, 4, 2), (64, 64, 4, 2), (64, 128, 4, 1), (64, 128, 4, 3)],
    128: [(64, 128, 4, 2), (64, 128, 8, 2), (64, 256, 4, 2), (64, 256, 8, 2), (128, 128, 8, 2), (32, 128, 4, 2),
          (64, 64, 4, 2), (64, 128, 8, 1), (64, 128, 8, 3)],
}


def time_tile_configs(lengths: tuple[int, ...] = (2048, 16384)) -> dict:
    """Time every configuration of TILE_CONFIGS (fp16, not causal, B·N = 16384, H·d = 2048) on this GPU."""
    import triton.testing

    from tutorial_kernels.reference import reference_attention, relative_error

    rows = []
    for head_dim, configs in TILE_CONFIGS.items():
        for n in lengths:
            batch, heads = 16384 // n, 2048 // head_dim
            gen = torch.Generator(device="cuda").manual_seed(n + head_dim)
            q, k, v = (torch.randn(batch, heads, n, head_dim, generator=gen, device="cuda", dtype=torch.float16)
                       for _ in range(3))
            ref = reference_attention(q[:1, :1], k[:1, :1], v[:1, :1])
            for block_m, block_n, num_warps, num_stages in configs:
                def call():
                    return flash_attn_v1_with_stats(q, k, v, block_m=block_m, block_n=block_n,
                                                    num_warps=num_warps, num_stages=num_stages)[0]
                err = relative_error(call()[:1, :1], ref)
                ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
                rows.append(dict(head_dim=head_dim, n=n, batch=batch, heads=heads, block_m=block_m, block_n=block_n,
                                 num_warps=num_warps, num_stages=num_stages, ms=ms, rel_err_head0=err,
                                 tflops=4.0 * batch * heads * n * n * head_dim / (ms * 1e-3) / 1e12,
                                 default=gpu_blocks(head_dim) == dict(block_m=block_m, block_n=block_n,
                                                                      num_warps=num_warps, num_stages=num_stages)))
                print(f"d={head_dim:3} N={n:5} {block_m:3}×{block_n:3} warps={num_warps} stages={num_stages}: "
                      f"{ms:8.3f} ms {rows[-1]['tflops']:6.1f} TFLOP/s err {err:.1e}", flush=True)
    return {
        "description": "Chapter 4: FlashAttention-1 tile configurations, fp16, not causal, B·N = 16384, H·d = 2048",
        "notes": ["triton.testing.do_bench median (warmup 25 ms, rep 100 ms), after one checked call."],
        "tiles": rows,
    }


EXPERIMENTS = {  # name → (function, default data file)
    "timeline": (record_timelines, "ch04_timeline.json"),
    "tiles": (time_tile_configs, "ch04_tiles.json"),
}


def main(argv: list[str] | None = None) -> None:
    """`python -m tutorial_kernels.ch04_flash_v1 {timeline,tiles} [--out PATH]` → data/ch04_<name>.json."""
    import argparse
    import json
    import sys
    from pathlib import Path

    from tutorial_kernels.bench import DATA_DIR, provenance

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.ch04_flash_v1")
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--out", type=Path, help="JSON file to write (default: data/ch04_<experiment>.json)")
    args = parser.parse_args(argv)
    if (reason := timeline.unavailable_reason()) is not None:
        parser.error(f"{args.experiment} runs on a CUDA GPU only; here {reason}")
    function, default_file = EXPERIMENTS[args.experiment]
    out = args.out or DATA_DIR / default_file
    results = function()
    info = provenance(f"ch04-{args.experiment}", argv)
    info["command"] = " ".join(["python -m tutorial_kernels.ch04_flash_v1", *argv])
    if args.experiment == "timeline":
        info["timing"] = "per-program %globaltimer stamps (ns) read with inline PTX; one launch per timeline"
    info.pop("peak_extra_memory", None)
    data = {"description": results.pop("description"), "notes": results.pop("notes"), "provenance": info,
            "results": [], **results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    for run in data.get("timelines", []):
        print(f"{run['label']:40} {len(run['sm']):4} programs on {len(set(run['sm'])):3} SMs, "
              f"{max(run['end_ns']) / 1e3:9.1f} µs")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()


__all__ = [
    "flash_attn_v1",
    "flash_attn_v1_with_stats",
    "default_blocks",
    "gpu_blocks",
    "flash_v1_schedule",
    "flash_v1_hbm_bytes",
    "naive_kernel_bytes",
    "theorem2_block_n",
    "flash_v1_timeline",
]
