"""Lab 9's grader can fail in the ways that teach: a band that masks instead of skipping is refused with its
own hint though its output is right, each planted slip in the scores (the bias inside the cap, its sign, the
window's mask) is named, a wrong softcap derivative and a wrong packed length are refused (on the CPU,
through Triton's interpreter); the solutions are chapter 9's own helpers."""

from __future__ import annotations

import triton
import triton.language as tl

from tutorial_kernels import ch09_variants
from tutorial_kernels.labs import check
from tutorial_kernels.labs.ch09 import STEPS, tanh
from tutorial_kernels.tests.planted import assert_caught_with_its_hint


@triton.jit
def _band_without_right_bound(start_m, n_q, n_k, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    lo = 0
    hi = n_k  # the right bound forgotten: the tiles past the diagonal are visited and masked
    if HAS_LEFT:
        lo = tl.maximum(start_m + (n_k - n_q) - left, 0) // BLOCK_N * BLOCK_N
    return lo, hi


@triton.jit
def _scores_with(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP: tl.constexpr,
                 ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BIAS_IN_CAP: tl.constexpr,
                 SIGN: tl.constexpr, WINDOW: tl.constexpr, SQUARE: tl.constexpr):
    x = qk * sm_scale
    distance = cols[None, :] - (rows[:, None] + (n_k - n_q))
    bias = 0.0
    if ALIBI:
        bias = SIGN * slope * tl.abs(distance).to(tl.float32)
    if BIAS_IN_CAP:
        x = x + bias
    slope_of_cap = 1.0
    if SOFTCAP:
        t = tanh(x / softcap)
        x = softcap * t
        slope_of_cap = 1.0 - t * t if SQUARE else 1.0 - t
    if not BIAS_IN_CAP:
        x = x + bias
    seen = (rows[:, None] < n_q) & (cols[None, :] < n_k)
    if WINDOW and HAS_LEFT:
        seen = seen & (distance >= -left)
    if WINDOW and HAS_RIGHT:
        seen = seen & (distance <= right)
    return tl.where(seen, x * 1.4426950408889634, float("-inf")), slope_of_cap


@triton.jit
def _bias_in_cap(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP: tl.constexpr,
                 ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    return _scores_with(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP, ALIBI, HAS_LEFT,
                        HAS_RIGHT, True, -1.0, True, True)


@triton.jit
def _bias_sign(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP: tl.constexpr,
               ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    return _scores_with(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP, ALIBI, HAS_LEFT,
                        HAS_RIGHT, False, 1.0, True, True)


@triton.jit
def _no_window(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP: tl.constexpr,
               ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    return _scores_with(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP, ALIBI, HAS_LEFT,
                        HAS_RIGHT, False, -1.0, False, True)


@triton.jit
def _slope_not_squared(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP: tl.constexpr,
                       ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    return _scores_with(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right, SOFTCAP, ALIBI, HAS_LEFT,
                        HAS_RIGHT, False, -1.0, True, False)


@triton.jit
def _length_is_the_end(cu_ptr, batch, n_dense, VARLEN: tl.constexpr):
    start = batch * 0
    length = n_dense
    if VARLEN:
        start = tl.load(cu_ptr + batch).to(tl.int64)
        length = tl.load(cu_ptr + batch + 1)  # the next start, not the length
    return start, length


def test_a_band_that_masks_instead_of_skipping_is_refused_with_its_hint():
    assert_caught_with_its_hint("ch09.key_range", _band_without_right_bound, "no_skip")


def test_the_planted_score_slips_are_named():
    for planted, mistake in ((_bias_in_cap, "bias_capped"), (_bias_sign, "bias_sign"), (_no_window, "no_mask")):
        assert_caught_with_its_hint("ch09.scores", planted, mistake)


def test_a_wrong_softcap_derivative_is_refused():
    report = check("ch09.scores", _slope_not_squared, quiet=True)
    assert not report.passed and "the softcap's derivative" in report.message and "1 − tanh²" in report.message


def test_a_wrong_packed_length_is_refused():
    report = check("ch09.sequence", _length_is_the_end, quiet=True)
    assert not report.passed and "wrote past the end of the packed output" in report.message
    assert "its length is the difference" in report.message


def test_the_solutions_are_the_chapters_helpers():
    assert STEPS["key_range"].solution is ch09_variants._key_range
    assert STEPS["scores"].solution is ch09_variants._variant_scores
    assert STEPS["sequence"].solution is ch09_variants._sequence
