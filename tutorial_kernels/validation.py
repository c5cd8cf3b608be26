"""Input checks shared by every chapter's public attention function.

A kernel given a bad pointer or shape does not fail politely: it reads out of bounds, hangs or
returns garbage. So every public entry point first calls `check_attention_inputs`, which either
returns the problem's sizes or raises a `ValueError`/`TypeError` that names the argument, the
value given and what is accepted.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tutorial_kernels.runtime import interpreter_active

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = "torch.float16, torch.bfloat16 or torch.float32"


@dataclass(frozen=True)
class AttentionShape:
    """Sizes of one attention problem: q is (batch, heads, n_q, head_dim), k and v (batch, kv_heads, n_k, head_dim).

    kv_heads equals heads except under grouped-query attention, where each of the kv_heads key/value
    heads serves heads // kv_heads consecutive query heads (kv_heads = 1 is multi-query attention).
    """

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    sm_scale: float
    kv_heads: int = 0

    def __post_init__(self) -> None:
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads


class UnsupportedShape(ValueError):
    """A valid attention problem that this kernel does not handle (e.g. chapter 4 stops at
    head_dim 128): benchmarks record it as "unsupported" instead of failing, while any other
    ValueError stays an error."""


# The call the front door has validated: (q, k, v, causal) by identity, and its sizes (`validated_call`)
_VALIDATED: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("validated_call", default=None)
checks_run = 0  # full validations so far in this process (a test counts them per call)


@contextlib.contextmanager
def validated_call(shape: AttentionShape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   causal: bool) -> Iterator[None]:
    """Within the block, `check_attention_inputs` on these very tensors and flag, with the validated scale,
    returns `shape` without checking again: a caller that validated a call (the front door) runs the
    chapters' launchers, which check their own inputs, without paying for the same checks twice."""
    token = _VALIDATED.set((id(q), id(k), id(v), bool(causal), shape))
    try:
        yield
    finally:
        _VALIDATED.reset(token)


def check_attention_inputs(
    q: object,
    k: object,
    v: object,
    causal: object,
    sm_scale: object,
    *,
    min_head_dim: int = 16,
    max_head_dim: int = 128,
    runs_triton: bool = True,
    allow_gqa: bool = False,
    allow_empty: bool = False,
) -> AttentionShape:
    """Validate the arguments of `fn(q, k, v, causal, sm_scale)` and return the problem's sizes.

    `runs_triton=False` is for plain-PyTorch implementations, which run on any device and dtype.
    `allow_gqa=True` accepts k and v with fewer heads than q, as long as their count divides q's.
    `allow_empty=True` accepts a batch or a sequence length of 0 (the caller answers as PyTorch does).
    Inside `validated_call` for the same tensors and flag, the sizes validated there (when they meet
    these options' limits too).
    """
    if not torch.compiler.is_compiling():  # traced, the checks run once, at trace time (no context to read)
        done = _VALIDATED.get()
        if done is not None and isinstance(causal, bool) and done[:4] == (id(q), id(k), id(v), causal):
            shape = done[4]
            if (sm_scale == shape.sm_scale and min_head_dim <= shape.head_dim <= max_head_dim
                    and (allow_gqa or shape.kv_heads == shape.heads)
                    and (allow_empty or min(shape.batch, shape.n_q, shape.n_k) > 0)):
                return shape
        global checks_run
        checks_run += 1
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (batch, heads, seq, head_dim), got {tensor.dim()} "
                f"with shape {tuple(tensor.shape)}"
            )
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name}.dtype must be {_DTYPE_NAMES}, got {tensor.dtype}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)

    for name, tensor in (("k", k), ("v", v)):
        if tensor.dtype != q.dtype:
            raise TypeError(f"{name}.dtype must equal q.dtype ({q.dtype}), got {tensor.dtype}")
        if tensor.device != q.device:
            raise ValueError(f"{name} must be on q's device ({q.device}), got {tensor.device}")

    batch, heads, n_q, head_dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    kv_heads = k.shape[1]
    if k.shape[0] != batch:
        raise ValueError(f"k must have q's batch ({batch}), got {k.shape[0]}")
    if allow_gqa:
        if kv_heads < 1 or heads % kv_heads != 0:
            raise ValueError(
                f"k's heads ({kv_heads}) must divide q's heads ({heads}): each key/value head serves "
                "an equal group of query heads"
            )
    elif kv_heads != heads:
        raise ValueError(
            f"k must have q's batch and heads ({batch}, {heads}), got ({k.shape[0]}, {kv_heads})"
        )
    if k.shape[3] != head_dim:
        raise ValueError(f"k's head_dim must equal q's ({head_dim}), got {k.shape[3]}")
    n_k = k.shape[2]
    for name, size in (("batch", batch), ("heads", heads), ("q's seq length", n_q), ("k's seq length", n_k)):
        if size < 1 and not (allow_empty and name != "heads"):
            raise ValueError(f"{name} must be at least 1, got {size} (q {tuple(q.shape)}, k {tuple(k.shape)})")
    if not min_head_dim <= head_dim <= max_head_dim:
        raise UnsupportedShape(
            f"head_dim (q.shape[3]) must be between {min_head_dim} and {max_head_dim}, got {head_dim}"
        )

    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    if sm_scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    elif isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a float or None, got {type(sm_scale).__name__} {sm_scale!r}")
    elif not (math.isfinite(sm_scale) and sm_scale > 0):
        raise ValueError(f"sm_scale must be a finite number > 0 or None (1/sqrt(head_dim)), got {sm_scale}")
    else:
        scale = float(sm_scale)

    if runs_triton:
        check_triton_tensor(q, "q, k and v")
    return AttentionShape(batch, heads, n_q, n_k, head_dim, scale, kv_heads)


def check_window_size(window_size) -> tuple[int, int]:
    """A sliding window (left, right) as flash-attn takes it: two ints ≥ −1 (−1: no bound). Returns it
    as a tuple; raises ValueError naming the argument."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(type(w) is int and w >= -1 for w in window_size)):
        raise ValueError(f"window_size must be a pair (left, right) of ints ≥ −1 (−1: no bound), got {window_size!r}")
    return tuple(window_size)


def check_triton_tensor(t: torch.Tensor, name: str) -> None:
    """A Triton kernel can read `t` here: on a CUDA device, or on the CPU with the interpreter on
    (which cannot do bfloat16)."""
    interpreting = interpreter_active()
    if t.device.type == "cpu" and not interpreting:
        raise ValueError(
            f"{name}: on the CPU but Triton's interpreter is off; move the tensors to a CUDA device, "
            "or set TRITON_INTERPRET=1 before importing tutorial_kernels to run on the CPU"
        )
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be on a CUDA device (or the CPU with the interpreter), got {t.device}")
    if interpreting and t.dtype == torch.bfloat16:
        # NumPy has no bfloat16: the interpreter keeps bf16 as raw uint16 bits and its dot products and
        # sums come out wrong without any error (triton-lang/triton#4972). Refuse rather than mislead.
        raise TypeError(
            f"{name}: dtype torch.bfloat16 is not supported under Triton's interpreter, which computes bfloat16 "
            "wrongly without an error; use torch.float16 or torch.float32 on the CPU, or run on a GPU"
        )


def check_out(
    out: object, name: str, shape: tuple[int, ...], like: torch.Tensor, *, any_dense_layout: bool = False,
) -> torch.Tensor:
    """Validate a caller-supplied output buffer: right type, shape, dtype and device, and contiguous, or
    with `any_dense_layout` (for kernels that write through the buffer's strides) any permutation of a
    contiguous layout: every element at its own address, so no two programs write to the same one."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != like.dtype:
        raise TypeError(f"{name}.dtype must be {like.dtype}, got {out.dtype}")
    if out.device != like.device:
        raise ValueError(f"{name} must be on {like.device}, got {out.device}")
    if any_dense_layout:
        if not _is_dense(out):
            raise ValueError(f"{name} must be contiguous or a permuted view of a contiguous tensor (every element "
                             f"at its own address, no gaps), got shape {tuple(out.shape)} with strides {out.stride()}")
    elif not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {out.stride()}")
    return out


def _is_dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill one block of memory with no gaps and no overlaps, in some order of
    its dimensions: the strides, smallest first, are 1 and each the product of the sizes before."""
    expected = 1
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if stride != expected:
            return False
        expected *= size
    return True
