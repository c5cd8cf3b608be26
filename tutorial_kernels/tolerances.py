"""How close to the float64 reference a kernel must come, by two rules.

* Relative norms, one bound per dtype: ‖out − ref‖ / ‖ref‖ for the forward (`tolerance`) and for the
  gradients (`grad_tolerance`), on the GPU and in Triton's interpreter. Used by the chapter tests and by
  the benchmark harness, which refuses to report a fast wrong kernel.
* The peers' rule, scale-free (flash-attn's tests; the conformance and peer suites): the largest
  elementwise error may be at most a factor times PyTorch's own in the same dtype, plus a small slack,

      max|out − ref| ≤ factor · max|torch_out − ref| + PEER_ABS_TOL,

  factor `PEER_OUTPUT_FACTOR` for outputs and `PEER_GRAD_FACTOR` for gradients
  (`testing.assert_within_peer_rule`).
"""

from __future__ import annotations

import torch

from tutorial_kernels.precision import full_float32
from tutorial_kernels.runtime import interpreter_active

# flash-attn's tests compare a kernel's error with that of PyTorch's attention in the same dtype: twice it for
# outputs; for gradients from 2× (plus twice the dtype's rounding near |x| + 0.3) to 5× (plus 1e-3, on its
# overflow inputs). Adopted here: 2× for outputs, 3× for gradients, and 1e-5 absolute, which keeps a case where
# PyTorch happens to be exact (one key: O = V, dQ = 0) from demanding that every rounding be exact too (1e-5 is
# still too little for FlashAttention-2's backward there: tests/test_peer_suites.py, DELTA_FROM_OUTPUT).
PEER_OUTPUT_FACTOR = 2.0
PEER_GRAD_FACTOR = 3.0
PEER_ABS_TOL = 1e-5


def _full_float32() -> bool:
    """Whether float32 products are computed in float32: always in the interpreter (NumPy), on a GPU
    as PyTorch's float32 matmul precision says."""
    return interpreter_active() or full_float32(torch.float32)


def tolerance(dtype: torch.dtype) -> float:
    """Bound on ‖out − ref‖ / ‖ref‖ for one attention output in `dtype`.

    float32 is exact to ~1e-6 in the interpreter, and on a GPU under PyTorch's default float32 matmul
    precision ("highest"), where the kernels multiply to float32 accuracy (`precision.dot_precision`);
    under "high" or "medium" `tl.dot` rounds float32 operands to TF32 (10-bit mantissa, error ~1e-3).
    float16 keeps 10 mantissa bits (unit roundoff 4.9e-4) and bfloat16 7 bits (3.9e-3), and S and P
    are rounded to that dtype once each.
    """
    if dtype == torch.float32:
        return 1e-5 if _full_float32() else 5e-3
    if dtype == torch.float16:
        return 3e-3
    if dtype == torch.bfloat16:
        return 2e-2
    raise TypeError(f"no tolerance for dtype {dtype}")


def grad_tolerance(dtype: torch.dtype) -> float:
    """Bound on ‖grad − ref‖ / ‖ref‖. Looser than the forward's: P, dS and dO are each rounded to the
    input dtype before a matrix product, and dK sums n_q such products (tf32 for float32 on a GPU)."""
    if dtype == torch.float32:
        # with TF32 a GPU's tl.dot rounds float32 operands to 10 mantissa bits — the inputs too, unlike
        # float16 inputs, which are already exact — so float32 in TF32 gets twice float16's bound
        return 1e-5 if _full_float32() else 2e-2
    if dtype == torch.float16:
        return 1e-2
    if dtype == torch.bfloat16:
        return 5e-2
    raise TypeError(f"no tolerance for dtype {dtype}")
