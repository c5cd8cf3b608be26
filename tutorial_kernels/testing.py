"""The kernel test harness shared by every chapter: inputs, poisoned outputs, tolerances, shapes.

Rules it enforces (see the README's "How kernels are tested"):
* inputs are fresh random normals — never zeros, which hide unwritten outputs and wrong indexing —
  drawn from a seed that is printed in every failure message so a failure can be replayed;
* outputs are filled with NaN before the launch, so an element the kernel forgot to write fails;
* errors are ‖out − ref‖ / ‖ref‖ against the float64 reference, with one bound per dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tutorial_kernels.inputs import AttentionInputs, fresh_seed, random_qkv  # noqa: F401  (re-exported for tests)
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.runtime import default_device, interpreter_active
from tutorial_kernels.tolerances import grad_tolerance, tolerance  # noqa: F401  (re-exported for tests)

ON_GPU = default_device().type == "cuda"

SKIP_BF16_REASON = (
    "bfloat16 runs on the GPU only: Triton's interpreter computes bf16 wrongly without an error "
    "(NumPy has no bf16; triton-lang/triton#4972)"
)


# The dtypes every kernel is tested in; bfloat16 only where it can be computed right (the GPU).
KERNEL_DTYPES = [
    torch.float32,
    torch.float16,
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not ON_GPU, reason=SKIP_BF16_REASON)),
]


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An output buffer full of NaN: any element the kernel fails to write stays NaN."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, *, seed: int, what: str = "out") -> float:
    """Fail unless `out` is fully written (no NaN) and within `tolerance(dtype)` of `ref`."""
    unwritten = torch.isnan(out).sum().item()
    assert unwritten == 0, f"{what}: {unwritten} of {out.numel()} elements are NaN (unwritten?); seed={seed}"
    err = relative_error(out, ref)
    bound = tolerance(dtype)
    assert err <= bound, f"{what}: relative error {err:.3e} > {bound:.1e} for {dtype}; seed={seed}"
    return err


def check_attention(fn, case: "Case", causal: bool, dtype: torch.dtype) -> None:
    """The check every chapter's `fn(q, k, v, causal, sm_scale, *, out)` passes on one shape:
    fresh inputs, a NaN-poisoned `out` that must come back fully written, the float64 reference."""
    x = random_qkv(case.batch, case.heads, case.n_q, case.n_k, case.head_dim, dtype)
    out = poisoned(tuple(x.q.shape), dtype, x.q.device)
    assert fn(x.q, x.k, x.v, causal, out=out) is out, "the result must be the out= buffer"
    assert_close(out, reference_attention(x.q, x.k, x.v, causal), dtype, seed=x.seed)


@dataclass(frozen=True)
class Case:
    """One attention shape to test."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int

    @property
    def id(self) -> str:
        n = f"n{self.n_q}" if self.n_q == self.n_k else f"nq{self.n_q}-nk{self.n_k}"
        return f"b{self.batch}h{self.heads}-{n}-d{self.head_dim}"


SEQ_LENS = (1, 17, 100, 128, 257)
HEAD_DIMS = (16, 32, 64, 80, 128)


def attention_cases(head_dims: tuple[int, ...] = HEAD_DIMS) -> list[Case]:
    """Shapes every chapter's forward is tested on.

    On the GPU: every sequence length × every head_dim, plus longer and unequal lengths.
    Under the interpreter (cost ∝ programs × loop steps) a covering subset: every length at d=64,
    every head_dim at n=100, and n_q ≠ n_k both ways. batch × heads > 1 everywhere.
    """
    unequal = [Case(2, 3, 17, 100, 64), Case(1, 2, 100, 17, 64), Case(2, 2, 1, 257, 80), Case(1, 3, 257, 128, 32)]
    if ON_GPU:
        grid = [Case(2, 3, n, n, d) for n in SEQ_LENS for d in head_dims]
        longer = [Case(2, 4, 1000, 1000, 64), Case(1, 8, 2048, 2048, 128), Case(1, 4, 1024, 3000, 80)]
        return grid + unequal + longer
    by_length = [Case(2, 3, n, n, 64) for n in SEQ_LENS]
    by_dim = [Case(1, 2, 100, 100, d) for d in head_dims if d != 64]
    return by_length + by_dim + unequal
