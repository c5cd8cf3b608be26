"""The problems the harness times. Each shape is a frozen dataclass (its fields are written into every
data row) with the same protocol:

- `draw()`: fresh random inputs on the GPU, as the provider's arguments, and the seed that drew them;
- `prepare(fn, args)` (attention and decoding only): the call to time; other shapes time `fn(*args)`;
- `check(out, args)`: the output's relative error against a float64 reference, as a dict for the row;
- `rates(ms)`: TFLOP/s or GB/s for a time in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from tutorial_kernels.ch01_gpu_hierarchy import reduction_error
from tutorial_kernels.inputs import fresh_seed, random_qkv
from tutorial_kernels.reference import (reference_attention, reference_kvcache_attention, reference_softmax,
                                        relative_error)
from tutorial_kernels.runtime import default_device


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
        (x,) = args
        return {"rel_err": reduction_error(out, x)}  # |s − Σx| / Σ|x|, Σx in float64

    def rates(self, ms: float) -> dict:
        return {"gb_per_s": self.min_bytes / (ms * 1e-3) / 1e9}


@dataclass(frozen=True)
class DecodeShape:
    """One decoding step: one new query per sequence, q (batch, heads, 1, head_dim), against a KV cache of
    kv_heads heads holding n keys per sequence, or with `varying_lengths` seqlens[b] keys drawn uniformly
    in [n/2, n] from `lengths_seed` (the same lengths in every run). The cache is drawn contiguous,
    (batch, kv_heads, n, head_dim); a provider's fn is a factory, fn(q, k_cache, v_cache, seqlens) → the
    call to time, which lays the cache out as it reads it (a paged pool, a slice) untimed."""

    # timed as a CUDA graph's replay: a step's GPU work is shorter than a Python launch (timing.py)
    cuda_graph: ClassVar[bool] = True

    batch: int
    heads: int
    kv_heads: int
    n: int  # keys per sequence (the most, with varying lengths); `--n` selects on it
    head_dim: int
    dtype: str = "float16"
    varying_lengths: bool = False
    lengths_seed: int = 0

    @property
    def seqlens(self) -> list[int]:
        """Keys cached per sequence."""
        if not self.varying_lengths:
            return [self.n] * self.batch
        g = torch.Generator(device="cpu").manual_seed(self.lengths_seed)
        return torch.randint(self.n // 2, self.n + 1, (self.batch,), generator=g).tolist()

    @property
    def cache_bytes(self) -> int:
        """K and V as drawn, n keys for every sequence: what one provider's inputs hold."""
        return 2 * self.batch * self.kv_heads * self.n * self.head_dim * getattr(torch, self.dtype).itemsize

    @property
    def kv_bytes(self) -> int:
        """What one step must read, each key and value once: Σ_b seqlens[b] · kv_heads · d · 2 · itemsize."""
        return 2 * sum(self.seqlens) * self.kv_heads * self.head_dim * getattr(torch, self.dtype).itemsize

    def draw(self) -> tuple[tuple, int]:
        seed = fresh_seed()
        device = default_device()
        gen = torch.Generator(device=device).manual_seed(seed)
        dtype = getattr(torch, self.dtype)

        def randn(*shape: int) -> torch.Tensor:  # in the dtype itself: a float32 draw of a 10 GiB cache needs 20 more
            return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

        q = randn(self.batch, self.heads, 1, self.head_dim)
        k_cache, v_cache = (randn(self.batch, self.kv_heads, self.n, self.head_dim) for _ in "kv")
        return (q, k_cache, v_cache, torch.tensor(self.seqlens, dtype=torch.int32, device=device)), seed

    def prepare(self, fn: Callable, args: tuple) -> Callable:
        """The provider's layout is built here, untimed (and outside the peak-memory measurement)."""
        return fn(*args)

    def check(self, out: torch.Tensor, args: tuple) -> dict:
        """Query head 0 (which reads KV head 0) of every sequence, each over its own keys, against float64."""
        q, k_cache, v_cache, seqlens = args
        ref, _ = reference_kvcache_attention(q[:, :1], k_cache[:, :1], v_cache[:, :1], seqlens)
        row = {"rel_err_head0": relative_error(out[:, :1], ref)}
        if self.varying_lengths:
            row["seqlens"] = self.seqlens
        return row

    def rates(self, ms: float) -> dict:
        return {"gb_per_s": self.kv_bytes / (ms * 1e-3) / 1e9}
