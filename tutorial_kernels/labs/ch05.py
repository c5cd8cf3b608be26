"""Lab 5: write FlashAttention-2's inner loop, its causal stage bounds, then the whole kernel (chapter 5).

The lab gives a kernel (`_lab_attention_kernel`: chapter 5's minimal kernel, with the causal stages
of the tuned one); the learner writes the three `@triton.jit` helpers it calls, one step each, and
then a whole forward kernel from its signature:

    ch05.mask            hide the scores a query may not see: −∞ past n_k and above the causal diagonal
    ch05.online_softmax  fold one tile of scores into the running (acc, ℓ, m): the online-softmax update
    ch05.causal_stages   where the unmasked stage ends and where the masked stage ends, for a query tile
    ch05.kernel          the whole FlashAttention-2 forward kernel (batch, grouped-query heads, strides)

Each step has a skeleton (`*_skeleton`: placeholders that fail the grader) and its solution (the
chapter's own code: `_flash_v2_minimal_kernel`'s mask and update, `tiling.causal_key_stages`, and
`_flash_v2_minimal_kernel` itself). `tutorial_kernels.labs.check("ch05.<step>", fn)` grades a learner's
function.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tutorial_kernels import ch05_flash_v2
from tutorial_kernels.labs.steps import (
    Attempt, AttentionCase, Failure, Mistake, Step, attention64, attention_cases, check_slack, compare, grade_attention,
    recognised, sm_scale, tiled64, visibility, with_slack)
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.precision import dot_precision
from tutorial_kernels.runtime import default_device
from tutorial_kernels.tiling import LOG2_E, causal_key_stages, head_dim_block, key_stages
from tutorial_kernels.tolerances import tolerance

NOTEBOOK = "05_flash_v2_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
BLOCK_M = 16  # small tiles: 70 keys are five tiles, the last one ragged
BLOCK_N = 16


# --- the kernel the lab provides ---------------------------------------------------------------------

@triton.jit
def _scores_and_values(q, k_ptr, v_ptr, head, stride_kh, stride_kn, stride_vh, stride_vn,
                       cols, offs_d, n_k, head_dim, qk_scale, DOT_PRECISION: tl.constexpr):
    """S = τ·log₂e · Q K_jᵀ (log₂ units) and V_j for key tile `cols`. Loads stay bounds-checked in both
    stages, so a wrong stage bound gives a wrong answer, never a read of stray memory."""
    d_ok = offs_d < head_dim
    k_t = tl.load(k_ptr + head * stride_kh + cols[None, :] * stride_kn + offs_d[:, None],
                  mask=(cols[None, :] < n_k) & d_ok[:, None], other=0.0)  # K_jᵀ
    v = tl.load(v_ptr + head * stride_vh + cols[:, None] * stride_vn + offs_d[None, :],
                mask=(cols[:, None] < n_k) & d_ok[None, :], other=0.0)  # V_j
    return tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale, v


@triton.jit
def _lab_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,
    stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
    n_q, n_k, head_dim, qk_scale,
    MASK: tl.constexpr, UPDATE: tl.constexpr, STAGES: tl.constexpr,  # the learner's three helpers
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program: query rows [start_m, start_m + BLOCK_M) of one head (contiguous head_dim)."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        unmasked_end, masked_end = STAGES(start_m, n_q, n_k, BLOCK_M, BLOCK_N)
    else:
        unmasked_end, masked_end = n_k // BLOCK_N * BLOCK_N, n_k  # only the ragged last tile needs a mask
    for start_n in range(0, unmasked_end, BLOCK_N):  # stage 1: key tiles every row sees in full, no mask
        s, v = _scores_and_values(q, k_ptr, v_ptr, head, stride_kh, stride_kn, stride_vh, stride_vn,
                                  start_n + offs_n, offs_d, n_k, head_dim, qk_scale, DOT_PRECISION)
        acc, l_i, m_i = UPDATE(acc, l_i, m_i, s, v, DOT_PRECISION)
    for start_n in range(unmasked_end, masked_end, BLOCK_N):  # stage 2: tiles across the diagonal or the end
        cols = start_n + offs_n
        s, v = _scores_and_values(q, k_ptr, v_ptr, head, stride_kh, stride_kn, stride_vh, stride_vn,
                                  cols, offs_d, n_k, head_dim, qk_scale, DOT_PRECISION)
        s = MASK(s, offs_m, cols, n_q, n_k, CAUSAL)
        acc, l_i, m_i = UPDATE(acc, l_i, m_i, s, v, DOT_PRECISION)
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # O = diag(ℓ)⁻¹ O once; ℓ = 0: the row saw no key, O = 0
    tl.store(o_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=(offs_m[:, None] < n_q) & d_ok[None, :])


def lab_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  mask=None, update=None, stages=None) -> torch.Tensor:
    """softmax(Q Kᵀ/√d) V for q (1, H, n_q, d), k, v (1, H, n_k, d), through the lab's kernel with the
    given helpers (the solutions where None)."""
    q, k, v = (t[0].contiguous() for t in (q, k, v))  # (H, n, d)
    o = torch.full_like(q, float("nan"))  # poisoned: a row the kernel never writes stays NaN
    heads, n_q, head_dim = q.shape
    grid = (triton.cdiv(n_q, BLOCK_M), heads)
    _lab_attention_kernel[grid](
        q, k, v, o, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o.stride(0), o.stride(1), n_q, k.shape[1], head_dim, head_dim ** -0.5 * LOG2_E,
        MASK=mask or mask_scores, UPDATE=update or online_softmax_update, STAGES=stages or causal_stages,
        CAUSAL=causal, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=head_dim_block(head_dim),
        DOT_PRECISION=dot_precision(q.dtype))
    return o[None]


# --- step 1: the mask --------------------------------------------------------------------------------

@triton.jit
def mask_scores_skeleton(s, offs_m, cols, n_q, n_k, CAUSAL: tl.constexpr):
    """s: (BLOCK_M, BLOCK_N) scores of query rows offs_m against keys cols. Return s with −∞ where the
    key does not exist (cols ≥ n_k) and, if CAUSAL, where query r may not see key c (bottom-right)."""
    # TODO: visible = ...   (a (BLOCK_M, BLOCK_N) boolean: cols[None, :] < n_k, and the causal condition)
    # TODO: return tl.where(visible, s, ...)
    return s


@triton.jit
def mask_scores(s, offs_m, cols, n_q, n_k, CAUSAL: tl.constexpr):
    """The solution: `_flash_v2_minimal_kernel`'s mask."""
    visible = cols[None, :] < n_k  # the ragged last tile
    if CAUSAL:
        visible = visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))  # bottom-right: c ≤ r + (n_k − n_q)
    return tl.where(visible, s, float("-inf"))


def _no_key_rows_nonzero(a: Attempt) -> bool:
    """Rows that see no key (causal, n_q > n_k) came back nonzero: a finite fill lets them average V."""
    hidden_rows = a.case.n_q - a.case.n_k
    return a.case.causal and hidden_rows > 0 and bool(a.got[..., :hidden_rows, :].abs().max() > 1e-3)


def staged_visibility(n_q: int, n_k: int, masked_stage: torch.Tensor) -> torch.Tensor:
    """The (n_q, n_k) keys the lab's causal kernel lets each query see when its masked stage applies
    `masked_stage`: keys before the tile's unmasked_end unmasked, then `masked_stage` up to masked_end."""
    visible = torch.zeros(n_q, n_k, dtype=torch.bool, device=masked_stage.device)
    for start_m in range(0, n_q, BLOCK_M):
        unmasked_end, masked_end = key_stages(start_m, n_q, n_k, BLOCK_M, BLOCK_N)
        rows = slice(start_m, start_m + BLOCK_M)
        visible[rows, :unmasked_end] = True
        visible[rows, unmasked_end:masked_end] = masked_stage[rows, unmasked_end:masked_end]
    return visible


def _top_left(a: Attempt) -> bool:
    """The causal diagonal is not shifted by n_k − n_q (c ≤ r, top-left aligned)."""
    n_q, n_k = a.case.n_q, a.case.n_k
    wrong = staged_visibility(n_q, n_k, visibility(n_q, n_k, a.q.device, 0))
    return a.case.causal and n_q != n_k and a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case), wrong))


def _strict_diagonal(a: Attempt) -> bool:
    n_q, n_k = a.case.n_q, a.case.n_k
    wrong = staged_visibility(n_q, n_k, visibility(n_q, n_k, a.q.device, n_k - n_q, strict=True))
    return a.case.causal and a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case), wrong))


def _ragged_keys_seen(a: Attempt) -> bool:
    """Non-causal output equals attention over keys padded with zero rows to a whole tile."""
    pad = -a.case.n_k % BLOCK_N
    k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (a.k, a.v))
    return not a.case.causal and pad > 0 and a.matches(attention64(a.q, k, v, sm_scale(a.case)))


MASK_MISTAKES = (
    Mistake("ragged", "Keys past n_k still count: the last tile is ragged (n_k is not a multiple of BLOCK_N) and "
            "its missing keys load as zeros, scoring 0, not −∞. Include `cols[None, :] < n_k` in `visible`.",
            _ragged_keys_seen),
    Mistake("finite", "Rows that see no key at all must come out as zeros, but yours average V. Hide scores with "
            "float(\"-inf\"), not a finite constant such as -1e9 or -1e4: with a finite fill, a row whose every "
            "score is hidden has m = the constant, and 2^(s − m) = 1 for every hidden key.",
            _no_key_rows_nonzero),
    Mistake("alignment", "The causal mask is aligned top-left (c ≤ r), right only when n_q = n_k. "
            "Bottom-right alignment shifts the diagonal by n_k − n_q: key c is visible to query r when "
            "c ≤ r + (n_k − n_q).", _top_left),
    Mistake("off_by_one", "Each query must see its own diagonal key: c ≤ r + (n_k − n_q), not <. "
            "(With one query and one key, the query sees that key.)", _strict_diagonal),
)


def _grade_mask(fn) -> tuple[int, int, Failure | None]:
    cases = attention_cases()
    passed, failure = grade_attention(lambda c, q, k, v: lab_attention(q, k, v, c.causal, mask=fn), cases,
                                      list(MASK_MISTAKES), "Check `visible`: a key exists when c < n_k; with "
                                      "CAUSAL, query r sees key c when c ≤ r + (n_k − n_q); hidden scores are −∞.")
    return passed, len(cases), failure


# --- step 2: the online-softmax update ---------------------------------------------------------------

@triton.jit
def online_softmax_update_skeleton(acc, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    """Fold one tile into the running state of BLOCK_M query rows. s: (BLOCK_M, BLOCK_N) scores in log₂
    units (τ·log₂e already folded in), −∞ where hidden; v: (BLOCK_N, BLOCK_D) values; acc: (BLOCK_M,
    BLOCK_D) un-normalised output, l_i the running sums, m_i the running maxima (log₂ units).
    DOT_PRECISION: pass it to tl.dot as input_precision ("tf32x3" keeps float32 products at float32
    accuracy on a GPU).
    Return the new (acc, l_i, m_i)."""
    # TODO: m_new = ...            the new running max
    # TODO: shift = ...            m_new, but 0 where m_new is −∞ (a row that has seen no key yet)
    # TODO: p = ...                2^(s − shift)
    # TODO: alpha = ...            2^(m_i − shift): rescales what was summed before
    # TODO: l_i = ...            rescale by alpha, then add this tile's row sums
    # TODO: acc = ...            rescale by alpha, then add P̃ V: tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def online_softmax_update(acc, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    """The solution: `_flash_v2_minimal_kernel`'s update."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))  # m_new = max(m_i, rowmax S)
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees no key yet: no −∞ − (−∞)
    p = tl.math.exp2(s - shift[:, None])  # P̃ = 2^{S − m_new}
    alpha = tl.math.exp2(m_i - shift)  # α = 2^{m_i − m_new}
    l_i = l_i * alpha + tl.sum(p, axis=1)  # ℓ_i ← α ℓ_i + rowsum P̃
    acc = acc * alpha[:, None]  # O_i ← diag(α) O_i
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # O_i ← O_i + P̃ V_j
    return acc, l_i, m_new


def _all_zero(a: Attempt) -> bool:
    return bool(torch.isfinite(a.got).all()) and bool(a.got.abs().max() == 0) and bool(a.expected.abs().max() > 0)


def _tiled_mistake(**forgot):
    def detect(a: Attempt) -> bool:
        n_q, n_k = a.case.n_q, a.case.n_k
        visible = visibility(n_q, n_k, a.q.device, n_k - n_q) if a.case.causal else None
        return a.matches(tiled64(a.q, a.k, a.v, sm_scale(a.case), visible, BLOCK_N, **forgot))
    return detect


def _natural_exp(a: Attempt) -> bool:
    n_q, n_k = a.case.n_q, a.case.n_k
    visible = visibility(n_q, n_k, a.q.device, n_k - n_q) if a.case.causal else None
    return a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case) * LOG2_E, visible))


UPDATE_MISTAKES = (
    Mistake("unchanged", "Every row came out as zeros: ℓ stayed 0. Does your function compute and return the "
            "new (acc, l_i, m_i)?", _all_zero),
    Mistake("no_rescale_acc", "The output is what you get when acc is not rescaled: when the running max grows, "
            "what acc summed before was weighted by 2^(s − m_old); multiply it by alpha = 2^(m_old − m_new) "
            "before adding this tile: acc = acc * alpha[:, None].", _tiled_mistake(rescale_acc=False)),
    Mistake("no_rescale_l", "The output is what you get when l_i is not rescaled: l_i = l_i * alpha + "
            "tl.sum(p, axis=1), the same alpha as acc.", _tiled_mistake(rescale_l=False)),
    Mistake("exp", "The output is the softmax of log₂e·τ·QKᵀ: the scores are already in log₂ units (τ·log₂e is "
            "folded into the scale), so use tl.math.exp2, not tl.exp, for p and alpha.", _natural_exp),
    Mistake("nan", "Some rows are NaN: a row that has seen only hidden keys has m_new = −∞, and s − m_new = "
            "−∞ − (−∞) = NaN. Shift by 0 for such rows: shift = tl.where(m_new == float(\"-inf\"), 0.0, m_new).",
            lambda a: bool(torch.isnan(a.got).any())),
)


def _grade_update(fn) -> tuple[int, int, Failure | None]:
    cases = attention_cases()
    passed, failure = grade_attention(lambda c, q, k, v: lab_attention(q, k, v, c.causal, update=fn), cases,
                                      list(UPDATE_MISTAKES), "Write the update line by line from the equations: "
                                      "m_new, shift, p, alpha, then l_i and acc rescaled by alpha before adding "
                                      "this tile.")
    return passed, len(cases), failure


# --- step 3: the causal stage bounds -----------------------------------------------------------------

@triton.jit
def causal_stages_skeleton(start_m, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query rows [start_m, start_m + BLOCK_M), bottom-right causal (query r sees key c when
    c ≤ r + (n_k − n_q)). Return (unmasked_end, masked_end):
    unmasked_end: the largest multiple of BLOCK_N such that every key before it exists and is visible to
                  every row of the tile (at least 0);
    masked_end:   one past the last key that some row of the tile sees (at most n_k, at least 0)."""
    # TODO: first_row_sees = ...   keys [0, this) are visible to the tile's first row
    # TODO: last_row_sees = ...    no row of the tile sees a key at or past this
    unmasked_end = 0
    masked_end = 0
    return unmasked_end, masked_end


causal_stages = causal_key_stages  # the solution: `tiling.causal_key_stages`, the chapter's own helper

# n_k − n_q = 15 and 31: the first row's last key ends a tile, where an off-by-one moves unmasked_end
PROBE_LENGTHS = ((1, 1), (17, 17), (70, 70), (17, 70), (70, 17), (1, 16), (2, 33), (33, 100), (100, 33), (64, 64))


@triton.jit
def _probe_stages_kernel(out_ptr, n_q, n_k, STAGES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program i writes STAGES(i · BLOCK_M, …) to out[2i], out[2i + 1]."""
    pid = tl.program_id(0)
    unmasked_end, masked_end = STAGES(pid * BLOCK_M, n_q, n_k, BLOCK_M, BLOCK_N)
    tl.store(out_ptr + 2 * pid, unmasked_end)
    tl.store(out_ptr + 2 * pid + 1, masked_end)


def probe_stages(fn, n_q: int, n_k: int) -> list[tuple[int, int]]:
    """(unmasked_end, masked_end) that `fn` gives for every query tile of n_q × n_k."""
    tiles = triton.cdiv(n_q, BLOCK_M)
    out = torch.full((2 * tiles,), -999, dtype=torch.int32, device=default_device())
    _probe_stages_kernel[(tiles,)](out, n_q, n_k, STAGES=fn, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return [tuple(pair) for pair in out.view(tiles, 2).tolist()]


def _bounds(start_m, n_q, n_k, *, plus_one=1, last=0, offset=True, round_down=True, clamp=True, floor=True):
    """`key_stages` with one typical mistake switched on."""
    off = n_k - n_q if offset else 0
    first, last_sees = start_m + off + plus_one, start_m + BLOCK_M + off + last
    unmasked = min(first, n_k) if clamp else first
    unmasked = unmasked // BLOCK_N * BLOCK_N if round_down else unmasked
    masked = min(last_sees, n_k) if clamp else last_sees
    return (max(unmasked, 0), max(masked, 0)) if floor else (unmasked, masked)


STAGE_MISTAKES = {  # name: (the bounds that mistake gives, hint)
    "unchanged": (dict(), "Both bounds are still 0 (the skeleton's placeholders): no key tile is visited."),
    "off_by_one": (dict(plus_one=0), "unmasked_end is one short: the first row r = start_m sees keys c ≤ "
                   "start_m + (n_k − n_q), that is [0, start_m + (n_k − n_q) + 1): the bound is one past the last key."),
    "off_by_one_last": (dict(last=-1), "masked_end is one short: the tile's last row is start_m + BLOCK_M − 1, so "
                        "it sees keys [0, start_m + BLOCK_M + (n_k − n_q)); masked_end is one past its last key."),
    "alignment": (dict(offset=False), "The bounds ignore the bottom-right alignment: with n_q ≠ n_k, query r sees "
                  "keys up to r + (n_k − n_q); add the offset n_k − n_q to both bounds."),
    "round_down": (dict(round_down=False), "unmasked_end must be a multiple of BLOCK_N: the unmasked stage takes whole "
                   "tiles, so round down (// BLOCK_N * BLOCK_N); the partial tile goes to the masked stage."),
    "clamp": (dict(clamp=False), "Clamp both bounds to n_k (tl.minimum): past n_k there are no keys to visit."),
    "floor": (dict(floor=False), "Clamp both bounds at 0 (tl.maximum): with n_q > n_k the first query tiles see no "
              "key at all, and start_m + (n_k − n_q) is negative."),
}


def _grade_stages(fn) -> tuple[int, int, Failure | None]:
    cases = attention_cases(causal=(True,))
    total = len(PROBE_LENGTHS) + len(cases)
    got, expected = {}, {}
    for done, (n_q, n_k) in enumerate(PROBE_LENGTHS):
        try:
            got[n_q, n_k] = probe_stages(fn, n_q, n_k)
        except Exception as exc:
            message = str(exc).strip().splitlines()
            return done, total, Failure(f"n_q={n_q}, n_k={n_k}", f"the kernel raised {type(exc).__name__}: "
                                        + (message[-1] if message else ""), [STAGE_MISTAKES["unchanged"][1]])
        expected[n_q, n_k] = [key_stages(s, n_q, n_k, BLOCK_M, BLOCK_N) for s in range(0, n_q, BLOCK_M)]
    wrong = [pair for pair in PROBE_LENGTHS if got[pair] != expected[pair]]
    if wrong:
        (n_q, n_k) = pair = wrong[0]
        tile = next(i for i, (g, e) in enumerate(zip(got[pair], expected[pair])) if g != e)
        # a mistake is recognised when it gives exactly the learner's bounds on every probe
        hints = [hint for name, (kw, hint) in STAGE_MISTAKES.items() if name != "unchanged" and all(
            [_bounds(s, *p, **kw) for s in range(0, p[0], BLOCK_M)] == got[p] for p in PROBE_LENGTHS)]
        if all(g == (0, 0) for bounds in got.values() for g in bounds):
            hints = [STAGE_MISTAKES["unchanged"][1]]
        detail = (f"query tile {tile} (rows {tile * BLOCK_M}..{min((tile + 1) * BLOCK_M, n_q) - 1}, BLOCK_M = "
                  f"BLOCK_N = {BLOCK_M}): expected (unmasked_end, masked_end) = {expected[pair][tile]}, "
                  f"got {got[pair][tile]}")
        return PROBE_LENGTHS.index(pair), total, Failure(f"n_q={n_q}, n_k={n_k}, causal=True", detail, hints or [
            "Work it out for one tile on paper: the first row start_m sees keys [0, start_m + (n_k − n_q) + 1), "
            "the last row [0, start_m + BLOCK_M + (n_k − n_q)); round the first down to a tile, clamp to [0, n_k]."])
    passed, failure = grade_attention(lambda c, q, k, v: lab_attention(q, k, v, True, stages=fn), cases, [],
                                      "The bounds are right but the attention is not: run the earlier steps' checks.")
    return len(PROBE_LENGTHS) + passed, total, failure


# --- step 4: the whole kernel ---------------------------------------------------------------------

@triton.jit
def flash_forward_kernel_skeleton(
    q_ptr, k_ptr, v_ptr, o_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, group_size, n_q, n_k, head_dim, qk_scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """O = softmax(τ Q Kᵀ) V for BLOCK_M query rows of one (batch, head): program (i, bh) of the grid
    (⌈n_q / BLOCK_M⌉, batch × n_heads) owns rows [i·BLOCK_M, (i + 1)·BLOCK_M) of (batch, head) =
    divmod(bh, n_heads). Q, O: (batch, n_heads, n_q, head_dim); K, V: (batch, n_heads / group_size, n_k,
    head_dim), query head h reading key/value head h // group_size; any strides (in elements).
    qk_scale = τ · log₂e: scores times it are in log₂ units. CAUSAL: query r sees key c when
    c ≤ r + (n_k − n_q). BLOCK_D: head_dim rounded up to a power of two. DOT_PRECISION: tl.dot's
    input_precision. A row that sees no key gets O = 0; rows and columns past n_q and head_dim are not
    written."""
    # TODO: which rows and which (batch, head, key/value head) this program owns
    # TODO: load this tile of Q once
    # TODO: the running maximum, sum and un-normalised output
    # TODO: loop over the key tiles any of these rows may see: scores, mask, online-softmax update
    # TODO: normalise and store O
    pass


flash_forward_kernel = ch05_flash_v2._flash_v2_minimal_kernel  # the solution: the chapter's minimal kernel


def lab_forward(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Launch `kernel` (the signature of `flash_forward_kernel`) on q (B, H, n_q, d), k, v (B, H_kv, n_k, d)
    as chapter 5's launcher does, with the lab's 16 × 16 tiles; O starts as NaN. O is followed by a tile's
    worth of slack, so that a store past its end (a missing row or column mask) is reported
    (`steps.SlackWritten`) instead of writing over memory the process does not own."""
    batch, heads, n_q, head_dim = q.shape
    slack = BLOCK_M * head_dim_block(head_dim) + head_dim
    buffer, flat = with_slack(q.numel(), slack, float("nan"), q.dtype, q.device)
    o = flat.view(q.shape)
    grid = (triton.cdiv(n_q, BLOCK_M), batch * heads)
    kernel[grid](q, k, v, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(), heads, heads // k.shape[1], n_q,
                 k.shape[2], head_dim, head_dim ** -0.5 * LOG2_E, CAUSAL=causal, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                 BLOCK_D=head_dim_block(head_dim), DOT_PRECISION=dot_precision(q.dtype))
    check_slack(buffer, q.numel(), float("nan"), "O", "mask the store: rows ≥ n_q and columns ≥ head_dim")
    return o


def _with_visibility(offset_of=lambda n_q, n_k: n_k - n_q, strict: bool = False):
    """A detector: the output is softmax attention with the causal diagonal at `offset_of(n_q, n_k)`."""
    def detect(a: Attempt) -> bool:
        n_q, n_k = a.case.n_q, a.case.n_k
        wrong = visibility(n_q, n_k, a.q.device, offset_of(n_q, n_k), strict=strict)
        return a.case.causal and a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case), wrong))
    return detect


def _not_normalised(a: Attempt) -> bool:
    """O = Σ_j 2^{S − m} V_j, never divided by ℓ."""
    n_q, n_k = a.case.n_q, a.case.n_k
    s = (a.q.double() @ a.k.double().transpose(-2, -1)) * sm_scale(a.case)
    if a.case.causal:
        s = s.masked_fill(~visibility(n_q, n_k, a.q.device, n_k - n_q), float("-inf"))
    top = s.amax(dim=-1, keepdim=True)
    return a.matches(torch.exp(s - torch.where(torch.isfinite(top), top, 0.0)) @ a.v.double())


def _loop_stops_early(a: Attempt) -> bool:
    """Causal, the loop over key tiles ends at the query tile's last row, (i + 1)·BLOCK_M, not shifted by n_k − n_q."""
    n_q, n_k = a.case.n_q, a.case.n_k
    visible = visibility(n_q, n_k, a.q.device, n_k - n_q)
    for start_m in range(0, n_q, BLOCK_M):
        visible[start_m:start_m + BLOCK_M, min(start_m + BLOCK_M, n_k):] = False
    return a.case.causal and n_k > n_q and a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case), visible))


def _nan_rows(a: Attempt) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows holding NaN, rows that see no key) of the output, over (batch, head, query)."""
    n_q, n_k = a.case.n_q, a.case.n_k
    nan = torch.isnan(a.got).any(dim=-1)
    sees = visibility(n_q, n_k, a.q.device, n_k - n_q).any(dim=-1) if a.case.causal else torch.ones(
        n_q, dtype=torch.bool, device=a.q.device)
    return nan, ~sees.expand_as(nan)


def _nan_where_no_key(a: Attempt) -> bool:
    """NaN only in rows that see no key (some of them at least), every other row right."""
    nan, blind = _nan_rows(a)
    return bool(nan.any()) and not bool((nan & ~blind).any()) and bool(torch.isfinite(a.got[~nan]).all()) and (
        relative_error(a.got[~nan], a.expected[~nan]) <= 3 * tolerance(a.case.dtype))


def _nan_where_keys_seen(a: Attempt) -> bool:
    """NaN in rows that see keys (and not everywhere): rows never written, or 0 × a value read past n_k."""
    nan, blind = _nan_rows(a)
    return bool((nan & ~blind).any()) and not bool(torch.isnan(a.got).all())


def _with_scale(scale_of):
    """A detector: the output is attention with the scale `scale_of(case)` (the causal mask as it should be)."""
    def detect(a: Attempt) -> bool:
        n_q, n_k = a.case.n_q, a.case.n_k
        visible = visibility(n_q, n_k, a.q.device, n_k - n_q) if a.case.causal else None
        return a.matches(attention64(a.q, a.k, a.v, scale_of(a.case), visible))
    return detect


def _causal_ignored(a: Attempt) -> bool:
    return a.case.causal and a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case)))


def _last_tile_only(a: Attempt) -> bool:
    """m_i never updated: α = 2^{−∞} = 0 wipes every tile but the last one a row's program visits."""
    n_q, n_k = a.case.n_q, a.case.n_k
    visible = visibility(n_q, n_k, a.q.device, n_k - n_q) if a.case.causal else torch.ones(
        n_q, n_k, dtype=torch.bool, device=a.q.device)
    for start_m in range(0, n_q, BLOCK_M):
        hi = min(start_m + BLOCK_M + n_k - n_q, n_k) if a.case.causal else n_k
        last = max(hi - 1, 0) // BLOCK_N * BLOCK_N
        visible[start_m:start_m + BLOCK_M, :last] = False
    return a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case), visible))


KERNEL_MISTAKES = (
    Mistake("unwritten", "Every element of O is still the NaN the lab filled it with: the kernel stored nothing. "
            "It ends with tl.store of O (rows < n_q, columns < head_dim masked).",
            lambda a: bool(torch.isnan(a.got).all())),
    MASK_MISTAKES[0], MASK_MISTAKES[1],
    Mistake("alignment", "The causal mask is aligned top-left (c ≤ r), right only when n_q = n_k. Bottom-right "
            "alignment shifts the diagonal by n_k − n_q: key c is visible to query r when c ≤ r + (n_k − n_q).",
            _with_visibility(lambda n_q, n_k: 0)),
    Mistake("off_by_one", "Each query must see its own diagonal key: c ≤ r + (n_k − n_q), not <.",
            _with_visibility(strict=True)),
    Mistake("loop_end", "With n_k > n_q the last rows of a causal tile see keys past (i + 1)·BLOCK_M: the loop over "
            "key tiles must run to min((i + 1)·BLOCK_M + (n_k − n_q), n_k), the last key the tile's last row sees.",
            _loop_stops_early),
    *UPDATE_MISTAKES[1:4],  # acc or ℓ not rescaled, e where 2 was meant
    Mistake("nan", "NaN in exactly the rows that see no key (causal, n_q > n_k): for them m = −∞ and ℓ = 0. Either "
            "2^(s − m) formed −∞ − (−∞) (shift by tl.where(m_new == float(\"-inf\"), 0.0, m_new)), or the end divided "
            "0 by 0 (divide by tl.where(l_i > 0.0, l_i, 1.0), leaving those rows 0).", _nan_where_no_key),
    Mistake("nan_rows", "NaN in rows that see keys: either rows no program wrote (the lab fills O with NaN: check "
            "how program ids become (batch, head) and rows, and that every row < n_q is stored), or 0 times a value "
            "loaded past n_k (load V with its mask and other=0.0).", _nan_where_keys_seen),
    Mistake("no_scale", "The output is the softmax of Q Kᵀ · ln 2: the scores were not multiplied by qk_scale "
            "(τ · log₂e), which puts them in the log₂ units tl.math.exp2 wants.", _with_scale(lambda c: math.log(2))),
    Mistake("causal_ignored", "The output ignores the causal mask: with CAUSAL, hide key c from query r when "
            "c > r + (n_k − n_q), and stop the loop after the last key the tile's last row sees.", _causal_ignored),
    Mistake("m_not_updated", "Only each program's last key tile counts: the running maximum is never updated (m_i = "
            "m_new at the end of each iteration), so α = 2^(m_i − m_new) = 0 wipes what came before.", _last_tile_only),
    Mistake("not_normalised", "The output is Σ_j 2^(S − m) V_j, never divided by ℓ: after the loop, O = acc / ℓ "
            "(with ℓ = 0, a row that saw no key, left as 0).", _not_normalised),
)

GQA_CASES = [AttentionCase(17, 70, False, torch.float32), AttentionCase(70, 17, True, torch.float32)]


def _grade_kernel(fn) -> tuple[int, int, Failure | None]:
    cases = attention_cases()
    total = len(cases) + len(GQA_CASES)
    passed, failure = grade_attention(lambda c, q, k, v: lab_forward(fn, q, k, v, c.causal), cases,
                                      list(KERNEL_MISTAKES), "Write it in the order of the TODOs, each from the "
                                      "chapter's equations; the earlier steps' helpers are its inner loop.")
    if failure is not None:
        return passed, total, failure
    for i, case in enumerate(GQA_CASES):  # 4 query heads on 2 key/value heads, over a batch of 2
        g = torch.Generator().manual_seed(77 + i)
        q = torch.randn(2, 4, case.n_q, case.head_dim, generator=g).to(default_device())
        # K: a view of a buffer with 4 heads (a kernel that reads head h, not h // group_size, reads wrong values,
        # not memory it does not own); V: (B, H_kv, d, n_k) transposed, so that its rows and columns have strides
        # of their own (a kernel that uses K's strides for V, or ignores a column stride, reads the wrong values)
        k = torch.randn(2, 4, case.n_k, case.head_dim, generator=g).to(default_device())[:, :2]
        v = torch.randn(2, 2, case.head_dim, case.n_k, generator=g).to(default_device()).transpose(2, 3)
        got = lab_forward(fn, q, k, v, case.causal)
        detail = compare(case, got, reference_attention(q, k, v, case.causal))
        if detail is not None:
            attempt = Attempt(case, q, k, v, got, reference_attention(q, k, v, case.causal))
            return len(cases) + i, total, Failure(f"{case}, batch 2, 4 query heads on 2 key/value heads", detail,
                                                  recognised(KERNEL_MISTAKES[:1], attempt) or [
                "Batch and grouped-query heads: program axis 1 is batch × n_heads + head; the key/value head is "
                "head // group_size; each tensor's batch and head strides place its rows."])
    return total, total, None


STEPS = {
    "mask": Step("ch05.mask", "hide the scores a query may not see", _grade_mask,
                 mask_scores_skeleton, mask_scores, MASK_MISTAKES),
    "online_softmax": Step("ch05.online_softmax", "fold one tile into the running (acc, ℓ, m)", _grade_update,
                           online_softmax_update_skeleton, online_softmax_update, UPDATE_MISTAKES),
    "causal_stages": Step("ch05.causal_stages", "where the unmasked and the masked stages end", _grade_stages,
                          causal_stages_skeleton, causal_stages,
                          tuple(Mistake(n, h, lambda a: False) for n, (_, h) in STAGE_MISTAKES.items())),
    "kernel": Step("ch05.kernel", "the whole FlashAttention-2 forward kernel", _grade_kernel,
                   flash_forward_kernel_skeleton, flash_forward_kernel, KERNEL_MISTAKES),
}

__all__ = ["STEPS", "lab_attention", "lab_forward", "mask_scores", "mask_scores_skeleton", "online_softmax_update",
           "online_softmax_update_skeleton", "causal_stages", "causal_stages_skeleton", "probe_stages",
           "flash_forward_kernel", "flash_forward_kernel_skeleton"]
