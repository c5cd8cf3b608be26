"""Lab 3's grader recognises each step's typical mistakes: planted slips are caught with their own hint
and no other; the solutions are the chapter's own lines (on the CPU, through Triton's interpreter)."""

from __future__ import annotations

import inspect

import pytest
import triton
import triton.language as tl

from tutorial_kernels import ch03_tiling_online_softmax as chapter
from tutorial_kernels.labs import ch03
from tutorial_kernels.tests.planted import assert_caught_with_its_hint


# --- planted mistakes: each is the solution with one typical slip -------------------------------------

@triton.jit
def _k_loop_unshifted_mask(a_tile, b_tile, offs_m, offs_n, offs_k, M, N, K, stride_ak, stride_bk,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           DOT_PRECISION: tl.constexpr):
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_tile, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)  # k0 forgotten
        b = tl.load(b_tile, mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk
    return acc


@triton.jit
def _k_loop_overwrites(a_tile, b_tile, offs_m, offs_n, offs_k, M, N, K, stride_ak, stride_bk,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_tile, mask=(offs_m[:, None] < M) & (k0 + offs_k[None, :] < K), other=0.0)
        b = tl.load(b_tile, mask=(k0 + offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, input_precision=DOT_PRECISION)  # not accumulated
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk
    return acc


@triton.jit
def _k_loop_not_advanced(a_tile, b_tile, offs_m, offs_n, offs_k, M, N, K, stride_ak, stride_bk,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_tile, mask=(offs_m[:, None] < M) & (k0 + offs_k[None, :] < K), other=0.0)
        b = tl.load(b_tile, mask=(k0 + offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)  # the windows never slide
    return acc


@triton.jit
def _stats_no_rescale(x_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l + tl.sum(tl.exp(x - shift), axis=0)  # ℓ not rescaled
        m = m_new
    return m, l


@triton.jit
def _stats_inverted(x_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(shift - m) + tl.sum(tl.exp(x - shift), axis=0)  # e^{m_new − m_old}
        m = m_new
    return m, l


@triton.jit
def _stats_m0_zero(x_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)  # m_0 = 0
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
        m = m_new
    return m, l


@triton.jit
def _stats_other_zero(x_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=0.0).to(tl.float32)  # pads with 0
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
        m = m_new
    return m, l


@triton.jit
def _stats_no_guard(x_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)  # −∞ − (−∞) on an all −∞ tile
        m = m_new
    return m, l


@triton.jit
def _k_loop_one_past_k(a_tile, b_tile, offs_m, offs_n, offs_k, M, N, K, stride_ak, stride_bk,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_tile, mask=(offs_m[:, None] < M) & (k0 + offs_k[None, :] <= K), other=0.0)  # <= K
        b = tl.load(b_tile, mask=(k0 + offs_k[:, None] <= K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk
    return acc


@triton.jit
def _stats_placeholders_kept(x_row, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
        m = m_new
    m = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)  # the skeleton's placeholders, left in below the sweep
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    return m, l


PLANTED = [
    ("ch03.k_loop", _k_loop_unshifted_mask, "ragged_k"),
    ("ch03.k_loop", _k_loop_overwrites, "overwritten"),
    ("ch03.k_loop", _k_loop_not_advanced, "not_advanced"),
    ("ch03.k_loop", _k_loop_one_past_k, "one_past_k"),
    ("ch03.online_softmax", _stats_no_rescale, "no_rescale"),
    ("ch03.online_softmax", _stats_inverted, "inverted"),
    ("ch03.online_softmax", _stats_m0_zero, "m0_zero"),
    ("ch03.online_softmax", _stats_other_zero, "ragged"),
    ("ch03.online_softmax", _stats_no_guard, "nan"),
    ("ch03.online_softmax", _stats_placeholders_kept, "unchanged"),
]


@pytest.mark.parametrize("step, fn, mistake", PLANTED, ids=[f"{s}-{m}" for s, _, m in PLANTED])
def test_a_planted_mistake_is_caught_with_its_hint(step, fn, mistake):
    assert_caught_with_its_hint(step, fn, mistake)


def test_every_mistake_of_the_lab_is_planted():
    """Each typical mistake but the untouched skeleton has a planted slip above that triggers it."""
    planted = {(step, mistake) for step, _, mistake in PLANTED}
    for step in ch03.STEPS.values():
        if step.name == "ch03.softmax_kernel":  # the whole kernel's slips are planted in test_labs.py, from its source
            continue
        for mistake in step.mistakes:
            assert mistake.name == "unchanged" or (step.name, mistake.name) in planted, (step.name, mistake.name)


def _code_lines(fn) -> list[str]:
    """The statements of a jitted function's body, comments and the docstring left out."""
    body = inspect.getsource(fn.fn).split('"""')[2]
    return [code for line in body.splitlines() if (code := line.split("#")[0].strip())]


def test_the_solutions_are_the_chapters_lines():
    """The K loop is `_matmul_pointer_kernel`'s (plus `input_precision`, which the attention kernels pass to
    `tl.dot` too) and the sweep is `_online_softmax_kernel`'s first loop."""
    for solution, kernel in ((ch03.k_loop, chapter._matmul_pointer_kernel),
                             (ch03.row_statistics, chapter._online_softmax_kernel)):
        chapter_lines = set(_code_lines(kernel))
        for code in _code_lines(solution):
            if not code.startswith("return"):
                code = code.replace(", input_precision=DOT_PRECISION", "")
                assert code in chapter_lines, f"{solution.__name__}: {code!r} is not in the chapter's kernel"


def test_the_cases_are_small_odd_and_fresh():
    """No length is a multiple of its tile, both dtypes run, and no two cases draw the same inputs."""
    for case in ch03.matmul_cases():
        assert all(case[axis] % 16 for axis in ("M", "N", "K"))
    for case in ch03.softmax_cases():
        assert case["n_cols"] % ch03.BLOCK
    x1 = ch03.draw_rows(ch03.softmax_cases()[1], 1)["x"]
    x2 = ch03.draw_rows(ch03.softmax_cases()[1], 2)["x"]
    assert not x1.eq(x2).all() and x1[1].abs().min() > 0
