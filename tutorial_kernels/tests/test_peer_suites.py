"""flash-attn's and PyTorch's attention test families, run against the front door under the peers' rule.

`tutorial_kernels.flash_attention` (and `scaled_dot_product_attention` for PyTorch's families), forward and
gradients, against the float64 reference: the largest elementwise error at most 2× (outputs) or 3×
(gradients) that of PyTorch's own attention in the same dtype, plus 1e-5 (`testing.assert_within_peer_rule`).

* flash-attn's output and gradient family (tests/test_flash_attn.py, `test_flash_attn_output`): its
  sequence-length pairs × head dims 32 … 256 (59 and 111 too) × multi-head, grouped-query and multi-query
  attention × causal or not × every dtype;
* its `test_flash_attn_bwd_overflow`: q = 5·randn, k and v = 3·randn, float16, n = 1 or 2, where keys
  past the end gave NaN in dQ: the output within the rule, the gradients finite;
* a non-contiguous dO (its `test_flash_attn_bwd_transpose`), and repeated runs bitwise equal under
  `torch.use_deterministic_algorithms(True)` (its `test_flash_attn_deterministic`);
* PyTorch's failure-mode inputs (test/test_transformers.py: `test_invalid_inputs_*`,
  `test_invalid_fused_inputs_*`, `TestSDPAFailureModes`): each raises a ValueError, TypeError or
  RuntimeError whose message names the argument, or computes what PyTorch's SDPA computes on the CPU;
  sequences of length 0 give PyTorch's answer (an empty output with no query, zeros with no key, and
  zero gradients).

On a GPU the full families. On the CPU, where Triton's interpreter's cost grows with programs × loop
steps (a 2048 × 2048 forward and backward takes about 14 s at one head, causal), a fixed sample that
visits every family, every head dimension and every length pair but 2048 × 2048, at batch × heads ≤ 4.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from tutorial_kernels import flash_attention, scaled_dot_product_attention
from tutorial_kernels.reference import reference_attention
from tutorial_kernels.runtime import default_device
from tutorial_kernels.testing import (KERNEL_DTYPES, ON_GPU, PEER_GRAD_FACTOR, PEER_OUTPUT_FACTOR, PeerRuleError,
                                      assert_within_peer_rule, fresh_seed, outputs_and_gradients, random_qkv,
                                      torch_attention_same_dtype, torch_variant_attention_same_dtype)

DEVICE = default_device()
F16, F32 = torch.float16, torch.float32


def _upstream(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """dO: fresh normals (never zeros) from the case's seed, on its device."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    return torch.randn(shape, generator=gen, device=DEVICE).to(dtype)


def _check_against_peers(fn: Callable, exact_fn: Callable, torch_fn: Callable, q, k, v, do, seed: int, *,
                         gradient_limit: str | None = None):
    """fn(q, k, v)'s output and gradients within the rule: `exact_fn` gives the float64 answer (run on
    float64 copies), `torch_fn` PyTorch's own in the inputs' dtype. Returns fn's (O, dQ, dK, dV).
    `gradient_limit`: why the gradients are known to exceed the rule here (an xfail if, and only if, they do)."""
    ours = outputs_and_gradients(fn, q, k, v, do)
    exact = outputs_and_gradients(exact_fn, q, k, v, do, torch.float64)
    torch_own = outputs_and_gradients(torch_fn, q, k, v, do)
    over = []  # gradients over the rule's ratio where that is known: an xfail once every check has run
    for i, what in enumerate(("out", "dq", "dk", "dv")):
        # dK and dV of grouped-query attention have k's (fewer) heads: summed over each group
        assert ours[i].dtype == q.dtype, f"{what}: {ours[i].dtype}, expected {q.dtype}"
        try:
            assert_within_peer_rule(ours[i], exact[i], torch_own[i], seed=seed, what=what,
                                    factor=PEER_OUTPUT_FACTOR if what == "out" else PEER_GRAD_FACTOR)
        except PeerRuleError as error:
            if what == "out" or gradient_limit is None:
                raise
            over.append(str(error))  # NaN, ∞ and shape are still checked on the gradients after this one
    if over:
        pytest.xfail(f"{gradient_limit}: {'; '.join(over)}")
    return ours


# FlashAttention-2's backward takes Δ_i = rowsum(dO_i ∘ O_i) from the stored output (dS = P ∘ (dP − Δ)), where
# softmax's autograd, PyTorch's yardstick, uses P itself. Where PyTorch's gradient error is 0 or nearly — one key
# (dS = 0 exactly: PyTorch's dQ and dK are exact, and the rule allows 1e-5 absolute) or a nearly one-hot P
# (|S| in the tens) — the kernel's dP − Δ is the rounding of two dot products (O rounded to its dtype, float32
# sums), which dQ multiplies by |K| and dK by |Q|, summed over the queries. Measured on the CPU: flash-attn's
# overflow inputs, 1 to 7 draws of 25 beyond the rule in every case, dK up to 2.5e-5 (n = 1) and dQ 8×
# PyTorch's error (n = 2, d = 32); 239 queries on one key at the GPU's 2 × 9 heads, not causal, 6 draws each:
# dK 1.4 to 1.8e-5 in every draw at d = 128 and 256 (float16 and float32), within the rule at d = 32.
# (Emulated in float64 with O alone rounded to float16, dQ shows the same error.) Known, not a bug: the
# output must pass, the gradients must be finite, and their ratio alone may fail (an xfail with the numbers).
DELTA_FROM_OUTPUT = "FlashAttention-2's Δ = rowsum(dO ∘ O) from the stored O, where PyTorch's error is 0 or nearly"


def _check_front_door(q, k, v, do, causal: bool, seed: int, sm_scale: float | None = None, *,
                      gradient_limit: str | None = None):
    return _check_against_peers(lambda *t: flash_attention(*t, causal, sm_scale),
                                lambda *t: reference_attention(*t, causal, sm_scale),
                                lambda *t: torch_attention_same_dtype(*t, causal, sm_scale), q, k, v, do, seed,
                                gradient_limit=gradient_limit)


# --- flash-attn: sequence lengths × head dims × heads × causal × dtype -----------------------------------

FLASH_ATTN_LENGTHS = ((1, 239), (239, 1), (3, 799), (799, 3), (113, 203), (128, 217), (113, 211), (108, 256),
                      (256, 512), (1023, 1024), (1024, 1023), (2048, 2048))
FLASH_ATTN_HEAD_DIMS = (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
# (batch, query heads, key/value heads) per kind of heads: flash-attn's 9 query heads on 9, 3 or 1 on a GPU (its
# batch 4 halved: the float64 reference of a 2048² problem holds several 0.6 GB tensors, and the GPU suite runs
# 16 processes on one GPU); on the CPU the fewest that still show each kind, batch × heads ≤ 4
HEADS = {"mha": (2, 9, 9), "gqa": (2, 9, 3), "mqa": (2, 9, 1)} if ON_GPU else \
    {"mha": (2, 1, 1), "gqa": (1, 4, 2), "mqa": (1, 2, 1)}


@dataclass(frozen=True)
class FlashAttnCase:
    n_q: int
    n_k: int
    head_dim: int
    heads: str  # "mha", "gqa" or "mqa"
    causal: bool
    dtype: torch.dtype

    @property
    def id(self) -> str:
        return (f"nq{self.n_q}-nk{self.n_k}-d{self.head_dim}-{self.heads}-{'causal' if self.causal else 'full'}-"
                f"{str(self.dtype)[6:]}")


def _flash_attn_cases() -> list[FlashAttnCase]:
    """Every combination on a GPU. On the CPU one case per length pair but 2048 × 2048, each head dimension
    once (the longest pairs at the smallest), the kinds of heads, causal or not and the dtypes in turn."""
    if ON_GPU:
        return [FlashAttnCase(n_q, n_k, d, heads, causal, dtype) for n_q, n_k in FLASH_ATTN_LENGTHS
                for d in FLASH_ATTN_HEAD_DIMS for heads in HEADS for causal in (False, True) for dtype in KERNEL_DTYPES]
    return [
        FlashAttnCase(1, 239, 256, "mqa", False, F16),
        FlashAttnCase(239, 1, 224, "gqa", True, F32),  # causal, n_q > n_k: 238 queries see no key
        FlashAttnCase(3, 799, 192, "mha", True, F16),
        FlashAttnCase(799, 3, 160, "mqa", False, F32),
        FlashAttnCase(113, 203, 59, "gqa", False, F16),
        FlashAttnCase(128, 217, 111, "mha", True, F32),
        FlashAttnCase(113, 211, 96, "mqa", True, F16),
        FlashAttnCase(108, 256, 80, "gqa", True, F32),
        FlashAttnCase(256, 512, 128, "mha", False, F16),
        FlashAttnCase(113, 203, 64, "mqa", True, F32),
        FlashAttnCase(1023, 1024, 40, "mha", True, F16),
        FlashAttnCase(1024, 1023, 32, "mha", True, F32),  # causal, n_q > n_k: the first query sees no key
    ]


@pytest.mark.parametrize("case", _flash_attn_cases(), ids=lambda c: c.id)
def test_flash_attn_lengths_and_head_dims(case: FlashAttnCase):
    batch, heads, kv_heads = HEADS[case.heads]
    x = random_qkv(batch, heads, case.n_q, case.n_k, case.head_dim, case.dtype)
    k, v = x.k[:, :kv_heads], x.v[:, :kv_heads]  # (B, H_kv, n_k, d), strided views
    _check_front_door(x.q, k, v, _upstream(x.q.shape, case.dtype, x.seed), case.causal, x.seed,
                      gradient_limit=DELTA_FROM_OUTPUT if case.n_k == 1 else None)


# --- flash-attn's test_flash_attn_bwd_overflow --------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_bwd_overflow(n: int, head_dim: int, causal: bool):
    """Large scores (q = 5·randn, k = 3·randn: |S| in the tens, each row's lse far from 0) over keys that
    end inside a tile: keys past n_k must not enter dQ, where e^{0 − lse} overflows float16 (∞ · 0 = NaN).
    The output within the rule and finite gradients are required; the gradients' ratio is a known limit
    (`DELTA_FROM_OUTPUT`)."""
    x = random_qkv(2, 5, n, n, head_dim, F32)  # B = 2, H = 5, as flash-attn; k and v separate draws
    q, k, v = (x.q * 5).to(F16), (x.k * 3).to(F16), (x.v * 3).to(F16)
    _check_front_door(q, k, v, _upstream(q.shape, F16, x.seed), causal, x.seed, gradient_limit=DELTA_FROM_OUTPUT)


# --- a non-contiguous dO; deterministic gradients ----------------------------------------------------------

# flash-attn's dO test: lengths 97 … 256, head dims 64 and 128; on the CPU the first of each
DO_LENGTHS, DO_HEAD_DIMS = ((97, 128, 200, 256), (64, 128)) if ON_GPU else ((97,), (64,))


def _strided_upstream(kind: str, shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """dO (B, H, N, d) as a view: "transposed" (d before N in memory) or "strided" (every other batch of a
    (N, 2B, H, d) tensor, as flash-attn's (s, b, h, d) output with g[:, ::2])."""
    batch, heads, n, d = shape
    if kind == "transposed":
        return _upstream((batch, heads, d, n), dtype, seed).transpose(2, 3)
    return _upstream((n, 2 * batch, heads, d), dtype, seed)[:, ::2].permute(1, 2, 0, 3)


@pytest.mark.parametrize("n", DO_LENGTHS)
@pytest.mark.parametrize("head_dim", DO_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_non_contiguous_upstream_gradient(n: int, head_dim: int, causal: bool, layout: str):
    """The gradients of a dO view are those of its contiguous copy, bit for bit, and within the rule."""
    dtype = KERNEL_DTYPES[-1]  # bfloat16 on a GPU, as flash-attn's test (float16 there too); float16 on the CPU
    x = random_qkv(2, 2, n, n, head_dim, dtype)
    do = _strided_upstream(layout, x.q.shape, dtype, x.seed)
    assert not do.is_contiguous()
    ours = _check_front_door(x.q, x.k, x.v, do, causal, x.seed)
    dense = outputs_and_gradients(lambda *t: flash_attention(*t, causal), x.q, x.k, x.v, do.contiguous())
    for name, got, want in zip(("out", "dq", "dk", "dv"), ours, dense):
        assert torch.equal(got, want), f"{name} differs with a {layout} dO; seed={x.seed}"


@contextlib.contextmanager
def _deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) inside the block; the previous setting after it."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


# (n_q, n_k, head_dim, kind of heads): flash-attn's deterministic test runs its lengths at head dims up to 256
DETERMINISTIC_CASES = [(113, 203, 59, "gqa")] + ([(1023, 1024, 128, "mha"), (2048, 2048, 64, "gqa"),
                                                  (108, 256, 256, "mqa")] if ON_GPU else [])
REPEATS = 10 if ON_GPU else 2  # the interpreter has one order of operations; a GPU's could vary by launch


@pytest.mark.parametrize("case", DETERMINISTIC_CASES, ids=lambda c: "nq{}-nk{}-d{}-{}".format(*c))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic_algorithms_give_bitwise_equal_runs(case, causal: bool):
    n_q, n_k, head_dim, kind = case
    dtype = KERNEL_DTYPES[-1]
    batch, heads, kv_heads = HEADS[kind]
    x = random_qkv(batch, heads, n_q, n_k, head_dim, dtype)
    k, v = x.k[:, :kv_heads], x.v[:, :kv_heads]
    do = _upstream(x.q.shape, dtype, x.seed)
    was = torch.are_deterministic_algorithms_enabled()
    with _deterministic_algorithms():  # only the front door inside: cuBLAS would need CUBLAS_WORKSPACE_CONFIG
        runs = [outputs_and_gradients(lambda *t: flash_attention(*t, causal), x.q, k, v, do) for _ in range(REPEATS)]
    assert torch.are_deterministic_algorithms_enabled() == was, "the previous setting must come back"
    for i, run in enumerate(runs[1:], 1):
        for name, got, first in zip(("out", "dq", "dk", "dv"), run, runs[0]):
            assert torch.equal(got, first), f"{name}: run {i} differs from run 0; seed={x.seed}"
    _check_front_door(x.q, k, v, do, causal, x.seed)


# --- PyTorch's SDPA failure modes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SdpaCall:
    """One call of `scaled_dot_product_attention(q, k, v, **kwargs)` from PyTorch's tests. `inputs(seed)` gives
    (q, k, v, kwargs); an error must match `names` (the argument it is about). `gradient_limit`: why the
    gradients are known to exceed the peers' rule on these inputs, if they are."""

    id: str
    names: str
    inputs: Callable[[int], tuple]
    gradient_limit: str | None = None


def _draw(seed: int, *shapes, dtype: torch.dtype = F16, device: torch.device | str = DEVICE) -> list[torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(s, generator=gen, device=device).to(dtype) for s in shapes]


def _qkv(q_shape, kv_shape=None, v_shape=None, dtype=F16, **kwargs):
    """Inputs of the given shapes (k's for v unless given), fresh normals, and the call's keyword arguments."""
    kv_shape = q_shape if kv_shape is None else kv_shape
    return lambda seed: (*_draw(seed, q_shape, kv_shape, v_shape or kv_shape, dtype=dtype), kwargs)


def _changed(make: Callable, q=lambda t: t, k=lambda t: t, v=lambda t: t):
    """`make`'s inputs with q, k and v transformed (another dtype, device or layout)."""
    def inputs(seed):
        q0, k0, v0, kwargs = make(seed)
        return q(q0), k(k0), v(v0), kwargs
    return inputs


_OTHER_DEVICE = "cpu" if ON_GPU else "meta"
_WIDE = torch.bfloat16 if ON_GPU else F32  # 133120 overflows float16
_HEAD_DIM = r"head_dim|head size"
SDPA_CALLS = [
    # PyTorch refuses these: so must we, naming the argument
    SdpaCall("dtypes-differ", r"\bk\.dtype|\bkey\b", _changed(_qkv((1, 4, 8, 16)), q=lambda t: t.float())),
    SdpaCall("devices-differ", r"\bk\b.*device|\bkey\b", _changed(_qkv((1, 4, 8, 16)), k=lambda t: t.to(_OTHER_DEVICE),
                                                                  v=lambda t: t.to(_OTHER_DEVICE))),
    SdpaCall("query-1-dimensional", r"\bquery\b", _qkv((16,), (1, 16))),
    SdpaCall("ranks-differ", r"\bquery\b", _qkv((1, 4, 8, 16), (4, 8, 16))),
    SdpaCall("head-dims-of-q-and-k-differ", r"\bk's head_dim|\bk and v\b|\bkey\b",
             _qkv((1, 4, 8, 16), (1, 4, 8, 32), (1, 4, 8, 16))),
    SdpaCall("k-and-v-lengths-differ", r"\bk and v\b|\bkey\b|\bvalue\b",
             _qkv((1, 4, 8, 16), (1, 4, 8, 16), (1, 4, 9, 16))),
    SdpaCall("gqa-heads-do-not-divide", r"\bk's heads\b|\bkey\b", _qkv((1, 4, 8, 16), (1, 3, 8, 16), enable_gqa=True)),
    SdpaCall("gqa-without-enable-gqa", r"enable_gqa", _qkv((1, 8, 8, 16), (1, 4, 8, 16))),
    SdpaCall("integer-dtype", r"\bq\.dtype|\bquery\b", _changed(_qkv((1, 4, 8, 16)), q=lambda t: t.to(torch.int32))),
    SdpaCall("query-not-a-tensor", r"\bquery\b", _changed(_qkv((1, 4, 8, 16)), q=lambda t: t.tolist())),
    # PyTorch computes these; we compute them too or refuse, naming the argument
    SdpaCall("two-dimensional", r"\bquery\b", _qkv((8, 16))),
    SdpaCall("three-dimensional-head-dim-8", rf"{_HEAD_DIM}|\bquery\b", _qkv((2, 3, 8))),  # ..._fused_inputs_dim_3
    SdpaCall("three-dimensional", r"\bquery\b", _qkv((2, 17, 16))),
    SdpaCall("five-dimensional", r"\bquery\b", _qkv((2, 2, 3, 8, 16))),  # two leading batch dimensions
    SdpaCall("batch-broadcast", r"\bquery\b", _qkv((1, 4, 3, 16), (2, 4, 3, 16))),
    SdpaCall("value-head-dim-differs", r"\bvalue\b", _qkv((1, 4, 8, 16), (1, 4, 8, 16), (1, 4, 8, 32))),
    SdpaCall("dropout", r"dropout_p", _qkv((2, 2, 3, 16), dropout_p=0.2)),
    SdpaCall("bool-mask", r"attn_mask", lambda s: (*_qkv((2, 2, 3, 16))(s)[:3], dict(
        attn_mask=torch.ones(3, 3, dtype=torch.bool, device=DEVICE).tril()))),
    SdpaCall("float-mask", r"attn_mask", lambda s: (*_qkv((2, 2, 3, 16))(s)[:3],
                                                    dict(attn_mask=_draw(s + 1, (2, 2, 3, 3))[0]))),
    SdpaCall("padding-mask-with-causal", r"attn_mask", lambda s: (*_qkv((2, 2, 19, 16))(s)[:3], dict(
        attn_mask=torch.arange(19, device=DEVICE)[None, None, None, :] < torch.tensor([19, 7], device=DEVICE)[:, None,
                                                                                                             None, None],
        is_causal=True))),
    SdpaCall("mask-hiding-rows", r"attn_mask", lambda s: (*_qkv((1, 2, 5, 16), (1, 2, 9, 16))(s)[:3], dict(
        attn_mask=torch.tensor([1, 0, 1, 0, 1], dtype=torch.bool, device=DEVICE)[:, None].expand(5, 9)))),
    SdpaCall("mask-five-dimensional", r"attn_mask", lambda s: (*_qkv((2, 2, 3, 8, 16))(s)[:3],
                                                               dict(attn_mask=_draw(s + 1, (3, 8, 8))[0]))),
    SdpaCall("causal-with-l-not-s", r"is_causal", _qkv((1, 1, 8, 16), (1, 1, 12, 16), is_causal=True)),
    SdpaCall("float64", r"\bq\.dtype|\bquery\b", _qkv((2, 2, 3, 16), dtype=torch.float64)),  # ..._invalid_dtype
    SdpaCall("head-dim-257", _HEAD_DIM, _qkv((2, 2, 3, 257))),  # test_invalid_fused_inputs_head_dim
    SdpaCall("head-dim-9", _HEAD_DIM, _qkv((2, 2, 3, 9))),
    SdpaCall("unaligned-head-dim-5", _HEAD_DIM, _qkv((2, 2, 8, 5))),  # test_unaligned_tensors
    SdpaCall("float32", r"\bquery\b", _qkv((2, 2, 32, 32), dtype=F32)),  # test_flash_fail_fp32, at batch × heads 4
    SdpaCall("gqa-8-on-4", r"\bkey\b", _qkv((2, 8, 33, 64), (2, 4, 33, 64), enable_gqa=True)),
    SdpaCall("scale-gqa-causal", r"\bquery\b", _qkv((1, 4, 20, 32), (1, 2, 20, 32), scale=0.3, enable_gqa=True,
                                                     is_causal=True)),
    # test_invalid_last_dim_stride, at head_dim 16: q's elements overlap, its last stride is 2
    SdpaCall("last-dim-stride-2", r"\bquery\b",
             _changed(_qkv((2, 2, 8, 16)), q=lambda t: t.as_strided(t.shape, (2, 2, 2, 2)))),
    # test_flash_atteention_large_bf16_nan_values (a forward test): scores of 10¹¹, where e^{s − max} must not
    # become NaN. Its gradients meet `DELTA_FROM_OUTPUT` at its worst: one key, dP ≈ 10⁶, and dQ multiplies
    # the rounding of dP − Δ by K = 133120 (about 10³ where PyTorch's dQ is exactly 0)
    SdpaCall("large-values", r"\bquery\b", lambda s: (*(torch.full((1, 1, 1, 64), 133120.0, device=DEVICE, dtype=_WIDE)
                                                        for _ in "qkv"), {}), gradient_limit=DELTA_FROM_OUTPUT),
]


def _as_bhld(t: torch.Tensor) -> torch.Tensor:
    """SDPA's (..., H, L, E) as (B, H, L, E), its (N, L, E) as one head: how ours and PyTorch's math read them."""
    return t.unsqueeze(1) if t.dim() == 3 else t.reshape(-1, *t.shape[-3:])


def _pytorch_same_dtype(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, attn_mask=None, **_):
    """`torch_attention_same_dtype` with SDPA's arguments and shapes (top-left causal mask, as SDPA's);
    with attn_mask, `torch_variant_attention_same_dtype` (SDPA computes is_causal with a mask only where L = S,
    where both alignments agree)."""
    if attn_mask is None:
        o = torch_attention_same_dtype(_as_bhld(q), _as_bhld(k), _as_bhld(v), is_causal, scale, alignment="top-left")
    else:
        mask = _as_bhld(attn_mask.expand(*q.shape[:-1], k.shape[-2]))
        o = torch_variant_attention_same_dtype(_as_bhld(q), _as_bhld(k), _as_bhld(v), scale, causal=is_causal,
                                               attn_mask=mask)
    return o.reshape(*q.shape[:-1], v.shape[-1])


def _cpu_float64(kwargs: dict) -> Callable:
    """PyTorch's SDPA in float64 on the CPU (the exact answer), on tensors given on any device (a float
    attn_mask in float64 too, as PyTorch wants it)."""
    mask = kwargs.get("attn_mask")
    if mask is not None:
        mask = mask.cpu() if mask.dtype == torch.bool else mask.cpu().double()
        kwargs = dict(kwargs, attn_mask=mask)
    return lambda *t: F.scaled_dot_product_attention(*(x.cpu() for x in t), **kwargs).to(t[0].device)


@pytest.mark.parametrize("call", SDPA_CALLS, ids=lambda c: c.id)
def test_sdpa_refuses_naming_the_argument_or_computes_what_pytorch_computes(call: SdpaCall):
    seed = fresh_seed()
    q, k, v, kwargs = call.inputs(seed)
    try:
        ours = scaled_dot_product_attention(q, k, v, **kwargs)
    except (ValueError, TypeError, RuntimeError) as error:
        assert re.search(call.names, str(error)), f"the error does not name {call.names!r}: {error}"
        return
    cpu = [t.detach().cpu() for t in (q, k, v)]
    try:  # PyTorch on the CPU, its mask there too
        want = F.scaled_dot_product_attention(*cpu, **{name: value.cpu() if isinstance(value, torch.Tensor) else value
                                                         for name, value in kwargs.items()})
    except RuntimeError as error:
        pytest.fail(f"computed what PyTorch refuses ({error}); seed={seed}")
    assert ours.shape == want.shape and ours.dtype == want.dtype and ours.device == q.device, \
        f"{tuple(ours.shape)} {ours.dtype} {ours.device}, PyTorch: {tuple(want.shape)} {want.dtype}; seed={seed}"
    _check_against_peers(lambda *t: scaled_dot_product_attention(*t, **kwargs), _cpu_float64(kwargs),
                         lambda *t: _pytorch_same_dtype(*t, **kwargs), q, k, v, _upstream(want.shape, q.dtype, seed),
                         seed, gradient_limit=call.gradient_limit)


# PyTorch's test_invalid_sequence_lengths (its (2, 2, 0, 8) at head_dim 16, which our kernels run), the other
# length 0, both, and an empty batch. PyTorch's answer, on the CPU: an empty output with no query; zeros with
# no key (an empty sum over keys, as our reference's rows that see no key); the gradients zero
ZERO_LENGTHS = {"no-query": ((2, 2, 0, 16), (2, 2, 5, 16)), "no-key": ((2, 2, 5, 16), (2, 2, 0, 16)),
                "neither": ((2, 2, 0, 16), (2, 2, 0, 16)), "empty-batch": ((0, 2, 5, 16), (0, 2, 5, 16))}


@pytest.mark.parametrize("lengths", list(ZERO_LENGTHS.values()), ids=list(ZERO_LENGTHS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("api", ["flash_attention", "scaled_dot_product_attention"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_zero_length_sequences_give_pytorchs_answer(lengths, causal: bool, api: str, dtype: torch.dtype):
    seed = fresh_seed()
    q, k, v = _draw(seed, lengths[0], lengths[1], lengths[1], dtype=dtype)
    do = _upstream(q.shape, dtype, seed)
    want = outputs_and_gradients(lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal),
                                 *(t.cpu() for t in (q, k, v, do)))
    if api == "flash_attention":  # its bottom-right mask gives PyTorch's top-left answer when L or S is 0
        ours = outputs_and_gradients(lambda *t: flash_attention(*t, causal), q, k, v, do)
    else:
        try:
            ours = outputs_and_gradients(lambda *t: scaled_dot_product_attention(*t, is_causal=causal), q, k, v, do)
        except ValueError as error:  # is_causal with L ≠ S: refused, as for every length
            assert causal and q.shape[2] != k.shape[2] and "is_causal" in str(error), f"{error}; seed={seed}"
            return
    for name, got, expected in zip(("out", "dq", "dk", "dv"), ours, want):
        assert got is not None and got.shape == expected.shape and got.dtype == expected.dtype, \
            f"{name}: {None if got is None else (tuple(got.shape), got.dtype)}, PyTorch: {tuple(expected.shape)}"
        assert torch.equal(got.cpu(), expected), f"{name}: not PyTorch's answer (zeros or empty); seed={seed}"
