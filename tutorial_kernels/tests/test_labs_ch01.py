"""Lab 1's grader recognises the typical mistakes of each step (planted: the solution with one slip),
each with its own hint, and its solutions are chapter 1's own code (on the CPU, through Triton's
interpreter). The generic checks (solutions pass, skeletons fail, the notebook) are in test_labs.py."""

from __future__ import annotations

import inspect

import pytest
import torch
import triton
import triton.language as tl

from tutorial_kernels import ch01_gpu_hierarchy
from tutorial_kernels.labs import ch01, check
from tutorial_kernels.labs.grader import LABS
from tutorial_kernels.tests.planted import assert_caught_with_its_hint

# --- step 1: the block sum ---------------------------------------------------------------------------


@triton.jit
def _block_offset(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid + tl.arange(0, BLOCK)  # × BLOCK forgotten
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def _block_no_mask(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def _block_other_inf(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf"))  # a softmax's fill, not a sum's
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def _block_float16_sum(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(x, axis=0).to(tl.float32))  # added in the input's dtype


@triton.jit
def _block_one_slot(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr, tl.sum(x.to(tl.float32), axis=0))  # + pid forgotten


@triton.jit
def _block_store_tile(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + offs, x.to(tl.float32))  # the tile, past partial's end: the lab's slack takes it


@triton.jit
def _block_one_past(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs <= n, other=0.0)  # reads x[n]
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


# --- step 2: the passes ------------------------------------------------------------------------------

def _one_pass(x, partial_sums_kernel, BLOCK):
    n = x.numel()
    partial = torch.empty(triton.cdiv(n, BLOCK), dtype=torch.float32, device=x.device)
    partial_sums_kernel[(partial.numel(),)](x, partial, n, BLOCK=BLOCK)
    return partial[0]


def _two_passes(x, partial_sums_kernel, BLOCK):
    values, n = x, x.numel()
    for _ in range(2):  # enough up to BLOCK² elements, not for 4097
        partial = torch.empty(triton.cdiv(n, BLOCK), dtype=torch.float32, device=x.device)
        partial_sums_kernel[(partial.numel(),)](values, partial, n, BLOCK=BLOCK)
        values, n = partial, partial.numel()
    return partial[0]


def _stale_n(x, partial_sums_kernel, BLOCK):
    n = x.numel()
    values, count = x, n
    while True:
        partial = torch.empty(triton.cdiv(count, BLOCK), dtype=torch.float32, device=x.device)
        partial_sums_kernel[(partial.numel(),)](values, partial, n, BLOCK=BLOCK)  # n never updated
        values, count = partial, partial.numel()
        if count == 1:
            return partial.reshape(())


def _floor_grid(x, partial_sums_kernel, BLOCK):
    n = x.numel()
    values = x
    while True:
        partial = torch.empty(max(n // BLOCK, 1), dtype=torch.float32, device=x.device)  # rounds down
        partial_sums_kernel[(partial.numel(),)](values, partial, n, BLOCK=BLOCK)
        values, n = partial, partial.numel()
        if n == 1:
            return partial.reshape(())


def _half_partials(x, partial_sums_kernel, BLOCK):
    n = x.numel()
    values = x
    while True:
        partial = torch.empty(triton.cdiv(n, BLOCK), dtype=x.dtype, device=x.device)  # float16 for float16 x
        partial_sums_kernel[(partial.numel(),)](values, partial, n, BLOCK=BLOCK)
        values, n = partial, partial.numel()
        if n == 1:
            return partial.reshape(()).float()


def _torch_finish(x, partial_sums_kernel, BLOCK):
    n = x.numel()
    partial = torch.empty(triton.cdiv(n, BLOCK), dtype=torch.float32, device=x.device)
    partial_sums_kernel[(partial.numel(),)](x, partial, n, BLOCK=BLOCK)
    return partial.sum()  # the rest added by torch, not by the kernel


def _no_reshape(x, partial_sums_kernel, BLOCK):
    n = x.numel()
    values = x
    while n > 1:  # n = 1: no launch, x itself comes back
        partial = torch.empty(triton.cdiv(n, BLOCK), dtype=torch.float32, device=x.device)
        partial_sums_kernel[(partial.numel(),)](values, partial, n, BLOCK=BLOCK)
        values, n = partial, partial.numel()
    return values


# --- step 3: atomics ---------------------------------------------------------------------------------

@triton.jit
def _atomic_store(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(total_ptr, tl.sum(x.to(tl.float32), axis=0))  # overwrites: the last program wins


@triton.jit
def _atomic_no_mask(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.atomic_add(total_ptr, tl.sum(x.to(tl.float32), axis=0), sem="relaxed")


@triton.jit
def _atomic_offset(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(total_ptr, tl.sum(x.to(tl.float32), axis=0), sem="relaxed")


@triton.jit
def _atomic_per_program(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(total_ptr + pid, tl.sum(x.to(tl.float32), axis=0), sem="relaxed")  # past total's one float


PLANTED = [
    ("ch01.block_sum", _block_offset, "offset"),
    ("ch01.block_sum", _block_no_mask, "no_mask"),
    ("ch01.block_sum", _block_other_inf, "other"),
    ("ch01.block_sum", _block_float16_sum, "float16"),
    ("ch01.block_sum", _block_one_slot, "one_slot"),
    ("ch01.two_pass", _one_pass, "one_pass"),
    ("ch01.two_pass", _two_passes, "fixed_passes"),
    ("ch01.two_pass", _stale_n, "stale_n"),
    ("ch01.two_pass", _floor_grid, "grid"),
    ("ch01.two_pass", _half_partials, "partial_dtype"),
    ("ch01.atomic", _atomic_store, "store"),
    ("ch01.atomic", _atomic_no_mask, "no_mask"),
    ("ch01.atomic", _atomic_offset, "offset"),
    # a learner's run through the lab: stores past the end are caught in slack (they used to kill the process)
    ("ch01.block_sum", _block_store_tile, "past_end"),
    ("ch01.block_sum", _block_one_past, "one_past"),
    ("ch01.two_pass", _torch_finish, "too_few"),
    ("ch01.two_pass", _no_reshape, "shape"),
    ("ch01.atomic", _atomic_per_program, "past_end"),
]


@pytest.mark.parametrize("step, fn, mistake", PLANTED, ids=[f"{s}-{m}" for s, _, m in PLANTED])
def test_a_planted_mistake_is_caught_with_its_hint(step, fn, mistake):
    assert_caught_with_its_hint(step, fn, mistake)


def test_every_mistake_of_the_lab_is_planted():
    """Each typical mistake the grader knows, except the skeletons' own and the endless loop, is planted above."""
    planted = {(step, mistake) for step, _, mistake in PLANTED}
    known = {(step.name, m.name) for step in LABS["ch01"].values() for m in step.mistakes}
    assert known - planted == {("ch01.block_sum", "unchanged"), ("ch01.two_pass", "unchanged"),
                               ("ch01.atomic", "unchanged"), ("ch01.atomic", "other"), ("ch01.atomic", "float16"),
                               ("ch01.atomic", "one_past"),
                               ("ch01.two_pass", "same_input"), ("ch01.two_pass", "endless")}


def test_a_loop_that_never_stops_is_stopped_and_named():
    def endless(x, partial_sums_kernel, BLOCK):
        n = x.numel()
        values = x
        while True:
            partial = torch.empty(triton.cdiv(n, BLOCK), dtype=torch.float32, device=x.device)
            partial_sums_kernel[(partial.numel(),)](values, partial, n, BLOCK=BLOCK)
            values, n = partial, partial.numel()
            if n == 0:  # never
                return partial.reshape(())

    report = check("ch01.two_pass", endless, quiet=True)
    assert not report.passed and "The loop does not stop" in report.message, report.message


def test_the_solutions_are_the_chapters_lines():
    """The two kernels are the chapter's own; the passes are `triton_sum`'s loop, line for line, with its
    block size a parameter (and its num_warps left to the default)."""
    assert ch01.STEPS["block_sum"].solution is ch01_gpu_hierarchy.partial_sums_kernel
    assert ch01.STEPS["atomic"].solution is ch01_gpu_hierarchy._atomic_sum_kernel
    chapter = inspect.getsource(ch01_gpu_hierarchy.triton_sum).replace(
        ", num_warps=REDUCTION_WARPS", "").replace("REDUCTION_BLOCK", "BLOCK")
    lines = {line.split("#")[0].strip() for line in chapter.splitlines()}
    body = inspect.getsource(ch01.two_pass_sum).split('"""')[2].splitlines()
    for line in body:
        code = line.split("#")[0].strip()
        if code:
            assert code in lines, f"two_pass_sum: {code!r} is not in triton_sum"
