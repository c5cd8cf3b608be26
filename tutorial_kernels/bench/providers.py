"""The implementations the harness times, by key: `PROVIDERS[key]` is a `Provider`.

A provider's `fn` takes the arguments its shape draws: attention `(q, k, v, causal)` (also for
`TrainingShape`, with autograd), matmul `(a, b)`, softmax and reduction `(x,)`. Decoding
(`DecodeShape`) is the exception: its `fn(q, k_cache, v_cache, seqlens)` gets a contiguous cache, lays
it out as it reads it (a paged pool, a slice), untimed, and returns the call to time. Importing this
module compiles nothing: Triton kernels compile on their first launch, chapter 1's CUDA extension on
its first call.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tutorial_kernels import attention
from tutorial_kernels import ch01_gpu_hierarchy as ch01
from tutorial_kernels import ch02_naive_attention as ch02
from tutorial_kernels import ch03_tiling_online_softmax as ch03
from tutorial_kernels import ch04_flash_v1 as ch04
from tutorial_kernels import ch05_flash_v2 as ch05
from tutorial_kernels import ch07_hopper
from tutorial_kernels import ch06_backward as ch06
from tutorial_kernels import ch09_variants as ch09
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


def _pinned(backend: SDPBackend) -> Callable[[], contextlib.AbstractContextManager]:
    # a factory, not one context: the harness enters the provider's context several times
    return partial(sdpa_kernel, backend)


def paged_copy(k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor, block_size: int,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each sequence's first seqlens[b] keys and values of a contiguous cache (B, H_kv, capacity, d),
    copied into pools (num_blocks, H_kv, block_size, d) of just the blocks they fill, handed out in a
    shuffled order (torch.randperm, `seed`) as an allocator serving many sequences leaves them; and the
    block table (B, ⌈capacity / block_size⌉) int32, 0 past a sequence's blocks (never read)."""
    batch, kv_heads, capacity, d = k_cache.shape
    counts = [-(-n // block_size) for n in seqlens.tolist()]
    order = torch.randperm(sum(counts), generator=torch.Generator(device="cpu").manual_seed(seed))
    pools = [cache.new_empty((sum(counts), kv_heads, block_size, d)) for cache in (k_cache, v_cache)]
    table = torch.zeros((batch, -(-capacity // block_size)), dtype=torch.int32)
    start = 0
    for b, count in enumerate(counts):  # one sequence at a time: the copy's temporaries stay small
        blocks = order[start:start + count]
        start += count
        table[b, :count] = blocks
        for pool, cache in zip(pools, (k_cache, v_cache)):
            tokens = cache[b, :, :count * block_size]  # (H_kv, tokens, d)
            if tokens.shape[1] < count * block_size:  # a last block past the cache's capacity: zeros, never read
                tokens = torch.cat([tokens, tokens.new_zeros(kv_heads, count * block_size - tokens.shape[1], d)], 1)
            pool[blocks.to(pool.device)] = tokens.reshape(kv_heads, count, block_size, d).transpose(0, 1)
    return pools[0], pools[1], table.to(k_cache.device)


def _kvcache(block_size: int | None) -> Callable:
    """The front door's flash_attention_with_kvcache reading the drawn cache (None), or a paged copy of it,
    with no append."""
    def factory(q, k_cache, v_cache, seqlens):
        if block_size is None:
            return lambda: attention.flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
        k_pool, v_pool, table = paged_copy(k_cache, v_cache, seqlens, block_size)
        return lambda: attention.flash_attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=seqlens,
                                                              block_table=table)
    return factory


def _sliced(k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache cut to the batch's one length; UnsupportedShape when lengths differ (one call takes one
    length: per-sequence lengths would need a mask, or a call per sequence)."""
    lengths = set(seqlens.tolist())
    if len(lengths) > 1:
        raise UnsupportedShape(f"one length per call, and these sequences hold {min(lengths)} to {max(lengths)} keys")
    n = lengths.pop() if lengths else 0
    return k_cache[:, :, :n], v_cache[:, :, :n]


def _sdpa_decode(q, k_cache, v_cache, seqlens):
    k, v = _sliced(k_cache, v_cache, seqlens)
    # not causal: SDPA aligns its mask top-left, and the one query, the last position, sees every key
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def _sdpa_cudnn_decode(q, k_cache, v_cache, seqlens):
    call = _sdpa_decode(q, k_cache, v_cache, seqlens)

    def refusable():
        # cuDNN may accept the inputs at dispatch and then build no plan for them (one query row, grouped
        # heads): that is a refusal, recorded, where `refusal_reason` would let the suite stop on it
        try:
            return call()
        except RuntimeError as err:
            if "cudnn" not in str(err).lower():
                raise
            raise UnsupportedShape((str(err).strip().splitlines() or ["cuDNN"])[0]) from err
    return refusable


def _front_door_decode(q, k_cache, v_cache, seqlens):
    k, v = _sliced(k_cache, v_cache, seqlens)
    return lambda: attention.flash_attention(q, k, v, causal=True)  # bottom-right: the query sees every key


# --- chapter 9 (VariantShape: fn(q, k, v, causal, variants); PackedShape: fn(q, k, v, cu_seqlens, max_seqlen,
# causal)), each a factory returning the call to time; what it builds first (a block mask) is untimed

def _front_door_variants(q, k, v, causal, variants):
    return lambda: attention.flash_attention(q, k, v, causal, **variants)


def _front_door_varlen(q, k, v, cu_seqlens, max_seqlen, causal):
    return lambda: attention.flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                    causal=causal)


WIDE_FORWARD_TILES = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)


@contextlib.contextmanager
def _wide_forward():
    """Chapter 9's forward in 128 × 64 tiles, 8 warps, 3 stages instead of its readable 64 × 64 (the A/B)."""
    before, ch09.FORWARD_TILES = ch09.FORWARD_TILES, WIDE_FORWARD_TILES
    try:
        yield
    finally:
        ch09.FORWARD_TILES = before


_FLEX: list = []


def _flex() -> Callable:
    """torch.compile(flex_attention), compiled once per process (FlexAttention is meant to be compiled:
    eager, it runs an unfused reference)."""
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention
        _FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _FLEX[0]


def _flex_mask(mask_mod, n: int, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask
    return create_block_mask(mask_mod, None, None, n, n, device=device)


def _flex_variants(q, k, v, causal, variants):
    """FlexAttention with the same mask as a block mask (its empty tiles skipped); masks only."""
    if set(variants) - {"window_size"}:
        raise UnsupportedShape("this provider times FlexAttention's masks (causal, window), not score mods")
    left = variants.get("window_size", (-1, -1))[0]
    if left >= 0 and not causal:
        raise UnsupportedShape("this provider times causal windows only")
    if left >= 0:
        mask = _flex_mask(lambda b, h, i, j: (i >= j) & (i - j <= left), q.shape[2], q.device)
    elif causal:
        mask = _flex_mask(lambda b, h, i, j: i >= j, q.shape[2], q.device)
    else:
        mask = None
    flex = _flex()
    return lambda: flex(q, k, v, block_mask=mask)


def _flex_document(q, k, v, cu_seqlens, max_seqlen, causal):
    """FlexAttention over the packed batch as one sequence of (1, H, total, d), with a document mask
    (causal within each document when `causal`) as its block mask."""
    lengths = cu_seqlens.diff().long()
    document = torch.repeat_interleave(torch.arange(len(lengths), device=q.device), lengths)

    def same_document(b, h, i, j):
        return (document[i] == document[j]) & (i >= j) if causal else document[i] == document[j]

    mask = _flex_mask(same_document, q.shape[0], q.device)
    flex = _flex()
    q4, k4, v4 = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, H, total, d) views
    return lambda: flex(q4, k4, v4, block_mask=mask)[0].transpose(0, 1)


PROVIDERS: dict[str, Provider] = {
    # attention: fn(q, k, v, causal)
    "eager": Provider("eager PyTorch", ch02.eager_attention),
    "naive-triton": Provider("naive Triton (ch. 2)", ch02.naive_attention),
    "online-triton": Provider("online-softmax Triton (ch. 3)", ch03.online_softmax_attention),
    "flash-v1-triton": Provider("FlashAttention-1 Triton (ch. 4)", ch04.flash_attn_v1),
    "sdpa-default": Provider("torch SDPA (default pick)", _sdpa),
    "sdpa-flash": Provider("torch SDPA: flash", _sdpa, _pinned(SDPBackend.FLASH_ATTENTION)),
    "sdpa-efficient": Provider("torch SDPA: mem-efficient", _sdpa, _pinned(SDPBackend.EFFICIENT_ATTENTION)),
    "sdpa-cudnn": Provider("torch SDPA: cuDNN", _sdpa, _pinned(SDPBackend.CUDNN_ATTENTION)),
    "sdpa-math": Provider("torch SDPA: math", _sdpa, _pinned(SDPBackend.MATH)),
    "flash-v2-triton": Provider("FlashAttention-2 Triton, teaching (ch. 5)", ch05.flash_attn_v2),
    "flash-v2-tuned": Provider("FlashAttention-2 Triton, tuned (ch. 5)", ch05.flash_attn_v2_tuned,
                               config=ch05.tuned_choice),
    "flash-v2-tuned-pointers": Provider("FlashAttention-2 Triton, tuned, no TMA (ch. 5)",
                                        partial(ch05.flash_attn_v2_tuned, descriptors=False)),
    "flash-v2-hopper": Provider("FlashAttention-2 with FA3's Hopper schedule, Gluon (ch. 7)", ch07_hopper.flash_attn_hopper),
    # differentiable attention (TrainingShape): fn(q, k, v, causal) with autograd
    "front-door": Provider("tutorial_kernels.flash_attention (the front door)",
                           lambda q, k, v, causal: attention.flash_attention(q, k, v, causal)),
    "flash-attention": Provider("FlashAttention-2 fwd + bwd Triton (ch. 6)", partial(ch06.flash_attention, tuned=True),
                                config=ch06.tuned_backward_choice),
    # decoding (DecodeShape): fn(q, k_cache, v_cache, seqlens) → the call to time
    "kvcache": Provider("tutorial_kernels.flash_attention_with_kvcache, contiguous cache (ch. 8)", _kvcache(None)),
    "kvcache-paged16": Provider("tutorial_kernels.flash_attention_with_kvcache, paged cache, 16-token blocks (ch. 8)",
                                _kvcache(16)),
    "kvcache-paged256": Provider("tutorial_kernels.flash_attention_with_kvcache, paged cache, 256-token blocks "
                                 "(ch. 8)", _kvcache(256)),
    "sdpa-flash-gqa": Provider("torch SDPA: flash, enable_gqa, on the sliced cache", _sdpa_decode,
                               _pinned(SDPBackend.FLASH_ATTENTION)),
    "sdpa-cudnn-gqa": Provider("torch SDPA: cuDNN, enable_gqa, on the sliced cache", _sdpa_cudnn_decode,
                               _pinned(SDPBackend.CUDNN_ATTENTION)),
    "front-door-decode": Provider("tutorial_kernels.flash_attention on the sliced cache (the front door)",
                                  _front_door_decode),
    # chapter 9 (VariantShape, PackedShape): factories, fn(q, k, v, causal, variants) / fn(q, k, v, cu_seqlens,
    # max_seqlen, causal) → the call to time
    "ch09-front-door": Provider("tutorial_kernels.flash_attention with the variant (the front door)",
                                _front_door_variants),
    "ch09-front-door-wide": Provider("the front door, chapter 9's forward in 128 × 64 tiles", _front_door_variants,
                                     _wide_forward),
    "ch09-flex": Provider("FlexAttention (torch.compile), the same mask as a block mask", _flex_variants),
    "ch09-front-door-varlen": Provider("tutorial_kernels.flash_attention_varlen (the front door)", _front_door_varlen),
    "ch09-flex-document": Provider("FlexAttention (torch.compile), a document mask as a block mask", _flex_document),
    # matmul: fn(a, b)
    "torch-matmul": Provider("torch.matmul (cuBLAS)", torch.matmul),
    "triton-matmul-pointers": Provider("Triton matmul, pointer tiles (ch. 3)", partial(ch03.matmul, method="pointers")),
    "triton-matmul-descriptors": Provider("Triton matmul, descriptors (ch. 3)", partial(ch03.matmul, method="descriptors")),
    # softmax over rows: fn(x)
    "torch-softmax": Provider("torch.softmax", lambda x: torch.softmax(x, dim=-1)),
    "three-pass-softmax": Provider("three-pass softmax (ch. 2)", ch03.three_pass_softmax_rows),
    "online-softmax": Provider("online softmax (ch. 3)", ch03.online_softmax),
    # reductions: fn(x) -> float32 scalar
    "torch-sum": Provider("torch.sum (float32 accumulation)", lambda x: torch.sum(x, dtype=torch.float32)),
    "triton-sum": Provider("Triton sum, repeated passes (ch. 1)", ch01.triton_sum),
    "triton-sum-atomic": Provider("Triton sum, atomics (ch. 1)", partial(ch01.triton_sum, method="atomic")),
    "cuda-sum": Provider("CUDA warp-shuffle sum (ch. 1)", ch01.cuda_sum),
}
