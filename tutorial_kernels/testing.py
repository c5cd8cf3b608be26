"""The kernel test harness shared by every chapter: inputs, poisoned outputs, tolerances, shapes.

Rules it enforces (see the README's "How kernels are tested"):
* inputs are fresh random normals — never zeros, which hide unwritten outputs and wrong indexing —
  drawn from a seed that is printed in every failure message so a failure can be replayed;
* outputs are filled with NaN before the launch, so an element the kernel forgot to write fails;
* errors against the float64 reference: ‖out − ref‖ / ‖ref‖ with one bound per dtype (`assert_close`),
  or, in the conformance and peer suites, the peers' rule: the largest elementwise error at most a factor times that
  of PyTorch's own attention in the same dtype (`torch_attention_same_dtype`, `assert_within_peer_rule`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tutorial_kernels.inputs import AttentionInputs, fresh_seed, random_qkv  # noqa: F401  (re-exported for tests)
from tutorial_kernels.reference import (alibi_bias, causal_mask, expand_kv_heads, reference_attention,
                                       relative_error, variant_mask)
from tutorial_kernels.runtime import default_device, interpreter_active
from tutorial_kernels.tolerances import (PEER_ABS_TOL, PEER_GRAD_FACTOR,  # noqa: F401  (re-exported for tests)
                                         PEER_OUTPUT_FACTOR, grad_tolerance, tolerance)

ON_GPU = default_device().type == "cuda"

# bfloat16 is tested on the GPU only. NumPy has no bfloat16, so Triton's interpreter keeps bf16 as raw
# 16-bit integers and computes its dot products and sums wrongly WITHOUT an error (triton-lang/triton#4972);
# the public functions refuse bf16 under the interpreter (`validation.check_triton_tensor`). Rather than
# collect bf16 tests only to skip them, the CPU run does not generate them (conftest.py says so once).
BF16_NEEDS_GPU = (
    "bfloat16 runs on the GPU only: Triton's interpreter computes bf16 wrongly without an error "
    "(NumPy has no bf16; triton-lang/triton#4972)"
)

# The dtypes every kernel is tested in here: float32 and float16 everywhere, bfloat16 on a GPU only.
ALL_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KERNEL_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])

# A test (or parameter) that needs a CUDA GPU is marked `@pytest.mark.gpu("what kind")`: conftest.py
# deselects it at collection on a machine without one, so the CPU run neither collects nor skips it,
# and counts it by kind in one summary line.


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An output buffer full of NaN: any element the kernel fails to write stays NaN."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_close(
    out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, *, seed: int, what: str = "out",
    bound: float | None = None,
) -> float:
    """Fail unless `out` is fully written (no NaN) and within `bound` (default `tolerance(dtype)`;
    `grad_tolerance(dtype)` for gradients) of `ref`."""
    unwritten = torch.isnan(out).sum().item()
    assert unwritten == 0, f"{what}: {unwritten} of {out.numel()} elements are NaN (unwritten?); seed={seed}"
    err = relative_error(out, ref)
    bound = tolerance(dtype) if bound is None else bound
    assert err <= bound, f"{what}: relative error {err:.3e} > {bound:.1e} for {dtype}; seed={seed}"
    return err


def torch_attention_same_dtype(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None, *,
    alignment: str = "bottom-right", scale_first: bool = True,
) -> torch.Tensor:
    """PyTorch's own attention in the inputs' dtype: the yardstick of the peers' rule, as flash-attn's
    `attention_ref(..., upcast=False)`. Plain torch ops on q's device, each result rounded to q.dtype:

        S = (scale · Q) Kᵀ      −∞ where the causal mask hides a key
        P = softmax(S)          a row that sees no key: P = 0 (not NaN), as `reference.reference_softmax`
        O = P V

    float32 products follow `torch.get_float32_matmul_precision()`, as every torch.matmul does. Grouped-
    query k and v are expanded with `reference.expand_kv_heads`. Differentiable: torch autograd, in the same
    dtype, gives the gradients' yardstick. `alignment` of the causal mask: "bottom-right" (every chapter,
    `reference.causal_mask`) or "top-left" (`torch.nn.functional.scaled_dot_product_attention`).
    `scale_first=False` rounds Q Kᵀ, then its product with the scale, as the textbook formula (chapter 2's
    eager attention) does.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    heads = q.shape[1]
    k_t = expand_kv_heads(k, heads).transpose(-2, -1)
    s = (q * scale) @ k_t if scale_first else (q @ k_t) * scale  # (B, H, n_q, n_k), in q.dtype
    if not causal:
        return torch.softmax(s, dim=-1) @ expand_kv_heads(v, heads)
    n_q, n_k = q.shape[-2], k.shape[-2]
    if alignment == "bottom-right":
        visible = causal_mask(n_q, n_k, q.device)  # query i sees key j ≤ i + n_k − n_q
    elif alignment == "top-left":
        visible = torch.arange(n_k, device=q.device)[None, :] <= torch.arange(n_q, device=q.device)[:, None]  # j ≤ i
    else:
        raise ValueError(f"alignment must be 'bottom-right' or 'top-left', got {alignment!r}")
    return _softmax_where_seen(s, visible) @ expand_kv_heads(v, heads)


def _softmax_where_seen(s: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Row softmax of s over the keys `visible` (n_q, n_k), or broadcastable to s, lets each query see, in s's dtype.

    Softmax over a row of −∞ is NaN, and NaN in the backward too (0 · NaN): a row that sees no key keeps
    finite scores through the softmax and gets P = 0 after it, so its output and gradients are exact zeros."""
    blind = ~visible.any(dim=-1, keepdim=True)  # (n_q, 1): queries that see no key
    return torch.softmax(s.masked_fill(~visible & ~blind, -math.inf), dim=-1).masked_fill(blind, 0.0)


def torch_variant_attention_same_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                                      *, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                                      softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                                      attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Chapter 9's variants (`reference.reference_variant_scores`) computed by plain torch ops in the inputs'
    dtype, each result rounded to it: the peers' yardstick for them. A row that sees no key: P = 0."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    heads = q.shape[1]
    s = (q * scale) @ expand_kv_heads(k, heads).transpose(-2, -1)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = s.shape[-2:]
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, heads, n_q, n_k, q.dtype)
    visible = variant_mask(n_q, n_k, window_size, causal, q.device)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        visible = visible & attn_mask
    elif attn_mask is not None:
        s = s + attn_mask.to(q.dtype)
        visible = visible & (attn_mask != -math.inf)
    return _softmax_where_seen(s, visible) @ expand_kv_heads(v, heads)


def max_abs_error(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, tuple[int, ...]]:
    """max |x − ref| elementwise (in float64) and the index of the element where it is reached; (0, ())
    for empty tensors. NaN anywhere in x gives NaN."""
    diff = (x.detach().double() - ref.detach().double().to(x.device)).abs()
    if diff.numel() == 0:
        return 0.0, ()
    flat = int(torch.argmax(torch.nan_to_num(diff, nan=math.inf)).item())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    return diff[index].item(), index


class PeerRuleError(AssertionError):
    """The peers' rule failed on its ratio (not on a NaN or a shape): what a case marked as known to exceed
    the rule may raise, and nothing else (`pytest.mark.xfail(raises=PeerRuleError)`)."""


def assert_within_peer_rule(
    out: torch.Tensor, ref64: torch.Tensor, baseline: torch.Tensor, *, factor: float, seed: int, what: str = "out",
) -> float:
    """flash-attn's acceptance rule, scale-free: fail unless `out` is fully written and finite (no NaN: a
    poisoned buffer's unwritten elements) and, errors being elementwise maxima against the float64 `ref64`,

        max|out − ref64| ≤ factor · max|baseline − ref64| + PEER_ABS_TOL

    where `baseline` is PyTorch's attention (or its gradient) in out's dtype (`torch_attention_same_dtype`);
    factor `PEER_OUTPUT_FACTOR` for outputs, `PEER_GRAD_FACTOR` for gradients. Returns the error; raises
    `PeerRuleError` when only the ratio fails (a plain AssertionError for a shape, NaN or ∞)."""
    assert out.shape == ref64.shape == baseline.shape, f"{what}: shape {tuple(out.shape)}, reference " \
        f"{tuple(ref64.shape)}, PyTorch {tuple(baseline.shape)}; seed={seed}"
    unwritten = torch.isnan(out).sum().item()
    assert unwritten == 0, f"{what}: {unwritten} of {out.numel()} elements are NaN (unwritten, or computed " \
        f"as NaN); seed={seed}"
    infinite = torch.isinf(out).sum().item()
    assert infinite == 0, f"{what}: {infinite} of {out.numel()} elements are infinite; seed={seed}"
    err, at = max_abs_error(out, ref64)
    torch_err, _ = max_abs_error(baseline, ref64)
    assert math.isfinite(torch_err), f"{what}: PyTorch's own {baseline.dtype} attention is not finite here, " \
        f"so the rule has no yardstick; seed={seed}"
    bound = factor * torch_err + PEER_ABS_TOL
    ratio = err / torch_err if torch_err > 0 else math.inf
    if not err <= bound:
        raise PeerRuleError(
            f"{what}: max |error| {err:.3e} at {at} (got {out[at].item():.6g}, exact {ref64[at].item():.6g}) > "
            f"{factor:g} × PyTorch's {torch_err:.3e} in {out.dtype} + {PEER_ABS_TOL:.0e} = {bound:.3e} "
            f"(ratio {ratio:.2f}); seed={seed}")
    return err


def outputs_and_gradients(
    fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(O, dQ, dK, dV) of `fn(q, k, v)` with upstream gradient `do`, through autograd, on fresh leaf copies
    of q, k, v (converted to `dtype` if given, as `do` is)."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    o.backward(do.to(o.dtype))
    return (o.detach(), *(t.grad for t in leaves))


def check_attention(fn, case: "Case", causal: bool, dtype: torch.dtype) -> None:
    """The check every chapter's `fn(q, k, v, causal, sm_scale, *, out)` passes on one shape:
    fresh inputs, a NaN-poisoned `out` that must come back fully written, the float64 reference."""
    x = random_qkv(case.batch, case.heads, case.n_q, case.n_k, case.head_dim, dtype)
    out = poisoned(tuple(x.q.shape), dtype, x.q.device)
    assert fn(x.q, x.k, x.v, causal, out=out) is out, "the result must be the out= buffer"
    assert_close(out, reference_attention(x.q, x.k, x.v, causal), dtype, seed=x.seed)


@dataclass(frozen=True)
class Case:
    """One attention shape to test: q (batch, heads, n_q, head_dim), k and v (batch, kv_heads, n_k,
    head_dim); kv_heads = 0 means heads (no grouped-query attention)."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    kv_heads: int = 0

    def __post_init__(self) -> None:
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)

    @property
    def id(self) -> str:
        n = f"n{self.n_q}" if self.n_q == self.n_k else f"nq{self.n_q}-nk{self.n_k}"
        kv = "" if self.kv_heads == self.heads else f"kv{self.kv_heads}"
        return f"b{self.batch}h{self.heads}{kv}-{n}-d{self.head_dim}"


SEQ_LENS = (1, 17, 100, 128, 257)
HEAD_DIMS = (16, 32, 64, 80, 128)


def attention_cases(head_dims: tuple[int, ...] = HEAD_DIMS) -> list[Case]:
    """Shapes every attention implementation's forward is tested on (`tests/test_conformance.py`).

    On the GPU: every sequence length × every head_dim at batch 2 × 3 heads, plus longer and unequal
    lengths. Under the interpreter, whose cost grows with programs × loop steps, a covering subset at
    batch × heads = 2 (batch 2 or 2 heads, so both strides are exercised): every length but 257 at
    d = 64, every head_dim at n = 70, and n_q ≠ n_k both ways (one query against 257 keys; 129 queries,
    one past a tile, against 65 keys), so that every kernel still crosses several tiles, ends on a
    ragged one and (causal, n_q > n_k) has rows that see no key.
    """
    if ON_GPU:
        unequal = [Case(2, 3, 17, 100, 64), Case(1, 2, 100, 17, 64), Case(2, 2, 1, 257, 80), Case(1, 3, 257, 128, 32)]
        grid = [Case(2, 3, n, n, d) for n in SEQ_LENS for d in head_dims]
        longer = [Case(2, 4, 1000, 1000, 64), Case(1, 8, 2048, 2048, 128), Case(1, 4, 1024, 3000, 80)]
        return grid + unequal + longer
    by_length = [Case(2, 1, 1, 1, 64), Case(1, 2, 17, 17, 64), Case(2, 1, 100, 100, 64), Case(1, 2, 128, 128, 64)]
    by_dim = [Case(2, 1, 70, 70, d) for d in head_dims if d != 64]  # 70: past a 64-row tile, ragged
    unequal = [Case(1, 2, 17, 100, 64), Case(2, 1, 100, 17, 64), Case(1, 2, 1, 257, 80), Case(1, 2, 129, 65, 32)]
    return by_length + by_dim + unequal
