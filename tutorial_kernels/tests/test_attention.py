"""The front door (`tutorial_kernels.attention`): dispatch, gradients, PyTorch's SDPA semantics,
out=, bad input, and torch.compile without a graph break.

The forward on every shape of `testing.attention_cases` runs in test_conformance.py (the registry);
this file checks what is particular to the front door.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tutorial_kernels
from tutorial_kernels.attention import backward_kernel_for, flash_attention, kernel_for, scaled_dot_product_attention
from tutorial_kernels.reference import reference_attention
from tutorial_kernels.runtime import default_device
from tutorial_kernels.testing import KERNEL_DTYPES, ON_GPU, assert_close, grad_tolerance, poisoned, random_qkv

# (batch, heads, kv_heads, n_q, n_k, head_dim): N = 1, ragged tiles, d = 80, n_q ≠ n_k both ways with
# rows that see no key (causal, n_q > n_k), grouped- and multi-query attention
GRAD_CASES = [(1, 2, 2, 1, 1, 16), (2, 2, 1, 17, 17, 32), (1, 4, 2, 33, 70, 80), (1, 2, 1, 70, 33, 64)]
if ON_GPU:
    GRAD_CASES += [(2, 8, 2, 257, 300, 128), (1, 4, 4, 300, 257, 256), (2, 4, 1, 1000, 1000, 64)]


def _grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(do)
    return out, q.grad, k.grad, v.grad


def test_the_package_exports_the_front_door():
    assert tutorial_kernels.flash_attention is flash_attention
    assert tutorial_kernels.scaled_dot_product_attention is scaled_dot_product_attention


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: "b{}h{}kv{}-nq{}-nk{}-d{}".format(*c))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_forward_and_gradients_match_the_float64_reference(case, causal, dtype):
    batch, heads, kv_heads, n_q, n_k, d = case
    x = random_qkv(batch, heads, n_q, n_k, d, dtype)
    k, v = x.k[:, :kv_heads], x.v[:, :kv_heads]  # (B, H_kv, n_k, d), strided views
    do = torch.randn(x.q.shape, generator=torch.Generator(x.q.device).manual_seed(x.seed), device=x.q.device).to(dtype)
    out, dq, dk, dv = _grads(lambda q, k, v: flash_attention(q, k, v, causal), x.q, k, v, do)
    ref, rq, rk, rv = _grads(lambda q, k, v: reference_attention(q, k, v, causal), x.q.double(), k.double(),
                             v.double(), do.double())
    assert_close(out.detach(), ref.detach(), dtype, seed=x.seed)
    for name, got, want in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        assert_close(got, want, dtype, seed=x.seed, what=name, bound=grad_tolerance(dtype))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_out_is_written_in_any_dense_layout(causal):
    x = random_qkv(2, 3, 40, 40, 32, torch.float16, layout="bnhd")
    out = poisoned((2, 40, 3, 32), torch.float16, x.q.device).transpose(1, 2)  # the layout o_proj reads
    assert flash_attention(x.q, x.k, x.v, causal, out=out) is out
    assert_close(out, reference_attention(x.q, x.k, x.v, causal), torch.float16, seed=x.seed)


def test_out_refuses_autograd_as_pytorch_does():
    x = random_qkv(1, 2, 8, 8, 16, torch.float32)
    q = x.q.requires_grad_()
    with pytest.raises(RuntimeError, match="out=.*automatic differentiation"):
        flash_attention(q, x.k, x.v, out=torch.empty_like(q))


@pytest.mark.parametrize("shape", [(2, 3, 21, 16), (21, 16), (2, 2, 3, 21, 16)], ids=["4d", "3d", "5d"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_sdpa_matches_torch(shape, is_causal):
    shape = (2, *shape) if len(shape) == 2 else shape  # (N, L, E)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(shape, generator=gen).to(default_device()) for _ in range(3))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=is_causal)
    got = scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=None)
    assert got.shape == want.shape
    assert_close(got, want, torch.float32, seed=1)


def test_sdpa_grouped_query_and_scale_as_torch():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(shape, generator=gen).to(default_device()) for shape in
               ((1, 4, 30, 32), (1, 2, 45, 32), (1, 2, 45, 32)))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.3, enable_gqa=True)
    assert_close(scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True), want, torch.float32, seed=2)


@pytest.mark.parametrize("call, error, match", [
    (dict(attn_mask=torch.ones(8, 8, dtype=torch.int32)), ValueError, "attn_mask: expected dtype bool, float32"),
    (dict(attn_mask=torch.ones(3, 8, 8, dtype=torch.bool)), ValueError, "attn_mask of shape \\(3, 8, 8\\) does not"),
    (dict(attn_mask=torch.zeros(8, 8, requires_grad=True)), ValueError, "attn_mask: this kernel gives no gradient"),
    (dict(attn_mask="causal"), TypeError, "attn_mask must be a torch.Tensor or None, got str"),
    (dict(dropout_p=0.1), ValueError, "dropout_p: .*got dropout_p=0.1"),
    (dict(is_causal=True, key_len=9), ValueError, "is_causal: PyTorch aligns .* top-left .* L=8, S=9"),
    (dict(kv_heads=1), ValueError, "key: 1 key/value heads for 2 query heads needs enable_gqa=True"),
    (dict(value_dim=32), ValueError, "value: .*head size equal to query's \\(16\\), got 32"),
    (dict(query=torch.randn(8, 16)), ValueError, "query must have at least 3 dimensions"),
    (dict(query=torch.randn(3, 2, 8, 16)), ValueError, "same leading \\(batch\\) dimensions"),
    (dict(query=[1.0]), TypeError, "query must be a torch.Tensor, got list"),
])
def test_sdpa_refuses_what_it_does_not_compute(call, error, match):
    call = dict(call)
    key_len, kv_heads, value_dim = call.pop("key_len", 8), call.pop("kv_heads", 2), call.pop("value_dim", 16)
    query = call.pop("query", torch.randn(1, 2, 8, 16))
    key, value = torch.randn(1, kv_heads, key_len, 16), torch.randn(1, kv_heads, key_len, value_dim)
    on = [t.to(default_device()) if isinstance(t, torch.Tensor) else t for t in (query, key, value)]
    mask = call.get("attn_mask")
    if isinstance(mask, torch.Tensor):  # where the kernels run, so that only the mask is wrong
        call["attn_mask"] = mask.detach().to(default_device()).requires_grad_(mask.requires_grad)
    with pytest.raises(error, match=match):
        scaled_dot_product_attention(*on, **call)


def test_the_cpu_runs_the_interpreter_configuration():
    x = random_qkv(1, 2, 8, 8, 16, torch.float32, device="cpu")
    assert kernel_for(x.q, x.k, x.v, True) == "triton-interpreter"
    assert backward_kernel_for(x.q, x.k, x.v, x.q, True) == "triton-interpreter"


def _block(q, k, v):
    """A small attention block as a model has it: projections around the call."""
    return (scaled_dot_product_attention(q * 1.5, k, v, is_causal=True, enable_gqa=True) + 1).sin()


@pytest.mark.parametrize("backend", ["aot_eager"] + (["inductor"] if ON_GPU else []))
def test_torch_compile_runs_through_without_a_graph_break(backend):
    """fullgraph=True makes any graph break an error; forward and gradients equal the eager call's."""
    torch._dynamo.reset()
    x = random_qkv(1, 4, 33, 33, 32, torch.float32)
    k, v = x.k[:, :2], x.v[:, :2]
    compiled = torch.compile(_block, fullgraph=True, backend=backend)
    out, dq, dk, dv = _grads(compiled, x.q, k, v, torch.ones_like(x.q))
    ref, rq, rk, rv = _grads(_block, x.q, k, v, torch.ones_like(x.q))
    for name, got, want in (("out", out, ref), ("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        torch.testing.assert_close(got, want, msg=lambda m: f"{name}: {m}; seed={x.seed}")
    with torch.no_grad():  # the inference operator, which writes into its out buffer
        torch.testing.assert_close(compiled(x.q, k, v), _block(x.q, k, v))


def test_the_operators_pass_torch_library_opcheck():
    """Schema, fake (meta) implementations and autograd registration, as torch.library checks them."""
    from tutorial_kernels.attention import _attention_fwd, _attention_into  # noqa: PLC2701 (the ops under test)

    x = random_qkv(1, 2, 9, 12, 16, torch.float32)
    q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
    torch.library.opcheck(_attention_fwd, (q, k, v, True, 0.25, ""))
    torch.library.opcheck(_attention_into, (x.q, x.k, x.v, torch.empty_like(x.q), False, 0.25, ""))


@pytest.mark.gpu("the Hopper kernel")
def test_hopper_takes_the_gluon_kernels_where_they_win():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper GPU (compute capability 9.x)")
    x = random_qkv(1, 8, 4096, 4096, 128, torch.bfloat16)
    assert kernel_for(x.q, x.k, x.v, True) == "hopper"
    columns_apart = torch.empty(1, 8, 128, 4096, dtype=torch.bfloat16, device=x.q.device).transpose(2, 3)
    assert kernel_for(x.q, x.k, x.v, True, out=columns_apart) == "triton-tuned"
    assert backward_kernel_for(x.q, x.k, x.v, x.q, False) == "hopper"
    assert backward_kernel_for(x.q, x.k, x.v, x.q, True) == "hopper"
    narrow = random_qkv(1, 8, 4096, 4096, 64, torch.bfloat16)
    assert backward_kernel_for(narrow.q, narrow.k, narrow.v, narrow.q, True) == "hopper"  # d = 64 as well
    short = random_qkv(1, 8, 1024, 1024, 128, torch.bfloat16)
    assert backward_kernel_for(short.q, short.k, short.v, short.q, True) == "triton-tuned"  # no rule takes 1024
    mid, mid_narrow = (random_qkv(1, 8, 2048, 2048, d, torch.bfloat16) for d in (128, 64))
    assert backward_kernel_for(mid.q, mid.k, mid.v, mid.q, True) == "hopper"  # ahead at 2048 at d = 128
    assert backward_kernel_for(mid_narrow.q, mid_narrow.k, mid_narrow.v, mid_narrow.q, False) == "hopper"
    assert backward_kernel_for(mid_narrow.q, mid_narrow.k, mid_narrow.v, mid_narrow.q, True) == "triton-tuned"
    torch.use_deterministic_algorithms(True)
    try:
        assert backward_kernel_for(x.q, x.k, x.v, x.q, False) == "triton-tuned"  # dQ's atomics: no fixed order
    finally:
        torch.use_deterministic_algorithms(False)
    assert_close(flash_attention(x.q, x.k, x.v, True), reference_attention(x.q, x.k, x.v, True), torch.bfloat16,
                 seed=x.seed)


# --- what the peers' suites found (issue: flash-attn's and PyTorch's test cases) ------------------------


def _model_layout_qkv(batch, n, heads, head_dim, dtype, seed=0):
    """q, k, v as a model makes them: one projection, viewed (B, N, H, d), transposed to (B, H, N, d)."""
    gen = torch.Generator(device=default_device()).manual_seed(seed)
    x = torch.randn(batch, n, heads * head_dim, generator=gen, device=default_device()).to(dtype)
    w = (torch.randn(3, heads * head_dim, heads * head_dim, generator=gen, device=default_device())
         / (heads * head_dim) ** 0.5).to(dtype)
    return [(x @ w[i]).view(batch, n, heads, head_dim).transpose(1, 2).detach().requires_grad_() for i in range(3)]


@pytest.mark.parametrize("backend", ["aot_eager"] + (["inductor"] if ON_GPU else []))
def test_torch_compile_trains_on_a_models_transposed_projections(backend):
    """fullgraph=True with gradients, q, k, v (B, N, H, d) memory seen as (B, H, N, d): the fake
    implementations' strides must be the real kernels' (they were not: the backward failed to compile)."""
    torch._dynamo.reset()
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    n = 300 if ON_GPU else 40
    q, k, v = _model_layout_qkv(2, n, 4, 64 if ON_GPU else 16, dtype)
    compiled = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True), fullgraph=True, backend=backend)
    compiled(q, k, v).float().square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    flash_attention(q, k, v, causal=True).float().square().sum().backward()
    for name, got, t in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, msg=lambda m: f"{name}: {m}")


def test_the_backward_operator_passes_opcheck_on_transposed_inputs():
    """The gradients' fake strides, checked by torch.library on (B, N, H, d) views, GQA included."""
    from tutorial_kernels.attention import _attention_bwd, _attention_fwd  # noqa: PLC2701 (the ops under test)

    x = random_qkv(2, 4, 9, 12, 16, torch.float32, layout="bnhd")
    q, k, v = x.q, x.k[:, :2], x.v[:, :2]
    o, lse = _attention_fwd(q, k, v, False, 0.25, "")
    do = torch.randn_like(q).transpose(2, 3).contiguous().transpose(2, 3)  # dO in yet another layout
    for causal in (False, True):
        torch.library.opcheck(_attention_fwd, (q, k, v, causal, 0.25, ""))
        torch.library.opcheck(_attention_bwd, (do, q, k, v, o, lse, causal, 0.25, ""))


def test_eager_training_matches_the_operators_and_leaves_torchs_compiler_unimported():
    """Eagerly the front door trains through an autograd.Function around the operators' bodies: the
    same outputs and gradients, bit for bit, as the operators under autograd, and — in a fresh process
    — no import of torch._dynamo, which an operator's first call costs (seconds on a new machine)."""
    import subprocess
    import sys

    from tutorial_kernels.attention import _attention_fwd  # noqa: PLC2701 (the operator compared with)

    x = random_qkv(2, 4, 37, 21, 16, torch.float32, layout="bnhd")
    q, k, v = x.q, x.k[:, :2], x.v[:, :2]
    do = torch.randn_like(q)
    eager = _grads(lambda q, k, v: flash_attention(q, k, v, True, 0.25), q, k, v, do)
    operator = _grads(lambda q, k, v: _attention_fwd(q, k, v, True, 0.25, "")[0], q, k, v, do)
    for name, got, want in zip(("out", "dq", "dk", "dv"), eager, operator):
        assert torch.equal(got, want), f"{name}: the eager path differs from the operator; seed={x.seed}"
    script = ("import sys, torch, tutorial_kernels\n"
              f"q = torch.randn(1, 2, 20, 16, device='{q.device.type}', requires_grad=True)\n"
              "tutorial_kernels.flash_attention(q, q, q, True).sum().backward()\n"
              "assert torch.isfinite(q.grad).all()\n"
              "print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    assert done.stdout.split()[-1] == "False", "a first eager training call imported torch._dynamo"


def test_fake_tensors_see_the_operators_fake_shapes():
    """Under FakeTensorMode (what torch.compile and export trace with) no kernel runs: the operators'
    fake implementations give the shapes, for inference and training alike."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    device = default_device()
    with FakeTensorMode():
        q = torch.empty(2, 4, 33, 16, device=device)
        k, v = (torch.empty(2, 2, 40, 16, device=device) for _ in "kv")
        assert flash_attention(q, k, v, True).shape == (2, 4, 33, 16)
        q.requires_grad_()
        o = flash_attention(q, k, v, True)
        o.sum().backward()
        assert o.shape == q.shape and q.grad.shape == q.shape


@pytest.mark.parametrize("n_q, n_k", [(0, 5), (5, 0), (0, 0)], ids=["no-query", "no-key", "neither"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_empty_sequences_give_pytorchs_answer(n_q, n_k, causal):
    """A sequence of length 0: an empty output (no query) or zeros (no key), with zero gradients, as
    torch's SDPA returns; `out=` is written (zeros) or left empty."""
    x = random_qkv(2, 2, max(n_q, 1), max(n_k, 1), 16, torch.float32)
    q, k, v = (t[:, :, :n].detach().requires_grad_() for t, n in ((x.q, n_q), (x.k, n_k), (x.v, n_k)))
    o = flash_attention(q, k, v, causal)
    want = F.scaled_dot_product_attention(q.detach().cpu(), k.detach().cpu(), v.detach().cpu())
    assert o.shape == (2, 2, n_q, 16) and torch.equal(o.detach().cpu(), want)
    o.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()
    out = poisoned((2, 2, n_q, 16), torch.float32, q.device)
    assert flash_attention(q.detach(), k.detach(), v.detach(), causal, out=out) is out and not out.any()
    got = scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=causal and n_q == n_k)
    assert got.shape == want.shape and torch.equal(got.cpu(), want)


def test_an_empty_batch_gives_an_empty_output():
    x = random_qkv(1, 2, 5, 5, 16, torch.float32)
    q, k, v = (t[:0] for t in (x.q, x.k, x.v))
    assert flash_attention(q, k, v, True).shape == (0, 2, 5, 16)
    assert scaled_dot_product_attention(q, k, v).shape == (0, 2, 5, 16)


def test_more_programs_than_a_grid_axis_holds_run_in_slices(monkeypatch):
    """batch × heads past CUDA's 65535 programs on grid axis 1 runs as slices that fit: the same
    numbers, bit for bit, as one launch (here with the limit lowered to 4 and to 2, so that the batch
    and then the heads, in whole groups, are sliced)."""
    import tutorial_kernels.attention as front

    x = random_qkv(3, 4, 20, 20, 16, torch.float32)
    q, k, v = x.q, x.k[:, :2], x.v[:, :2]  # grouped-query: 2 query heads per key/value head
    do = torch.randn_like(q)
    whole = _grads(lambda q, k, v: flash_attention(q, k, v, True), q, k, v, do)
    with torch.no_grad():
        whole_out = flash_attention(q, k, v, True)
    widest = []  # batch × heads of every launch, inference (_launch) and training (_train_forward) alike
    launch, train = front._launch, front._train_forward
    monkeypatch.setattr(front, "_launch", lambda kernel, q, *a: (widest.append(q.shape[0] * q.shape[1]),
                                                                 launch(kernel, q, *a))[1])
    monkeypatch.setattr(front, "_train_forward", lambda q, *a: (widest.append(q.shape[0] * q.shape[1]),
                                                                train(q, *a))[1])
    for limit in (4, 2):
        monkeypatch.setattr(front, "MAX_GRID_Y", limit)
        front._DECISIONS.clear()  # the unsliced calls' remembered decisions were made under the old limit
        sliced = _grads(lambda q, k, v: flash_attention(q, k, v, True), q, k, v, do)
        for name, got, want in zip(("out", "dq", "dk", "dv"), sliced, whole):
            assert torch.equal(got, want), f"{name} differs when sliced at {limit}; seed={x.seed}"
        out = poisoned(tuple(q.shape), q.dtype, q.device)
        with torch.no_grad():
            assert flash_attention(q, k, v, True, out=out) is out and torch.equal(out, whole_out)
        assert widest and max(widest) <= limit, widest
        widest.clear()


@pytest.mark.gpu("a grid past 65535 programs")
def test_pytorchs_largest_batch_runs():
    """PyTorch's own test: batch 65536 × 2 heads, more programs than grid axis 1 holds."""
    x = random_qkv(65536, 2, 8, 8, 16, torch.float16)
    o = flash_attention(x.q, x.k, x.v)
    torch.cuda.synchronize()
    assert_close(o[-3:], reference_attention(x.q[-3:], x.k[-3:], x.v[-3:]), torch.float16, seed=x.seed)
    assert_close(o[:3], reference_attention(x.q[:3], x.k[:3], x.v[:3]), torch.float16, seed=x.seed)


def _compiled(kernel) -> int:
    """How many binaries Triton holds for a @triton.jit function (every device)."""
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


@pytest.mark.gpu("compiling the backward ahead")
@pytest.mark.parametrize("layout, head_dim", [("bhnd", 48), ("bnhd", 56)])
def test_the_training_forward_compiles_the_backward_the_gradients_run(layout, head_dim):
    """A training forward at a new shape starts compiling the backward's kernels, and compiles exactly
    what the backward then launches: after the forward the backward compiles nothing more. Then the
    same at lengths in the same bucket that Triton specialises apart (multiples of 16). Head
    dimensions no other test uses, at n ≈ 5000 (bucket 8192), keep the tiles new in the process."""
    from tutorial_kernels import ch06_backward as c6

    kernels = (c6._attn_bwd_preprocess_kernel, c6._attn_bwd_dkdv_kernel, c6._attn_bwd_dq_kernel)
    for n_q, n_k in ((5000, 4100), (4800, 4096)):
        x = random_qkv(1, 4, n_q, n_k, head_dim, torch.float16, "cuda", layout=layout)
        q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k[:, :2], x.v[:, :2]))
        assert backward_kernel_for(q, k, v, q, True) == "triton-tuned"
        for kernel in kernels:  # another test may have compiled the same binaries: forget them (the
            kernel.device_caches.clear()  # disk cache gives them back fast)
        out = flash_attention(q, k, v, causal=True)
        for future in list(c6._PENDING.values()):
            future.result()
        assert [_compiled(kernel) for kernel in kernels] == [1, 1, 1], "the forward compiled no backward ahead"
        out.backward(torch.randn_like(out))
        assert [_compiled(kernel) for kernel in kernels] == [1, 1, 1], f"the backward compiled again at {n_q, n_k}"
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.gpu("compiling the backward ahead")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_new_length_in_a_compiled_bucket_compiles_nothing(causal):
    """The forward's lengths are not compiled in (its kernels say do_not_specialize): after one call in a
    length bucket, calls at other lengths of that bucket — a multiple of 16, an odd one — compile no
    forward kernel, Triton's or Hopper's. (The backward's kernels keep Triton's specialisation, which
    measured faster; the training forward compiles them ahead. At head_dim 64 every length leaves the
    strides' divisibility by 16, which Triton does compile in, unchanged.)"""
    from tutorial_kernels import ch05_flash_v2 as c5
    from tutorial_kernels import ch07_hopper as c7

    kernels = (c5._flash_v2_fwd_kernel, c7._flash_hopper_fwd)
    counts = []
    for n in (1000, 1024, 1008, 1017):
        x = random_qkv(2, 4, n, n, 64, torch.bfloat16, "cuda")
        q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
        out = flash_attention(q, k, v, causal=causal)
        with torch.no_grad():
            flash_attention(q, k, v, causal=causal)  # inference: the forward without the log-sum-exp
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
        counts.append([_compiled(kernel) for kernel in kernels])
    assert all(c == counts[0] for c in counts), f"forward binaries per kernel after n = 1000, 1024, 1008, 1017: {counts}"


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_return_lse_gives_each_rows_log_sum_exp(causal, training):
    """flash-attn's softmax_lse: log Σ_j e^{S_ij} per row against float64 (−∞ for a row that sees no key,
    causal with n_q > n_k), the output unchanged, no gradient through the lse; with out= and the variants."""
    from tutorial_kernels.reference import reference_log_sum_exp, reference_scores

    x = random_qkv(2, 4, 37, 29, 32, torch.float32)
    x_q, x_k, x_v = x.q, x.k[:, :2], x.v[:, :2]  # grouped-query: 2 key/value heads, strided views
    q, k, v = (t.clone().requires_grad_(training) for t in (x_q, x_k, x_v))
    o, lse = flash_attention(q, k, v, causal, return_lse=True)
    expected = reference_log_sum_exp(reference_scores(x_q, x_k, causal))
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 37) and not lse.requires_grad
    assert torch.equal(torch.isinf(lse), torch.isinf(expected)), f"seed={x.seed}"
    seen = torch.isfinite(expected)
    torch.testing.assert_close(lse.double()[seen], expected[seen], atol=1e-4, rtol=1e-5, msg=lambda m: f"{m}; seed={x.seed}")
    assert_close(o.detach(), reference_attention(x_q, x_k, x_v, causal), torch.float32, seed=x.seed)
    if training:
        o.sum().backward()
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    else:
        out = poisoned((2, 4, 37, 32), torch.float32, q.device)
        o2, lse2 = flash_attention(x_q, x_k, x_v, causal, out=out, return_lse=True)
        assert o2 is out and torch.equal(lse2, lse)
    _, lse_window = flash_attention(x_q, x_k, x_v, causal, window_size=(500, 500), return_lse=True)
    torch.testing.assert_close(lse_window, lse, atol=1e-4, rtol=1e-5)  # a window wider than the sequence: no change
