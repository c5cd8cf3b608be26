"""Lab 6: write the backward pass's Δ and the dQ kernel's inner update (chapter 6).

The lab gives two kernels: `_lab_delta_kernel` (chapter 6's preprocess kernel, one head at a time) and
`_lab_dq_kernel` (chapter 6's dQ kernel: one program per query tile, a loop over key tiles in the
forward's two causal stages, dQ = τ · Σ_j dS_j K_j stored at the end). The learner writes the three
`@triton.jit` helpers they call, one step each:

    ch06.delta       Δ_i = rowsum(dO_i ∘ O_i), one float32 number per query row
    ch06.recompute_p P = exp(τ S − lse) from the saved log-sum-exp (log₂ units), 0 where the mask hides a key
    ch06.dq          dP = dO Vᵀ, dS = P ∘ (dP − Δ), dQ ← dQ + dS K

Each step has a skeleton (`*_skeleton`: placeholders that fail the grader) and its solution (the
chapter's own lines: `_attn_bwd_preprocess_kernel`'s Δ and `_dq_from_key_tiles`' loop body). The
gradient steps are graded against float64 autograd of the reference attention, with O, the
log-sum-exp and Δ given in float64 (rounded as the forward stores them), so that only the step's own
lines are tested. `tutorial_kernels.labs.check("ch06.<step>", fn)` grades a learner's helper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from tutorial_kernels.labs import capstone
from tutorial_kernels.labs.gradients import (SEED, GradAttempt, describe, dq_autograd64, draw_backward,
                                             grade_backward)
from tutorial_kernels.labs.steps import (DTYPES, AttentionCase, Failure, Mistake, Step, attention_cases, check_slack,
                                         recognised, sm_scale, with_slack)
from tutorial_kernels.precision import dot_precision
from tutorial_kernels.reference import (
    causal_mask, expand_kv_heads, reference_attention, reference_log_sum_exp, reference_scores)
from tutorial_kernels.runtime import default_device
from tutorial_kernels.tiling import LOG2_E, causal_key_stages, head_dim_block, key_stages, to_log2_units
from tutorial_kernels.tolerances import grad_tolerance, tolerance

NOTEBOOK = "06_backward_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
BLOCK_M = 16  # small tiles: 70 queries or keys are five tiles, the last one ragged
BLOCK_N = 16
# One query against 17 keys, not one against one: with a single key P = 1 and dQ = 0 whatever the lines.
# The square case comes first: there a strict causal mask (c < r) already fails, and alignment does not.
DQ_LENGTHS = ((17, 17), (1, 17), (70, 70), (17, 70), (70, 17))


# --- the kernels the lab provides --------------------------------------------------------------------

@triton.jit
def _lab_delta_kernel(
    o_ptr, do_ptr, delta_ptr, stride_oh, stride_om, stride_doh, stride_dom, n_q, head_dim,
    DELTA: tl.constexpr,  # the learner's helper
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program: Δ of query rows [start_m, start_m + BLOCK_M) of one head (contiguous head_dim)."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim)  # padded rows and columns load 0
    o = tl.load(o_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(do_ptr + head * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :], mask=mask, other=0.0)
    delta = DELTA(o, do)
    tl.store(delta_ptr + head * n_q + offs_m, delta, mask=offs_m < n_q)


@triton.jit
def _lab_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_doh, stride_dom,
    stride_dqh, stride_dqm,
    n_q, n_k, head_dim, sm_scale, qk_scale,
    RECOMPUTE_P: tl.constexpr, UPDATE: tl.constexpr,  # the learner's helpers
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program: dQ of query rows [start_m, start_m + BLOCK_M) of one head; the only writer of them."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < n_q
    d_ok = offs_d < head_dim
    qd_mask = m_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :], mask=qd_mask, other=0.0)
    do = tl.load(do_ptr + head * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :], mask=qd_mask, other=0.0)
    lse = tl.load(lse_ptr + head * n_q + offs_m, mask=m_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), to_log2_units(lse))  # P = 0 for unseeing rows
    delta = tl.load(delta_ptr + head * n_q + offs_m, mask=m_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:  # the forward's two stages (chapter 5): whole visible tiles, then the diagonal's tiles
        unmasked_end, masked_end = causal_key_stages(start_m, n_q, n_k, BLOCK_M, BLOCK_N)
    else:
        unmasked_end = n_k  # no causal mask; keys past n_k get P = 0 below
        masked_end = n_k
    for start_n in range(0, masked_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_ok[None, :]
        k = tl.load(k_ptr + head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # S = Q K_jᵀ, (BLOCK_M, BLOCK_N), float32
        if start_n < unmasked_end:
            p = RECOMPUTE_P(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, False)
        else:
            p = RECOMPUTE_P(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, True)
        # keys past n_k load as 0 but would still get P = e^{−lse}: huge where lse is very negative
        p = tl.where(offs_n[None, :] < n_k, p, 0.0)
        dq = UPDATE(dq, p, do, k, v, delta, DOT_PRECISION)
    dq = dq * sm_scale  # dQ = τ dS K: τ once, at the end
    tl.store(dq_ptr + head * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
             dq.to(dq_ptr.dtype.element_ty), mask=qd_mask)


def lab_delta(o: torch.Tensor, do: torch.Tensor, delta=None) -> torch.Tensor:
    """Δ (1, H, n_q), float32, for o and do (1, H, n_q, d), through the lab's kernel with the given helper
    (the solution where None)."""
    o, do = (t[0].contiguous() for t in (o, do))  # (H, n_q, d)
    heads, n_q, head_dim = o.shape
    out = torch.full((heads, n_q), float("nan"), dtype=torch.float32, device=o.device)  # unwritten rows stay NaN
    _lab_delta_kernel[(triton.cdiv(n_q, BLOCK_M), heads)](
        o, do, out, o.stride(0), o.stride(1), do.stride(0), do.stride(1), n_q, head_dim,
        DELTA=delta or delta_rows, BLOCK_M=BLOCK_M, BLOCK_D=head_dim_block(head_dim))
    return out[None]


def lab_dq(q, k, v, do, lse, delta, causal: bool, recompute=None, update=None) -> torch.Tensor:
    """dQ (1, H, n_q, d) for q, do (1, H, n_q, d), k, v (1, H, n_k, d), lse and Δ (1, H, n_q) float32,
    through the lab's kernel with the given helpers (the solutions where None)."""
    q, k, v, do = (t[0].contiguous() for t in (q, k, v, do))
    lse, delta = (t[0].float().contiguous() for t in (lse, delta))
    heads, n_q, head_dim = q.shape
    dq = torch.full_like(q, float("nan"))  # poisoned: a row the kernel never writes stays NaN
    _lab_dq_kernel[(triton.cdiv(n_q, BLOCK_M), heads)](
        q, k, v, do, lse, delta, dq, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), n_q, k.shape[1], head_dim,
        head_dim ** -0.5, head_dim ** -0.5 * LOG2_E,
        RECOMPUTE_P=recompute or recompute_p, UPDATE=update or dq_update, CAUSAL=causal,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=head_dim_block(head_dim), DOT_PRECISION=dot_precision(q.dtype))
    return dq[None]


# --- grading gradients: the cases' inputs, the float64 answers, the report ---------------------------

def staged_visibility(n_q: int, n_k: int, masked_stage: torch.Tensor) -> torch.Tensor:
    """The (n_q, n_k) keys the lab's causal dQ kernel lets each query see when its masked stage applies
    `masked_stage`: keys before the tile's unmasked_end all, then `masked_stage` up to masked_end."""
    visible = torch.zeros(n_q, n_k, dtype=torch.bool, device=masked_stage.device)
    for start_m in range(0, n_q, BLOCK_M):
        unmasked_end, masked_end = key_stages(start_m, n_q, n_k, BLOCK_M, BLOCK_N)
        rows = slice(start_m, start_m + BLOCK_M)
        visible[rows, :unmasked_end] = True
        visible[rows, unmasked_end:masked_end] = masked_stage[rows, unmasked_end:masked_end]
    return visible


def visited(a: GradAttempt) -> torch.Tensor:
    """The (n_q, n_k) pairs the dQ kernel visits at all: every key without CAUSAL; with it, the keys
    before each query tile's masked_end."""
    n_q, n_k = a.case.n_q, a.case.n_k
    everything = torch.ones(n_q, n_k, dtype=torch.bool, device=a.q.device)
    return staged_visibility(n_q, n_k, everything) if a.case.causal else everything


def p64(a: GradAttempt, visible: torch.Tensor | None = None, *, score_scale: float | None = None,
        lse_scale: float = LOG2_E, base: float = 2.0) -> torch.Tensor:
    """P = base^(score_scale · Q Kᵀ − lse_scale · lse) in float64, 0 where not `visible` (the true causal
    mask where None) and for queries that see no key. The defaults give the right P; each mistake of
    the recompute step is one argument changed."""
    score_scale = sm_scale(a.case) * LOG2_E if score_scale is None else score_scale
    if visible is None:
        visible = (causal_mask(a.case.n_q, a.case.n_k, a.q.device) if a.case.causal
                   else torch.ones(a.case.n_q, a.case.n_k, dtype=torch.bool, device=a.q.device))
    lse = a.lse.double()[..., None]
    x = (a.q.double() @ a.k.double().transpose(-2, -1)) * score_scale - lse_scale * torch.where(
        torch.isfinite(lse), lse, 0.0)
    p = torch.pow(base, x)
    return torch.where(visible & torch.isfinite(lse), p, 0.0)


def dq64(a: GradAttempt, p: torch.Tensor | None = None, *, dp_from_keys: bool = False, subtract_delta: bool = True,
         times_p: bool = True, with_values: bool = False, delta_sign: float = 1.0) -> torch.Tensor:
    """dQ = τ · (P ∘ (dO Vᵀ − Δ)) K in float64 from `p` (the right P where None); each mistake of the
    dQ step is one argument changed."""
    p = p64(a) if p is None else p
    k, v, do = a.k.double(), a.v.double(), a.do.double()
    dp = do @ (k if dp_from_keys else v).transpose(-2, -1)
    centred = dp - delta_sign * a.delta.double()[..., None] if subtract_delta else dp
    ds = p * centred if times_p else torch.where(visited(a), centred, 0.0)
    return sm_scale(a.case) * ds @ (v if with_values else k)


def _all_zero(a: GradAttempt) -> bool:
    return bool(torch.isfinite(a.got).all()) and bool(a.got.abs().max() == 0) and bool(a.expected.abs().max() > 0)


# --- step 1: Δ ---------------------------------------------------------------------------------------

@triton.jit
def delta_rows_skeleton(o, do):
    """o, do: (BLOCK_M, BLOCK_D) tiles of the output O and its gradient dO, in the input dtype (zeros in
    padded rows and columns). Return Δ: (BLOCK_M,) float32, Δ_i = Σ_d dO_id · O_id."""
    # TODO: delta = ...   multiply elementwise in float32 (.to(tl.float32)), then sum each row (axis=1)
    delta = tl.zeros([o.shape[0]], tl.float32)
    return delta


@triton.jit
def delta_rows(o, do):
    """The solution: `_attn_bwd_preprocess_kernel`'s Δ."""
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # Δ = rowsum(dO ∘ O), float32
    return delta


def _rowsum_of(name: str):
    def detect(a: GradAttempt) -> bool:
        return a.matches(getattr(a, name).double().sum(dim=-1))
    return detect


DELTA_MISTAKES = (
    Mistake("unchanged", "Every Δ came out as 0: the skeleton's placeholder. Δ_i is the dot product of row i of "
            "dO with row i of O.", _all_zero),
    Mistake("rowsum_do", "Your Δ is rowsum(dO): multiply by O first. Δ_i = Σ_j P_ij dP_ij, which equals Σ_d "
            "dO_id O_id because dP = dO Vᵀ and O = P V: Δ = rowsum(dO ∘ O).", _rowsum_of("do")),
    Mistake("rowsum_o", "Your Δ is rowsum(O): multiply by dO first. Δ = rowsum(dO ∘ O), the elementwise "
            "product summed over the head dimension.", _rowsum_of("o")),
)


def _grade_delta(fn) -> tuple[int, int, Failure | None]:
    return grade_backward(lambda c, x: lab_delta(x["o"], x["do"], delta=fn),
                          lambda c, x: (x["do"].double() * x["o"].double()).sum(dim=-1), tolerance,
                          attention_cases(), DELTA_MISTAKES,
                          "Δ must be one float32 number per query row, a (BLOCK_M,) vector: the elementwise "
                          "product of dO and O, summed along axis=1.", "Δ", ("head", "query row"))


# --- step 2: recompute P ------------------------------------------------------------------------------

@triton.jit
def recompute_p_skeleton(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    """s: (BLOCK_M, BLOCK_N) raw scores Q K_jᵀ of query rows offs_m against keys offs_n (float32);
    lse2: (BLOCK_M,) each row's log-sum-exp in log₂ units (lse · log₂e; +∞ for a row that sees no key);
    qk_scale = τ · log₂e. Return P = 2^(s · qk_scale − lse2), and, if MASKED, 0 where query r may not see
    key c (bottom-right causal: c ≤ r + (n_k − n_q))."""
    # TODO: p = ...          exp2 of the scaled score minus the row's lse2 (broadcast: lse2[:, None]);
    # TODO:                  cap that exponent at 0 with tl.minimum (P ≤ 1, whatever lse's rounding)
    # TODO: if MASKED:
    # TODO:     visible = ...  the causal condition, (BLOCK_M, BLOCK_N)
    # TODO:     p = ...        tl.where(visible, p, ...): a hidden key has probability 0
    p = s * 0.0
    return p


@triton.jit
def recompute_p(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    """The solution: `_dq_from_key_tiles`' recomputation of P."""
    p = tl.math.exp2(tl.minimum(s * qk_scale - lse2[:, None], 0.0))  # P = e^{min(τS − lse, 0)} ≤ 1
    if MASKED:
        visible = offs_n[None, :] <= offs_m[:, None] + (n_k - n_q)  # bottom-right causal
        p = tl.where(visible, p, 0.0)
    return p


def _with_p(**p_args):
    """The dQ a kernel computes from the P that `p64(**p_args)` describes."""
    return lambda a: a.matches(dq64(a, p64(a, **p_args)))


def _masked_stage(strict: bool = False, offset: bool = True, everything: bool = False):
    """dQ when the masked stage hides keys by another rule than c ≤ r + (n_k − n_q)."""
    def detect(a: GradAttempt) -> bool:
        n_q, n_k = a.case.n_q, a.case.n_k
        rows = torch.arange(n_q, device=a.q.device)[:, None]
        cols = torch.arange(n_k, device=a.q.device)[None, :]
        last = rows + (n_k - n_q if offset else 0)
        rule = torch.ones(n_q, n_k, dtype=torch.bool, device=a.q.device) if everything else (
            cols < last if strict else cols <= last)
        return a.case.causal and a.matches(dq64(a, p64(a, staged_visibility(n_q, n_k, rule))))
    return detect


RECOMPUTE_MISTAKES = (
    Mistake("unchanged", "dQ came out as zeros: P is still the skeleton's 0. Recompute it: "
            "p = tl.math.exp2(tl.minimum(s * qk_scale - lse2[:, None], 0.0)).", _all_zero),
    Mistake("exp", "Your P is e^{log₂e · (τS − lse)}: both s · qk_scale and lse2 are in log₂ units (log₂e folded "
            "in), so use tl.math.exp2, not tl.exp.", _with_p(base=math.e)),
    Mistake("no_scale", "Your P is 2^(S − lse2): the raw scores need the scale. The forward's softmax is of τ·S, "
            "so P = 2^(s · qk_scale − lse2) with qk_scale = τ · log₂e.", _with_p(score_scale=1.0)),
    Mistake("lse_units", "Your P subtracts the log-sum-exp in natural units from scores in log₂ units: both must "
            "be in the same units. Use lse2 (lse · log₂e), which the kernel passes you.",
            _with_p(lse_scale=1.0)),
    Mistake("no_mask", "Causal dQ is wrong: in the masked stage, P must be 0 above the diagonal. The saved lse "
            "normalises only the keys a query sees, so recomputing P does not hide the others by itself: "
            "with MASKED, p = tl.where(visible, p, 0.0).", _masked_stage(everything=True)),
    Mistake("alignment", "The causal mask is aligned top-left (c ≤ r), right only when n_q = n_k. The forward "
            "aligned it bottom-right: key c is visible to query r when c ≤ r + (n_k − n_q).",
            _masked_stage(offset=False)),
    # only on a square case: one query against 17 keys masks key 16 in both ways, and a strict mask
    # fails on (17, 17), the first causal case, before it gets there
    Mistake("off_by_one", "Each query sees its own diagonal key: c ≤ r + (n_k − n_q), not <.",
            lambda a: a.case.n_q == a.case.n_k and _masked_stage(strict=True)(a)),
    Mistake("fill", "dQ holds NaN or ±inf: a hidden key's P must be 0.0, a probability, not −∞ (P is already "
            "exponentiated, and −∞ · 0 is NaN in dS).",
            lambda a: a.case.causal and not bool(torch.isfinite(a.got).all())),
)


def _run_dq(recompute=None, update=None):
    return lambda c, x: lab_dq(x["q"], x["k"], x["v"], x["do"], x["lse"], x["delta"], c.causal,
                               recompute=recompute, update=update)


def dq_cases() -> list[AttentionCase]:
    """`attention_cases`' order (non-causal before causal, float32 before float16) over DQ_LENGTHS."""
    return [AttentionCase(n_q, n_k, c, dtype) for dtype in DTYPES for c in (False, True) for n_q, n_k in DQ_LENGTHS]


def _dq_answer(c: AttentionCase, x: dict) -> torch.Tensor:
    return dq_autograd64(x["q"], x["k"], x["v"], x["do"], c.causal)


def _grade_recompute(fn) -> tuple[int, int, Failure | None]:
    return grade_backward(_run_dq(recompute=fn), _dq_answer, grad_tolerance, dq_cases(), RECOMPUTE_MISTAKES,
                          "Write P from the equation: 2^(s · qk_scale − lse2), the row's lse2 broadcast over the "
                          "keys; with MASKED, 0 where c > r + (n_k − n_q).", "dQ",
                          ("head", "query row", "column"))


# --- step 3: the dQ update ----------------------------------------------------------------------------

@triton.jit
def dq_update_skeleton(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    """Add one key tile to dQ_i. p: (BLOCK_M, BLOCK_N) the recomputed P (float32); do: (BLOCK_M, BLOCK_D) dO_i;
    k, v: (BLOCK_N, BLOCK_D) K_j and V_j; delta: (BLOCK_M,) Δ_i; dq: (BLOCK_M, BLOCK_D) float32. Products
    take the input dtype: cast ds with .to(k.dtype). DOT_PRECISION: pass it to tl.dot as input_precision.
    Return dq + dS K_j (the kernel multiplies by τ once, at the end)."""
    # TODO: dp = ...   dP = dO_i V_jᵀ: tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    # TODO: ds = ...   dS = P ∘ (dP − Δ): Δ is one number per row, delta[:, None]
    # TODO: dq = ...   dQ_i + dS K_j: tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def dq_update(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    """The solution: `_dq_from_key_tiles`' update."""
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # dP = dO_i V_jᵀ
    ds = p * (dp - delta[:, None])  # dS = P ∘ (dP − Δ)
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # dQ_i ← dQ_i + dS K_j  (τ: at the end)
    return dq


def _delta_as_columns(a: GradAttempt) -> bool:
    """dS = P ∘ (dP − Δ laid out along the keys): in the tile of rows [start_m, start_m + BLOCK_M), key c
    gets Δ of row start_m + c mod BLOCK_N (0 past n_q, where the kernel loads 0)."""
    n_q, n_k = a.case.n_q, a.case.n_k
    padded = torch.nn.functional.pad(a.delta.double(), (0, BLOCK_M))  # Δ of rows past n_q: 0
    rows = torch.arange(n_q, device=a.q.device)[:, None] // BLOCK_M * BLOCK_M
    cols = torch.arange(n_k, device=a.q.device)[None, :] % BLOCK_N
    shifted = padded[..., rows + cols]  # (1, H, n_q, n_k)
    dp = a.do.double() @ a.v.double().transpose(-2, -1)
    return a.matches(sm_scale(a.case) * (p64(a) * (dp - shifted)) @ a.k.double())


def _last_key_tile_only(a: GradAttempt) -> bool:
    """dq = tl.dot(ds, k) without dq as the accumulator: each query tile keeps only the last key tile it visits."""
    n_q, n_k = a.case.n_q, a.case.n_k
    last = torch.zeros(n_q, n_k, dtype=torch.bool, device=a.q.device)
    for start_m in range(0, n_q, BLOCK_M):
        end = key_stages(start_m, n_q, n_k, BLOCK_M, BLOCK_N)[1] if a.case.causal else n_k
        if end > 0:
            last[start_m:start_m + BLOCK_M, (end - 1) // BLOCK_N * BLOCK_N:end] = True
    return bool((~last & visited(a)).any()) and a.matches(dq64(a, torch.where(last, p64(a), 0.0)))


def _dq_mistake(**kw):
    return lambda a: a.matches(dq64(a, **kw))


UPDATE_MISTAKES = (
    Mistake("unchanged", "dQ came out as zeros: your function returns dq unchanged. Add this tile's dS K_j and "
            "return the sum.", _all_zero),
    Mistake("no_delta", "Your dS is P ∘ dP: subtract Δ. The softmax's Jacobian gives dS_ij = P_ij (dP_ij − Δ_i), "
            "with Δ_i = Σ_j P_ij dP_ij: ds = p * (dp - delta[:, None]).", _dq_mistake(subtract_delta=False)),
    Mistake("no_p", "Your dS is dP − Δ without P: multiply by P. dS = P ∘ (dP − Δ), elementwise, so keys a "
            "query does not see (P = 0) add nothing.", _dq_mistake(times_p=False)),
    Mistake("dp_keys", "Your dP is dO Kᵀ: dP is the gradient of P in O = P V, so dP = dO Vᵀ: "
            "tl.dot(do, tl.trans(v), ...).", _dq_mistake(dp_from_keys=True)),
    Mistake("values", "Your dQ adds dS V: S = τ Q Kᵀ, so dQ = τ dS K. The last product takes k: "
            "tl.dot(ds.to(k.dtype), k, dq, ...).", _dq_mistake(with_values=True)),
    Mistake("plus_delta", "Your dS adds Δ: the sign is minus. dS = P ∘ (dP − Δ): ds = p * (dp - delta[:, None]).",
            _dq_mistake(delta_sign=-1.0)),
    Mistake("overwritten", "Your dQ is the last key tile's dS K_j alone: tl.dot(ds, k) without dq as its third "
            "argument starts from zero on every tile and throws away what the earlier key tiles added. Accumulate: "
            "dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION) (or dq += tl.dot(...)).",
            _last_key_tile_only),
    Mistake("broadcast", "Your dS subtracts Δ along the wrong axis: delta[None, :] lays the rows' Δ out as columns "
            "(it runs because BLOCK_M = BLOCK_N). Δ_i belongs to query row i: delta[:, None].", _delta_as_columns),
)


def _grade_update(fn) -> tuple[int, int, Failure | None]:
    return grade_backward(_run_dq(update=fn), _dq_answer, grad_tolerance, dq_cases(), UPDATE_MISTAKES,
                          "Write the update from the equations: dP = dO Vᵀ, then dS = P ∘ (dP − Δ), then "
                          "dq + dS K. Shapes: p, dp, ds (BLOCK_M, BLOCK_N); do, dq (BLOCK_M, BLOCK_D); k, v "
                          "(BLOCK_N, BLOCK_D).", "dQ", ("head", "query row", "column"))


# --- step 4: the whole dK/dV kernel ---------------------------------------------------------------------

@triton.jit
def dkdv_kernel_skeleton(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    n_heads, group_size, n_q, n_k, head_dim, sm_scale, qk_scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dK and dV of BLOCK_N keys of one (batch, key/value head): program (j, b·H_kv + g) of the grid
    (⌈n_k / BLOCK_N⌉, batch × n_heads / group_size) owns key rows [j·BLOCK_N, (j + 1)·BLOCK_N) and is
    their only writer. Q, dO: (batch, n_heads, n_q, head_dim); K, V, dK, dV: (batch, n_heads / group_size,
    n_k, head_dim), query head h reading key/value head h // group_size; any strides (in elements). lse
    (natural units, −∞ for a query that sees no key) and Δ = rowsum(dO ∘ O): float32, contiguous
    (batch, n_heads, n_q). sm_scale = τ; qk_scale = τ · log₂e. CAUSAL: query r sees key c when
    c ≤ r + (n_k − n_q). Rows past n_k and columns past head_dim are not written."""
    # TODO: which key rows and which (batch, key/value head) this program owns; load K_j and V_j once
    # TODO: dK_j and dV_j accumulators, float32
    # TODO: for every query head of the group, for every query tile: recompute Pᵀ, add to dV_j and dK_j
    # TODO: scale dK_j by τ once; store both
    pass


@triton.jit
def dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    n_heads, group_size, n_q, n_k, head_dim, sm_scale, qk_scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The solution: chapter 6's `_attn_bwd_dkdv_kernel` with `_dkdv_from_query_tiles`' loop written in,
    one stage (every query tile masked when CAUSAL) where the chapter splits it in two."""
    pid_n = tl.program_id(0)
    pid_bkv = tl.program_id(1).to(tl.int64)
    n_kv_heads = n_heads // group_size
    batch = pid_bkv // n_kv_heads
    kv_head = pid_bkv % n_kv_heads

    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    kv_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < head_dim)
    k = tl.load(k_ptr + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)  # K_j, on chip for the whole program
    v = tl.load(v_ptr + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)  # V_j, likewise
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    for h in range(group_size):
        head = kv_head * group_size + h
        q_src = q_ptr + batch * stride_qb + head * stride_qh
        do_src = do_ptr + batch * stride_dob + head * stride_doh
        lse_src = lse_ptr + (batch * n_heads + head) * n_q
        delta_src = delta_ptr + (batch * n_heads + head) * n_q
        for start_m in range(0, n_q, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            m_ok = offs_m < n_q
            q_t = tl.load(q_src + offs_d[:, None] * stride_qd + offs_m[None, :] * stride_qm,
                          mask=d_ok[:, None] & m_ok[None, :], other=0.0)
            do = tl.load(do_src + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                         mask=m_ok[:, None] & d_ok[None, :], other=0.0)
            lse = tl.load(lse_src + offs_m, mask=m_ok, other=float("inf"))
            # a query that sees no key has lse = −∞; +∞ instead makes its P = 2^(s − ∞) = 0, not ∞·0 = NaN
            lse2 = tl.where(lse == float("-inf"), float("inf"), to_log2_units(lse))
            delta = tl.load(delta_src + offs_m, mask=m_ok, other=0.0)

            s_t = tl.dot(k, q_t, input_precision=DOT_PRECISION)  # Sᵀ = K_j Qᵢᵀ, (BLOCK_N, BLOCK_M), float32
            p_t = tl.math.exp2(tl.minimum(s_t * qk_scale - lse2[None, :], 0.0))
            if CAUSAL:
                visible = offs_n[:, None] <= offs_m[None, :] + (n_k - n_q)  # bottom-right causal
                p_t = tl.where(visible, p_t, 0.0)
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # dV_j ← dV_j + Pᵀ dOᵢ
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # dPᵀ = V_j dOᵢᵀ, float32
            ds_t = p_t * (dp_t - delta[None, :])  # dSᵀ = Pᵀ ∘ (dPᵀ − Δ); 0 wherever P is 0
            dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=DOT_PRECISION)  # dK_j ← dK_j + dSᵀ Qᵢ (τ: later)

    dk = dk * sm_scale  # dK = τ dSᵀ Q
    tl.store(dk_ptr + batch * stride_dkb + kv_head * stride_dkh + offs_n[:, None] * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + batch * stride_dvb + kv_head * stride_dvh + offs_n[:, None] * stride_dvn
             + offs_d[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


def lab_dkdv(kernel, q, k, v, do, lse, delta, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dK, dV), each (B, H_kv, n_k, d), from `kernel` (the signature of `dkdv_kernel`) launched as chapter 6
    launches its dK/dV kernel, with the lab's 16 × 16 tiles; dK and dV start as NaN."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    # each followed by a tile's worth of slack: a store past its end (a missing mask) is reported, not a crash
    slack = BLOCK_N * head_dim_block(head_dim) + head_dim
    buffers = [with_slack(k.numel(), slack, float("nan"), k.dtype, k.device) for _ in "kv"]
    dk, dv = (flat.view(k.shape) for _, flat in buffers)
    lse, delta = (t.float().contiguous() for t in (lse, delta))
    kernel[(triton.cdiv(n_k, BLOCK_N), batch * kv_heads)](
        q, k, v, do, lse, delta, dk, dv, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(),
        *dv.stride(), heads, heads // kv_heads, n_q, n_k, head_dim, head_dim ** -0.5, head_dim ** -0.5 * LOG2_E,
        CAUSAL=causal, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=head_dim_block(head_dim),
        DOT_PRECISION=dot_precision(q.dtype))
    for (buffer, _), name in zip(buffers, ("dK", "dV")):
        check_slack(buffer, k.numel(), float("nan"), name, "mask the stores: rows ≥ n_k and columns ≥ head_dim")
    return dk, dv


@dataclass
class KVAttempt(GradAttempt):
    """A dK/dV attempt: `which` says whether `got` is dK or dV."""

    which: str = "dV"


def _dkdv64(a: KVAttempt, p: torch.Tensor | None = None, *, subtract_delta: bool = True,
            scale_dk: float | None = None) -> torch.Tensor:
    """dV = Pᵀ dO or dK = τ (P ∘ (dO Vᵀ − Δ))ᵀ Q, whichever `a` holds, in float64 from `p` (the right P where
    None), summed over each key/value head's group of query heads."""
    p = p64(a) if p is None else p  # (B, H, n_q, n_k)
    group = a.q.shape[1] // a.k.shape[1]
    if a.which == "dV":
        grad = p.transpose(-2, -1) @ a.do.double()
    else:
        dp = a.do.double() @ expand_kv_heads(a.v, a.q.shape[1]).double().transpose(-2, -1)
        ds = p * (dp - a.delta.double()[..., None] if subtract_delta else dp)
        grad = (sm_scale(a.case) if scale_dk is None else scale_dk) * ds.transpose(-2, -1) @ a.q.double()
    return grad.unflatten(1, (a.k.shape[1], group)).sum(dim=2)  # (B, H_kv, n_k, d)


def _dkdv_mistake(which: str | None = None, p: Callable | None = None, **kw):
    """A detector: `which` ("dK", "dV" or either) is what `_dkdv64` gives with P from `p` and `kw`."""
    def detect(a: KVAttempt) -> bool:
        return (which is None or a.which == which) and a.matches(_dkdv64(a, None if p is None else p(a), **kw))
    return detect


def _p_visible(offset_of=None, strict: bool = False):
    """P with the causal diagonal placed by offset_of(n_q, n_k) (None: no mask at all)."""
    def p(a: KVAttempt) -> torch.Tensor:
        n_q, n_k = a.case.n_q, a.case.n_k
        if offset_of is None or not a.case.causal:  # hidden pairs too, capped at 1 as the kernel caps the exponent
            return p64(a, torch.ones(n_q, n_k, dtype=torch.bool, device=a.q.device)).clamp(max=1.0)
        rows = torch.arange(n_q, device=a.q.device)[:, None]
        cols = torch.arange(n_k, device=a.q.device)[None, :]
        off = offset_of(n_q, n_k)
        return p64(a, cols < rows + off if strict else cols <= rows + off)
    return p


def _first_head_only(a: KVAttempt) -> bool:
    """Grouped-query heads: only query head g·G of each group was summed."""
    group = a.q.shape[1] // a.k.shape[1]
    if group == 1:
        return False
    one = KVAttempt(**{**a.__dict__, "q": a.q[:, ::group], "do": a.do[:, ::group], "lse": a.lse[:, ::group],
                       "delta": a.delta[:, ::group], "o": a.o[:, ::group]})
    return a.matches(_dkdv64(one))


DKDV_MISTAKES = (
    Mistake("unwritten", "dK and dV are still the NaN the lab filled them with: the kernel stored nothing. It ends "
            "with two tl.store calls, rows past n_k and columns past head_dim masked.",
            lambda a: bool(torch.isnan(a.got).all())),
    Mistake("no_mask", "The result is what you get without the causal mask: recompute Pᵀ from lse for every pair, "
            "then zero the pairs where key c > query r + (n_k − n_q) (tl.where(visible, p_t, 0.0)).",
            _dkdv_mistake(p=_p_visible())),
    Mistake("alignment", "The causal mask is aligned top-left (c ≤ r): bottom-right alignment shifts it by "
            "n_k − n_q, so key c is visible to query r when c ≤ r + (n_k − n_q).",
            _dkdv_mistake(p=_p_visible(lambda n_q, n_k: 0))),
    Mistake("off_by_one", "Each query sees its own diagonal key: c ≤ r + (n_k − n_q), not <.",
            _dkdv_mistake(p=_p_visible(lambda n_q, n_k: n_k - n_q, strict=True))),
    Mistake("no_delta", "dK is what you get from dS = P ∘ dP: the softmax's Jacobian subtracts Δ, one number per "
            "query row, dS = P ∘ (dP − Δ) (in the transposed tile: dp_t − delta[None, :]).",
            _dkdv_mistake("dK", subtract_delta=False)),
    Mistake("no_scale", "dK is missing τ: S = τ Q Kᵀ, so dK = τ dSᵀ Q. Multiply once, after the loop.",
            _dkdv_mistake("dK", scale_dk=1.0)),
    Mistake("group", "Only the first query head of each group reached dK and dV: the key/value head is read by "
            "group_size query heads (h = kv_head · group_size + i), and all of their contributions add up.",
            _first_head_only),
)


def _kv_answer(x: dict, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """dK, dV of the float64 reference attention for dO."""
    k64, v64 = (t.detach().double().requires_grad_() for t in (x["k"], x["v"]))
    reference_attention(x["q"].double(), k64, v64, causal).backward(x["do"].double())
    return k64.grad, v64.grad


def _grade_dkdv(fn) -> tuple[int, int, Failure | None]:
    cases = [AttentionCase(n_q, n_k, c, dtype) for dtype in DTYPES for c in (False, True) for n_q, n_k in DQ_LENGTHS]
    gqa = [AttentionCase(17, 70, False, torch.float32), AttentionCase(70, 17, True, torch.float32)]
    total = len(cases) + len(gqa)
    for i, case in enumerate(cases + gqa):
        grouped = i >= len(cases)
        if grouped:  # batch 2, 4 query heads on 2 key/value heads, K and V strided views
            g = torch.Generator().manual_seed(SEED + i)
            q, do = (torch.randn(2, 4, case.n_q, case.head_dim, generator=g).to(default_device()) for _ in "qo")
            k, v = (torch.randn(2, 4, case.n_k, case.head_dim, generator=g).to(default_device())[:, :2] for _ in "kv")
            o = reference_attention(q, k, v, case.causal).float()
            x = dict(q=q, k=k, v=v, do=do, o=o, lse=reference_log_sum_exp(reference_scores(q, k, case.causal)).float(),
                     delta=(do * o).sum(dim=-1))
        else:
            x = draw_backward(case, SEED + i)
        where = f"{case}" + (", batch 2, 4 query heads on 2 key/value heads" if grouped else "")
        try:
            dk, dv = lab_dkdv(fn, x["q"], x["k"], x["v"], x["do"], x["lse"], x["delta"], case.causal)
        except Exception as exc:  # the learner's code did not compile or run: say what Triton said
            message = str(exc).strip().splitlines()
            return i, total, Failure(where, f"the kernel raised {type(exc).__name__}: " + (message[-1] if message else ""),
                                     ["Write it in the order of the TODOs, from the chapter's equations: "
                                      "dV = Pᵀ dO, dS = P ∘ (dP − Δ), dK = τ dSᵀ Q."])
        want_k, want_v = _kv_answer(x, case.causal)
        bound = grad_tolerance(case.dtype)
        for which, got, want in (("dV", dv, want_v), ("dK", dk, want_k)):
            detail = describe(got.flatten(0, 1)[None], want.flatten(0, 1)[None], bound, which,
                              ("batch × key/value head", "key row", "column"))
            if detail is not None:
                attempt = KVAttempt(case, **x, got=got, expected=want, bound=bound, which=which)
                return i, total, Failure(where, detail, recognised(DKDV_MISTAKES, attempt) or [
                    "dV_j = Σ_i Pᵢⱼᵀ dOᵢ and dK_j = τ Σ_i dSᵢⱼᵀ Qᵢ over every query tile of every query head of the "
                    "group; Pᵀ = 2^(τ·log₂e · K Qᵀ − lse·log₂e), masked; check each against the chapter."])
    return total, total, None


STEPS = {
    "delta": Step("ch06.delta", "Δ = rowsum(dO ∘ O), one number per query row", _grade_delta,
                  delta_rows_skeleton, delta_rows, DELTA_MISTAKES),
    "recompute_p": Step("ch06.recompute_p", "recompute P from the saved log-sum-exp, masked", _grade_recompute,
                        recompute_p_skeleton, recompute_p, RECOMPUTE_MISTAKES),
    "dq": Step("ch06.dq", "dP, dS and one key tile's share of dQ", _grade_update,
               dq_update_skeleton, dq_update, UPDATE_MISTAKES),
    "dkdv": Step("ch06.dkdv", "the whole dK/dV kernel", _grade_dkdv, dkdv_kernel_skeleton, dkdv_kernel,
                 DKDV_MISTAKES),
    "autograd": Step("ch06.autograd", "the autograd.Function, and a GPT trained with it", capstone.grade_autograd,
                     capstone.LabAttention_skeleton, capstone.LabAttention, capstone.AUTOGRAD_MISTAKES),
}

__all__ = ["STEPS", "lab_delta", "lab_dq", "delta_rows", "delta_rows_skeleton", "recompute_p",
           "recompute_p_skeleton", "dq_update", "dq_update_skeleton", "draw_backward", "dq_autograd64", "dkdv_kernel",
           "dkdv_kernel_skeleton", "lab_dkdv"]
