"""Benchmark harness shared by every chapter: `python -m tutorial_kernels.bench SUITE [--out PATH]`.

For each (provider, shape) it draws fresh random inputs, checks the output of one head against the
float64 reference, measures the peak extra memory of one call, and times the call with
`triton.testing.do_bench` (median after warm-up) in a few rounds interleaved with the shape's other
providers, so that no provider is always the one measured first on a rested GPU. torch's own
attention runs in the same process: eager PyTorch, and `scaled_dot_product_attention` with each
backend pinned. Results and provenance (GPU, versions, commit, date, exact command) go to a JSON file
under `data/`.

    TFLOP/s = 4 · B · H · n_q · n_k · d / time   (× 0.5 when causal; FlashAttention-2 paper convention)

A provider that cannot run a shape is recorded, not dropped: status "oom" when the GPU runs out of
memory, "unsupported" when a pinned backend refuses the inputs.

Modules: `providers` (what is timed), `shapes` (the problems), `timing` (measuring one shape),
`suites` (the named sweeps), `run` (suites and probes with provenance), `cli` (the command).
"""

from tutorial_kernels.bench.providers import PROVIDERS, Provider
from tutorial_kernels.bench.run import measure_subset, run_probe, run_suite, suite_provenance
from tutorial_kernels.bench.shapes import MatmulShape, ReductionShape, Shape, SoftmaxShape, TrainingShape
from tutorial_kernels.bench.suites import SUITES, Suite
from tutorial_kernels.bench.timing import measure, measure_shape, refusal_reason, take_turns

__all__ = [
    "PROVIDERS", "Provider",
    "SUITES", "Suite",
    "Shape", "TrainingShape", "MatmulShape", "SoftmaxShape", "ReductionShape",
    "take_turns", "refusal_reason", "measure_shape", "measure",
    "suite_provenance", "run_suite", "run_probe", "measure_subset",
]
