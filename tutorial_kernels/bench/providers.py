"""The implementations the harness times, by key: `PROVIDERS[key]` is a `Provider`.

A provider's `fn` takes the arguments its shape draws: attention `(q, k, v, causal)` (also for
`TrainingShape`, with autograd), matmul `(a, b)`, softmax and reduction `(x,)`. Importing this module
compiles nothing: Triton kernels compile on their first launch, chapter 1's CUDA extension on its
first call.
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
    "flash-v2-hopper": Provider("FlashAttention-2 with FA3's Hopper schedule, Gluon (ch. 5)", ch07_hopper.flash_attn_hopper),
    # differentiable attention (TrainingShape): fn(q, k, v, causal) with autograd
    "front-door": Provider("tutorial_kernels.flash_attention (the front door)",
                           lambda q, k, v, causal: attention.flash_attention(q, k, v, causal)),
    "flash-attention": Provider("FlashAttention-2 fwd + bwd Triton (ch. 6)", partial(ch06.flash_attention, tuned=True),
                                config=ch06.tuned_backward_choice),
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
