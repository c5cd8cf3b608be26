"""FlashAttention from the ground up: one module of Triton kernels per chapter.

Every chapter exposes the same call, `fn(q, k, v, causal=False, sm_scale=None) -> o`, on tensors
shaped (batch, heads, seq, head_dim), and is checked against the float64 reference in
`tutorial_kernels.reference`. Importing the package compiles nothing and touches no GPU. On a machine
without a CUDA GPU it sets TRITON_INTERPRET=1 (unless already set), so that the kernels run through
Triton's interpreter on the CPU; with a GPU it changes no process-wide setting.

Layers, bottom to top (a module imports only from its own layer or below;
tutorial_kernels/tests/test_architecture.py):
leaves (runtime, paths, reference, validation, inputs, tolerances, provenance, recorder, tiling) →
perf → chapters (ch01 … ch06, ch07_hopper) → instruments, integrations → bench → figures → this
package's own API and the test harness (testing).
"""

from tutorial_kernels.runtime import choose_execution_mode

# Must run before any chapter module is imported: @triton.jit reads TRITON_INTERPRET when it decorates.
choose_execution_mode()

from tutorial_kernels.ch02_naive_attention import eager_attention, naive_attention  # noqa: E402
from tutorial_kernels.reference import reference_attention  # noqa: E402

__all__ = ["eager_attention", "naive_attention", "reference_attention"]
