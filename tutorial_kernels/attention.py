"""The front door: one attention call that picks the fastest kernel that is correct for its inputs.

    from tutorial_kernels import flash_attention, scaled_dot_product_attention
    o = flash_attention(q, k, v, causal=True)                      # (B, H, n_q, d), differentiable
    o = scaled_dot_product_attention(q, k, v, is_causal=True)      # torch's semantics and arguments

Which kernel runs (`dispatch.kernel_for`, `dispatch.backward_kernel_for`; `dispatch.explain` says why, and
`dispatch.attention_kernels` pins or excludes kernels for the calls in a block):

* the forward: on a Hopper GPU where chapter 7's kernel applies and is the faster
  (`dispatch.hopper_forward_preferred`), FlashAttention-3's schedule in Gluon; elsewhere on a GPU,
  chapter 5's autotuned Triton kernel; on the CPU, its teaching configuration in Triton's interpreter.
  With gradients needed (autograd is recording and an input requires grad) the same kernels also
  write each row's log-sum-exp;
* the backward: on a Hopper GPU where chapter 7's backward applies and is the faster
  (`dispatch.hopper_backward_preferred`), its Gluon kernel, unless
  `torch.use_deterministic_algorithms(True)` asks for reproducible gradients (its dQ is summed with
  atomic additions); elsewhere chapter 6's kernels, autotuned on a GPU;
* a call with a sliding window alone, where chapter 7's forward would run the call without it:
  chapter 7's kernels with the window's bounds (the key tiles outside it never loaded), the
  backward as above, chapter 9's where the Hopper backward does not run;
* a call with a softcap, ALiBi slopes, a hook (score_mod, mask_mod), the SDPA call's attn_mask, other
  windows, and `flash_attention_varlen`'s packed batches: chapter 9's kernels, forward and backward
  (one readable configuration, not tuned); every call with a variant runs eagerly (under
  torch.compile the graph breaks around it).

Both calls are `torch.library` custom operators (`tutorial_kernels::attention_into`, `::attention_fwd`,
`::attention_bwd`) with fake implementations for shapes and an autograd formula, so that
`torch.compile` traces straight through them (no graph break) and `torch.export` can carry them.
Called eagerly, the front door runs the operators' bodies without their dispatch (training through an
autograd.Function): cheaper per call, and no import of torch's compiler at the first call.

Conventions. `flash_attention` aligns the causal mask to the bottom-right corner (query i of n_q
sees keys j ≤ i + n_k − n_q, what a key/value cache needs), like every chapter.
`scaled_dot_product_attention` follows `torch.nn.functional.scaled_dot_product_attention`:
top-left alignment, so it refuses `is_causal=True` with n_q ≠ n_k instead of computing the other
alignment; it computes `attn_mask` (chapter 9's kernels) and refuses what these kernels do not compute
(dropout) with a ValueError.
As in PyTorch, a call with `out=` does not support autograd.
"""

from __future__ import annotations

import contextlib
import math

import torch

from tutorial_kernels import ch05_flash_v2, ch07_hopper, ch07_hopper_backward
from tutorial_kernels.dispatch import (NoAllowedKernel, allowed_kernels, backward_kernel_for, kernel_for, pinned,
                                       pins_as_text, pins_from_text)
from tutorial_kernels.ch05_flash_v2 import flash_attn_v2, flash_attn_v2_tuned, flash_attn_v2_with_lse
from tutorial_kernels.ch06_backward import compile_backward_ahead, flash_attn_backward
from tutorial_kernels.ch08_decode import check_kvcache_inputs, kvcache_call_key, relaunch_kvcache, run_kvcache
from tutorial_kernels.ch09_variants import flash_attn_variants, flash_attn_variants_backward, flash_attn_varlen
from tutorial_kernels.ch07_hopper import flash_attn_hopper, flash_attn_hopper_with_lse
from tutorial_kernels.perf.launch_plan import attention_call_key
from tutorial_kernels.validation import check_attention_inputs, check_out, check_window_size, validated_call

MAX_HEAD_DIM = 256
# CUDA runs at most 65535 programs along a grid's y axis, where every kernel here puts batch × heads:
# a call with more runs as several calls on slices of the batch (and of the heads, whole groups each)
MAX_GRID_Y = 65535
MAX_DECISIONS = 4096  # remembered calls (`flash_attention`); forgotten all at once beyond this
_DECISIONS: dict = {}  # attention_call_key(...) → (kernel, scale, its relaunch, the kernel's own launch key or None)
# per forward kernel that remembers its launches: (its launch key for a call, the relaunch under that key)
_RELAUNCHES = {"hopper": (ch07_hopper.remembered_key, ch07_hopper.relaunch_remembered),
               "triton-tuned": (ch05_flash_v2.remembered_key, ch05_flash_v2.relaunch_remembered)}


# --8<-- [start:custom_ops]
def _launch(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool,
            sm_scale: float) -> None:
    if kernel == "none":
        out.zero_()  # no key: every query's output is 0, as in PyTorch (and nothing to write without a query)
    elif kernel == "hopper":
        flash_attn_hopper(q, k, v, causal, sm_scale, out=out)  # Hopper, FA3's schedule (chapter 7)
    elif kernel == "triton-tuned":
        flash_attn_v2_tuned(q, k, v, causal, sm_scale, out=out)  # autotuned per shape bucket (chapter 5)
    else:
        flash_attn_v2(q, k, v, causal, sm_scale, out=out)  # the interpreter: one small configuration


def _run_into(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool,
              sm_scale: float) -> None:
    """Inference: O = softmax(sm_scale · Q Kᵀ) V written into `out` (B, H, n_q, d), any dense layout."""
    _launch(kernel_for(q, k, v, causal, out=out), q, k, v, out, causal, sm_scale)


# The same bodies as operators torch.compile can trace. Eager calls skip the operators: their dispatch
# costs tens of microseconds of CPU time per call, more than the launch it wraps at short lengths.
# An operator takes the pins of the block it was traced in (`pins_as_text`) as an argument: a compiled
# graph runs, and its backward runs, long after that block has ended.
def _pinned_run_into(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool,
                     sm_scale: float, pins: str) -> None:
    with pinned(pins_from_text(pins)):
        _run_into(q, k, v, out, causal, sm_scale)


_attention_into = torch.library.custom_op("tutorial_kernels::attention_into", _pinned_run_into, mutates_args=("out",))


@_attention_into.register_fake
def _(q, k, v, out, causal, sm_scale, pins):
    return None


def _train_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Training forward: (O (B, H, n_q, d), lse (B, H, n_q) float32, log Σ_j e^{S_ij})."""
    kernel = kernel_for(q, k, v, causal)
    if kernel == "none":
        return q.new_zeros(q.shape), q.new_full(q.shape[:3], -math.inf, dtype=torch.float32)
    if backward_kernel_for(q, k, v, q, causal) == "triton-tuned":  # dO will be dense, of q's shape and dtype
        compile_backward_ahead(q, k, v, causal, sm_scale)  # a new shape's backward compiles during the forward
    if kernel == "hopper":
        return flash_attn_hopper_with_lse(q, k, v, causal, sm_scale)
    return flash_attn_v2_with_lse(q, k, v, causal, sm_scale, tuned=q.is_cuda)


def _pinned_train_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
                          pins: str) -> tuple[torch.Tensor, torch.Tensor]:
    with pinned(pins_from_text(pins)):
        return _train_forward(q, k, v, causal, sm_scale)


_attention_fwd = torch.library.custom_op("tutorial_kernels::attention_fwd", _pinned_train_forward, mutates_args=())


@_attention_fwd.register_fake
def _(q, k, v, causal, sm_scale, pins):
    batch, heads, n_q, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, heads, n_q), dtype=torch.float32)


def _train_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, causal: bool, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) from dO and the forward's O and log-sum-exp (`backward_kernel_for` says whose)."""
    # dO arrives with whatever strides autograd built (stride 0 after .sum()): a dense copy reads faster
    do = do.contiguous()
    kernel = backward_kernel_for(q, k, v, do, causal)
    if kernel == "none":  # O does not depend on q, k or v
        return q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    if kernel == "hopper":
        return ch07_hopper_backward.flash_attn_hopper_backward(q, k, v, o, lse, do, causal, sm_scale)
    return flash_attn_backward(q, k, v, o, lse, do, causal, sm_scale, tuned=q.is_cuda)


def _pinned_train_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                           lse: torch.Tensor, causal: bool, sm_scale: float,
                           pins: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with pinned(pins_from_text(pins)):
        return _train_backward(do, q, k, v, o, lse, causal, sm_scale)


_attention_bwd = torch.library.custom_op("tutorial_kernels::attention_bwd", _pinned_train_backward, mutates_args=())


@_attention_bwd.register_fake
def _(do, q, k, v, o, lse, causal, sm_scale, pins):
    # every backward returns new contiguous gradients, whatever the strides of q, k and v (a model's
    # (B, N, H, d) projections seen as (B, H, N, d)): the fake must say the same, or torch.compile's
    # checks fail on the real strides
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, sm_scale, pins = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)  # O(N·d) numbers: never the n_q × n_k matrix P
    ctx.causal, ctx.sm_scale, ctx.pins = causal, sm_scale, pins  # the backward keeps the forward's pins


def _backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_bwd(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale, ctx.pins)
    return dq, dk, dv, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """Eager training: the operators' bodies under autograd, without the operators. An operator's
    first call imports torch's compiler (seconds, once per process); an autograd.Function does not."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        o, lse = _train_forward(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.allowed = causal, sm_scale, allowed_kernels()
        ctx.mark_non_differentiable(lse)  # returned for return_lse; no gradient flows through it
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        with pinned(ctx.allowed):  # the forward's pins, wherever the backward runs
            return *_train_backward(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale), None, None


def _pins_here() -> str:
    """The enclosing block's pins as the operators' argument; traced, a constant of the graph (torch.compile
    cannot read a context variable, and a graph keeps the pins it was traced under)."""
    return pins_as_text(allowed_kernels())


# what torch.compiler.assume_constant_result sets, without importing torch's compiler into eager processes
# (a test compiles under pins and fails should the mark stop working)
_pins_here._dynamo_marked_constant = True


def _traced(q: torch.Tensor) -> bool:
    """Whether this call is seen by more than eager execution — torch.compile or torch.export, a
    dispatch mode (FakeTensorMode, make_fx), functorch's transforms, a tensor subclass: there the
    operators, with their fake implementations, stand for the kernels."""
    return (torch.compiler.is_compiling() or type(q) is not torch.Tensor
            or torch._C._len_torch_dispatch_stack() > 0 or torch._C._are_functorch_transforms_active())
# --8<-- [end:custom_ops]


# --8<-- [start:flash_attention]
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None, *, out: torch.Tensor | None = None,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None, return_lse: bool = False, score_mod=None,
                    score_mod_grad=None, mask_mod=None):
    """softmax(sm_scale · Q Kᵀ) V through the fastest kernel of this tutorial that is correct for the
    inputs, forward and backward (see the module docstring).

    q: (B, H, n_q, d); k, v: (B, H_kv, n_k, d) with H_kv dividing H (grouped-query attention);
    16 ≤ d ≤ 256; any strides; float16, bfloat16 or float32, all three alike; on a CUDA GPU or the CPU.
    B, n_q and n_k may be 0: PyTorch's answer, an empty output, or zeros for queries without keys.
    causal: the mask aligned to the bottom-right corner. sm_scale: default 1/√d.
    out: a (B, H, n_q, d) tensor to write into (any dense layout); not with autograd, as in PyTorch.
    window_size, softcap, alibi_slopes: chapter 9's variants, flash-attn's arguments (a sliding window
    (left, right) around the bottom-right diagonal, −1 for no bound; c · tanh(S / c); ALiBi's per-head
    slopes, float32 (H,) or (B, H)); a call with any of them runs chapter 9's kernels (a window alone, on
    Hopper, chapter 7's where they would run the plain call), not with `out`.
    return_lse: also return each row's log Σ_j e^{S_ij}, (B, H, n_q) float32 (−∞ for a query that sees no
    key), flash-attn's `softmax_lse`; no gradient flows through it.
    score_mod, score_mod_grad, mask_mod: FlexAttention's hooks as @triton.jit functions (chapter 9,
    `ch09_variants.flash_attn_variants` states them); a call with one runs chapter 9's kernels.
    Raises TypeError / ValueError naming the argument for inputs outside this contract.
    """
    hooks = dict(score_mod=score_mod, score_mod_grad=score_mod_grad, mask_mod=mask_mod)
    if (window_size != (-1, -1) or softcap != 0.0 or alibi_slopes is not None
            or any(fn is not None for fn in hooks.values())):
        return _with_variants(q, k, v, causal, sm_scale, out, window_size, softcap, alibi_slopes, return_lse, hooks)
    if return_lse:
        return _with_lse(q, k, v, causal, sm_scale, out)
    training = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    if _traced(q):  # traced once: the operators go into the graph
        scale = _checked_scale(q, k, v, causal, sm_scale, out, training)
        if q.shape[0] * q.shape[1] > MAX_GRID_Y:
            return _in_slices(q, k, v, causal, scale, out)
        if training:
            return _attention_fwd(q, k, v, bool(causal), scale, _pins_here())[0]
        out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
        _attention_into(q, k, v, out, bool(causal), scale, _pins_here())
        return out
    # Eagerly, a call like an earlier one (shapes, strides, dtypes, flags) passed the same checks and
    # picks the same kernel: remembered, so that a model's layers pay for neither again.
    key = attention_call_key(q, k, v, out, causal, sm_scale, training)
    pins = allowed_kernels()
    if key is not None and pins is not None:
        key = (key, pins)  # a decision holds only under the pins it was made under
    decision = _DECISIONS.get(key) if key is not None else None
    checked = contextlib.nullcontext()  # the chapters' launchers check their inputs; once is enough
    if decision is None:
        shape = _checked_shape(q, k, v, causal, sm_scale, out, training)
        scale = float(shape.sm_scale)
        if q.shape[0] * q.shape[1] > MAX_GRID_Y:  # not remembered: each slice's call is
            return _in_slices(q, k, v, causal, scale, out)
        decision = ("train" if training else kernel_for(q, k, v, causal, out=out), scale, None, None)
        if key is not None:
            if len(_DECISIONS) >= MAX_DECISIONS:
                _DECISIONS.clear()
            _DECISIONS[key] = decision
        checked = validated_call(shape, q, k, v, bool(causal))
    kernel, scale, relaunch, plan = decision
    if kernel == "train":
        with checked:
            return _EagerAttention.apply(q, k, v, causal, scale)[0]
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if plan is not None and relaunch(plan, q, k, v, out):
        return out  # the kernel's launch, remembered under its own key, which this call's key implies
    with checked:
        _launch(kernel, q, k, v, out, causal, scale)  # the operator's body, without its dispatch
    # Equal front-door keys mean equal kernel keys (a kernel key that depends on anything else, such as
    # float32's matmul precision, is None): compute it once
    if kernel in _RELAUNCHES and key is not None:
        remembered_key, relaunch = _RELAUNCHES[kernel]
        _DECISIONS[key] = (kernel, scale, relaunch, remembered_key(q, k, v, out, causal, scale))
    return out


def _with_lse(q, k, v, causal, sm_scale, out) -> tuple[torch.Tensor, torch.Tensor]:
    """`flash_attention(..., return_lse=True)` without variants: the training forward, which writes the
    log-sum-exp, under autograd where gradients are needed (through the operator when traced)."""
    training = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    scale = _checked_scale(q, k, v, causal, sm_scale, out, training)
    if q.shape[0] * q.shape[1] > MAX_GRID_Y:
        raise ValueError(f"return_lse: batch × heads above {MAX_GRID_Y} runs in slices, which return no "
                         f"log-sum-exp; got q {tuple(q.shape)}")
    if _traced(q):
        o, lse = _attention_fwd(q, k, v, bool(causal), scale, _pins_here())
    elif training:
        o, lse = _EagerAttention.apply(q, k, v, bool(causal), scale)
    else:
        o, lse = _train_forward(q, k, v, bool(causal), scale)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


def _with_variants(q, k, v, causal, sm_scale, out, window_size, softcap, alibi_slopes, return_lse=False,
                   hooks=None):
    """Chapter 9's kernels, for a call with a window, a softcap, ALiBi slopes or hooks. They launch
    eagerly: under torch.compile the call is a graph break (`_eagerly`)."""
    hooks = hooks or {}
    if torch.compiler.is_compiling():
        return _eagerly(_with_variants)(q, k, v, causal, sm_scale, out, window_size, softcap, alibi_slopes,
                                        return_lse, hooks)
    if out is not None:
        raise ValueError("out: a call with window_size, softcap, alibi_slopes or a hook returns a new tensor; pass "
                         "out=None")
    if softcap == 0.0 and alibi_slopes is None and not any(hooks.values()):
        # a window alone: on Hopper, chapter 7's kernels take it
        training = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
        scale = _checked_scale(q, k, v, causal, sm_scale, None, training)
        window_size = check_window_size(window_size)
        if q.shape[0] * q.shape[1] <= MAX_GRID_Y and kernel_for(q, k, v, causal) == "hopper":
            o, lse = _HopperWindow.apply(q, k, v, bool(causal), scale, window_size)
            return (o, lse) if return_lse else o
    return flash_attn_variants(q, k, v, causal, sm_scale, window_size=window_size, softcap=softcap,
                               alibi_slopes=alibi_slopes, return_lse=return_lse, **hooks)


class _HopperWindow(torch.autograd.Function):
    """A sliding window through chapter 7's Hopper kernels: the forward always; the backward where
    `backward_kernel_for` picks the Hopper backward (under the forward's pins), else chapter 9's kernels
    from the same O and log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, window_size):
        o, lse = flash_attn_hopper_with_lse(q, k, v, causal, sm_scale, window_size=window_size)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.window_size, ctx.allowed = causal, sm_scale, window_size, allowed_kernels()
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        do = do.contiguous()
        try:
            with pinned(ctx.allowed):
                kernel = backward_kernel_for(q, k, v, do, ctx.causal)
        except NoAllowedKernel:  # pins that allow no plain backward here: chapter 9's runs windows whatever the pins
            kernel = "variants"
        if kernel == "hopper":
            grads = ch07_hopper_backward.flash_attn_hopper_backward(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale,
                                                                    window_size=ctx.window_size)
        else:
            grads = flash_attn_variants_backward(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale,
                                                 window_size=ctx.window_size)
        return *grads, None, None, None


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           sm_scale: float | None = None, *, window_size: tuple[int, int] = (-1, -1),
                           softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None, return_lse: bool = False):
    """Attention over a packed batch of sequences of different lengths, flash-attn's
    `flash_attn_varlen_func` (chapter 9): q (total_q, H, d), k and v (total_k, H_kv, d), cu_seqlens_*
    int32 (B + 1,) marking where each sequence starts, max_seqlen_* the longest; the variants as
    `flash_attention`. Differentiable; no padding is computed. Returns O (total_q, H, d) (and the
    log-sum-exp (H, total_q) with return_lse). Raises ValueError naming the argument."""
    call = _eagerly(flash_attn_varlen) if torch.compiler.is_compiling() else flash_attn_varlen
    return call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale,
                window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, return_lse=return_lse)


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                            sm_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The front door's training forward without autograd: (O (B, H, n_q, d), lse (B, H, n_q) float32,
    log Σ_j e^{S_ij}, −∞ for a query that sees no key), for callers that combine partial results by
    their log-sum-exp (chapter 10's ring) and run `flash_attention_backward` themselves. Inputs as
    `flash_attention`'s (without the variants); raises TypeError / ValueError naming the argument."""
    scale = _checked_scale(q, k, v, causal, sm_scale, None, training=False)
    return _train_forward(q, k, v, bool(causal), scale)


def flash_attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                             lse: torch.Tensor, causal: bool = False,
                             sm_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of O = softmax(sm_scale · Q Kᵀ) V for the rows' given O and log-sum-exp — which may
    be those of a larger problem that this (q, k, v) is one block of: then dQ is this block's share and
    Δ = rowsum(dO ∘ O) the whole row's, as the ring's backward needs. dO, O: q's shape; lse: (B, H, n_q)
    float32. dK, dV have k's shape (summed over each group of query heads). Raises ValueError naming the
    argument."""
    scale = _checked_scale(q, k, v, causal, sm_scale, None, training=False)
    for name, t, shape in (("do", do, q.shape), ("o", o, q.shape), ("lse", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor) or t.shape != shape:
            raise ValueError(f"{name} must be a tensor of shape {tuple(shape)}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if do.dtype != q.dtype or o.dtype != q.dtype or lse.dtype != torch.float32:
        raise ValueError(f"do and o must have q's dtype {q.dtype} and lse float32, got {do.dtype}, {o.dtype}, "
                         f"{lse.dtype}")
    return _train_backward(do, q, k, v, o, lse, bool(causal), scale)


def _eagerly(fn):
    """`fn` as torch.compile runs it: outside the graph (torch.compiler.disable, made when first
    compiled: the decorator imports torch's compiler, seconds that an eager process need not pay)."""
    return torch.compiler.disable(fn)


def _in_slices(q, k, v, causal: bool, sm_scale: float, out) -> torch.Tensor:
    """`flash_attention` on (validated) inputs whose batch × heads exceeds MAX_GRID_Y: the same call on
    slices of the batch, and of the heads (in whole groups of query heads sharing a key/value head)
    where the heads alone exceed it, each within the limit; the slices' outputs joined."""
    batch, heads = q.shape[:2]
    group = heads // k.shape[1]
    heads_per = min(heads, MAX_GRID_Y // group * group)
    if heads_per == 0:
        raise ValueError(f"q: {group} query heads per key/value head is more than one launch runs "
                         f"({MAX_GRID_Y}), got q {tuple(q.shape)}, k {tuple(k.shape)}")
    batch_per = max(1, MAX_GRID_Y // heads_per)
    rows = []
    for b in range(0, batch, batch_per):
        bs = slice(b, b + batch_per)
        parts = [flash_attention(q[bs, h:h + heads_per], k[bs, h // group:(h + heads_per) // group],
                                 v[bs, h // group:(h + heads_per) // group], causal, sm_scale,
                                 out=None if out is None else out[bs, h:h + heads_per])
                 for h in range(0, heads, heads_per)]
        rows.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))
    return out if out is not None else torch.cat(rows, dim=0)


def _checked_scale(q, k, v, causal, sm_scale, out, training: bool) -> float:
    """The full checks of a call (raising TypeError / ValueError naming the argument); its scale."""
    return float(_checked_shape(q, k, v, causal, sm_scale, out, training).sm_scale)


def _checked_shape(q, k, v, causal, sm_scale, out, training: bool):
    """`_checked_scale`'s checks; the call's sizes (`validation.AttentionShape`)."""
    shape = check_attention_inputs(q, k, v, causal, sm_scale, max_head_dim=MAX_HEAD_DIM, allow_gqa=True,
                                   allow_empty=True)
    if out is not None:
        if training:
            raise RuntimeError("flash_attention(): functions with out=... arguments don't support automatic "
                               "differentiation, but one of the arguments (q, k, v) requires grad; call it "
                               "without out= to train")
        check_out(out, "out", tuple(q.shape), q, any_dense_layout=True)
    return shape
# --8<-- [end:flash_attention]


# --8<-- [start:sdpa]
def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """`torch.nn.functional.scaled_dot_product_attention`'s call and semantics, through `flash_attention`.

    query (..., H, L, E), key and value (..., H_kv, S, E) with the same leading dimensions; H_kv = H
    unless enable_gqa=True (then H_kv divides H). is_causal aligns the mask to the top-left corner,
    as PyTorch does, which is the bottom-right alignment when L == S; L ≠ S with is_causal raises.
    attn_mask: boolean (False hides a pair) or float (added to the scores; bool, float32 or the query's
    dtype), broadcastable to (..., L, S), no gradient; with is_causal both apply, as PyTorch computes
    them. A query the mask leaves no key gets 0, as PyTorch's. A call with a mask runs chapter 9's
    kernels, which skip the tiles it hides whole. Raises ValueError for dropout and for a value head
    size other than E: these kernels compute neither, and a wrong answer is worse than an error.
    Differentiable in query, key and value.
    """
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: this kernel has no attention dropout, got dropout_p={dropout_p}; pass 0.0 "
                         "(e.g. dropout_p=self.dropout if self.training else 0.0)")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 3:
            raise ValueError(f"{name} must have at least 3 dimensions (..., L or S, E), got shape {tuple(t.shape)}")
    lead = [t.shape[:-2] if t.dim() == 3 else t.shape[:-3] for t in (query, key, value)]
    if not (query.dim() == key.dim() == value.dim()) or not (lead[0] == lead[1] == lead[2]):
        raise ValueError(f"query, key and value must have the same leading (batch) dimensions, got shapes "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if value.shape[-1] != query.shape[-1]:
        raise ValueError(f"value: this kernel needs value's head size equal to query's ({query.shape[-1]}), "
                         f"got {value.shape[-1]}")
    n_q, n_k = query.shape[-2], key.shape[-2]
    if is_causal and n_q != n_k:
        raise ValueError(f"is_causal: PyTorch aligns the causal mask to the top-left corner, which this kernel "
                         f"computes only when L == S, got L={n_q}, S={n_k}; for the bottom-right alignment a "
                         f"key/value cache needs, call tutorial_kernels.flash_attention(q, k, v, causal=True)")
    if query.dim() == 3:  # (N, L, E): one head
        q, k, v = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    else:  # (..., H, L, E): the leading dimensions as one batch
        # (the batch's size written out: -1 cannot be inferred for a tensor with no elements)
        q, k, v = (t.reshape(math.prod(t.shape[:-3]), *t.shape[-3:]) for t in (query, key, value))
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise ValueError(f"key: {k.shape[1]} key/value heads for {q.shape[1]} query heads needs enable_gqa=True, "
                         "as in PyTorch")
    if attn_mask is None:
        o = flash_attention(q, k, v, bool(is_causal), scale)
    else:  # the mask as (B, H, L, S), broadcast dimensions kept as stride 0 where the leading ones are one
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
        try:
            mask = attn_mask.expand(*query.shape[:-1], key.shape[-2])
        except RuntimeError:
            raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the attention's "
                             f"{(*query.shape[:-1], key.shape[-2])}") from None
        mask = mask.unsqueeze(1) if query.dim() == 3 else mask.reshape(q.shape[0], *mask.shape[-3:])
        call = _eagerly(flash_attn_variants) if torch.compiler.is_compiling() else flash_attn_variants
        o = call(q, k, v, bool(is_causal), scale, attn_mask=mask)
    return o.squeeze(1) if query.dim() == 3 else o.reshape(query.shape)
# --8<-- [end:sdpa]


@torch.library.custom_op("tutorial_kernels::attention_kvcache", mutates_args=("k_cache", "v_cache"))
def _attention_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None,
                       v: torch.Tensor | None, cache_seqlens: torch.Tensor, block_table: torch.Tensor | None,
                       causal: bool, sm_scale: float, num_splits: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 8's decode attention as an operator torch.compile can trace: (O, lse); k and v appended
    to the cache in place."""
    return run_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, sm_scale, num_splits)


@_attention_kvcache.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, sm_scale, num_splits):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


def flash_attention_with_kvcache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None = None,
    v: torch.Tensor | None = None, *, cache_seqlens: torch.Tensor | int, block_table: torch.Tensor | None = None,
    causal: bool = True, sm_scale: float | None = None, num_splits: int | None = None, return_lse: bool = False,
):
    """New queries against a KV cache, contiguous or paged, after appending k and v to it in place:
    chapter 8's kernels (`ch08_decode.flash_attention_with_kvcache` states the arguments, flash-attn's
    names). Under torch.compile the call is one operator of the graph; eagerly it skips the operator's
    dispatch, as `flash_attention` does, and a call like an earlier one (shapes, strides, dtypes, flags)
    repeats its launches without checks or Triton's dispatch. Returns O (B, H, n_q, d), and with
    return_lse (O, lse)."""
    if torch.compiler.is_compiling():  # traced once: the operator goes into the graph
        cache_seqlens, scale = check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal,
                                                    sm_scale, num_splits)
        out, lse = _attention_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, num_splits)
        return (out, lse) if return_lse else out
    plan = kvcache_call_key(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, sm_scale, num_splits)
    done = relaunch_kvcache(plan, q, k_cache, v_cache, k, v, cache_seqlens, block_table) if plan is not None else None
    if done is not None:
        return done if return_lse else done[0]
    cache_seqlens, scale = check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal,
                                                sm_scale, num_splits)
    out, lse = run_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, num_splits, plan)
    return (out, lse) if return_lse else out


__all__ = ["flash_attention", "scaled_dot_product_attention", "flash_attention_with_kvcache", "flash_attention_varlen",
           "flash_attention_forward", "flash_attention_backward", "kernel_for", "backward_kernel_for", "MAX_HEAD_DIM"]
