"""Lab 6's grader can fail: planted typical mistakes of Δ, of the recomputed P and of the dQ update are each
caught with their own hint, and the solutions are chapter 6's own lines. (That every step's solution
passes and its unfilled skeleton fails is `test_labs.py`'s, for every lab.)"""

from __future__ import annotations

import inspect

import pytest
import triton
import triton.language as tl

from tutorial_kernels import ch06_backward
from tutorial_kernels.tests.planted import assert_caught_with_its_hint

# --- planted mistakes: each is the solution with one typical slip -------------------------------------


@triton.jit
def _delta_rowsum_do(o, do):
    delta = tl.sum(do.to(tl.float32), axis=1)  # O forgotten
    return delta


@triton.jit
def _delta_rowsum_o(o, do):
    delta = tl.sum(o.to(tl.float32), axis=1)  # dO forgotten
    return delta


@triton.jit
def _p_exp(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    p = tl.exp(s * qk_scale - lse2[:, None])  # natural exp of log₂-unit scores
    if MASKED:
        visible = offs_n[None, :] <= offs_m[:, None] + (n_k - n_q)
        p = tl.where(visible, p, 0.0)
    return p


@triton.jit
def _p_no_scale(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    p = tl.math.exp2(s - lse2[:, None])  # the raw scores, τ·log₂e forgotten
    if MASKED:
        visible = offs_n[None, :] <= offs_m[:, None] + (n_k - n_q)
        p = tl.where(visible, p, 0.0)
    return p


@triton.jit
def _p_lse_natural(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    p = tl.math.exp2(s * qk_scale - lse2[:, None] / 1.4426950408889634)  # lse back in natural units
    if MASKED:
        visible = offs_n[None, :] <= offs_m[:, None] + (n_k - n_q)
        p = tl.where(visible, p, 0.0)
    return p


@triton.jit
def _p_no_mask(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    p = tl.math.exp2(s * qk_scale - lse2[:, None])  # MASKED ignored
    return p


@triton.jit
def _p_top_left(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    p = tl.math.exp2(s * qk_scale - lse2[:, None])
    if MASKED:
        visible = offs_n[None, :] <= offs_m[:, None]  # the diagonal not shifted by n_k − n_q
        p = tl.where(visible, p, 0.0)
    return p


@triton.jit
def _p_strict(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    p = tl.math.exp2(s * qk_scale - lse2[:, None])
    if MASKED:
        visible = offs_n[None, :] < offs_m[:, None] + (n_k - n_q)  # the diagonal key hidden
        p = tl.where(visible, p, 0.0)
    return p


@triton.jit
def _p_fill_minus_inf(s, lse2, offs_m, offs_n, n_q, n_k, qk_scale, MASKED: tl.constexpr):
    p = tl.math.exp2(s * qk_scale - lse2[:, None])
    if MASKED:
        visible = offs_n[None, :] <= offs_m[:, None] + (n_k - n_q)
        p = tl.where(visible, p, float("-inf"))  # a score's fill, not a probability's
    return p


@triton.jit
def _dq_no_delta(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * dp  # Δ not subtracted
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _dq_no_p(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = dp - delta[:, None]  # P ∘ forgotten
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _dq_dp_from_keys(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    dp = tl.dot(do, tl.trans(k), input_precision=DOT_PRECISION)  # dO Kᵀ
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _dq_with_values(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(v.dtype), v, dq, input_precision=DOT_PRECISION)  # dS V
    return dq


@triton.jit
def _dq_delta_as_columns(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[None, :])  # Δ along the keys: runs, since BLOCK_M = BLOCK_N
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _dq_plus_delta(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp + delta[:, None])  # wrong sign
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _dq_overwritten(dq, p, do, k, v, delta, DOT_PRECISION: tl.constexpr):
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)  # dq not passed as the accumulator
    return dq


PLANTED = [
    ("ch06.delta", _delta_rowsum_do, "rowsum_do"),
    ("ch06.delta", _delta_rowsum_o, "rowsum_o"),
    ("ch06.recompute_p", _p_exp, "exp"),
    ("ch06.recompute_p", _p_no_scale, "no_scale"),
    ("ch06.recompute_p", _p_lse_natural, "lse_units"),
    ("ch06.recompute_p", _p_no_mask, "no_mask"),
    ("ch06.recompute_p", _p_top_left, "alignment"),
    ("ch06.recompute_p", _p_fill_minus_inf, "fill"),
    ("ch06.recompute_p", _p_strict, "off_by_one"),
    ("ch06.dq", _dq_no_delta, "no_delta"),
    ("ch06.dq", _dq_no_p, "no_p"),
    ("ch06.dq", _dq_dp_from_keys, "dp_keys"),
    ("ch06.dq", _dq_with_values, "values"),
    ("ch06.dq", _dq_delta_as_columns, "broadcast"),
    ("ch06.dq", _dq_plus_delta, "plus_delta"),
    ("ch06.dq", _dq_overwritten, "overwritten"),
]


@pytest.mark.parametrize("step, fn, mistake", PLANTED, ids=[f"{s}-{m}" for s, _, m in PLANTED])
def test_a_planted_mistake_is_caught_with_its_hint(step, fn, mistake):
    assert_caught_with_its_hint(step, fn, mistake)


def test_the_solutions_are_the_chapters_lines():
    """Δ is `_attn_bwd_preprocess_kernel`'s line; P and the dQ update are `_dq_from_key_tiles`' (comments aside)."""
    def lines(fn):
        return {line.split("#")[0].strip() for line in inspect.getsource(fn.fn).splitlines()}

    from tutorial_kernels.labs import ch06

    for solution, kernel in ((ch06.delta_rows, ch06_backward._attn_bwd_preprocess_kernel),
                             (ch06.recompute_p, ch06_backward._dq_from_key_tiles),
                             (ch06.dq_update, ch06_backward._dq_from_key_tiles)):
        chapter = lines(kernel)
        body = inspect.getsource(solution.fn).split('"""')[2].splitlines()
        for line in body:
            code = line.split("#")[0].strip()
            if code and not code.startswith("return"):
                assert code in chapter, f"{solution.__name__}: {code!r} is not in {kernel.__name__}"
