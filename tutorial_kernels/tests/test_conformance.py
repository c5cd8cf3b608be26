"""One correctness matrix for every attention implementation (`implementations.IMPLEMENTATIONS`).

Each implementation gets every case it supports, against the float64 reference, with fresh random
inputs (never zeros; the seed is in every failure message), under the peers' rule (flash-attn's): the
largest elementwise error at most 2× (outputs) or 3× (gradients) that of PyTorch's own attention in the
same dtype, plus 1e-5 (`testing.assert_within_peer_rule`, `Implementation.baseline`):

* forward: the shapes of `testing.attention_cases()` (odd N with N = 1, head_dim 80, n_q ≠ n_k both
  ways), causal and not — causal with n_q > n_k leaves queries that see no key, whose rows must be
  exact zeros —, every dtype it runs here, a NaN-poisoned `out=` that must come back fully written
  (in the model's (B, N, H, d) layout where the implementation writes any dense layout), (B, N, H, d)
  views as inputs with a custom sm_scale, and grouped-/multi-query attention where supported;
* gradients, for the differentiable ones: dQ, dK and dV against float64 autograd, on the same kinds
  of cases, PyTorch's gradients (autograd in the same dtype) the yardstick;
* bad input: a ValueError or TypeError whose message names the argument.


The chapter test files keep what is particular to each chapter (statistics, schedules, tile knobs,
kernel-specific edge cases). On the CPU (Triton's interpreter) the shapes are small and bfloat16 is
not generated; a GPU runs the larger matrix.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

from tutorial_kernels.runtime import INTERPRET_VARIABLE, default_device
from tutorial_kernels.testing import (ON_GPU, PEER_GRAD_FACTOR, PEER_OUTPUT_FACTOR, Case,
                                      assert_within_peer_rule, outputs_and_gradients, poisoned, random_qkv)
from tutorial_kernels.tests.implementations import CONTIGUOUS_OUT, DENSE_OUT, IMPLEMENTATIONS, Implementation
from tutorial_kernels.validation import SUPPORTED_DTYPES

DEVICE = default_device()


@dataclass(frozen=True)
class Problem:
    """A shape, the memory layout of q, k and v, and the scale."""

    case: Case
    layout: str = "bhnd"  # "bnhd": (B, N, H, d) storage seen as (B, H, N, d), as Hugging Face passes it
    sm_scale: float | None = None

    @property
    def id(self) -> str:
        scale = "" if self.sm_scale is None else f"-scale{self.sm_scale}"
        layout = "" if self.layout == "bhnd" else f"-{self.layout}"
        return f"{self.case.id}{layout}{scale}"


def _marks(impl: Implementation) -> list:
    """Deselected without a GPU (conftest.py) for GPU-only kernels; skipped, with the reason, on a GPU
    that cannot run them (the Hopper kernel on another architecture)."""
    marks = [pytest.mark.gpu(impl.gpu_only)] if impl.gpu_only else []
    if ON_GPU and (why := impl.unavailable()) is not None:
        marks.append(pytest.mark.skip(reason=why))
    return marks


def _variants(impl: Implementation) -> list[Problem]:
    """What every implementation gets beyond its shape matrix: (B, N, H, d) views with a custom scale
    (one of them causal with n_q > n_k, so that queries see no key; d = 80 is Phi-2's, 48 runs in two
    blocks in chapter 5), and grouped-query (8 query heads on 2) and multi-query (3 on 1) attention.
    Each crosses several tiles: the interpreter's 32-wide ones on the CPU, a GPU's 64- and 128-wide ones."""
    if ON_GPU:
        strided, shifted, grouped, multi = (77, 130), (150, 40), (70, 90), (100, 77)
    else:
        strided, shifted, grouped, multi = (45, 70), (60, 25), (33, 50), (37, 45)
    problems = [Problem(Case(2, 2, *strided, impl.fit(80)), "bnhd", 0.3),
                Problem(Case(2, 2, *shifted, impl.fit(48)), "bnhd", 0.17)]
    if impl.gqa:
        problems += [Problem(Case(1, 8, *grouped, impl.fit(64), kv_heads=2)),
                     Problem(Case(2, 3, *multi, impl.fit(32), kv_heads=1), "bnhd")]
    return problems


def _matrix(impl: Implementation, cases: list[Case]) -> list:
    problems = [Problem(c, layout) for layout in impl.layouts for c in cases] + _variants(impl)
    return [pytest.param(impl, p, causal, dtype, marks=_marks(impl),
                         id=f"{impl.name}-{p.id}-{cid}-{str(dtype)[6:]}")
            for p in problems for causal, cid in ((False, "full"), (True, "causal")) for dtype in impl.dtypes_here()]


FORWARD = [param for impl in IMPLEMENTATIONS for param in _matrix(impl, impl.shape_cases())]
GRADIENTS = [param for impl in IMPLEMENTATIONS if impl.differentiable
             for param in _matrix(impl, impl.gradient_cases())]


def _inputs(problem: Problem, dtype: torch.dtype):
    c = problem.case
    x = random_qkv(c.batch, c.heads, c.n_q, c.n_k, c.head_dim, dtype, layout=problem.layout)
    # grouped-query k and v are sliced out of q-sized ones: their heads are not contiguous either
    return x.q, x.k[:, :c.kv_heads], x.v[:, :c.kv_heads], x.seed


def _output_buffer(impl: Implementation, problem: Problem, dtype: torch.dtype) -> torch.Tensor | None:
    """NaN everywhere: an element the kernel does not write stays NaN and fails. In (B, N, H, d) memory
    for a (B, N, H, d) problem where the implementation writes any dense layout, as a model's output
    projection reads it."""
    c = problem.case
    if impl.out == DENSE_OUT and problem.layout == "bnhd":
        return poisoned((c.batch, c.n_q, c.heads, c.head_dim), dtype, DEVICE).transpose(1, 2)
    if impl.out in (CONTIGUOUS_OUT, DENSE_OUT):
        return poisoned((c.batch, c.heads, c.n_q, c.head_dim), dtype, DEVICE)
    return None


@pytest.mark.parametrize("impl,problem,causal,dtype", FORWARD)
def test_forward_matches_reference(impl: Implementation, problem: Problem, causal: bool, dtype: torch.dtype):
    q, k, v, seed = _inputs(problem, dtype)
    out = _output_buffer(impl, problem, dtype)
    o = impl(q, k, v, causal, problem.sm_scale, out=out)
    if out is not None:
        assert o is out, "the result must be the out= buffer"
    assert o.shape == q.shape and o.dtype == dtype and o.device == q.device, f"{o.shape} {o.dtype} {o.device}"
    assert_within_peer_rule(o, impl.reference(q, k, v, causal, problem.sm_scale),
                            impl.baseline(q, k, v, causal, problem.sm_scale), factor=PEER_OUTPUT_FACTOR, seed=seed)
    blind = impl.rows_without_keys(causal, problem.case.n_q, problem.case.n_k)
    assert torch.all(o[:, :, :blind] == 0), f"queries that see no key must output zeros; seed={seed}"


@pytest.mark.parametrize("impl,problem,causal,dtype", GRADIENTS)
def test_gradients_match_reference(impl: Implementation, problem: Problem, causal: bool, dtype: torch.dtype):
    q, k, v, seed = _inputs(problem, dtype)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = impl(q, k, v, causal, problem.sm_scale)
    gen = torch.Generator(device=q.device).manual_seed(seed + 1)
    do = torch.randn(o.shape, generator=gen, device=q.device).to(dtype)  # never zeros
    o.backward(do)

    exact = outputs_and_gradients(lambda *t: impl.reference(*t, causal, problem.sm_scale), q, k, v, do, torch.float64)
    torch_own = outputs_and_gradients(lambda *t: impl.baseline(*t, causal, problem.sm_scale), q, k, v, do)
    assert_within_peer_rule(o.detach(), exact[0], torch_own[0], factor=PEER_OUTPUT_FACTOR, seed=seed)
    for name, got, want, yardstick, like in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), exact[1:], torch_own[1:],
                                                (q, k, v)):
        # grouped-query dK and dV have k's and v's (fewer) heads: summed over each group
        assert got.shape == like.shape and got.dtype == dtype, f"{name}: {tuple(got.shape)} {got.dtype}"
        assert_within_peer_rule(got, want, yardstick, factor=PEER_GRAD_FACTOR, seed=seed, what=name)
    blind = impl.rows_without_keys(causal, problem.case.n_q, problem.case.n_k)
    assert torch.all(q.grad[:, :, :blind] == 0), f"queries that see no key must get dq = 0; seed={seed}"


# --- bad input: a ValueError or TypeError that names the argument --------------------------------------


@dataclass(frozen=True)
class Bad:
    """One bad call: `call(impl, q, k, v)` returns (args, kwargs) for impl; it must raise `error` matching
    `match` (a regular expression naming the argument, or a function of impl giving one)."""

    id: str
    error: type
    match: str | Callable[[Implementation], str]
    call: Callable
    applies: Callable[[Implementation], bool] = lambda impl: True
    after_device_checks: bool = False  # checked only where the implementation can run (the Hopper kernel)
    env: dict = field(default_factory=dict)


def _args(q, k, v, causal=False, sm_scale=None, **kwargs):
    return (q, k, v, causal, sm_scale), kwargs


def _resized(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = size
    return torch.randn(shape, device=t.device).to(t.dtype)


def _missing_float_dtype(impl: Implementation) -> torch.dtype | None:
    return next((d for d in SUPPORTED_DTYPES if d not in impl.dtypes), None)


BAD = [
    Bad("q-not-a-tensor", TypeError, r"q must be a torch\.Tensor, got list", lambda i, q, k, v: _args(q.tolist(), k, v)),
    Bad("k-wrong-rank", ValueError, r"k must have 4 dimensions \(batch, heads, seq, head_dim\), got 3",
        lambda i, q, k, v: _args(q, k[0], v)),
    Bad("q-integer-dtype", TypeError, r"q\.dtype must be torch\.float16, torch\.bfloat16 or torch\.float32, got torch\.int32",
        lambda i, q, k, v: _args(q.to(torch.int32), k, v)),
    Bad("v-dtype-differs", TypeError, r"v\.dtype must equal q\.dtype \(torch\.float16\), got torch\.float32",
        lambda i, q, k, v: _args(q, k, v.float())),
    Bad("k-on-another-device", ValueError, r"k must be on q's device .*, got meta",
        lambda i, q, k, v: _args(q, k.to("meta"), v)),
    Bad("k-and-v-shapes-differ", ValueError, r"k and v must have the same shape",
        lambda i, q, k, v: _args(q, k, _resized(v, 2, v.shape[2] + 1))),
    Bad("batch-differs", ValueError, r"k must have q's batch",
        lambda i, q, k, v: _args(q, _resized(k, 0, 2), _resized(v, 0, 2))),
    Bad("kv-heads-differ", ValueError, r"k must have q's batch and heads \(1, 4\), got \(1, 2\)",
        lambda i, q, k, v: _args(q, k[:, :2], v[:, :2]), applies=lambda i: not i.gqa),
    Bad("kv-heads-do-not-divide", ValueError, r"k's heads \(3\) must divide q's heads \(4\)",
        lambda i, q, k, v: _args(q, k[:, :3], v[:, :3]), applies=lambda i: i.gqa),
    Bad("head-dims-differ", ValueError, r"k's head_dim must equal q's",
        lambda i, q, k, v: _args(q, _resized(k, 3, 2 * k.shape[3]), _resized(v, 3, 2 * v.shape[3]))),
    Bad("empty-sequence", ValueError, r"q's seq length must be at least 1, got 0",
        lambda i, q, k, v: _args(q[:, :, :0], k, v), applies=lambda i: not i.empty_sequences),
    Bad("head-dim-too-large", ValueError, lambda i: rf"head_dim\b.*, got {i.max_head_dim + 8}\b",
        lambda i, q, k, v: _args(*(_resized(t, 3, i.max_head_dim + 8) for t in (q, k, v)))),
    Bad("head-dim-too-small", ValueError, lambda i: rf"head_dim\b.*, got {i.min_head_dim - 8}\b",
        lambda i, q, k, v: _args(*(_resized(t, 3, i.min_head_dim - 8) for t in (q, k, v))),
        applies=lambda i: i.min_head_dim > 8),
    Bad("causal-not-a-bool", TypeError, r"causal must be a bool, got int 1", lambda i, q, k, v: _args(q, k, v, 1)),
    Bad("sm-scale-a-string", TypeError, r"sm_scale must be a float or None, got str '0\.1'",
        lambda i, q, k, v: _args(q, k, v, False, "0.1")),
    Bad("sm-scale-a-bool", TypeError, r"sm_scale must be a float or None, got bool",
        lambda i, q, k, v: _args(q, k, v, False, True)),
    *[Bad(f"sm-scale-{name}", ValueError, r"sm_scale must be a finite number > 0",
          lambda i, q, k, v, s=scale: _args(q, k, v, False, s))
      for name, scale in (("zero", 0.0), ("negative", -1.0), ("nan", math.nan), ("inf", math.inf))],
    Bad("dtype-it-does-not-run", TypeError, r"q\.dtype",
        lambda i, q, k, v: _args(*(t.to(_missing_float_dtype(i)) for t in (q, k, v))),
        applies=lambda i: _missing_float_dtype(i) is not None),
    Bad("out-not-a-tensor", TypeError, r"out must be a torch\.Tensor or None, got str",
        lambda i, q, k, v: _args(q, k, v, out="out"), applies=lambda i: i.out is not None, after_device_checks=True),
    Bad("out-wrong-shape", ValueError, r"out must have shape \(1, 4, 8, \d+\), got \(1, 4, 8, 8\)",
        lambda i, q, k, v: _args(q, k, v, out=torch.empty(1, 4, 8, 8, dtype=q.dtype, device=q.device)),
        applies=lambda i: i.out is not None, after_device_checks=True),
    Bad("out-wrong-dtype", TypeError, r"out\.dtype must be torch\.float16, got torch\.float32",
        lambda i, q, k, v: _args(q, k, v, out=torch.empty(q.shape, device=q.device)),
        applies=lambda i: i.out is not None, after_device_checks=True),
    Bad("out-on-another-device", ValueError, r"out must be on .*, got meta",
        lambda i, q, k, v: _args(q, k, v, out=torch.empty(q.shape, dtype=q.dtype, device="meta")),
        applies=lambda i: i.out is not None, after_device_checks=True),
    Bad("out-not-contiguous", ValueError, r"out must be contiguous, got strides",
        lambda i, q, k, v: _args(q, k, v, out=torch.empty(1, 4, q.shape[3], 8, dtype=q.dtype,
                                                          device=q.device).transpose(2, 3)),
        applies=lambda i: i.out == CONTIGUOUS_OUT, after_device_checks=True),
    Bad("out-overlapping", ValueError, r"out must be contiguous or a permuted view of a contiguous tensor .*strides "
        r"\(\d+, 0, \d+, 1\)",
        lambda i, q, k, v: _args(q, k, v, out=torch.empty(1, 1, 8, q.shape[3], dtype=q.dtype,
                                                          device=q.device).expand(q.shape)),
        applies=lambda i: i.out == DENSE_OUT, after_device_checks=True),
    Bad("out-with-gaps", ValueError, r"out must be contiguous or a permuted view of a contiguous tensor",
        lambda i, q, k, v: _args(q, k, v, out=torch.empty(1, 4, 8, 2 * q.shape[3], dtype=q.dtype,
                                                          device=q.device)[..., :q.shape[3]]),
        applies=lambda i: i.out == DENSE_OUT, after_device_checks=True),
]
if not ON_GPU:  # what the CPU refuses: bfloat16 under the interpreter, and CPU tensors with it off
    BAD += [
        Bad("bfloat16-under-the-interpreter", TypeError,
            r"q, k and v: dtype torch\.bfloat16 is not supported under Triton's interpreter",
            lambda i, q, k, v: _args(*(t.bfloat16() for t in (q, k, v))), applies=lambda i: i.runs_triton),
        Bad("cpu-tensors-with-the-interpreter-off", ValueError,
            r"q, k and v: on the CPU but Triton's interpreter is off", lambda i, q, k, v: _args(q, k, v),
            applies=lambda i: i.runs_triton, env={INTERPRET_VARIABLE: "0"}),
    ]


def _bad_params() -> list:
    params = []
    for impl in IMPLEMENTATIONS:
        for bad in BAD:
            if not bad.applies(impl):
                continue
            # arguments are checked before the device everywhere; the Hopper kernel checks out= only
            # where it can run
            marks = _marks(impl) if bad.after_device_checks else []
            params.append(pytest.param(impl, bad, marks=marks, id=f"{impl.name}-{bad.id}"))
    return params


@pytest.mark.parametrize("impl,bad", _bad_params())
def test_bad_input_names_the_argument(impl: Implementation, bad: Bad, monkeypatch):
    # float16 (every implementation runs it), 4 query heads, 8 queries and keys, the smallest head_dim it runs
    x = random_qkv(1, 4, 8, 8, impl.fit(16), torch.float16)
    args, kwargs = bad.call(impl, x.q, x.k, x.v)
    for name, value in bad.env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(bad.error, match=bad.match(impl) if callable(bad.match) else bad.match):
        impl(*args, **kwargs)


def test_every_public_attention_function_is_registered():
    """A new chapter's attention function must be added to `implementations.IMPLEMENTATIONS`."""
    import importlib
    import pkgutil

    import tutorial_kernels

    registered = {getattr(impl.fn, "func", impl.fn) for impl in IMPLEMENTATIONS}
    missing = []
    for info in pkgutil.iter_modules(tutorial_kernels.__path__):
        if not info.name.startswith("ch0"):
            continue
        module = importlib.import_module(f"tutorial_kernels.{info.name}")
        for name in getattr(module, "__all__", []):
            fn = getattr(module, name)
            if callable(fn) and _is_attention_function(name) and fn not in registered:
                missing.append(f"{info.name}.{name}")
    assert not missing, f"attention functions without a registry entry: {missing}"


def _is_attention_function(name: str) -> bool:
    """The public `fn(q, k, v, causal, sm_scale)` functions: their names end in `attention`, or start with
    `flash_attn` (chapters 4 and 5), except the variants that return more than the output (`_with_*`)
    and the backward passes (`flash_attn_backward`, `flash_attn_hopper_backward`: gradients, not O), and
    the packed-batch calls (`*_varlen`: (tokens, H, d) inputs and cu_seqlens, tested in their chapter's tests)."""
    return (name.endswith("attention") or name.startswith("flash_attn")) and "_with_" not in name \
        and not name.endswith(("_backward", "_varlen"))

