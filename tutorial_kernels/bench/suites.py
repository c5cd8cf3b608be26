"""The named sweeps of `python -m tutorial_kernels.bench SUITE`: `SUITES[name]` is a `Suite` (which
providers, by key in `PROVIDERS`, on which shapes, written to which file under `data/`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tutorial_kernels.bench.shapes import (DecodeShape, MatmulShape, PackedShape, ReductionShape, Shape, SoftmaxShape,
                                           TrainingShape, VariantShape)


@dataclass
class Suite:
    """A named sweep: which providers, on which shapes, written to which data file."""

    description: str
    providers: list[str]
    shapes: list
    default_out: str
    notes: list[str] = field(default_factory=list)
    # which providers time which shape, when not all of them every shape: measures(key, shape) → bool
    measures: Callable[[str, object], bool] | None = None

    def providers_for(self, shape, chosen: list[str] | None = None) -> list[str]:
        """The providers (of `chosen`, default the suite's) that time `shape`."""
        return [p for p in (chosen or self.providers) if self.measures is None or self.measures(p, shape)]


def fa2_paper_shapes(head_dims, lengths, dtypes=("float16", "bfloat16")) -> list[Shape]:
    """The FlashAttention-2 paper's convention: 16k tokens per batch (B = 16384 / N) and a hidden
    size of 2048 (H = 2048 / d), so every point does comparable total work."""
    return [
        Shape(16384 // n, 2048 // d, n, d, causal, dtype)
        for dtype in dtypes for d in head_dims for causal in (False, True) for n in lengths
    ]


DECODE_PROVIDERS = ["kvcache", "kvcache-paged16", "kvcache-paged256", "sdpa-flash-gqa", "sdpa-cudnn-gqa",
                    "front-door-decode"]
# measure_shape holds every provider's inputs until the cell is timed, so a cell needs one cache per
# provider at once; 64 GiB of them leaves an 80 GB H100 room for outputs, a paged copy's moment of
# two caches and do_bench's L2 flush
DECODE_MEMORY_BYTES = 64 * 2**30


def decode_shapes(batches=(1, 8, 64), lengths=(1024, 4096, 32768, 131072), heads=((32, 8), (32, 32)),
                  head_dims=(64, 128), dtypes=("bfloat16", "float16"),
                  providers: int = len(DECODE_PROVIDERS), memory: int = DECODE_MEMORY_BYTES) -> list[DecodeShape]:
    """Every (dtype, equal or varying lengths, d, (H, H_kv), B, n) cell whose caches, one per provider, fit
    in `memory` bytes; the others are not generated (a cache that cannot be drawn is no measurement)."""
    cells = [DecodeShape(b, h, h_kv, n, d, dtype, varying)
             for dtype in dtypes for varying in (False, True) for d in head_dims for h, h_kv in heads
             for b in batches for n in lengths]
    return [s for s in cells if providers * s.cache_bytes <= memory]


def _decode_left_out() -> str:
    """The (B, H_kv, n, d) cells `decode_shapes()` leaves out, for the suite's notes."""
    kept = {(s.batch, s.kv_heads, s.n, s.head_dim) for s in decode_shapes()}
    every = {(s.batch, s.kv_heads, s.n, s.head_dim) for s in decode_shapes(memory=2**80)}
    return ", ".join(map(str, sorted(every - kept)))


CH09_WINDOW = 4096  # the sliding window of chapter 9's speed table (Mistral's)
CH09_SOFTCAP = 50.0  # Gemma 2's attention softcap


def ch09_shapes() -> list:
    """Chapter 9's speed table, bf16, d = 128, H = 16 (H·d = 2048), forward and backward: (a) a causal
    sliding window of 4096 keys at N = 32k, and plain causal there; (b) a packed batch of 64k tokens and a
    dense batch of the same tokens (16 × 4096), causal; (c) softcap and ALiBi against plain attention at
    N = 4k and 16k (B·N = 16k tokens, not causal)."""
    shapes: list = []
    for mode in ("fwd", "bwd"):
        shapes += [VariantShape(1, 16, 32768, 128, True, "bfloat16", window=w, mode=mode) for w in (-1, CH09_WINDOW)]
        shapes += [PackedShape(65536, 16, 128, True, "bfloat16", mode=mode),
                   VariantShape(16, 16, 4096, 128, True, "bfloat16", mode=mode)]
        shapes += [VariantShape(16384 // n, 16, n, 128, False, "bfloat16", softcap=cap, alibi=alibi, mode=mode)
                   for n in (4096, 16384) for cap, alibi in ((0.0, False), (CH09_SOFTCAP, False), (0.0, True))]
    return shapes


def _ch09_measures(key: str, shape) -> bool:
    """Packed batches by the varlen front door and Flex's document mask; the dense shapes by the front door;
    Flex on the window's table (its masks, not the score mods); the wide forward where chapter 9's forward runs."""
    if isinstance(shape, PackedShape):
        return key in ("ch09-front-door-varlen", "ch09-flex-document")
    if key in ("ch09-front-door-varlen", "ch09-flex-document"):
        return False
    if key == "ch09-flex":
        return shape.n == 32768  # the window's table: causal, with and without the window
    if key == "ch09-front-door-wide":  # where chapter 9's forward runs: a softcap or ALiBi (a window alone runs on
        return shape.mode == "fwd" and (shape.softcap > 0 or shape.alibi)  # chapter 7's kernels on Hopper)
    return True


SUITES: dict[str, Suite] = {
    "ch01-reduction": Suite(
        description="Chapter 1: sum-reduction bandwidth vs length, Triton and CUDA against torch.sum",
        providers=["torch-sum", "triton-sum", "triton-sum-atomic", "cuda-sum"],
        shapes=[ReductionShape(n, dtype) for dtype in ("float32", "float16")
                for n in sorted([2**k for k in range(10, 29, 2)] + [1_000_003])],
        default_out="ch01_reduction.json",
        notes=["GB/s counts the bytes read, n · itemsize; the copy ceiling counts bytes read + written.",
               "rel_err is |s − Σx| / Σ|x| with Σx from torch.sum in float64 (reduction_error).",
               "The CUDA kernel is compiled by torch.utils.cpp_extension.load_inline before timing."],
    ),
    "ch02-sweep": Suite(
        description="Chapter 2: time, TFLOP/s and peak extra memory vs N (B=1, H=32, d=128, fp16)",
        providers=["eager", "naive-triton", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"],
        shapes=[Shape(1, 32, n, 128, causal) for causal in (False, True) for n in (512, 1024, 2048, 4096, 8192, 16384)],
        default_out="ch02_sweep.json",
    ),
    "ch02-rocm": Suite(
        description="The ROCm blog's sweep: B=1, H=32, d=128, fp16, causal, N=256..4096 step 256",
        providers=["eager", "sdpa-default", "naive-triton"],
        shapes=[Shape(1, 32, n, 128, True) for n in range(256, 4096 + 1, 256)],
        default_out="ch02_rocm.json",
        notes=["The blog draws inputs with torch.rand; we use torch.randn (never zeros, mean zero)."],
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
    "ch04-sweep": Suite(
        description="Chapter 4: FlashAttention-1 against chapters 2–3 and torch, fp16, d = 64 and 128, "
        "B·N = 16384 tokens, H·d = 2048 (FlashAttention-2 paper convention)",
        providers=["eager", "naive-triton", "online-triton", "flash-v1-triton", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"],
        shapes=fa2_paper_shapes((64, 128), (512, 1024, 2048, 4096, 8192, 16384), ("float16",)),
        default_out="ch04_sweep.json",
        notes=["batch = 16384 / N and heads = 2048 / d: the same number of tokens and the same hidden size at every N, "
               "so B·H, the number of FlashAttention-1 programs, falls from 1024 (N = 512, d = 64) to 16 (N = 16384, d = 128)."],
    ),
    "ch05-fwd": Suite(
        description="Forward pass of every attention in the tutorial and in torch, FA2 paper convention "
        "(B·N = 16384, H·d = 2048), d ∈ {64, 128, 256}, fp16 and bf16",
        providers=["flash-v2-triton", "flash-v2-tuned", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient",
                   "flash-v1-triton", "naive-triton", "eager", "sdpa-math"],
        shapes=fa2_paper_shapes((64, 128, 256), (512, 1024, 2048, 4096, 8192, 16384)),
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
                for s in fa2_paper_shapes((64, 128), (512, 1024, 2048, 4096, 8192, 16384))],
        default_out="ch06_bwd.json",
        notes=["TFLOP/s counts 2.5 × the forward's FLOPs (five N×N×d matmuls to the forward's two).",
               "Our kernels are autotuned per shape before timing; the choices are in each row's 'config'."],
    ),
    "ch07-head-dims": Suite(
        description="Chapter 7's Hopper forward at head_dim 64 and 256 against torch's cuDNN and flash backends "
        "and chapter 5's tuned Triton kernel, FA2 paper convention (B·N = 16384, H·d = 2048), bf16",
        providers=["sdpa-cudnn", "flash-v2-hopper", "flash-v2-tuned", "sdpa-flash"],
        shapes=fa2_paper_shapes((64, 256), (1024, 2048, 4096, 8192, 16384), ("bfloat16",)),
        default_out="ch07_hopper_head_dims.json",
        notes=["The Hopper kernel's tiles per head dimension are ch07_hopper.TILES; the tuned Triton kernel is "
               "autotuned per shape before timing."],
    ),
    "front-door-fwd": Suite(
        description="Forward pass of tutorial_kernels.flash_attention as a user calls it, against torch's cuDNN "
        "and flash backends, FA2 paper convention (B·N = 16384, H·d = 2048), d ∈ {64, 128}, fp16 and bf16",
        providers=["front-door", "sdpa-cudnn", "sdpa-flash"],
        shapes=fa2_paper_shapes((64, 128), (1024, 4096, 8192, 16384)),
        default_out="front_door_fwd.json",
        notes=["The front door picks its kernel per call (the Hopper kernel where it applies, else the tuned "
               "Triton kernel, autotuned per shape before timing)."],
    ),
    "front-door-bwd": Suite(
        description="Backward pass (dQ, dK, dV given dO; the forward runs once, untimed) of "
        "tutorial_kernels.flash_attention against torch's cuDNN and flash backends, FA2 paper convention, "
        "d ∈ {64, 128}, fp16 and bf16",
        providers=["front-door", "sdpa-cudnn", "sdpa-flash"],
        shapes=[TrainingShape(s.batch, s.heads, s.n, s.head_dim, s.causal, s.dtype, "bwd")
                for s in fa2_paper_shapes((64, 128), (1024, 4096, 8192, 16384))],
        default_out="front_door_bwd.json",
        notes=["TFLOP/s counts 2.5 × the forward's FLOPs (five N×N×d matmuls to the forward's two)."],
    ),
    "decode": Suite(
        description="Chapter 8: decoding from a KV cache, one new query per sequence against n cached keys, "
        "B ∈ {1, 8, 64}, n ∈ {1024, 4096, 32768, 131072}, (H, H_kv) ∈ {(32, 8), (32, 32)}, d ∈ {64, 128}, "
        "bf16 and fp16, equal and varying lengths: flash_attention_with_kvcache on a contiguous and a paged cache "
        "against torch's SDPA (flash, cuDNN) and the front door on the cache sliced to the length",
        providers=DECODE_PROVIDERS,
        shapes=decode_shapes(),
        default_out="ch08_decode.json",
        notes=["GB/s is KV bandwidth: the keys and values one step must read, Σ_b seqlens[b] · kv_heads · head_dim "
               "· 2 tensors · itemsize, over the time; the copy ceiling counts bytes read + written.",
               "ms is the GPU's time alone: each provider's call captured in a CUDA graph (torch.cuda.graph) after "
               "its check, the graph's replay timed (a decode step's GPU work is shorter than a launch from Python, "
               "as a serving engine replays graphs). Over 50 eager calls back to back (no L2 flush between them): "
               "host_us, the host's time per call until the last is enqueued; eager_ms, the time per call until "
               "the GPU has finished them all (the slower of host and GPU).",
               "varying_lengths: seqlens[b] uniform in [n/2, n], torch.randint(n // 2, n + 1, (batch,)) from "
               "torch.Generator().manual_seed(lengths_seed), listed in each measured row; SDPA and the front door "
               "take one length per call and are recorded 'unsupported' there.",
               "kvcache: the front door's flash_attention_with_kvcache, no append (k = v = None), cache_seqlens the "
               "lengths, num_splits chosen by the launcher; its first call (the check's) remembers its launches, "
               "which later calls repeat. "
               "kvcache-paged16/256 copy the drawn cache, untimed, into a pool of 16- or 256-token blocks handed "
               "out in a shuffled order (torch.randperm, seed 0), as an allocator serving many sequences leaves them.",
               "SDPA runs non-causal (its mask is top-left; the one query sees every key), the front door causal "
               "(bottom-right, the same keys); both get the contiguous cache sliced to the length, K and V of "
               "H_kv heads (enable_gqa=True for SDPA).",
               "rel_err_head0: query head 0 of every sequence, over that sequence's keys, against the float64 "
               "reference (reference_kvcache_attention).",
               "Cells whose caches, one per provider (the harness holds every provider's inputs until a cell is "
               f"timed), would exceed {DECODE_MEMORY_BYTES / 2**30:.0f} GiB are not generated; (B, H_kv, n, d): "
               f"{_decode_left_out()}."],
    ),
    "ch06-memory": Suite(
        description="Peak memory and time of forward + backward vs N (B = 1, H = 16, d = 128, fp16, causal)",
        providers=["flash-attention", "sdpa-flash", "sdpa-cudnn", "eager"],
        shapes=[TrainingShape(1, 16, n, 128, True, "float16", "fwd+bwd") for n in (1024, 2048, 4096, 8192, 16384, 32768)],
        default_out="ch06_memory.json",
        notes=["peak_extra_mib: the most memory allocated during one forward + backward beyond the inputs "
               "and dO (the gradients themselves, 3 · N · d · H · 2 bytes, are included)."],
    ),    "ch09-variants": Suite(
        description="Chapter 9: a sliding window, a packed batch, softcap and ALiBi through the front door, against "
        "its plain attention and FlexAttention with the same mask, bf16, d = 128, H = 16, forward and backward",
        providers=["ch09-front-door", "ch09-front-door-wide", "ch09-flex", "ch09-front-door-varlen",
                   "ch09-flex-document"],
        shapes=ch09_shapes(),
        default_out="ch09_variants.json",
        measures=_ch09_measures,
        notes=["TFLOP/s counts the (query, key) pairs the mask keeps, exactly (a window of w keys: about N·w; a "
               "packed batch: each sequence's own, L(L + 1)/2 causal), 4·d FLOPs a pair forward and 2.5× that "
               "backward; plain causal keeps N(N + 1)/2 pairs, (N + 1)/N times the other suites' N²/2.",
               "bwd times the backward alone (dQ, dK, dV given dO); the forward runs once, untimed.",
               f"window: {CH09_WINDOW} keys to the left of the diagonal, causal (flash-attn's window_size=("
               f"{CH09_WINDOW}, 0)); softcap {CH09_SOFTCAP:g}; ALiBi: slopes 2^(−8(h + 1)/H).",
               "The packed batch: lengths uniform in [128, 8192] from torch.Generator().manual_seed(0), the last "
               "taking what remains of 65536 tokens; the dense batch holds the same tokens as 16 × 4096.",
               "FlexAttention: torch.compile(flex_attention), block masks from create_block_mask (128 × 128 blocks, "
               "built once per shape, untimed): causal, causal with the window, the packed batch as one sequence "
               "with a causal document mask. It is timed on the masks only, not on softcap or ALiBi.",
               "ch09-front-door-wide: chapter 9's forward in 128 × 64 tiles, 8 warps and 3 stages instead of its "
               "readable 64 × 64 (4 warps, 2 stages); forward shapes only.",
               "rel_err_head0: head 0 (of every sequence, packed) against float64, gradients by float64 autograd."],
    ),
}
