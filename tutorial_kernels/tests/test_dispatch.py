"""Which kernel runs a call (`tutorial_kernels.dispatch`): the rules, pins and exclusions as
`torch.nn.attention.sdpa_kernel` has them, a backward that keeps its forward's pins, and `explain`."""

from __future__ import annotations

import pytest
import torch

import tutorial_kernels
from tutorial_kernels import attention_kernels, explain, flash_attention
from tutorial_kernels.dispatch import (KERNELS, NoAllowedKernel, allowed_kernels, backward_kernel_for, kernel_for,
                                       pins_as_text, pins_from_text)
from tutorial_kernels.reference import reference_attention
from tutorial_kernels.testing import ON_GPU, assert_close, default_device


def _qkv(n=24, d=16, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, n, d, generator=g).to(default_device(), dtype).requires_grad_(grad) for _ in range(3)]


def test_pins_take_names_or_lists_and_an_inner_block_replaces_the_outer_one():
    """As torch.nn.attention.sdpa_kernel: kernels as names or one list, exclude as a name or a list, and an
    inner block's choice replaces the outer's for its calls (no intersection) until it ends."""
    assert allowed_kernels() is None
    with attention_kernels("hopper", "triton-tuned"):
        assert allowed_kernels() == {"hopper", "triton-tuned"}
        with attention_kernels(exclude="hopper"):
            assert allowed_kernels() == {"triton-tuned", "triton-interpreter"}  # replaced, not narrowed
        with attention_kernels(["triton-interpreter"]):
            assert allowed_kernels() == {"triton-interpreter"}
        assert allowed_kernels() == {"hopper", "triton-tuned"}
    with attention_kernels(("hopper", "triton-tuned"), exclude=["hopper"]):
        assert allowed_kernels() == {"triton-tuned"}
    assert allowed_kernels() is None


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown kernel 'flash' in kernels; the kernels are hopper, triton-tuned"):
        with attention_kernels("flash"):
            pass
    with pytest.raises(ValueError, match="unknown kernel 'cudnn' in exclude"):
        with attention_kernels(exclude=["cudnn"]):
            pass
    with pytest.raises(ValueError, match="unknown kernel 'h' in exclude"):
        with attention_kernels(exclude="h"):
            pass
    with pytest.raises(TypeError, match="exclude must be a kernel's name or a list of names, got int 5"):
        with attention_kernels(exclude=5):
            pass


def test_pins_round_trip_through_an_operators_argument():
    for allowed in (None, frozenset(), frozenset({"hopper"}), frozenset(KERNELS)):
        assert pins_from_text(pins_as_text(allowed)) == allowed


@pytest.mark.cpu("the interpreter is the only kernel on the CPU")
def test_a_call_no_allowed_kernel_runs_says_why_each_cannot():
    q, k, v = _qkv()
    with attention_kernels(exclude=("triton-interpreter",)):
        with pytest.raises(NoAllowedKernel, match="no allowed kernel runs this forward .*hopper needs a CUDA GPU, "
                                                  "got the CPU.*triton-interpreter excluded by attention_kernels"):
            flash_attention(q, k, v, causal=True)
    assert torch.equal(flash_attention(q, k, v, causal=True), flash_attention(q, k, v, causal=True))  # after the block


@pytest.mark.cpu("the interpreter is the only kernel on the CPU")
def test_a_remembered_decision_holds_only_under_its_own_pins():
    """The front door remembers a call's kernel by the call's signature: a call repeated inside a block that
    excludes that kernel must not reuse it."""
    q, k, v = _qkv(seed=1)
    flash_attention(q, k, v)  # remembered outside any block
    with attention_kernels(exclude=("triton-interpreter",)):
        with pytest.raises(RuntimeError, match="no allowed kernel"):
            flash_attention(q, k, v)


@pytest.mark.cpu("the interpreter is the only kernel on the CPU")
def test_the_backward_keeps_the_pins_its_forward_ran_under():
    q, k, v = _qkv(grad=True, seed=2)
    with attention_kernels("triton-interpreter"):
        o = flash_attention(q, k, v, causal=True)
    with attention_kernels(exclude=("triton-interpreter",)):  # would refuse a call made here
        o.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.cpu("the interpreter is the only kernel on the CPU")
def test_a_compiled_backward_keeps_the_pins_its_forward_was_traced_under():
    """Under torch.compile the operators carry the pins of the block they were traced in: the backward,
    run after the block has ended and inside one that would refuse it, still runs (before, it read the
    pins at run time and raised)."""
    torch._dynamo.reset()
    q, k, v = _qkv(grad=True, seed=4)
    compiled = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True), backend="aot_eager", fullgraph=True)
    with attention_kernels("triton-interpreter"):
        o = compiled(q, k, v)
    with attention_kernels(exclude="triton-interpreter"):
        o.sum().backward()
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    flash_attention(q, k, v, causal=True).sum().backward()
    for got, expected in zip(want, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, expected)


def test_explain_names_the_kernels_and_why_the_others_do_not_run():
    q, k, v = _qkv(grad=True)
    text = explain(q, k, v, causal=True)
    forward, backward = kernel_for(q, k, v, True), backward_kernel_for(q, k, v, q, True)
    assert text.splitlines()[0].startswith(f"forward: {forward} — ")
    assert f"backward: {backward} — " in text
    assert "\nbackward: " not in explain(q.detach(), k.detach(), v.detach(), causal=True)
    if not ON_GPU:
        assert "  hopper: needs a CUDA GPU, got the CPU" in text
    with attention_kernels(exclude=("hopper",)):
        assert "  hopper: " in explain(q, k, v, causal=True)
    with pytest.raises(ValueError, match="head_dim"):
        explain(*(t[..., :8] for t in (q, k, v)))  # what the call refuses, explain refuses
    with torch.no_grad():  # as autograd: no backward without grad mode
        assert "\nbackward: " not in explain(q, k, v, causal=True)
    windowed = explain(q, k, v, causal=True, window_size=(5, 0))
    if kernel_for(q, k, v, True) == "hopper":
        assert windowed.startswith("forward: hopper — ") and "with the window's tile bounds" in windowed
    else:
        assert windowed.startswith("forward: chapter 9's Triton kernels with the window's tile bounds (hopper: ")
    assert "\nbackward: " in windowed
    with pytest.raises(ValueError, match="window_size"):
        explain(q, k, v, window_size=(5,))


@pytest.mark.gpu("pinning the Hopper kernels away")
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                    reason="chapter 7's kernels run on Hopper only")
def test_excluding_hopper_runs_chapter_5_and_6_where_hopper_would_run():
    q, k, v = _qkv(n=4096, d=128, dtype=torch.bfloat16, grad=True, seed=3)
    assert kernel_for(q, k, v, True) == "hopper" and backward_kernel_for(q, k, v, q, True) == "hopper"
    with attention_kernels(exclude=("hopper",)):
        assert kernel_for(q, k, v, True) == "triton-tuned" and backward_kernel_for(q, k, v, q, True) == "triton-tuned"
        assert "  hopper: excluded by attention_kernels" in explain(q, k, v, causal=True)
        o = flash_attention(q, k, v, causal=True)
    o.backward(torch.ones_like(o))  # outside the block: still chapter 6's backward (the forward's pins)
    want = reference_attention(q.detach(), k.detach(), v.detach(), causal=True)
    assert_close(o.detach(), want, torch.bfloat16, seed=3)
    with attention_kernels("hopper"):
        with pytest.raises(RuntimeError, match="hopper was measured faster .* from 1024 keys"):
            flash_attention(*(t[:, :, :64] for t in (q, k, v)), causal=True)


def test_the_package_exports_them():
    assert tutorial_kernels.explain is explain and tutorial_kernels.attention_kernels is attention_kernels


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_front_door_call_validates_its_inputs_once(grad):
    """The front door checks a call's inputs (naming the argument on failure) and the chapter's launcher it calls
    does not check them again (`validation.validated_call`); a repeated call reuses what it decided."""
    from tutorial_kernels import validation

    q, k, v = _qkv(n=40, grad=grad, seed=5)
    before = validation.checks_run
    o = flash_attention(q, k, v, causal=True)
    assert validation.checks_run - before == 1
    if grad:  # the backward is a call of its own: its kernels check their inputs once
        before = validation.checks_run
        o.sum().backward()
        assert validation.checks_run - before == 1
    want = reference_attention(*(t.detach() for t in (q, k, v)), causal=True)
    assert_close(o.detach(), want, torch.float32, seed=5)
    with pytest.raises(ValueError, match="head_dim"):  # and a bad call still fails on the first check
        flash_attention(q[..., :8], k[..., :8], v[..., :8])
