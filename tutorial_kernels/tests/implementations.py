"""Every public attention implementation of the package, with what it supports: the registry that
`test_conformance.py` gives the whole correctness matrix to. A new kernel is tested by adding one entry.

The capabilities are read off each function's checks and docstring:

* head_dim: `check_attention_inputs(..., min_head_dim, max_head_dim)` (16..128 by default; chapter 2's
  eager function, chapter 5 and chapter 6 go to 256; the Hopper kernel runs 64, 128 and 256 only);
* gqa: `allow_gqa=True` (k and v with fewer heads than q, dividing them);
* dtypes: float32, float16 and bfloat16 (`validation.SUPPORTED_DTYPES`) unless the kernel says otherwise;
* out: no `out=` at all (None), a contiguous buffer (`check_out`), or any dense layout, e.g. a model's
  (B, N, H, d) buffer seen as (B, H, N, d) (`check_out(..., any_dense_layout=True)`);
* causal alignment: bottom-right for every chapter (`tutorial_kernels.reference`), so when causal and
  n_q > n_k the first n_q − n_k queries see no key and must output zeros;
* runs_triton: a Triton kernel, run through the interpreter on the CPU (which cannot do bfloat16);
  the plain PyTorch reference implementation runs anywhere, in any dtype;
* gpu_only / unavailable: the Gluon kernel needs a CUDA GPU (deselected elsewhere) of compute
  capability 9.x (skipped, with the reason, on another GPU);
* differentiable: gradients through autograd (`test_gradients_match_reference`);
* empty_sequences: n_q or n_k = 0 gives PyTorch's answer (an empty output, or zeros where queries see no
  key) instead of the chapters' ValueError (the front door);
* scale_first: the yardstick of the peers' rule scales q before Q Kᵀ (flash-attn's reference), except for
  chapter 2's eager attention, which computes the textbook (Q Kᵀ)·scale and is measured against the same order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tutorial_kernels.ch02_naive_attention import eager_attention, naive_attention
from tutorial_kernels.ch03_tiling_online_softmax import online_softmax_attention
from tutorial_kernels.ch04_flash_v1 import flash_attn_v1
from tutorial_kernels.ch05_flash_v2 import flash_attn_v2, flash_attn_v2_minimal, flash_attn_v2_tuned
from tutorial_kernels.ch07_hopper import HEAD_DIMS as HOPPER_HEAD_DIMS
from tutorial_kernels.ch07_hopper import flash_attn_hopper
from tutorial_kernels.ch09_variants import flash_attn_variants
from tutorial_kernels.attention import flash_attention as front_door
from tutorial_kernels.ch06_backward import flash_attention
from tutorial_kernels.reference import expand_kv_heads, reference_attention, reference_scores, reference_softmax
from tutorial_kernels.testing import (ALL_KERNEL_DTYPES, HEAD_DIMS, KERNEL_DTYPES, ON_GPU, Case, attention_cases,
                                      torch_attention_same_dtype)

NO_OUT, CONTIGUOUS_OUT, DENSE_OUT = None, "contiguous", "dense"


@dataclass(frozen=True)
class Implementation:
    """One public attention function `fn(q, k, v, causal, sm_scale[, out=])` and what it supports."""

    name: str  # the test ids start with it: `pytest -k flash_attn_v1` runs one implementation
    fn: Callable
    min_head_dim: int = 16
    max_head_dim: int = 128
    head_dims: tuple[int, ...] = HEAD_DIMS  # the head dimensions the shape matrix visits
    only_head_dims: bool = False  # runs these head dimensions only, not every one from min to max
    gqa: bool = False
    dtypes: tuple[torch.dtype, ...] = ALL_KERNEL_DTYPES
    out: str | None = CONTIGUOUS_OUT
    causal_alignment: str = "bottom-right"
    runs_triton: bool = True
    gpu_only: str | None = None  # why it needs a CUDA GPU: its tests are not collected without one
    unavailable: Callable[[], str | None] = lambda: None  # on a GPU: why this one cannot run there
    differentiable: bool = False
    empty_sequences: bool = False  # a sequence of length 0 gives PyTorch's answer, not a ValueError
    # the yardstick's order of operations (`testing.torch_attention_same_dtype`): scale q first, or Q Kᵀ
    scale_first: bool = True
    # shapes, when not `attention_cases(head_dims)` (kernels that run one head_dim, or whose every new
    # shape costs an autotuning pass on the GPU); gradient shapes, when not the same
    cases: Callable[[], list[Case]] | None = None
    grad_cases: Callable[[], list[Case]] | None = None
    layouts: tuple[str, ...] = ("bhnd",)  # of the shape matrix; every implementation also gets (B, N, H, d) views

    def __post_init__(self) -> None:
        assert self.causal_alignment in ("bottom-right", "top-left"), self.causal_alignment
        assert self.out in (NO_OUT, CONTIGUOUS_OUT, DENSE_OUT), self.out

    def __call__(self, q, k, v, causal=False, sm_scale=None, *, out=None):
        return self.fn(q, k, v, causal, sm_scale, **({} if out is None else {"out": out}))

    def __str__(self) -> str:
        return self.name

    def fit(self, head_dim: int) -> int:
        """`head_dim` if this implementation runs it, else the nearest one it does."""
        if self.only_head_dims:
            return min(self.head_dims, key=lambda d: abs(d - head_dim))
        return min(max(head_dim, self.min_head_dim), self.max_head_dim)

    def shape_cases(self) -> list[Case]:
        return self.cases() if self.cases is not None else attention_cases(self.head_dims)

    def gradient_cases(self) -> list[Case]:
        return self.grad_cases() if self.grad_cases is not None else self.shape_cases()

    def dtypes_here(self) -> list[torch.dtype]:
        """The dtypes tested on this machine: all of them for plain PyTorch and for GPU-only kernels
        (whose tests are not collected without a GPU), bfloat16 only on a GPU for Triton kernels."""
        if self.gpu_only or not self.runs_triton:
            return list(self.dtypes)
        return [d for d in self.dtypes if d in KERNEL_DTYPES]

    def reference(self, q, k, v, causal: bool, sm_scale: float | None) -> torch.Tensor:
        """The float64 answer under this implementation's causal alignment."""
        if not causal or self.causal_alignment == "bottom-right":
            return reference_attention(q, k, v, causal, sm_scale)
        n_q, n_k = q.shape[2], k.shape[2]
        top_left = torch.arange(n_k, device=q.device)[None, :] <= torch.arange(n_q, device=q.device)[:, None]
        s = reference_scores(q, k, False, sm_scale).masked_fill(~top_left, float("-inf"))
        return reference_softmax(s) @ expand_kv_heads(v, q.shape[1]).double()

    def baseline(self, q, k, v, causal: bool, sm_scale: float | None) -> torch.Tensor:
        """PyTorch's own attention in the inputs' dtype under this implementation's causal alignment: the
        yardstick of the peers' rule (`testing.torch_attention_same_dtype`; differentiable)."""
        return torch_attention_same_dtype(q, k, v, causal, sm_scale, alignment=self.causal_alignment,
                                          scale_first=self.scale_first)

    def rows_without_keys(self, causal: bool, n_q: int, n_k: int) -> int:
        """How many leading queries see no key (their output rows must be zeros)."""
        return max(n_q - n_k, 0) if causal and self.causal_alignment == "bottom-right" else 0


def _on_hopper() -> str | None:
    if ON_GPU and torch.cuda.get_device_capability()[0] == 9:
        return None
    return "the Gluon kernel needs a GPU of compute capability 9.x (H100/H200)"


# Chapter 5 splits the head dimension into two blocks at 48, 80 and 96 and pads 72 and 160 into one
# (`_head_dim_blocks`); two blocks gave wrong outputs at those two on the H100: they guard that choice.
V2_HEAD_DIMS = (16, 32, 48, 64, 72, 80, 96, 128, 160, 256)
BACKWARD_HEAD_DIMS = (16, 32, 64, 80, 128, 256)
# the minimal kernel pads every head_dim to one power-of-two block: 48, 80 and 160 are padded, 256 is the largest
MINIMAL_HEAD_DIMS = (16, 32, 48, 64, 80, 128, 160, 256)


def _tuned_cases() -> list[Case]:
    """On a GPU every new (length bucket, head_dim, dtype) of a tuned launcher costs an autotuning pass:
    a few shapes there (`ch05`'s `test_every_tuning_config` checks each configuration it may pick).
    On the CPU the tuned launcher runs the interpreter's one tile, through its own launch path."""
    if ON_GPU:
        return [Case(2, 3, 17, 17, 128), Case(2, 4, 100, 1000, 80), Case(1, 2, 300, 300, 256)]
    return [Case(2, 1, 1, 1, 64), Case(1, 2, 100, 17, 48), Case(1, 2, 70, 45, 80), Case(1, 1, 33, 70, 72),
            Case(2, 1, 40, 130, 256)]


def _tuned_backward_cases() -> list[Case]:
    if ON_GPU:
        return [Case(2, 3, 300, 500, 64), Case(1, 4, 1000, 1000, 128), Case(1, 2, 257, 130, 80)]
    return [Case(1, 2, 17, 100, 64), Case(2, 1, 70, 33, 80)]


def _backward_cases() -> list[Case]:
    """Gradient shapes: odd lengths 1, 17, 100 at d = 64, every head_dim (256 too) at n = 40, n_q ≠ n_k
    both ways over several tiles; on the GPU longer ones and every head_dim at 257."""
    cases = [
        Case(2, 2, 1, 1, 64), Case(2, 3, 17, 17, 64), Case(1, 2, 100, 100, 64),
        *[Case(1, 2, 40, 40, d) for d in BACKWARD_HEAD_DIMS if d != 64],
        Case(2, 2, 17, 100, 64), Case(1, 2, 100, 17, 32), Case(1, 2, 1, 70, 80),
    ]
    if not ON_GPU:  # several of the interpreter's 32-wide tiles, the last one ragged by one row
        return cases + [Case(1, 2, 129, 65, 32), Case(1, 2, 65, 129, 16)]
    return cases + [Case(1, 2, 257, 130, 32), Case(1, 2, 130, 257, 16)] + [
        Case(2, 3, 257, 257, d) for d in (16, 64, 80, 128, 256)] + [
        Case(2, 4, 1000, 1000, 64), Case(1, 4, 1024, 3000, 128), Case(1, 4, 3000, 1024, 80)]


def _hopper_cases() -> list[Case]:
    """N = 1, N not a multiple of the 128-row or the key tiles, n_q ≠ n_k both ways, grouped-query and
    multi-query attention; one 1000-long problem. All of them at head_dim 128, the ragged ones at 64
    and 256 (other key tiles, other rings)."""
    d = 128
    return [Case(1, 2, 1, 1, d), Case(2, 3, 17, 17, d), Case(1, 4, 100, 100, d, kv_heads=2),
            Case(2, 4, 257, 257, d, kv_heads=1), Case(1, 2, 128, 128, d), Case(1, 8, 384, 384, d, kv_heads=2),
            Case(1, 2, 100, 357, d, kv_heads=1), Case(1, 2, 300, 130, d), Case(1, 2, 1, 700, d),
            Case(1, 4, 1000, 1000, d)] + [
        case for d in HOPPER_HEAD_DIMS if d != 128
        for case in (Case(1, 2, 1, 1, d), Case(2, 4, 257, 257, d, kv_heads=1), Case(1, 2, 100, 357, d, kv_heads=1),
                     Case(1, 2, 300, 130, d), Case(1, 4, 1000, 1000, d))]


IMPLEMENTATIONS = [
    # chapter 2: plain PyTorch (runs on any device, in any dtype); no out=
    Implementation("eager_attention", eager_attention, max_head_dim=256, out=NO_OUT, runs_triton=False,
                   scale_first=False),
    # chapter 2: three Triton kernels, S and P in HBM
    Implementation("naive_attention", naive_attention),
    # chapter 3: one query block attends to all keys with the online softmax
    Implementation("online_softmax_attention", online_softmax_attention),
    # chapter 4: FlashAttention-1's schedule (K/V outer, Q inner)
    Implementation("flash_attn_v1", flash_attn_v1),
    # chapter 5: FlashAttention-2, the minimal kernel (one loop, every tile masked, d padded to a power of two)
    Implementation("flash_attn_v2_minimal", flash_attn_v2_minimal, max_head_dim=256,
                   head_dims=MINIMAL_HEAD_DIMS, gqa=True, out=DENSE_OUT),
    # chapter 5: the same algorithm with the extras, the teaching configuration and the autotuned launch
    Implementation("flash_attn_v2", flash_attn_v2, max_head_dim=256, head_dims=V2_HEAD_DIMS, gqa=True,
                   out=DENSE_OUT),
    Implementation("flash_attn_v2_tuned", flash_attn_v2_tuned, max_head_dim=256, head_dims=V2_HEAD_DIMS,
                   gqa=True, out=DENSE_OUT, cases=_tuned_cases),
    # chapter 7: FA3's schedule in Gluon; float16/bfloat16, head_dim 64, 128 or 256, compute capability 9.x
    Implementation("flash_attn_hopper", flash_attn_hopper, min_head_dim=min(HOPPER_HEAD_DIMS),
                   max_head_dim=max(HOPPER_HEAD_DIMS), head_dims=HOPPER_HEAD_DIMS, only_head_dims=True, gqa=True,
                   dtypes=(torch.float16, torch.bfloat16), out=DENSE_OUT, runs_triton=False,
                   gpu_only="the Gluon kernel", unavailable=_on_hopper, cases=_hopper_cases,
                   layouts=("bhnd", "bnhd")),
    # chapter 6: differentiable (chapter 5's forward with the log-sum-exp, chapter 6's backward); no out=.
    # The teaching configurations everywhere, and the autotuned call on a few shapes.
    Implementation("flash_attention_teaching", flash_attention, max_head_dim=256,
                   head_dims=BACKWARD_HEAD_DIMS, gqa=True, out=NO_OUT, differentiable=True,
                   grad_cases=_backward_cases),
    Implementation("flash_attention_tuned", functools.partial(flash_attention, tuned=True), max_head_dim=256,
                   head_dims=BACKWARD_HEAD_DIMS, gqa=True, out=NO_OUT, differentiable=True, cases=_tuned_cases,
                   grad_cases=_tuned_backward_cases),
    # chapter 9: the variants' kernels with no variant asked for, forward and backward (the variants
    # themselves: tests/test_ch09_variants.py); no out=
    Implementation("flash_attn_variants", flash_attn_variants, max_head_dim=256, head_dims=(16, 59, 80, 256),
                   gqa=True, out=NO_OUT, differentiable=True, empty_sequences=True, grad_cases=_backward_cases),
    # the front door (tutorial_kernels.flash_attention): whichever kernel it picks, forward and backward
    Implementation("front_door", front_door, max_head_dim=256, head_dims=BACKWARD_HEAD_DIMS, gqa=True,
                   out=DENSE_OUT, differentiable=True, empty_sequences=True, cases=_tuned_cases,
                   grad_cases=_tuned_backward_cases, layouts=("bhnd", "bnhd")),
]

__all__ = ["IMPLEMENTATIONS", "Implementation", "NO_OUT", "CONTIGUOUS_OUT", "DENSE_OUT"]
