"""How a kernel multiplies float32 matrices: as accurately as PyTorch's float32 matmul setting asks.

`torch.get_float32_matmul_precision()` is "highest" by default: float32 products to float32 accuracy.
Triton's `tl.dot` rounds float32 operands to TF32 (10 mantissa bits, relative error about 1e-3) unless
told otherwise. Every attention kernel takes `DOT_PRECISION: tl.constexpr` and passes it to each
`tl.dot` as `input_precision`:

* "highest" → "tf32x3": each operand is split into a TF32 part and the TF32 remainder, and three
  tensor-core products (big·big + big·small + small·big) recover float32's accuracy. On an H100 this
  measured the error of full float32 products (4–8e-7 against float64, "ieee" 5e-7) at 3 to 10 times
  their speed: "ieee" runs on the CUDA cores, where attention's tiles spill registers by the thousand
  and each process then holds gigabytes of local memory.
* "high" or "medium" → "tf32", one tensor-core product.

float16 and bfloat16 operands are exact in TF32, so they get "tf32", Triton's default, either way.
Full float32 needs about twice the shared memory and registers per tile: `full_float32_tiles` is the
one small configuration every launcher uses for it, and the tuned launchers do not autotune it.
"""

from __future__ import annotations

import torch

from tutorial_kernels.runtime import interpreter_active


def full_float32(dtype: torch.dtype) -> bool:
    """Whether `dtype`'s products must reach float32 accuracy: float32 under torch's "highest"."""
    return dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest"


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input_precision for operands of `dtype` under PyTorch's current setting."""
    return "tf32x3" if full_float32(dtype) else "tf32"


def full_float32_tiles(head_dim: int) -> dict:
    """The configuration for full-precision float32 on a GPU: 32 × 32 tiles (16 × 32 above d = 128),
    4 warps, 1 stage. Measured on an H100 (docs/how-the-numbers-were-obtained.md, chapter 5): the fastest of the
    candidates that compile, spilling few or no registers in the forward kernels."""
    return dict(BLOCK_M=32 if head_dim <= 128 else 16, BLOCK_N=32, num_warps=4, num_stages=1)


def tiles_for(dtype: torch.dtype, head_dim: int, **tiles) -> dict:
    """A launcher's own `tiles` (BLOCK_M, BLOCK_N, ...), or `full_float32_tiles` for float32 in full
    precision on a GPU (the interpreter keeps its tiles: it has no shared memory to overflow)."""
    if full_float32(dtype) and not interpreter_active():
        return full_float32_tiles(head_dim)
    return tiles


def autotunes(t: torch.Tensor) -> bool:
    """Whether a tuned launcher autotunes for `t`: not for full-precision float32 on a GPU, which runs
    `full_float32_tiles` (the tensor-core candidates spill or do not fit, and timing them all took
    minutes per shape). In the interpreter the tuned path runs as it does for every dtype."""
    return not (t.is_cuda and full_float32(t.dtype))


__all__ = ["autotunes", "dot_precision", "full_float32", "full_float32_tiles", "tiles_for"]
