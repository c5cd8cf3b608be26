"""Lab 4's grader can tell typical mistakes apart: each planted slip in the update of O, ℓ, m or in their
round trip through HBM is caught with its own hint (on the CPU, through Triton's interpreter), and the
solutions are chapter 4's own lines."""

from __future__ import annotations

import inspect

import pytest
import triton
import triton.language as tl

from tutorial_kernels import ch04_flash_v1
from tutorial_kernels.ch04_flash_v1 import _finite_or_zero
from tutorial_kernels.labs import check
from tutorial_kernels.labs.ch04 import STEPS, flash_v1_update, round_trip_state
from tutorial_kernels.tests.planted import assert_caught_with_its_hint


# --- planted mistakes in ch04.update: the solution with one slip -----------------------------------------

@triton.jit
def _update_no_alpha_o(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    shift = _finite_or_zero(m_new)
    alpha = tl.exp(m_i - shift)
    beta = tl.exp(m_tile - shift)
    l_new = alpha * l_i + beta * l_tile
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = l_i[:, None] * o_i + beta[:, None] * pv  # O_i not rescaled by alpha
    o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]
    return o_i, l_new, m_new


@triton.jit
def _update_no_alpha_l(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    shift = _finite_or_zero(m_new)
    alpha = tl.exp(m_i - shift)
    beta = tl.exp(m_tile - shift)
    l_new = l_i + beta * l_tile  # ℓ_i not rescaled
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = (l_i * alpha)[:, None] * o_i + beta[:, None] * pv
    o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]
    return o_i, l_new, m_new


@triton.jit
def _update_no_beta(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    shift = _finite_or_zero(m_new)
    alpha = tl.exp(m_i - shift)
    l_new = alpha * l_i + l_tile  # this tile not brought to the new maximum
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = (l_i * alpha)[:, None] * o_i + pv
    o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]
    return o_i, l_new, m_new


@triton.jit
def _update_not_unnormalised(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    shift = _finite_or_zero(m_new)
    alpha = tl.exp(m_i - shift)
    beta = tl.exp(m_tile - shift)
    l_new = alpha * l_i + beta * l_tile
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = alpha[:, None] * o_i + beta[:, None] * pv  # the normalised O_i not multiplied by ℓ_i
    o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]
    return o_i, l_new, m_new


@triton.jit
def _update_no_division(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    shift = _finite_or_zero(m_new)
    alpha = tl.exp(m_i - shift)
    beta = tl.exp(m_tile - shift)
    l_new = alpha * l_i + beta * l_tile
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = (l_i * alpha)[:, None] * o_i + beta[:, None] * pv  # never divided by ℓ_new
    return o_i, l_new, m_new


@triton.jit
def _update_twice(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    shift = _finite_or_zero(m_new)
    alpha = tl.exp(m_i - shift)
    beta = tl.exp(m_tile - shift)
    l_new = alpha * l_i + beta * l_tile
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = (l_i * alpha)[:, None] * o_i + beta[:, None] * pv
    o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]
    o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]  # normalised twice
    return o_i, l_new, m_new


@triton.jit
def _update_exp2(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    shift = _finite_or_zero(m_new)
    alpha = tl.math.exp2(m_i - shift)  # chapter 5's base-2 habit, on natural-unit scores
    beta = tl.math.exp2(m_tile - shift)
    l_new = alpha * l_i + beta * l_tile
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = (l_i * alpha)[:, None] * o_i + beta[:, None] * pv
    o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]
    return o_i, l_new, m_new


@triton.jit
def _update_no_guard(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    alpha = tl.exp(m_i - m_new)  # −∞ − (−∞) for a row that has seen no key yet
    beta = tl.exp(m_tile - m_new)
    l_new = alpha * l_i + beta * l_tile
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = (l_i * alpha)[:, None] * o_i + beta[:, None] * pv
    o_i = o_i / l_new[:, None]
    return o_i, l_new, m_new


@triton.jit
def _update_returns_the_old_state(o_i, l_i, m_i, s, v, DOT_PRECISION: tl.constexpr):
    m_tile = tl.max(s, axis=1)
    p = tl.exp(s - _finite_or_zero(m_tile)[:, None])
    l_tile = tl.sum(p, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    shift = _finite_or_zero(m_new)
    alpha = tl.exp(m_i - shift)
    beta = tl.exp(m_tile - shift)
    l_new = alpha * l_i + beta * l_tile
    pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    o_i = (l_i * alpha)[:, None] * o_i + beta[:, None] * pv
    o_i = o_i / tl.where(l_new > 0.0, l_new, 1.0)[:, None]
    return o_i, l_i, m_i  # the skeleton's return line, kept


# --- planted mistakes in ch04.round_trip ------------------------------------------------------------------

@triton.jit
def _round_trip_no_store_o(acc_head, l_head, m_head, rows, offs_d, row_ok, tile_ok, head_dim, s, v,
                           UPDATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    o_i = tl.load(acc_head + rows[:, None] * head_dim + offs_d[None, :], mask=tile_ok, other=0.0)
    l_i = tl.load(l_head + rows, mask=row_ok, other=0.0)
    m_i = tl.load(m_head + rows, mask=row_ok, other=float("-inf"))
    o_i, l_new, m_new = UPDATE(o_i, l_i, m_i, s, v, DOT_PRECISION)
    tl.store(l_head + rows, l_new, mask=row_ok)  # O_i never written back
    tl.store(m_head + rows, m_new, mask=row_ok)


@triton.jit
def _round_trip_no_store_m(acc_head, l_head, m_head, rows, offs_d, row_ok, tile_ok, head_dim, s, v,
                           UPDATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    o_i = tl.load(acc_head + rows[:, None] * head_dim + offs_d[None, :], mask=tile_ok, other=0.0)
    l_i = tl.load(l_head + rows, mask=row_ok, other=0.0)
    m_i = tl.load(m_head + rows, mask=row_ok, other=float("-inf"))
    o_i, l_new, m_new = UPDATE(o_i, l_i, m_i, s, v, DOT_PRECISION)
    tl.store(acc_head + rows[:, None] * head_dim + offs_d[None, :], o_i, mask=tile_ok)
    tl.store(l_head + rows, l_new, mask=row_ok)  # m_new never written back


@triton.jit
def _round_trip_no_store_l(acc_head, l_head, m_head, rows, offs_d, row_ok, tile_ok, head_dim, s, v,
                           UPDATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    o_i = tl.load(acc_head + rows[:, None] * head_dim + offs_d[None, :], mask=tile_ok, other=0.0)
    l_i = tl.load(l_head + rows, mask=row_ok, other=0.0)
    m_i = tl.load(m_head + rows, mask=row_ok, other=float("-inf"))
    o_i, l_new, m_new = UPDATE(o_i, l_i, m_i, s, v, DOT_PRECISION)
    tl.store(acc_head + rows[:, None] * head_dim + offs_d[None, :], o_i, mask=tile_ok)
    tl.store(m_head + rows, m_new, mask=row_ok)  # ℓ_new never written back


@triton.jit
def _round_trip_no_loads(acc_head, l_head, m_head, rows, offs_d, row_ok, tile_ok, head_dim, s, v,
                         UPDATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    o_i = tl.zeros([rows.shape[0], offs_d.shape[0]], tl.float32)  # a fresh state for every K/V tile
    l_i = tl.zeros([rows.shape[0]], tl.float32)
    m_i = tl.full([rows.shape[0]], float("-inf"), tl.float32)
    o_i, l_new, m_new = UPDATE(o_i, l_i, m_i, s, v, DOT_PRECISION)
    tl.store(acc_head + rows[:, None] * head_dim + offs_d[None, :], o_i, mask=tile_ok)
    tl.store(l_head + rows, l_new, mask=row_ok)
    tl.store(m_head + rows, m_new, mask=row_ok)


PLANTED = [
    ("update", _update_no_alpha_o, "no_alpha_o"),
    ("update", _update_no_alpha_l, "no_alpha_l"),
    ("update", _update_no_beta, "no_beta"),
    ("update", _update_not_unnormalised, "not_unnormalised"),
    ("update", _update_no_division, "no_division"),
    ("update", _update_twice, "twice"),
    ("update", _update_exp2, "exp2"),
    ("update", _update_no_guard, "nan"),
    ("update", _update_returns_the_old_state, "old_state"),
    ("round_trip", _round_trip_no_store_o, "no_store_o"),
    ("round_trip", _round_trip_no_store_m, "stale"),
    ("round_trip", _round_trip_no_store_l, "stale"),
    ("round_trip", _round_trip_no_loads, "stale"),
]


@pytest.mark.parametrize("name, fn, mistake", PLANTED, ids=[f"{s}-{fn.__name__}" for s, fn, _ in PLANTED])
def test_a_planted_mistake_is_caught_with_its_hint(name, fn, mistake):
    assert_caught_with_its_hint(STEPS[name].name, fn, mistake)


def test_the_solutions_are_the_chapters_lines():
    """The update and the round trip are `_flash_v1_kernel`'s own lines (comments aside); the round trip's
    one call of UPDATE stands for the lines of step 1."""
    chapter = {line.split("#")[0].strip() for line in inspect.getsource(ch04_flash_v1._flash_v1_kernel.fn)
               .splitlines()}
    for solution in (flash_v1_update, round_trip_state):
        body = inspect.getsource(solution.fn).split('"""')[2].splitlines()
        for line in body:
            code = line.split("#")[0].strip()
            if code and not code.startswith("return") and "UPDATE(" not in code:
                assert code in chapter, f"{solution.__name__}: {code!r} is not in the chapter's kernel"


@triton.jit
def _round_trip_unmasked_store(acc_head, l_head, m_head, rows, offs_d, row_ok, tile_ok, head_dim, s, v,
                               UPDATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    o_i = tl.load(acc_head + rows[:, None] * head_dim + offs_d[None, :], mask=tile_ok, other=0.0)
    l_i = tl.load(l_head + rows, mask=row_ok, other=0.0)
    m_i = tl.load(m_head + rows, mask=row_ok, other=float("-inf"))
    o_i, l_new, m_new = UPDATE(o_i, l_i, m_i, s, v, DOT_PRECISION)
    tl.store(acc_head + rows[:, None] * head_dim + offs_d[None, :], o_i, mask=tile_ok)
    tl.store(l_head + rows, l_new, mask=row_ok)
    tl.store(m_head + rows, m_new)  # no mask: the ragged last tile writes past the end of m


def test_a_store_without_its_mask_is_named_not_a_crash():
    """Through the interpreter an unmasked store past a buffer's end would overwrite memory the process
    does not own (and kill a notebook's kernel); the lab's buffers carry slack, and the grader says which."""
    report = check("ch04.round_trip", _round_trip_unmasked_store, quiet=True)
    assert not report.passed
    assert "wrote past the end of m" in report.message, report.message
