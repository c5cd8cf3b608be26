"""Benchmark harness shared by every chapter: `python -m tutorial_kernels.bench SUITE [--out PATH]`.

For each (provider, shape) it draws fresh random inputs, checks the output of one head against the
float64 reference, measures the peak extra memory of one call, and times the call with
`triton.testing.do_bench` (median after warm-up) in a few rounds interleaved with the shape's
other providers, so that no provider is always the one measured first on a rested GPU. torch's own attention runs in the same process:
eager PyTorch, and `scaled_dot_product_attention` with each backend pinned. Results and provenance
(GPU, versions, commit, date, exact command) go to a JSON file under `data/`.

    TFLOP/s = 4 · B · H · n_q · n_k · d / time   (× 0.5 when causal; FlashAttention-2 paper convention)

A provider that cannot run a shape is recorded, not dropped: status "oom" when the GPU runs out of
memory, "unsupported" when a pinned backend refuses the inputs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from tutorial_kernels.ch02_naive_attention import eager_attention, naive_attention
from tutorial_kernels.reference import reference_attention, reference_softmax, relative_error
from tutorial_kernels.inputs import fresh_seed, random_qkv
from tutorial_kernels.paths import data_dir
from tutorial_kernels.provenance import provenance
from tutorial_kernels.validation import UnsupportedShape


@dataclass(frozen=True)
class Provider:
    """One implementation to time, and the context it must run in (e.g. a pinned SDPA backend)."""

    label: str
    fn: Callable
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    config: Callable | None = None  # after a call: the configuration an autotuner chose, for the record


def _sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _pinned(backend_name: str) -> Callable[[], contextlib.AbstractContextManager]:
    def context():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, backend_name))

    return context


def _chapter(module: str, name: str, **options) -> Callable:
    """A chapter's function, imported on first call so `bench` imports no more than it runs (chapter 1's
    CUDA kernel compiles on its first call, for example)."""

    def call(*args):
        import importlib

        return getattr(importlib.import_module(f"tutorial_kernels.{module}"), name)(*args, **options)

    return call


PROVIDERS: dict[str, Provider] = {
    # attention: fn(q, k, v, causal)
    "eager": Provider("eager PyTorch", eager_attention),
    "naive-triton": Provider("naive Triton (ch. 2)", naive_attention),
    "online-triton": Provider("online-softmax Triton (ch. 3)", _chapter("ch03_tiling_online_softmax", "online_softmax_attention")),
    "sdpa-default": Provider("torch SDPA (default pick)", _sdpa),
    "sdpa-flash": Provider("torch SDPA: flash", _sdpa, _pinned("FLASH_ATTENTION")),
    "sdpa-efficient": Provider("torch SDPA: mem-efficient", _sdpa, _pinned("EFFICIENT_ATTENTION")),
    "sdpa-cudnn": Provider("torch SDPA: cuDNN", _sdpa, _pinned("CUDNN_ATTENTION")),
    "sdpa-math": Provider("torch SDPA: math", _sdpa, _pinned("MATH")),
    "flash-v2-triton": Provider("FlashAttention-2 Triton, teaching (ch. 5)", _chapter("ch05_flash_v2", "flash_attn_v2")),
    "flash-v2-tuned": Provider("FlashAttention-2 Triton, tuned (ch. 5)", _chapter("ch05_flash_v2", "flash_attn_v2_tuned"),
                               config=_chapter("ch05_flash_v2", "tuned_choice")),
    "flash-v2-tuned-pointers": Provider(
        "FlashAttention-2 Triton, tuned, no TMA (ch. 5)", _chapter("ch05_flash_v2", "flash_attn_v2_tuned", descriptors=False)
    ),
    "flash-v2-hopper": Provider("FlashAttention-2 with FA3's Hopper schedule, Gluon (ch. 5)",
                                _chapter("ch05_hopper", "flash_attn_hopper")),
    # differentiable attention (TrainingShape): fn(q, k, v, causal) with autograd
    "flash-attention": Provider("FlashAttention-2 fwd + bwd Triton (ch. 6)", _chapter("ch06_backward", "flash_attention"),
                                config=_chapter("ch06_backward", "tuned_backward_choice")),
    # matmul: fn(a, b)
    "torch-matmul": Provider("torch.matmul (cuBLAS)", torch.matmul),
    "triton-matmul-pointers": Provider(
        "Triton matmul, pointer tiles (ch. 3)", _chapter("ch03_tiling_online_softmax", "matmul", method="pointers")
    ),
    "triton-matmul-descriptors": Provider(
        "Triton matmul, descriptors (ch. 3)", _chapter("ch03_tiling_online_softmax", "matmul", method="descriptors")
    ),
    # softmax over rows: fn(x)
    "torch-softmax": Provider("torch.softmax", lambda x: torch.softmax(x, dim=-1)),
    "three-pass-softmax": Provider("three-pass softmax (ch. 2)", _chapter("ch03_tiling_online_softmax", "three_pass_softmax_rows")),
    "online-softmax": Provider("online softmax (ch. 3)", _chapter("ch03_tiling_online_softmax", "online_softmax")),
}


@dataclass(frozen=True)
class Shape:
    """An attention problem: q, k, v of shape (batch, heads, n, head_dim)."""

    batch: int
    heads: int
    n: int
    head_dim: int
    causal: bool
    dtype: str = "float16"

    @property
    def flops(self) -> float:
        """4·B·H·N²·d: two matmuls of 2·N²·d each per head; half of S is skipped when causal."""
        full = 4.0 * self.batch * self.heads * self.n * self.n * self.head_dim
        return full * (0.5 if self.causal else 1.0)

    def draw(self) -> tuple[tuple, int]:
        x = random_qkv(self.batch, self.heads, self.n, self.n, self.head_dim, getattr(torch, self.dtype), "cuda")
        return (x.q, x.k, x.v, self.causal), x.seed

    def prepare(self, fn: Callable, args: tuple) -> Callable:
        """The call to time (run inside the provider's context)."""
        return lambda: fn(*args)

    def check(self, out: torch.Tensor, args: tuple) -> dict:
        """One head against the float64 reference: a fast wrong kernel must not be reported."""
        q, k, v, causal = args
        ref = reference_attention(q[:1, :1], k[:1, :1], v[:1, :1], causal)
        return {"rel_err_head0": relative_error(out[:1, :1], ref)}

    def rates(self, ms: float) -> dict:
        return {"tflops": self.flops / (ms * 1e-3) / 1e12}


@dataclass(frozen=True)
class TrainingShape(Shape):
    """The same attention problem, differentiated. mode "bwd" times the backward alone (the forward
    runs once, untimed, and its graph is kept for every repetition); "fwd+bwd" times both."""

    mode: str = "bwd"

    @property
    def flops(self) -> float:
        # the backward does five N×N×d matmuls (S again, dV, dP, dQ, dK) to the forward's two:
        # 2.5 × the forward's count, as in the FlashAttention-2 paper's figures
        return super().flops * (2.5 if self.mode == "bwd" else 3.5)

    def draw(self) -> tuple[tuple, int]:
        (q, k, v, causal), seed = super().draw()
        gen = torch.Generator(device="cuda").manual_seed(seed + 1)
        do = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)  # the upstream gradient
        return (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), causal, do), seed

    def prepare(self, fn: Callable, args: tuple) -> Callable:
        q, k, v, causal, do = args
        if self.mode == "bwd":
            out = fn(q, k, v, causal)
            return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        return lambda: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)

    def check(self, grads: tuple, args: tuple) -> dict:
        """dQ, dK, dV of head 0 against float64 autograd of the reference (heads are independent)."""
        q, k, v, causal, do = args
        leaves = [t[:1, :1].detach().double().requires_grad_() for t in (q, k, v)]
        reference_attention(*leaves, causal).backward(do[:1, :1].double())
        return {"rel_err_head0": max(relative_error(g[:1, :1], ref.grad) for g, ref in zip(grads, leaves))}


@dataclass(frozen=True)
class MatmulShape:
    """C (m, n) = A (m, k) B (k, n)."""

    m: int
    n: int
    k: int
    dtype: str = "float16"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k  # one multiply and one add per (i, j, l)

    @property
    def min_bytes(self) -> int:
        """Each input read once, C written once: the least HBM traffic any schedule can have."""
        return (self.m * self.k + self.k * self.n + self.m * self.n) * getattr(torch, self.dtype).itemsize

    def draw(self) -> tuple[tuple, int]:
        seed = fresh_seed()
        g = torch.Generator(device="cpu").manual_seed(seed)
        dtype = getattr(torch, self.dtype)
        a = torch.randn(self.m, self.k, generator=g).to("cuda", dtype)
        b = torch.randn(self.k, self.n, generator=g).to("cuda", dtype)
        return (a, b), seed

    def check(self, out: torch.Tensor, args: tuple) -> dict:
        a, b = args
        rows = slice(0, min(self.m, 256))  # 256 rows of C in float64 are plenty to catch a wrong kernel
        return {"rel_err": relative_error(out[rows], a[rows].double() @ b.double())}

    def rates(self, ms: float) -> dict:
        return {
            "tflops": self.flops / (ms * 1e-3) / 1e12,
            "intensity_flop_per_byte": self.flops / self.min_bytes,
        }


@dataclass(frozen=True)
class SoftmaxShape:
    """Softmax over the last axis of a (rows, cols) tensor."""

    rows: int
    cols: int
    dtype: str = "float32"

    @property
    def min_bytes(self) -> int:
        return 2 * self.rows * self.cols * getattr(torch, self.dtype).itemsize  # read x once, write y once

    def draw(self) -> tuple[tuple, int]:
        seed = fresh_seed()
        g = torch.Generator(device="cpu").manual_seed(seed)
        return ((torch.randn(self.rows, self.cols, generator=g) * 3).to("cuda", getattr(torch, self.dtype)),), seed

    def check(self, out: torch.Tensor, args: tuple) -> dict:
        (x,) = args
        return {"rel_err": relative_error(out[:64], reference_softmax(x[:64]))}

    def rates(self, ms: float) -> dict:
        return {"gb_per_s": self.min_bytes / (ms * 1e-3) / 1e9}


@dataclass
class Suite:
    """A named sweep: which providers, on which shapes, written to which data file."""

    description: str
    providers: list[str]
    shapes: list
    default_out: str
    notes: list[str] = field(default_factory=list)


def _fa2_paper_shapes(head_dims, lengths, dtypes=("float16", "bfloat16")) -> list[Shape]:
    """The FlashAttention-2 paper's convention: 16k tokens per batch (B = 16384 / N) and a hidden
    size of 2048 (H = 2048 / d), so every point does comparable total work."""
    return [
        Shape(16384 // n, 2048 // d, n, d, causal, dtype)
        for dtype in dtypes for d in head_dims for causal in (False, True) for n in lengths
    ]


SUITES: dict[str, Suite] = {
    "ch02-sweep": Suite(
        description="Chapter 2: time, TFLOP/s and peak extra memory vs N (B=1, H=32, d=128, fp16)",
        providers=["eager", "naive-triton", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"],
        shapes=[Shape(1, 32, n, 128, causal) for causal in (False, True) for n in (512, 1024, 2048, 4096, 8192, 16384)],
        default_out="ch02_sweep.json",
    ),
    "ch02-seed": Suite(
        description="The ROCm blog's sweep: B=1, H=32, d=128, fp16, causal, N=256..4096 step 256",
        providers=["eager", "sdpa-default", "naive-triton"],
        shapes=[Shape(1, 32, n, 128, True) for n in range(256, 4096 + 1, 256)],
        default_out="ch02_seed.json",
        notes=["The blog draws inputs with torch.rand; we use torch.randn (never zeros, mean zero)."],
    ),
    "ch05-fwd": Suite(
        description="Forward pass of every attention in the tutorial and in torch, FA2 paper convention "
        "(B·N = 16384, H·d = 2048), d ∈ {64, 128, 256}, fp16 and bf16",
        providers=["flash-v2-triton", "flash-v2-tuned", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient",
                   "flash-v1-triton", "naive-triton", "eager", "sdpa-math"],
        shapes=_fa2_paper_shapes((64, 128, 256), (512, 1024, 2048, 4096, 8192, 16384)),
        default_out="ch05_fwd.json",
        notes=["The tuned kernel is autotuned per shape before timing (tiles, warps, stages, and pointer vs "
               "tensor-descriptor loads); its choice is recorded in each row's 'config'. The teaching kernel "
               "runs one fixed config."],
    ),
    "ch06-bwd": Suite(
        description="Backward pass (dQ, dK, dV given dO; the forward runs once, untimed), FA2 paper convention "
        "(B·N = 16384, H·d = 2048), d ∈ {64, 128}, fp16 and bf16",
        providers=["flash-attention", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "eager"],
        shapes=[TrainingShape(s.batch, s.heads, s.n, s.head_dim, s.causal, s.dtype, "bwd")
                for s in _fa2_paper_shapes((64, 128), (512, 1024, 2048, 4096, 8192, 16384))],
        default_out="ch06_bwd.json",
        notes=["TFLOP/s counts 2.5 × the forward's FLOPs (five N×N×d matmuls to the forward's two).",
               "Our kernels are autotuned per shape before timing; the choices are in each row's 'config'."],
    ),
    "ch06-memory": Suite(
        description="Peak memory and time of forward + backward vs N (B = 1, H = 16, d = 128, fp16, causal)",
        providers=["flash-attention", "sdpa-flash", "sdpa-cudnn", "eager"],
        shapes=[TrainingShape(1, 16, n, 128, True, "float16", "fwd+bwd") for n in (1024, 2048, 4096, 8192, 16384, 32768)],
        default_out="ch06_memory.json",
        notes=["peak_extra_mib: the most memory allocated during one forward + backward beyond the inputs "
               "and dO (the gradients themselves, 3 · N · d · H · 2 bytes, are included)."],
    ),
    "ch03-matmul": Suite(
        description="Chapter 3: tiled matmul TFLOP/s vs size (square, fp16) against torch.matmul",
        providers=["torch-matmul", "triton-matmul-pointers", "triton-matmul-descriptors"],
        shapes=[MatmulShape(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)]
        + [MatmulShape(16384, 128, 16384), MatmulShape(16384, 16384, 128)],
        default_out="ch03_matmul.json",
        notes=["Triton kernels are autotuned per (M, N, K); the tuning runs before timing."],
    ),
    "ch03-softmax": Suite(
        description="Chapter 3: softmax bandwidth vs row length (4096 rows, fp32) against torch.softmax",
        providers=["torch-softmax", "three-pass-softmax", "online-softmax"],
        shapes=[SoftmaxShape(4096, c) for c in (128, 512, 1024, 4096, 16384, 65536)],
        default_out="ch03_softmax.json",
        notes=["GB/s counts the least traffic: x read once and y written once (2 · rows · cols · 4 bytes)."],
    ),
    "ch03-attention": Suite(
        description="Chapter 3: the online-softmax attention against chapter 2 and torch (B=1, H=32, d=128, fp16)",
        providers=["naive-triton", "online-triton", "sdpa-flash", "sdpa-cudnn"],
        shapes=[Shape(1, 32, n, 128, causal) for causal in (False, True) for n in (1024, 4096, 16384)],
        default_out="ch03_attention.json",
    ),
}


# --- chapter 1: reductions -----------------------------------------------------------------------


PROVIDERS.update({
    # reductions: fn(x) -> float32 scalar
    "torch-sum": Provider("torch.sum (float32 accumulation)", lambda x: torch.sum(x, dtype=torch.float32)),
    "triton-sum": Provider("Triton sum, repeated passes (ch. 1)", _chapter("ch01_gpu_hierarchy", "triton_sum")),
    "triton-sum-atomic": Provider("Triton sum, atomics (ch. 1)", _chapter("ch01_gpu_hierarchy", "triton_sum", method="atomic")),
    "cuda-sum": Provider("CUDA warp-shuffle sum (ch. 1)", _chapter("ch01_gpu_hierarchy", "cuda_sum")),
})


@dataclass(frozen=True)
class ReductionShape:
    """Σ x_i over a vector of n elements."""

    n: int
    dtype: str = "float32"

    @property
    def min_bytes(self) -> int:
        return self.n * getattr(torch, self.dtype).itemsize  # x read once; the one float written is noise

    def draw(self) -> tuple[tuple, int]:
        seed = fresh_seed()
        g = torch.Generator(device="cuda").manual_seed(seed)  # drawn on the GPU: 2²⁸ normals on a CPU take seconds
        return (torch.randn(self.n, generator=g, device="cuda").to(getattr(torch, self.dtype)),), seed

    def check(self, out: torch.Tensor, args: tuple) -> dict:
        from tutorial_kernels.ch01_gpu_hierarchy import reduction_error

        (x,) = args
        return {"rel_err": reduction_error(out, x)}  # |s − Σx| / Σ|x|, Σx in float64

    def rates(self, ms: float) -> dict:
        return {"gb_per_s": self.min_bytes / (ms * 1e-3) / 1e9}


SUITES["ch01-reduction"] = Suite(
    description="Chapter 1: sum-reduction bandwidth vs length, Triton and CUDA against torch.sum",
    providers=["torch-sum", "triton-sum", "triton-sum-atomic", "cuda-sum"],
    shapes=[ReductionShape(n, dtype) for dtype in ("float32", "float16")
            for n in sorted([2**k for k in range(10, 29, 2)] + [1_000_003])],
    default_out="ch01_reduction.json",
    notes=["GB/s counts the bytes read, n · itemsize; the copy ceiling counts bytes read + written.",
           "rel_err is |s − Σx| / Σ|x| with Σx from torch.sum in float64 (reduction_error).",
           "The CUDA kernel is compiled by torch.utils.cpp_extension.load_inline before timing."],
)


# --- chapter 4: FlashAttention-1 ------------------------------------------------------------------


PROVIDERS["flash-v1-triton"] = Provider("FlashAttention-1 Triton (ch. 4)", _chapter("ch04_flash_v1", "flash_attn_v1"))


SUITES["ch04-sweep"] = Suite(
    description="Chapter 4: FlashAttention-1 against chapters 2–3 and torch, fp16, d = 64 and 128, "
    "B·N = 16384 tokens, H·d = 2048 (FlashAttention-2 paper convention)",
    providers=["eager", "naive-triton", "online-triton", "flash-v1-triton", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"],
    shapes=[Shape(16384 // n, 2048 // d, n, d, causal)
            for d in (64, 128) for causal in (False, True) for n in (512, 1024, 2048, 4096, 8192, 16384)],
    default_out="ch04_sweep.json",
    notes=["batch = 16384 / N and heads = 2048 / d: the same number of tokens and the same hidden size at every N, "
           "so B·H, the number of FlashAttention-1 programs, falls from 1024 (N = 512, d = 64) to 16 (N = 16384, d = 128)."],
)


# Each provider of a shape is timed in ROUNDS short rounds, interleaved with the others and in a
# rotated order, and its time is the median over rounds. Timing each provider once, one after the
# other, let the GPU's state set the order: the first measured after an idle gap (compiling,
# autotuning) ran at higher clocks than one measured straight after seconds of load — 11 to 20 %
# apart for the same kernel (BENCHMARKS.md, third session, data/ch05_autotuner_diagnosis.json).
ROUNDS = 3


def take_turns(items: list, rounds: int = ROUNDS) -> Iterator:
    """`items` `rounds` times over, each round starting with the next item: a, b, c, b, c, a, c, a, b."""
    for r in range(rounds if items else 0):
        turn = r % len(items)
        yield from items[turn:] + items[:turn]


def _refusal(err: Exception) -> str | None:
    """'oom' or 'unsupported' for the failures a run records instead of raising; None for the others."""
    if isinstance(err, torch.OutOfMemoryError):
        return "oom"
    if isinstance(err, UnsupportedShape):  # one of our kernels refuses the shape (e.g. chapter 4 stops at d = 128)
        return "unsupported"
    if isinstance(err, RuntimeError) and ("No available kernel" in str(err) or "not supported" in str(err).lower()):
        return "unsupported"  # a pinned SDPA backend that refuses these inputs
    return None


def _prepare(provider: Provider, shape, probing: bool = False) -> tuple[dict, Callable | None]:
    """Draw inputs, compile (and autotune), check the output against float64 and measure peak extra
    memory. Returns the row so far and the call to time, or None when the provider cannot run it.
    `probing`: any other failure (a candidate configuration that does not compile) is recorded with
    status "failed" instead of raised."""
    row: dict = {"provider": provider.label, **asdict(shape)}
    args, row["seed"] = shape.draw()
    try:
        with provider.context():
            call = shape.prepare(provider.fn, args) if hasattr(shape, "prepare") else lambda: provider.fn(*args)
            call()  # compile and autotune outside the measured region
            if provider.config is not None:
                row["config"] = provider.config(*args[:4])
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = call()
            torch.cuda.synchronize()
            row["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
            row.update(shape.check(out, args))
            del out
    except Exception as err:
        status = _refusal(err)
        if status is None and not probing:
            raise
        lines = str(err).strip().splitlines() or [type(err).__name__]
        row["status"] = status or "failed"
        if status != "oom":  # a refusal says why on its first line; a compiler failure on its last
            row["error"] = (lines[0] if status else lines[-1])[:300]
        return row, None
    finally:
        torch.cuda.empty_cache()
    return row, call


def measure_shape(providers: list[Provider], shape, *, rounds: int = ROUNDS, rep_ms: int = 100,
                  probing: bool = False) -> list[dict]:
    """Check, measure memory and time every provider on one shape; never raises for OOM or refusal
    (nor, with `probing`, for a provider that fails to compile: see _prepare). Each provider keeps its
    own fresh inputs until the shape is done."""
    import triton.testing

    prepared = [_prepare(provider, shape, probing) for provider in providers]
    runnable = [i for i, (_, call) in enumerate(prepared) if call is not None]
    times: dict[int, list[float]] = {i: [] for i in runnable}
    for i in take_turns(runnable, rounds):
        row, call = prepared[i]
        if row.get("status") == "oom":
            continue
        try:
            with providers[i].context():
                times[i].append(triton.testing.do_bench(call, warmup=25, rep=rep_ms, return_mode="median"))
        except torch.OutOfMemoryError:
            row["status"] = "oom"
            torch.cuda.empty_cache()
    rows = []
    for i, (row, call) in enumerate(prepared):
        if call is not None and row.get("status") != "oom":
            ms = sorted(times[i])[len(times[i]) // 2]
            row.update(status="ok", ms=ms, ms_rounds=times[i], **shape.rates(ms))
        rows.append(row)
    del prepared
    torch.cuda.empty_cache()
    return rows


def measure(provider: Provider, shape, **options) -> dict:
    """One provider on one shape (see measure_shape)."""
    return measure_shape([provider], shape, **options)[0]


def measure_ceilings() -> dict:
    """The two roofs every figure is drawn against, measured in the same run: HBM copy bandwidth
    (bytes read + written) and fp16 matmul throughput (torch.matmul, 8192³, random data)."""
    import triton.testing

    # An idle H100 sits at a few hundred MHz and takes a moment to clock up: a second of matmuls
    # first, so neither the ceilings nor the suite's first shapes are measured on a cold GPU.
    warm = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    triton.testing.do_bench(lambda: warm @ warm, warmup=1000, rep=10)
    src = torch.randn(2**28, device="cuda", dtype=torch.float16)  # 512 MiB, ten times the L2
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    mm_ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
    return {
        "copy_tb_per_s": 2 * src.numel() * 2 / (copy_ms * 1e-3) / 1e12,
        "matmul_fp16_tflops": 2 * 8192**3 / (mm_ms * 1e-3) / 1e12,
    }


def suite_provenance(suite_name: str, argv: list[str]) -> dict:
    """The machine's provenance, plus what this harness did: the suite, how it timed, what memory means."""
    return provenance(" ".join(["python -m tutorial_kernels.bench", *argv])) | {
        "suite": suite_name,
        "timing": f"per shape, every provider timed in {ROUNDS} interleaved rounds (rotated order) of "
        "triton.testing.do_bench (warmup 25 ms, rep 100 ms, median); ms is the median over rounds, ms_rounds "
        "each round's; fresh torch.randn inputs",
        "peak_extra_memory": "torch.cuda.max_memory_allocated during one call minus memory allocated before it "
        "(inputs excluded, the output included)",
    }


def _progress(items: list, desc: str) -> Iterator:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: fall back to one line per item
        for i, item in enumerate(items):
            print(f"{desc}: {i + 1}/{len(items)}", file=sys.stderr, flush=True)
            yield item
        return
    yield from tqdm(items, desc=desc)


def run_suite(
    name: str, out_path: Path, argv: list[str], providers: list[str] | None = None,
    lengths: list[int] | None = None, dtypes: list[str] | None = None, append: bool = False,
) -> dict:
    suite = SUITES[name]
    chosen = providers or suite.providers
    shapes = [
        s for s in suite.shapes
        if (lengths is None or getattr(s, "n", None) in lengths) and (dtypes is None or getattr(s, "dtype", None) in dtypes)
    ]
    jobs = [(p, s) for s in shapes for p in chosen]
    ceilings = measure_ceilings()  # first: it also brings an idle GPU up to its working clocks
    result = {
        "description": suite.description,
        "notes": suite.notes,
        "provenance": suite_provenance(name, argv),
        "ceilings": ceilings,
        "results": [],
    }
    kept, earlier_complete = [], True
    if append and out_path.exists():
        # a suite too long for one sitting, run in parts (e.g. one dtype each): keep the earlier
        # parts' rows, each tagged with the run that measured it, and their provenance
        earlier = json.loads(out_path.read_text())
        if earlier["provenance"].get("suite") != name:
            raise SystemExit(f"--append: {out_path} holds suite {earlier['provenance'].get('suite')!r}, not {name!r}")
        earlier_complete = earlier.get("complete", False)
        runs = earlier.get("earlier_runs", []) + [{k: earlier[k] for k in ("provenance", "ceilings")}]
        result["earlier_runs"] = runs
        measuring = {(p, s) for p, s in jobs}
        kept = [r | {"run": r.get("run", len(runs) - 1)} for r in earlier["results"]
                if (r["provider_key"], _shape_of(r, suite)) not in measuring]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for s in _progress(shapes, name):
        rows = measure_shape([PROVIDERS[p] for p in chosen], s)
        result["results"] += [row | {"provider_key": p} for row, p in zip(rows, chosen)]
        # rewritten after every shape: a run cut short by a time limit still leaves what it measured
        result["complete"] = len(result["results"]) == len(jobs) and earlier_complete
        out_path.write_text(json.dumps(result | {"results": kept + result["results"]}, indent=1) + "\n")
    return result | {"results": kept + result["results"]}


def run_probe(candidates: dict[str, Callable], out_path: Path, command: str,
              head_dims=(64, 128), lengths=(4096, 16384), dtype: str = "float16",
              baselines: tuple[str, ...] = ()) -> dict:
    """Time candidate kernels (label → fn(q, k, v, causal)) against torch's cuDNN backend, and the
    PROVIDERS named in `baselines`, on the FlashAttention-2 paper's shapes, with `measure_shape`'s
    checks and rotated rounds. A candidate that does not compile is recorded as "failed", one whose
    output is off as "wrong", never timed as "ok". For experiments outside the suites
    (tools/probe_*.py); writes `out_path` after every shape."""
    from tutorial_kernels.tolerances import tolerance

    providers = [PROVIDERS["sdpa-cudnn"], *(PROVIDERS[key] for key in baselines),
                 *(Provider(label, fn) for label, fn in candidates.items())]
    result = {"description": "probe: candidate kernels against torch's cuDNN backend", "ceilings": measure_ceilings(),
              "provenance": suite_provenance("probe", []) | {"command": command}, "results": []}
    for shape in _fa2_paper_shapes(head_dims, lengths, (dtype,)):
        rows = measure_shape(providers, shape, probing=True)
        for row in rows:
            if row.get("status") == "ok" and row["rel_err_head0"] > tolerance(getattr(torch, dtype)):
                row["status"] = "wrong"
        result["results"] += rows
        cudnn = rows[0].get("tflops")
        for row in rows:
            ratio = f"{row['tflops'] / cudnn:.3f}× cuDNN" if row.get("status") == "ok" and cudnn else row.get("error", "")
            print(f"d={shape.head_dim} causal={shape.causal} N={shape.n} {row['provider']:32} {row['status']:6} "
                  f"{row.get('tflops', 0):6.0f} TFLOP/s {ratio}", flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _shape_of(row: dict, suite: Suite):
    """The suite's shape a data row was measured on (rows store the shape's fields)."""
    for s in suite.shapes:
        if all(row.get(k) == v for k, v in asdict(s).items()):
            return s
    return None


def measure_subset(name: str, keep: Callable[[object], bool]) -> dict:
    """Measure the shapes of suite `name` that `keep` selects, with all its providers, and return
    them in the same form as a data file (not written): what a notebook overlays on the recording."""
    suite = SUITES[name]
    rows = [
        row | {"provider_key": key}
        for shape in suite.shapes if keep(shape)
        for row, key in zip(measure_shape([PROVIDERS[key] for key in suite.providers], shape), suite.providers)
    ]
    return {"description": suite.description, "provenance": suite_provenance(name, ["(subset, not written)"]), "results": rows}


def _summary(result: dict) -> str:
    """One line per measurement: the provider, the shape, the time, the rate and the check."""
    lines = []
    for r in result["results"]:
        shape = " ".join(f"{k}={v}" for k, v in r.items()
                         if k in ("head_dim", "n", "causal", "dtype", "mode", "m", "k", "rows", "cols"))
        if r["status"] != "ok":
            lines.append(f"{r['provider']:40} {shape:50} {r['status']}")
            continue
        rate = f"{r['tflops']:7.1f} TFLOP/s" if "tflops" in r else f"{r['gb_per_s']:7.0f} GB/s"
        err = r.get("rel_err_head0", r.get("rel_err"))
        lines.append(f"{r['provider']:40} {shape:50} {r['ms']:9.3f} ms {rate} {r['peak_extra_mib']:9.1f} MiB err {err:.1e}")
    if "ceilings" in result:
        c = result["ceilings"]
        lines.append(f"ceilings: copy {c['copy_tb_per_s']:.2f} TB/s, fp16 matmul {c['matmul_fp16_tflops']:.0f} TFLOP/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.bench", description=__doc__.split("\n")[0])
    parser.add_argument("suite", choices=sorted(SUITES), help="which sweep to run")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: data/<suite's file>)")
    parser.add_argument("--providers", nargs="+", choices=sorted(PROVIDERS), help="subset of the suite's providers")
    parser.add_argument("--n", nargs="+", type=int, dest="lengths", help="only these sequence lengths")
    parser.add_argument("--dtype", nargs="+", dest="dtypes", help="only these dtypes (e.g. float16)")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of an existing output file that this run does not re-measure")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("benchmarks time real kernels and need a CUDA GPU; none is visible here")
    out = args.out or data_dir() / SUITES[args.suite].default_out
    result = run_suite(args.suite, out, argv, args.providers, args.lengths, args.dtypes, args.append)
    print(_summary(result))
    print(f"wrote {out}")

