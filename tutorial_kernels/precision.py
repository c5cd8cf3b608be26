"""How a kernel multiplies float32 matrices: as PyTorch would, by its float32 matmul setting.

`torch.get_float32_matmul_precision()` is "highest" by default: float32 products in full float32.
Triton's `tl.dot` instead rounds float32 operands to TF32 (10 mantissa bits, relative error about
1e-3) unless told otherwise. Every attention kernel takes `DOT_PRECISION: tl.constexpr` and passes
it to each `tl.dot` as `input_precision`: "ieee" (full float32, on the CUDA cores) under "highest",
"tf32" (the tensor cores) under "high" or "medium". float16 and bfloat16 operands are exact in
either mode, so they get Triton's default, "tf32", and compile exactly as before.
"""

from __future__ import annotations

import torch


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input_precision for operands of `dtype` under PyTorch's current setting."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


def on_tensor_cores(t: torch.Tensor) -> bool:
    """Whether a GPU multiplies `t`'s dtype on the tensor cores. Not so for float32 in full precision,
    which runs on the CUDA cores: there the autotuners' tensor-core tiles buy nothing, and timing them
    all took minutes per shape, so the tuned launchers run the teaching configuration instead."""
    return not (t.is_cuda and dot_precision(t.dtype) == "ieee")


__all__ = ["dot_precision", "on_tensor_cores"]
