"""The kernel test harness shared by every chapter: inputs, poisoned outputs, tolerances, shapes.

Rules it enforces (see the README's "How kernels are tested"):
* inputs are fresh random normals — never zeros, which hide unwritten outputs and wrong indexing —
  drawn from a seed that is printed in every failure message so a failure can be replayed;
* outputs are filled with NaN before the launch, so an element the kernel forgot to write fails;
* errors are ‖out − ref‖ / ‖ref‖ against the float64 reference, with one bound per dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tutorial_kernels.inputs import AttentionInputs, fresh_seed, random_qkv  # noqa: F401  (re-exported for tests)
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.runtime import default_device, interpreter_active
from tutorial_kernels.tolerances import grad_tolerance, tolerance  # noqa: F401  (re-exported for tests)

ON_GPU = default_device().type == "cuda"

# bfloat16 is tested on the GPU only. NumPy has no bfloat16, so Triton's interpreter keeps bf16 as raw
# 16-bit integers and computes its dot products and sums wrongly WITHOUT an error (triton-lang/triton#4972);
# the public functions refuse bf16 under the interpreter (`validation.check_triton_tensor`). Rather than
# collect bf16 tests only to skip them, the CPU run does not generate them (conftest.py says so once).
BF16_NEEDS_GPU = (
    "bfloat16 runs on the GPU only: Triton's interpreter computes bf16 wrongly without an error "
    "(NumPy has no bf16; triton-lang/triton#4972)"
)

# The dtypes every kernel is tested in here: float32 and float16 everywhere, bfloat16 on a GPU only.
ALL_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KERNEL_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])

# A test (or parameter) that needs a CUDA GPU is marked `@pytest.mark.gpu("what kind")`: conftest.py
# deselects it at collection on a machine without one, so the CPU run neither collects nor skips it,
# and counts it by kind in one summary line.


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An output buffer full of NaN: any element the kernel fails to write stays NaN."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_close(
    out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, *, seed: int, what: str = "out",
    bound: float | None = None,
) -> float:
    """Fail unless `out` is fully written (no NaN) and within `bound` (default `tolerance(dtype)`;
    `grad_tolerance(dtype)` for gradients) of `ref`."""
    unwritten = torch.isnan(out).sum().item()
    assert unwritten == 0, f"{what}: {unwritten} of {out.numel()} elements are NaN (unwritten?); seed={seed}"
    err = relative_error(out, ref)
    bound = tolerance(dtype) if bound is None else bound
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
    """One attention shape to test: q (batch, heads, n_q, head_dim), k and v (batch, kv_heads, n_k,
    head_dim); kv_heads = 0 means heads (no grouped-query attention)."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    kv_heads: int = 0

    def __post_init__(self) -> None:
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)

    @property
    def id(self) -> str:
        n = f"n{self.n_q}" if self.n_q == self.n_k else f"nq{self.n_q}-nk{self.n_k}"
        kv = "" if self.kv_heads == self.heads else f"kv{self.kv_heads}"
        return f"b{self.batch}h{self.heads}{kv}-{n}-d{self.head_dim}"


SEQ_LENS = (1, 17, 100, 128, 257)
HEAD_DIMS = (16, 32, 64, 80, 128)


def attention_cases(head_dims: tuple[int, ...] = HEAD_DIMS) -> list[Case]:
    """Shapes every attention implementation's forward is tested on (`tests/test_conformance.py`).

    On the GPU: every sequence length × every head_dim at batch 2 × 3 heads, plus longer and unequal
    lengths. Under the interpreter, whose cost grows with programs × loop steps, a covering subset at
    batch × heads = 2 (batch 2 or 2 heads, so both strides are exercised): every length but 257 at
    d = 64, every head_dim at n = 70, and n_q ≠ n_k both ways (one query against 257 keys; 129 queries,
    one past a tile, against 65 keys), so that every kernel still crosses several tiles, ends on a
    ragged one and (causal, n_q > n_k) has rows that see no key.
    """
    if ON_GPU:
        unequal = [Case(2, 3, 17, 100, 64), Case(1, 2, 100, 17, 64), Case(2, 2, 1, 257, 80), Case(1, 3, 257, 128, 32)]
        grid = [Case(2, 3, n, n, d) for n in SEQ_LENS for d in head_dims]
        longer = [Case(2, 4, 1000, 1000, 64), Case(1, 8, 2048, 2048, 128), Case(1, 4, 1024, 3000, 80)]
        return grid + unequal + longer
    by_length = [Case(2, 1, 1, 1, 64), Case(1, 2, 17, 17, 64), Case(2, 1, 100, 100, 64), Case(1, 2, 128, 128, 64)]
    by_dim = [Case(2, 1, 70, 70, d) for d in head_dims if d != 64]  # 70: past a 64-row tile, ragged
    unequal = [Case(1, 2, 17, 100, 64), Case(2, 1, 100, 17, 64), Case(1, 2, 1, 257, 80), Case(1, 2, 129, 65, 32)]
    return by_length + by_dim + unequal
