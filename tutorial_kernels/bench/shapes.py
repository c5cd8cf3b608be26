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
                                        reference_variant_attention, relative_error)
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


def _alibi_slopes(heads: int, device) -> torch.Tensor:
    """ALiBi's geometric slopes, 2^(−8(h + 1)/H) for head h (BLOOM's, for H a power of two), float32 (H,)."""
    return torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32, device=device)


def _kept_pairs(n: int, causal: bool, left: int) -> int:
    """(query, key) pairs a mask keeps in one n × n head: Σ_i |{j : i − left ≤ j ≤ i (causal) or n − 1}|,
    left < 0 for no left bound."""
    rows = torch.arange(n, dtype=torch.int64)
    lo = (rows - left).clamp(min=0) if left >= 0 else torch.zeros_like(rows)
    hi = rows if causal else torch.full_like(rows, n - 1)
    return int((hi - lo + 1).sum())


def _differentiated(call: Callable, leaves: tuple, do: torch.Tensor, mode: str) -> Callable:
    """The forward call as it is ("fwd"), or its backward alone ("bwd"): the forward runs once, untimed,
    and its graph is kept for every repetition (as TrainingShape does)."""
    if mode == "fwd":
        return call
    out = call()
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


@dataclass(frozen=True)
class VariantShape(Shape):
    """Chapter 9: attention with a variant, q, k, v of shape (batch, heads, n, head_dim): a sliding window
    of `window` keys to the left (−1: none; causal, or as far to the right when not), a `softcap`
    (0: none), ALiBi slopes (`alibi`); "fwd" times the forward, "bwd" the backward alone. A provider's fn
    is a factory, fn(q, k, v, causal, variants) → the call to time, where `variants` holds the front
    door's keywords (window_size, softcap, alibi_slopes) that differ from their defaults.

    TFLOP/s counts the (query, key) pairs the mask keeps, exactly: 4·d FLOPs a pair forward, 2.5× that
    backward. (Plain causal keeps N(N + 1)/2 pairs: (N + 1)/N times chapter 5's N²/2.)"""

    window: int = -1
    softcap: float = 0.0
    alibi: bool = False
    mode: str = "fwd"

    @property
    def flops(self) -> float:
        pairs = _kept_pairs(self.n, self.causal, self.window)
        return 4.0 * self.batch * self.heads * pairs * self.head_dim * (2.5 if self.mode == "bwd" else 1.0)

    def variants(self, device) -> dict:
        """The front door's keywords for this shape, those that differ from the defaults."""
        out: dict = {}
        if self.window >= 0:
            out["window_size"] = (self.window, 0 if self.causal else self.window)
        if self.softcap > 0:
            out["softcap"] = self.softcap
        if self.alibi:
            out["alibi_slopes"] = _alibi_slopes(self.heads, device)
        return out

    def draw(self) -> tuple[tuple, int]:
        x = random_qkv(self.batch, self.heads, self.n, self.n, self.head_dim, getattr(torch, self.dtype))
        gen = torch.Generator(device=x.q.device).manual_seed(x.seed + 1)
        do = torch.randn(x.q.shape, generator=gen, device=x.q.device).to(x.q.dtype)  # the upstream gradient
        q, k, v = (t.requires_grad_(self.mode == "bwd") for t in (x.q, x.k, x.v))
        return (q, k, v, self.causal, self.variants(q.device), do), x.seed

    def prepare(self, fn: Callable, args: tuple) -> Callable:
        q, k, v, causal, variants, do = args
        return _differentiated(fn(q, k, v, causal, variants), (q, k, v), do, self.mode)

    def check(self, out, args: tuple) -> dict:
        """Head 0 against the float64 reference (its gradients by float64 autograd for "bwd"). Causal, in
        blocks of 4096 queries against the keys up to the block's last: the same scores (bottom-right
        alignment puts the block's rows where they are), a few GB of float64 at N = 32k instead of tens."""
        q, k, v, causal, variants, do = args
        variants = dict(variants)
        if "alibi_slopes" in variants:
            variants["alibi_slopes"] = variants["alibi_slopes"][:1]
        leaves = [t[:1, :1].detach().double().requires_grad_(self.mode == "bwd") for t in (q, k, v)]
        step = 4096 if causal else self.n
        refs = []
        for a in range(0, self.n, step):
            b = min(a + step, self.n)
            ref, _ = reference_variant_attention(leaves[0][:, :, a:b], leaves[1][:, :, :b], leaves[2][:, :, :b],
                                                 causal=causal, **variants)
            if self.mode == "fwd":
                refs.append(ref)
            else:
                ref.backward(do[:1, :1, a:b].double())
        if self.mode == "fwd":
            return {"rel_err_head0": relative_error(out[:1, :1], torch.cat(refs, dim=2))}
        return {"rel_err_head0": max(relative_error(g[:1, :1], t.grad) for g, t in zip(out, leaves))}


@dataclass(frozen=True)
class PackedShape:
    """Chapter 9: a packed batch, as pre-training packs documents: sequence lengths drawn uniformly in
    [shortest, longest] from `lengths_seed` (the last takes what remains of `total` tokens, and is never
    shorter than `shortest`), q, k, v of shape (total, heads, head_dim). A provider's fn is a factory,
    fn(q, k, v, cu_seqlens, max_seqlen, causal) → the call to time; "fwd" / "bwd" as VariantShape.
    TFLOP/s counts the pairs each sequence keeps (L² or L(L + 1)/2), none across sequences."""

    total: int
    heads: int
    head_dim: int
    causal: bool
    dtype: str = "bfloat16"
    shortest: int = 128
    longest: int = 8192
    lengths_seed: int = 0
    mode: str = "fwd"

    @property
    def seqlens(self) -> list[int]:
        g = torch.Generator(device="cpu").manual_seed(self.lengths_seed)
        lengths, left = [], self.total
        while left > self.longest:
            top = min(self.longest, left - self.shortest)  # leaves the last sequence at least `shortest`
            lengths.append(int(torch.randint(self.shortest, top + 1, (1,), generator=g)))
            left -= lengths[-1]
        return lengths + [left]

    @property
    def flops(self) -> float:
        pairs = sum(n * (n + 1) // 2 if self.causal else n * n for n in self.seqlens)
        return 4.0 * self.heads * pairs * self.head_dim * (2.5 if self.mode == "bwd" else 1.0)

    def draw(self) -> tuple[tuple, int]:
        seed = fresh_seed()
        device = default_device()
        gen = torch.Generator(device=device).manual_seed(seed)
        dtype = getattr(torch, self.dtype)
        q, k, v, do = (torch.randn(self.total, self.heads, self.head_dim, generator=gen, device=device).to(dtype)
                       for _ in range(4))
        q, k, v = (t.requires_grad_(self.mode == "bwd") for t in (q, k, v))
        cu = torch.tensor([0, *torch.tensor(self.seqlens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        return (q, k, v, cu, max(self.seqlens), self.causal, do), seed

    def prepare(self, fn: Callable, args: tuple) -> Callable:
        q, k, v, cu, max_seqlen, causal, do = args
        return _differentiated(fn(q, k, v, cu, max_seqlen, causal), (q, k, v), do, self.mode)

    def check(self, out, args: tuple) -> dict:
        """Head 0 of every sequence, each over its own keys, against float64 (autograd for "bwd")."""
        q, k, v, cu, max_seqlen, causal, do = args
        got, want = [], []
        for a, b in zip(cu.tolist(), cu.tolist()[1:]):
            leaves = [t[a:b, :1].detach().transpose(0, 1)[None].double().requires_grad_() for t in (q, k, v)]
            ref, _ = reference_variant_attention(*leaves, causal=causal)
            if self.mode == "fwd":
                got.append(out[a:b, :1])
                want.append(ref[0].transpose(0, 1))
                continue
            ref.backward(do[a:b, :1].transpose(0, 1)[None].double())
            got += [g[a:b, :1] for g in out]
            want += [t.grad[0].transpose(0, 1) for t in leaves]
        if self.mode == "fwd":
            return {"rel_err_head0": relative_error(torch.cat(got), torch.cat(want))}
        return {"rel_err_head0": max(relative_error(torch.cat(got[i::3]), torch.cat(want[i::3])) for i in range(3))}

    def rates(self, ms: float) -> dict:
        return {"tflops": self.flops / (ms * 1e-3) / 1e12}
