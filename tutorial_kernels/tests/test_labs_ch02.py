"""Lab 2's grader catches each step's typical mistakes with their own hint, and its solutions and
skeletons are chapter 2's kernels (on the CPU, through Triton's interpreter)."""

from __future__ import annotations

import inspect

import pytest
import triton
import triton.language as tl

from tutorial_kernels import ch02_naive_attention
from tutorial_kernels.labs import ch02
from tutorial_kernels.tests.planted import assert_caught_with_its_hint


# --- planted mistakes: each is the chapter's kernel with one typical slip ------------------------------

@triton.jit
def _softmax_zero_padding(s_ptr, p_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    running_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=0.0)  # the slip
        running_max = tl.maximum(running_max, x.to(tl.float32))
    row_max = tl.max(running_max, axis=0)
    running_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=0.0)  # the slip
        running_sum += tl.exp(x.to(tl.float32) - row_max)
    inv_sum = 1.0 / tl.sum(running_sum, axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=mask, other=0.0)
        tl.store(p_ptr + row * n_cols + start + cols, (tl.exp(x.to(tl.float32) - row_max) * inv_sum)
                 .to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_no_max(s_ptr, p_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    running_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_sum += tl.exp(x.to(tl.float32))  # the slip: no max subtracted
    inv_sum = 1.0 / tl.sum(running_sum, axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=mask, other=float("-inf"))
        tl.store(p_ptr + row * n_cols + start + cols, (tl.exp(x.to(tl.float32)) * inv_sum)
                 .to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_unnormalised(s_ptr, p_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    running_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_max = tl.maximum(running_max, x.to(tl.float32))
    row_max = tl.max(running_max, axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=mask, other=float("-inf"))
        p = tl.exp(x.to(tl.float32) - row_max)  # the slip: not divided by the row sum
        tl.store(p_ptr + row * n_cols + start + cols, p.to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_clamped_max(s_ptr, p_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    running_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_max = tl.maximum(running_max, x.to(tl.float32))
    row_max = tl.maximum(tl.max(running_max, axis=0), 0.0)  # the slip: avoids −∞, but clamps every max
    running_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_sum += tl.exp(x.to(tl.float32) - row_max)
    row_sum = tl.sum(running_sum, axis=0)
    inv_sum = tl.where(row_sum > 0.0, 1.0 / tl.maximum(row_sum, 1e-30), 0.0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(s_ptr + row * n_cols + start + cols, mask=mask, other=float("-inf"))
        tl.store(p_ptr + row * n_cols + start + cols, (tl.exp(x.to(tl.float32) - row_max) * inv_sum)
                 .to(p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_with_slip(s_ptr, p_ptr, n_cols, BLOCK: tl.constexpr, SLIP: tl.constexpr):
    """The chapter's softmax, guards included, with one slip a learner made: "max_padding" (pass 1 loads the
    padding as 0), "unmasked_load" (no load is masked), "store_mask" (the store is not masked: without the
    lab's slack after P it wrote over memory the interpreter does not own and killed the process)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    running_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        if SLIP == "max_padding":
            x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=0.0)
        elif SLIP == "unmasked_load":
            x = tl.load(s_ptr + row * n_cols + start + cols)
        else:
            x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_max = tl.maximum(running_max, x.to(tl.float32))
    row_max = tl.max(running_max, axis=0)
    if SLIP != "max_padding":  # step 1's kernel has no guards yet; the others keep them
        row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    running_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        if SLIP == "unmasked_load":
            x = tl.load(s_ptr + row * n_cols + start + cols)
        else:
            x = tl.load(s_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_sum += tl.exp(x.to(tl.float32) - row_max)
    row_sum = tl.sum(running_sum, axis=0)
    if SLIP == "max_padding":
        inv_sum = 1.0 / row_sum
    else:
        inv_sum = tl.where(row_sum > 0.0, 1.0 / tl.maximum(row_sum, 1e-30), 0.0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        if SLIP == "unmasked_load":
            x = tl.load(s_ptr + row * n_cols + start + cols)
        else:
            x = tl.load(s_ptr + row * n_cols + start + cols, mask=mask, other=float("-inf"))
        p = (tl.exp(x.to(tl.float32) - row_max) * inv_sum).to(p_ptr.dtype.element_ty)
        if SLIP == "store_mask":
            tl.store(p_ptr + row * n_cols + start + cols, p)
        else:
            tl.store(p_ptr + row * n_cols + start + cols, p, mask=mask)


def _softmax_slip(slip: str):
    """`_softmax_with_slip` with SLIP bound, launched as the grader launches a learner's kernel."""
    class Slipped:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: _softmax_with_slip[grid](*args, **kwargs, SLIP=slip)
    return Slipped()


@triton.jit
def _scores_with_mask(q_ptr, k_ptr, s_ptr, stride_qb, stride_qh, stride_qm, stride_qd,
                      stride_kb, stride_kh, stride_kn, stride_kd, n_heads, n_q, n_k, head_dim, sm_scale,
                      CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, SLIP: tl.constexpr):
    """`_scores_kernel` with the causal mask written with one slip."""
    pid_bh = tl.program_id(2).to(tl.int64)
    batch = pid_bh // n_heads
    head = pid_bh % n_heads
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim), other=0.0)
    k_t = tl.load(k_ptr + batch * stride_kb + head * stride_kh + offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kn,
                  mask=(offs_d[:, None] < head_dim) & (offs_n[None, :] < n_k), other=0.0)
    s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * sm_scale
    if CAUSAL:
        if SLIP == "top_left":
            s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        elif SLIP == "strict":
            s = tl.where(offs_n[None, :] < offs_m[:, None] + (n_k - n_q), s, float("-inf"))
        elif SLIP == "tile_local":  # positions inside the tile, not in the matrix
            s = tl.where(tl.arange(0, BLOCK_N)[None, :] <= tl.arange(0, BLOCK_M)[:, None] + (n_k - n_q), s,
                         float("-inf"))
        elif SLIP == "sign":
            s = tl.where(offs_n[None, :] <= offs_m[:, None] + (n_q - n_k), s, float("-inf"))
        else:  # "finite"
            s = tl.where(offs_n[None, :] <= offs_m[:, None] + (n_k - n_q), s, -1e9)
    tl.store(s_ptr + pid_bh * n_q * n_k + offs_m[:, None].to(tl.int64) * n_k + offs_n[None, :],
             s.to(s_ptr.dtype.element_ty), mask=(offs_m[:, None] < n_q) & (offs_n[None, :] < n_k))


def _scores_slip(slip: str):
    """`_scores_with_mask` with SLIP bound, launched as the grader launches a learner's kernel: kernel[grid](...)."""
    class Slipped:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: _scores_with_mask[grid](*args, **kwargs, SLIP=slip)
    return Slipped()


PLANTED = [
    ("ch02.softmax", _softmax_zero_padding, "padding"),
    ("ch02.softmax", _softmax_no_max, "no_max"),
    ("ch02.softmax", _softmax_unnormalised, "unnormalised"),
    ("ch02.causal_mask", _scores_slip("top_left"), "alignment"),
    ("ch02.causal_mask", _scores_slip("strict"), "off_by_one"),
    ("ch02.causal_mask", _scores_slip("sign"), "sign"),
    ("ch02.causal_mask", _scores_slip("finite"), "finite"),
    ("ch02.empty_rows", ch02.guarded_softmax_kernel_skeleton, "nan"),  # no guards: the unfilled skeleton is that slip
    ("ch02.empty_rows", _softmax_clamped_max, "clamp"),
    # a learner's run through the lab
    ("ch02.softmax", _softmax_slip("max_padding"), "max_padding"),
    ("ch02.softmax", _softmax_slip("unmasked_load"), "unmasked_load"),
    ("ch02.softmax", _softmax_slip("store_mask"), "store_mask"),
    ("ch02.empty_rows", _softmax_slip("store_mask"), "store_mask"),
    ("ch02.causal_mask", _scores_slip("tile_local"), "tile_local"),
]


@pytest.mark.parametrize("step, fn, mistake", PLANTED, ids=[f"{s}-{m}" for s, _, m in PLANTED])
def test_a_planted_mistake_is_caught_with_its_hint(step, fn, mistake):
    assert_caught_with_its_hint(step, fn, mistake)


def test_the_solutions_are_the_chapters_kernels():
    """Each step's solution is chapter 2's kernel itself, not a second version."""
    assert ch02.STEPS["softmax"].solution is ch02_naive_attention._softmax_kernel
    assert ch02.STEPS["empty_rows"].solution is ch02_naive_attention._softmax_kernel
    assert ch02.STEPS["causal_mask"].solution is ch02_naive_attention._scores_kernel


@pytest.mark.parametrize("step", ["softmax", "causal_mask", "empty_rows"])
def test_the_skeletons_are_the_chapters_kernels_with_holes(step):
    """Every code line of a skeleton is a line of the chapter's kernel, a placeholder marked TODO, or (step 1)
    the unguarded division that step 3 guards; comments aside."""
    spec = ch02.STEPS[step]
    chapter = {line.split("#")[0].strip() for line in inspect.getsource(spec.solution.fn).splitlines()}
    body = inspect.getsource(spec.skeleton.fn).split('"""')[2].splitlines()
    for line in body:
        code = line.split("#")[0].strip()
        if code and code != "pass" and "TODO" not in line and "ch02.empty_rows" not in line:
            assert code in chapter, f"{spec.name}: {code!r} is not in the chapter's kernel"
