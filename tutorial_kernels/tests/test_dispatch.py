"""Which kernel runs a call (`tutorial_kernels.dispatch`): the rules, pins and exclusions as
`torch.nn.attention.sdpa_kernel` has them, a backward that keeps its forward's pins, and `explain`."""

from __future__ import annotations

import pytest
import torch

import tutorial_kernels
from tutorial_kernels import attention_kernels, explain, flash_attention
from tutorial_kernels.dispatch import allowed_kernels, backward_kernel_for, kernel_for
from tutorial_kernels.reference import reference_attention
from tutorial_kernels.testing import ON_GPU, assert_close, default_device


def _qkv(n=24, d=16, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, n, d, generator=g).to(default_device(), dtype).requires_grad_(grad) for _ in range(3)]


def test_pins_nest_narrow_and_end_with_their_block():
    assert allowed_kernels() is None
    with attention_kernels("hopper", "triton-tuned"):
        assert allowed_kernels() == {"hopper", "triton-tuned"}
        with attention_kernels(exclude=("hopper",)):
            assert allowed_kernels() == {"triton-tuned"}  # the inner block narrows the outer one
        assert allowed_kernels() == {"hopper", "triton-tuned"}
    assert allowed_kernels() is None


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown kernel 'flash'; the kernels are hopper, triton-tuned"):
        with attention_kernels("flash"):
            pass
    with pytest.raises(ValueError, match="unknown kernel 'cudnn'"):
        with attention_kernels(exclude=["cudnn"]):
            pass


@pytest.mark.cpu("the interpreter is the only kernel on the CPU")
def test_a_call_no_allowed_kernel_runs_says_why_each_cannot():
    q, k, v = _qkv()
    with attention_kernels(exclude=("triton-interpreter",)):
        with pytest.raises(RuntimeError, match="no allowed kernel runs this forward .*hopper needs a CUDA GPU, got the "
                                               "CPU.*triton-interpreter excluded by attention_kernels"):
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
