"""Lab 4: write FlashAttention-1's update of O, ℓ, m, then their round trip through HBM (chapter 4).

The lab gives the kernel (`_lab_flash_v1_kernel`: chapter 4's `_flash_v1_kernel`, one program per head,
K/V tiles in the OUTER loop and query tiles in the inner one, with O, ℓ and m in HBM); the learner writes
the two `@triton.jit` helpers it calls for every (K/V tile j, query tile i) pair:

    ch04.update      Algorithm 1, lines 11–12: fold tile (i, j) into (O_i, ℓ_i, m_i), O_i kept normalised
    ch04.round_trip  lines 8 and 12–13: load O_i, ℓ_i, m_i from HBM, update them, write them back

Each step has a skeleton (`*_skeleton`: placeholders that fail the grader) and its solution (the
chapter's own lines of `_flash_v1_kernel`). `tutorial_kernels.labs.check("ch04.<step>", fn)` grades a
learner's helper.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tutorial_kernels.ch04_flash_v1 import _finite_or_zero
from tutorial_kernels.labs.steps import (
    Attempt, Failure, Mistake, Step, attention_cases, check_slack, grade_attention, sm_scale, with_slack)
from tutorial_kernels.precision import dot_precision
from tutorial_kernels.tiling import causal_query_stages, head_dim_block, query_stages

NOTEBOOK = "04_flash_v1_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
BLOCK_M = 16  # small tiles: 70 keys are five K/V tiles (the last ragged), so O, ℓ, m make five round trips
BLOCK_N = 16
SLACK = BLOCK_M  # rows of slack after each state buffer: one query tile


# --- the kernel the lab provides ---------------------------------------------------------------------

@triton.jit
def _lab_flash_v1_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, acc_ptr, l_ptr, m_ptr,  # acc (H, n_q, head_dim), l and m (H, n_q): float32
    stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
    n_q, n_k, head_dim, sm_scale,
    UPDATE: tl.constexpr, ROUND_TRIP: tl.constexpr,  # the learner's two helpers
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Algorithm 1 for one head (contiguous head_dim): K/V tiles outside, query tiles inside."""
    head = tl.program_id(0).to(tl.int64)
    q_head = q_ptr + head * stride_qh
    acc_head = acc_ptr + head * n_q * head_dim  # this head's O, ℓ, m: no other program touches them
    l_head = l_ptr + head * n_q
    m_head = m_ptr + head * n_q
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    for start_n in range(0, n_k, BLOCK_N):  # line 5: for 1 ≤ j ≤ T_c
        cols = start_n + offs_n
        k_t = tl.load(k_ptr + head * stride_kh + cols[None, :] * stride_kn + offs_d[:, None],
                      mask=d_ok[:, None] & (cols[None, :] < n_k), other=0.0)  # line 6: K_jᵀ, on chip
        v = tl.load(v_ptr + head * stride_vh + cols[:, None] * stride_vn + offs_d[None, :],
                    mask=(cols[:, None] < n_k) & d_ok[None, :], other=0.0)  # line 6: V_j, on chip
        first_m = 0
        if CAUSAL:  # query tiles that see none of these keys are skipped, as in the chapter's kernel
            first_m, _ = causal_query_stages(start_n, n_q, n_k, BLOCK_N, BLOCK_M)
        for start_m in range(first_m, n_q, BLOCK_M):  # line 7: for 1 ≤ i ≤ T_r
            rows = start_m + offs_m
            row_ok = rows < n_q
            tile_ok = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_head + rows[:, None] * stride_qm + offs_d[None, :], mask=tile_ok, other=0.0)
            s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * sm_scale  # line 9: S_ij = τ Q_i K_jᵀ
            visible = cols[None, :] < n_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + (n_k - n_q))  # bottom-right aligned
            s = tl.where(visible, s, float("-inf"))
            ROUND_TRIP(acc_head, l_head, m_head, rows, offs_d, row_ok, tile_ok, head_dim, s, v,
                       UPDATE, DOT_PRECISION)  # lines 8 and 10–13
            tl.debug_barrier()  # this tile's stores are visible to every thread before its next load
    for start_m in range(0, n_q, BLOCK_M):  # line 16: O is already normalised, round it to the output dtype
        rows = start_m + offs_m
        tile_ok = (rows < n_q)[:, None] & d_ok[None, :]
        o_i = tl.load(acc_head + rows[:, None] * head_dim + offs_d[None, :], mask=tile_ok, other=0.0)
        tl.store(o_ptr + head * stride_oh + rows[:, None] * stride_om + offs_d[None, :],
                 o_i.to(o_ptr.dtype.element_ty), mask=tile_ok)


def lab_flash_v1(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 update=None, round_trip=None) -> torch.Tensor:
    """softmax(Q Kᵀ/√d) V for q (1, H, n_q, d), k, v (1, H, n_k, d), through the lab's kernel with the
    given helpers (the solutions where None). O, ℓ, m start as Algorithm 1's lines 1–4 say: 0, 0, −∞."""
    q, k, v = (t[0].contiguous() for t in (q, k, v))  # (H, n, d)
    o = torch.full_like(q, float("nan"))  # poisoned: a row the kernel never writes stays NaN
    heads, n_q, head_dim = q.shape
    # Each buffer is followed by one query tile of slack: a load or store that forgets its mask touches the
    # slack (the interpreter would otherwise write over memory it does not own and crash the notebook).
    acc_all, acc = with_slack(heads * n_q * head_dim, SLACK * head_dim, 0.0, device=q.device)
    l_all, l = with_slack(heads * n_q, SLACK, 0.0, device=q.device)
    m_all, m = with_slack(heads * n_q, SLACK, float("-inf"), device=q.device)
    acc, l, m = acc.view(heads, n_q, head_dim), l.view(heads, n_q), m.view(heads, n_q)
    _lab_flash_v1_kernel[(heads,)](
        q, k, v, o, acc, l, m, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o.stride(0), o.stride(1), n_q, k.shape[1], head_dim, head_dim ** -0.5,
        UPDATE=update or flash_v1_update, ROUND_TRIP=round_trip or round_trip_state,
        CAUSAL=causal, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=head_dim_block(head_dim),
        DOT_PRECISION=dot_precision(q.dtype))
    advice = "rows ≥ n_q of the last query tile: mask O's store with tile_ok, ℓ's and m's with row_ok"
    for name, buffer, size, fill in (("O", acc_all, acc.numel(), 0.0), ("ℓ", l_all, l.numel(), 0.0),
                                     ("m", m_all, m.numel(), float("-inf"))):
        check_slack(buffer, size, fill, name, advice)
    return o[None]


# --- what typical mistakes compute, in float64 --------------------------------------------------------

def flash_v1_64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, *,
                alpha_o: bool = True, alpha_l: bool = True, beta_o: bool = True, beta_l: bool = True,
                times_l: bool = True, divisions: int = 1, base: float = math.e,
                write_l: bool = True, write_m: bool = True) -> torch.Tensor:
    """The lab kernel's schedule (K/V tile j outside, query tile i inside, causal tiles skipped) in
    float64, with one slip switched on: a factor of the update left out (alpha_o, alpha_l, beta_o,
    beta_l, times_l: the diag(ℓ_i) that un-normalises O_i), O_i divided by ℓ_new `divisions` times,
    e^{…} of the rescales taken in another `base`, or ℓ or m never written back to HBM."""
    s_all = (q.double() @ k.double().transpose(-2, -1)) * scale  # (1, H, n_q, n_k)
    n_q, n_k = s_all.shape[-2:]
    if causal:
        rows = torch.arange(n_q, device=q.device)[:, None]
        s_all = s_all.masked_fill(torch.arange(n_k, device=q.device)[None, :] > rows + (n_k - n_q), -math.inf)
    v64 = v.double()
    o = torch.zeros(*s_all.shape[:-1], v.shape[-1], dtype=torch.float64, device=q.device)  # HBM
    l = torch.zeros(s_all.shape[:-1], dtype=torch.float64, device=q.device)
    m = torch.full(s_all.shape[:-1], -math.inf, dtype=torch.float64, device=q.device)

    def finite(x):
        return torch.where(torch.isfinite(x), x, 0.0)

    for start_n in range(0, n_k, BLOCK_N):
        cols = slice(start_n, start_n + BLOCK_N)
        first_m = query_stages(start_n, n_q, n_k, BLOCK_N, BLOCK_M)[0] if causal else 0
        for start_m in range(first_m, n_q, BLOCK_M):
            r = slice(start_m, start_m + BLOCK_M)
            s = s_all[..., r, cols]
            o_i, l_i, m_i = o[..., r, :], l[..., r], m[..., r]
            m_tile = s.amax(dim=-1)
            p = torch.exp(s - finite(m_tile)[..., None])
            l_tile = p.sum(dim=-1)
            m_new = torch.maximum(m_i, m_tile)
            alpha = base ** (m_i - finite(m_new))
            beta = base ** (m_tile - finite(m_new))
            l_new = (alpha if alpha_l else 1.0) * l_i + (beta if beta_l else 1.0) * l_tile
            o_new = ((l_i if times_l else 1.0) * (alpha if alpha_o else 1.0))[..., None] * o_i \
                + (beta[..., None] if beta_o else 1.0) * (p @ v64[..., cols, :])
            for _ in range(divisions):
                o_new = o_new / torch.where(l_new > 0, l_new, 1.0)[..., None]
            o[..., r, :] = o_new
            if write_l:
                l[..., r] = l_new
            if write_m:
                m[..., r] = m_new
    return o


def _all_zero(a: Attempt) -> bool:
    return bool(torch.isfinite(a.got).all()) and bool(a.got.abs().max() == 0) and bool(a.expected.abs().max() > 0)


def _slip(**slip):
    """A detector: the output is what the lab's schedule computes with this slip."""
    return lambda a: a.matches(flash_v1_64(a.q, a.k, a.v, sm_scale(a.case), a.case.causal, **slip))


def _any_slip(*slips):
    return lambda a: any(_slip(**slip)(a) for slip in slips)


# --- step 1: the update of one (i, j) pair ---------------------------------------------------------------

@triton.jit
def flash_v1_update_skeleton(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    """Fold tile (i, j) into the state of BLOCK_M query rows. s: (BLOCK_M, BLOCK_N) scores τ·Q_i K_jᵀ
    (natural units), −∞ where hidden; v: (BLOCK_N, BLOCK_D) values V_j; o_i: (BLOCK_M, BLOCK_D) the
    NORMALISED output so far, l_i the row sums, m_i the row maxima (0, 0, −∞ before the first tile).
    DOT_PRECISION: pass it to tl.dot as input_precision. Return the new (o_i, l_new, m_new), o_i normalised."""
    m_tile = tl.max(s, axis=1)  # line 10: m̃_ij = rowmax(S_ij)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])  # line 10: P̃_ij = e^{S_ij − m̃_ij}
    l_tile = tl.sum(p, axis=1)  # line 10: ℓ̃_ij = rowsum(P̃_ij)
    # TODO: m_new = ...    line 11: max(m_i, m̃)
    # TODO: shift = ...    m_new, but 0 where it is −∞: _finite_or_zero(m_new)
    # TODO: alpha = ...    e^{m_i − m_new}
    # TODO: beta = ...     e^{m̃ − m_new}
    # TODO: l_new = ...    line 11: e^{m_i − m_new} ℓ_i + e^{m̃ − m_new} ℓ̃
    # TODO: pv = ...       P̃ V_j: tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    # TODO: o_i = ...      line 12: diag(ℓ_i) e^{m_i − m_new} O_i + e^{m̃ − m_new} P̃ V_j ...
    # TODO: o_i = ...      ... then × diag(ℓ_new)⁻¹ (where ℓ_new > 0)
    return o_i, l_i, m_i


@triton.jit
def flash_v1_update(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    """The solution: `_flash_v1_kernel`'s lines 10–12."""
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
    return o_i, l_new, m_new


UPDATE_MISTAKES = (
    Mistake("unchanged", "Every row came out as zeros: O stayed as it started. Does your function compute and "
            "return the new (o_i, l_new, m_new)?", _all_zero),
    Mistake("no_alpha_o", "The output is what you get when O_i is not rescaled by α = e^{m_i − m_new}: when a "
            "later tile raises the row maximum, what O_i summed before was weighted under the old maximum. "
            "Multiply it by (l_i * alpha)[:, None], not by l_i alone.", _slip(alpha_o=False)),
    Mistake("no_alpha_l", "The output is what you get when ℓ_i is not rescaled: ℓ_new = e^{m_i − m_new} ℓ_i + "
            "e^{m̃ − m_new} ℓ̃, so l_new = alpha * l_i + beta * l_tile.", _slip(alpha_l=False)),
    Mistake("no_beta", "This tile's terms are not brought to the new maximum: P̃ = e^{S − m̃} is relative to the "
            "tile's own maximum m̃, so both ℓ̃ and P̃ V_j take the factor β = e^{m̃ − m_new} "
            "(beta * l_tile and beta[:, None] * pv).",
            _any_slip(dict(beta_o=False), dict(beta_l=False), dict(beta_o=False, beta_l=False))),
    Mistake("not_unnormalised", "O_i in HBM is normalised (divided by ℓ_i), so before adding this tile undo that: "
            "multiply it by ℓ_i as well as by α, o_i = (l_i * alpha)[:, None] * o_i + beta[:, None] * pv. "
            "Without diag(ℓ_i) the old keys count as if their weights summed to 1.", _slip(times_l=False)),
    Mistake("no_division", "O_i was not divided by ℓ_new: Algorithm 1 keeps O_i normalised after every tile "
            "(line 12: × diag(ℓ_new)⁻¹), and the next tile multiplies it by ℓ_i on that assumption. "
            "Divide once: o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None].", _slip(divisions=0)),
    Mistake("twice", "O_i was divided by ℓ_new twice (normalised twice): divide the new O_i once, after "
            "adding the rescaled old O_i and this tile's β P̃ V_j.", _slip(divisions=2)),
    Mistake("exp2", "The rescales are powers of 2, but here the scores are in natural units (τ = 1/√d, no log₂e "
            "folded in, unlike chapter 5): use tl.exp for alpha and beta, as for P̃.", _slip(base=2.0)),
    Mistake("old_state", "The output is the softmax of each row's LAST key tile alone: the state you return is "
            "the one you were given, so every key tile starts afresh. Return the new state, "
            "`return o_i, l_new, m_new` (the skeleton's last line returns l_i and m_i).",
            _any_slip(dict(write_m=False), dict(write_l=False), dict(write_m=False, write_l=False))),
    Mistake("nan", "Some rows are NaN. A row that has seen only hidden keys has m_new = −∞, and m_i − m_new = "
            "−∞ − (−∞) = NaN: shift by _finite_or_zero(m_new). Its ℓ_new is 0: divide by "
            "tl.where(l_new > 0.0, l_new, 1.0), so that 0 stays 0.", lambda a: bool(torch.isnan(a.got).any())),
)


def _grade_update(fn) -> tuple[int, int, Failure | None]:
    cases = attention_cases()
    passed, failure = grade_attention(lambda c, q, k, v: lab_flash_v1(q, k, v, c.causal, update=fn), cases,
                                      list(UPDATE_MISTAKES), "Write lines 11–12 one factor at a time: m_new, "
                                      "shift, alpha, beta, l_new, then O_i = (ℓ_i α O_i + β P̃ V_j) / ℓ_new.")
    return passed, len(cases), failure


# --- step 2: the round trip through HBM ------------------------------------------------------------------

@triton.jit
def round_trip_state_skeleton(acc_head, l_head, m_head, rows, offs_d, row_ok, tile_ok, head_dim, s, v,
                              UPDATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One (K/V tile j, query tile i) pair. acc_head: O of this head in HBM, (n_q, head_dim) float32,
    row-major (row r, column c at acc_head + r * head_dim + c); l_head, m_head: ℓ and m, (n_q,) float32.
    rows: the tile's query rows, offs_d its columns; row_ok, tile_ok: which rows / elements exist.
    Load O_i, ℓ_i, m_i (0, 0, −∞ where they do not exist), fold (s, v) in with
    UPDATE(o_i, l_i, m_i, s, v, DOT_PRECISION) -> (o_i, l_new, m_new), and write all three back."""
    # TODO: o_i = tl.load(...)    line 8: O_i (mask=tile_ok)
    # TODO: l_i = tl.load(...)    line 8: ℓ_i (mask=row_ok)
    # TODO: m_i = tl.load(...)    line 8: m_i (mask=row_ok; other=float("-inf"))
    o_i = tl.zeros([rows.shape[0], offs_d.shape[0]], tl.float32)  # placeholders: a fresh state
    l_i = tl.zeros([rows.shape[0]], tl.float32)
    m_i = tl.full([rows.shape[0]], float("-inf"), tl.float32)
    o_i, l_new, m_new = UPDATE(o_i, l_i, m_i, s, v, DOT_PRECISION)
    # TODO: tl.store(...)         line 12: write O_i
    # TODO: tl.store(...)         line 13: write ℓ_i ← ℓ_new
    # TODO: tl.store(...)         line 13: write m_i ← m_new


@triton.jit
def round_trip_state(acc_head, l_head, m_head, rows, offs_d, row_ok, tile_ok, head_dim, s, v,
                     UPDATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The solution: `_flash_v1_kernel`'s loads and stores of O, ℓ, m."""
    o_i = tl.load(acc_head + rows[:, None] * head_dim + offs_d[None, :], mask=tile_ok, other=0.0)
    l_i = tl.load(l_head + rows, mask=row_ok, other=0.0)
    m_i = tl.load(m_head + rows, mask=row_ok, other=float("-inf"))
    o_i, l_new, m_new = UPDATE(o_i, l_i, m_i, s, v, DOT_PRECISION)  # lines 10–12 (step 1)
    tl.store(acc_head + rows[:, None] * head_dim + offs_d[None, :], o_i, mask=tile_ok)  # line 12: write O_i
    tl.store(l_head + rows, l_new, mask=row_ok)  # line 13: write ℓ_i ← ℓ_new
    tl.store(m_head + rows, m_new, mask=row_ok)  # line 13: write m_i ← m_new


ROUND_TRIP_MISTAKES = (
    Mistake("no_store_o", "Every row came out as zeros: O_i never went back to HBM, and the final pass reads O "
            "from there. Store the updated o_i at the address you loaded it from, with mask=tile_ok.", _all_zero),
    Mistake("stale", "The output is the softmax of each row's LAST key tile alone: every K/V tile started from a "
            "fresh state, as if it were the first. Load O_i, ℓ_i and m_i from HBM (not zeros and −∞), and write "
            "all three back: without ℓ_new or m_new in HBM, the next K/V tile sees the state of before.",
            _any_slip(dict(write_m=False), dict(write_l=False))),
)


def _grade_round_trip(fn) -> tuple[int, int, Failure | None]:
    cases = attention_cases()
    passed, failure = grade_attention(lambda c, q, k, v: lab_flash_v1(q, k, v, c.causal, round_trip=fn), cases,
                                      list(ROUND_TRIP_MISTAKES), "Row r of O is at acc_head + r * head_dim, of ℓ "
                                      "and m at l_head + r and m_head + r: load all three, call UPDATE, store "
                                      "all three back at the same addresses, masked.")
    return passed, len(cases), failure


STEPS = {
    "update": Step("ch04.update", "fold tile (i, j) into the normalised O_i, ℓ_i, m_i", _grade_update,
                   flash_v1_update_skeleton, flash_v1_update, UPDATE_MISTAKES),
    "round_trip": Step("ch04.round_trip", "load O_i, ℓ_i, m_i from HBM, update them, write them back",
                       _grade_round_trip, round_trip_state_skeleton, round_trip_state, ROUND_TRIP_MISTAKES),
}

__all__ = ["STEPS", "flash_v1_64", "flash_v1_update", "flash_v1_update_skeleton", "lab_flash_v1",
           "round_trip_state", "round_trip_state_skeleton"]
