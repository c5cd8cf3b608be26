"""FlashAttention from the ground up: one module of Triton kernels per chapter.

Every chapter exposes the same call, `fn(q, k, v, causal=False, sm_scale=None) -> o`, on tensors
shaped (batch, heads, seq, head_dim), and is checked against the float64 reference in
`tutorial_kernels.reference`. Importing the package compiles nothing and touches no GPU. On a machine
without a CUDA GPU it sets TRITON_INTERPRET=1 (unless already set), so that the kernels run through
Triton's interpreter on the CPU; with a GPU it changes no process-wide setting.

Layers, bottom to top (a module imports only from its own layer or below;
tutorial_kernels/tests/test_architecture.py):
leaves (runtime, paths, reference, validation, inputs, tolerances, provenance, recorder, tiling, ranks) →
perf → chapters (ch01 … ch06, ch07_hopper, ch08_decode, ch09_variants) → dispatch (which kernel runs a call),
attention (the front door) →
ch10_context_parallel (several GPUs, on the front door) → instruments, integrations →
bench → figures → this package's own API and the test harness (testing).

For a model, the front door: `flash_attention(q, k, v, causal=False, sm_scale=None, *, out=None)`,
differentiable, and `scaled_dot_product_attention(...)` with PyTorch's arguments and semantics; both
pick the fastest kernel of the tutorial that is correct for the inputs and work under torch.compile.
Their Triton kernels take their tiles from a table measured per GPU; `tune(q, k, v, causal)` measures
this GPU's at one shape instead (`tutorial_kernels.tuning`). `explain(q, k, v, causal)` says which kernels a
call would run and why; `with attention_kernels("triton-tuned"):` pins (or, with exclude=, excludes)
kernels for the calls in the block, as torch.nn.attention.sdpa_kernel does. For generation, `flash_attention_with_kvcache(q,
k_cache, v_cache, k, v, cache_seqlens=..., block_table=None)` attends new queries to a KV cache, contiguous or
paged, appending the new keys and values in place (chapter 8). Chapter 9's variants: `flash_attention(...,
window_size=(left, right), softcap=c, alibi_slopes=slopes)` and `flash_attention_varlen(q, k, v,
cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)` for packed batches. One sequence across several GPUs
(chapter 10): `tutorial_kernels.ch10_context_parallel.ring_attention` and `ulysses_attention` on each rank's shard.
"""

from tutorial_kernels.runtime import choose_execution_mode

# Must run before any chapter module is imported: @triton.jit reads TRITON_INTERPRET when it decorates.
choose_execution_mode()

from tutorial_kernels.attention import (  # noqa: E402
    flash_attention, flash_attention_varlen, flash_attention_with_kvcache, scaled_dot_product_attention)
from tutorial_kernels.ch02_naive_attention import eager_attention, naive_attention  # noqa: E402
from tutorial_kernels.dispatch import attention_kernels, explain  # noqa: E402
from tutorial_kernels.reference import reference_attention  # noqa: E402
from tutorial_kernels.tuning import tune  # noqa: E402

__all__ = ["flash_attention", "scaled_dot_product_attention", "flash_attention_with_kvcache", "flash_attention_varlen",
           "attention_kernels", "explain",
           "eager_attention",
           "naive_attention",
           "reference_attention", "tune"]
