"""Chapter 6: the backward pass — gradients against float64 autograd of the one reference.

`flash_attention`'s output and gradients on every shape (head_dim up to 256), dtype, layout, scale,
grouped-/multi-query attention and bad input are checked by `test_conformance.py`, for the teaching
configuration and the default (tuned) call; here, what is particular to the backward."""

import pytest
import torch
import torch.nn.functional as F
import triton

from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse
from tutorial_kernels.ch06_backward import TUNED_DKDV, TUNED_DQ, _backward_config, flash_attention, flash_attn_backward
from tutorial_kernels.reference import reference_attention, reference_log_sum_exp, reference_scores, relative_error
from tutorial_kernels.runtime import default_device, interpreter_active
from tutorial_kernels.testing import Case, grad_tolerance, random_qkv

DEVICE = default_device()


def check_gradients(q, k, v, causal, dtype, seed, sm_scale=None, tuned=False):
    """Gradients of flash_attention vs float64 autograd of reference_attention, for a random dO.

    tuned=False by default: on a GPU every new shape would cost an autotuning pass; the tuned path
    is checked by its own tests below (on the interpreter the two are the same)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flash_attention(q, k, v, causal, sm_scale, tuned=tuned)
    gen = torch.Generator(device=q.device).manual_seed(seed + 1)
    do = torch.randn(out.shape, generator=gen, device=q.device).to(dtype)  # never zeros
    out.backward(do)

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    reference_attention(q64, k64, v64, causal, sm_scale).backward(do.double())

    bound = grad_tolerance(dtype)
    for name, got, ref in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert got.shape == ref.shape and got.dtype == dtype, f"{name}: {got.shape} {got.dtype}"
        nans = torch.isnan(got).sum().item()
        assert nans == 0, f"{name}: {nans} NaN of {got.numel()}; seed={seed}"
        err = relative_error(got, ref)
        assert err <= bound, f"{name}: relative error {err:.3e} > {bound:.1e} for {dtype}; seed={seed}"
    return q.grad, k.grad, v.grad


def test_queries_that_see_no_key_get_zero_gradients():
    # causal with n_q > n_k: query i sees keys j ≤ i − 30, so queries 0 … 29 see none (lse = −∞)
    x = random_qkv(1, 2, 50, 20, 32, torch.float32)
    dq, _, _ = check_gradients(x.q, x.k, x.v, True, torch.float32, x.seed)
    assert torch.all(dq[:, :, :30] == 0), f"seed={x.seed}"
    # query 30 sees one key (P = 1, so dS = dP − Δ = 0 up to rounding); queries 31 … 49 see more
    assert torch.all(dq[:, :, 31:].abs().amax(dim=-1) > 0), f"seed={x.seed}"


def test_full_attention_is_not_masked():
    # triton-lang/triton#4541: a backward that always applies the causal mask gives wrong
    # non-causal gradients. Ours must match the unmasked reference, and differ from the masked one.
    x = random_qkv(1, 2, 64, 64, 32, torch.float32)
    _, dk, _ = check_gradients(x.q, x.k, x.v, False, torch.float32, x.seed)
    k64 = x.k.double().requires_grad_()
    do = torch.randn(x.q.shape, dtype=torch.float64, device=x.q.device)
    reference_attention(x.q.double(), k64, x.v.double(), True).backward(do)
    assert relative_error(dk, k64.grad) > 0.1, "full-attention gradients look causally masked"


def test_trains_like_scaled_dot_product_attention():
    # n_q = n_k, where torch's top-left causal alignment and ours agree
    x = random_qkv(2, 2, 33, 33, 64, torch.float32)
    w = torch.randn(64, device=x.q.device)
    grads = []
    for fn in (flash_attention, lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal)):
        q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
        # a loss, as in training; dO = w expanded to (B, H, N, d): strides (0, 0, 0, 1)
        (fn(q, k, v, True) * w).sum().backward()
        grads.append((q.grad, k.grad, v.grad))
    for mine, theirs in zip(*grads):  # float32: exact on the interpreter, TF32 products on a GPU
        assert relative_error(mine, theirs) < grad_tolerance(torch.float32), f"seed={x.seed}"


def test_gradients_are_deterministic():
    # dQ is written by one program per tile and dK, dV summed in a fixed order: no atomics
    x = random_qkv(1, 4, 70, 70, 32, torch.float16)
    do = torch.randn(x.q.shape, device=x.q.device).to(torch.float16)
    results = []
    for _ in range(2):
        q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k[:, :2], x.v[:, :2]))
        flash_attention(q, k, v, True).backward(do)
        results.append((q.grad, k.grad, v.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_backward_rejects_a_do_unlike_q():
    # flash_attention's arguments are checked by test_conformance.py; do is the backward's own
    x = random_qkv(1, 4, 8, 8, 16, torch.float32)
    with pytest.raises(ValueError, match=r"do must have q's shape"):
        flash_attn_backward(x.q, x.k, x.v, x.q, x.q[..., 0].float(), x.q[:, :2], False)


class _ReferenceForwardKernelBackward(torch.autograd.Function):
    """The float64 reference as the forward, this chapter's kernels as the backward: gradcheck then
    compares the kernels' Jacobian with finite differences of the exact function.

    The kernels themselves cannot run in float64: check_attention_inputs accepts float16, bfloat16
    and float32 only, and their accumulators are float32 (the interpreter computes
    tl.dot(float64, float64, acc=float32) wrongly). So the backward runs in float32, accurate to
    ~1e-7 in the interpreter, well inside gradcheck's tolerances."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        o = reference_attention(q, k, v, causal)
        lse = reference_log_sum_exp(reference_scores(q, k, causal))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        grads = flash_attn_backward(*(t.float() for t in (q, k, v, o, lse, do)), ctx.causal)
        return (*(g.double() for g in grads), None)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_against_finite_differences(causal):
    # tiny: one interpreted backward per output element. GQA (2 query heads, 1 kv head); causal with
    # n_q > n_k leaves query 0 seeing no key.
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, h, n, 16, generator=gen, dtype=torch.float64).to(DEVICE).requires_grad_()
               for h, n in ((2, 3), (1, 2), (1, 2)))
    # on a GPU, tl.dot rounds float32 operands to TF32 (~1e-3): looser there
    tol = dict(atol=1e-6, rtol=1e-4) if interpreter_active() else dict(atol=5e-3, rtol=5e-3)
    assert torch.autograd.gradcheck(
        lambda q, k, v: _ReferenceForwardKernelBackward.apply(q, k, v, causal), (q, k, v), **tol,
    )


@pytest.mark.gpu("long sequences")  # too slow for the interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_sequences_on_gpu(causal, dtype):
    for case in (Case(1, 4, 4096, 4096, 128), Case(1, 2, 2048, 4096, 64)):
        x = random_qkv(case.batch, case.heads, case.n_q, case.n_k, case.head_dim, dtype)
        check_gradients(x.q, x.k, x.v, causal, dtype, x.seed)


# each kernel's candidates, paired with the other kernel's teaching config: the autotuner picks the
# two kernels' configurations independently
BACKWARD_CONFIGS = [("dkdv", c) for c in TUNED_DKDV.configs] + [("dq", c) for c in TUNED_DQ.configs]


@pytest.mark.gpu("autotuning candidates")  # the interpreter has one tuning config, the teaching one's tiles
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel,config", BACKWARD_CONFIGS,
                         ids=[f"{k}{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}w{c.num_warps}s{c.num_stages}"
                              for k, c in BACKWARD_CONFIGS])
def test_every_backward_config(kernel, config, causal, head_dim):
    """Each tuning candidate of both kernels, at ragged n_q ≠ n_k with GQA: the autotuner may pick any."""
    from triton.runtime.errors import OutOfResources

    x = random_qkv(2, 4, 300, 500, head_dim, torch.float16)
    k, v = x.k[:, :2], x.v[:, :2]
    o, lse = flash_attn_v2_with_lse(x.q, k, v, causal)
    do = torch.randn(o.shape, device=o.device).to(torch.float16)
    t = _backward_config(head_dim)
    teaching = triton.Config({"BLOCK_M": t["BLOCK_M"], "BLOCK_N": t["BLOCK_N"]}, num_warps=t["num_warps"],
                             num_stages=t["num_stages"])
    configs = (config, teaching) if kernel == "dkdv" else (teaching, config)
    try:
        grads = flash_attn_backward(x.q, k, v, o, lse, do, causal, tuned=False, configs=configs)
    except OutOfResources as err:  # the autotuner skips such configs too
        pytest.skip(f"does not fit at head_dim {head_dim}: {err}")
    q64, k64, v64 = (t.double().requires_grad_() for t in (x.q, k, v))
    reference_attention(q64, k64, v64, causal).backward(do.double())
    for name, got, ref in zip(("dq", "dk", "dv"), grads, (q64.grad, k64.grad, v64.grad)):
        err = relative_error(got, ref)
        assert err <= grad_tolerance(torch.float16), f"{name}: {err:.2e}; seed={x.seed}"
