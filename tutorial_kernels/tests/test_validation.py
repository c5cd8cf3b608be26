"""Bad input gets a clear ValueError/TypeError naming the argument, the value and what is accepted."""

import pytest
import torch

from tutorial_kernels.ch02_naive_attention import eager_attention, naive_attention
from tutorial_kernels.runtime import INTERPRET_VARIABLE, default_device
from tutorial_kernels.validation import UnsupportedShape

DEVICE = default_device()


def qkv(b=1, h=2, n=8, d=16, n_k=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    n_k = n if n_k is None else n_k
    make = lambda m: torch.randn(b, h, m, d, generator=g).to(DEVICE, dtype)  # noqa: E731
    return make(n), make(n_k), make(n_k)


FUNCTIONS = [naive_attention, eager_attention]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
class TestShapesAndTypes:
    def test_not_a_tensor(self, fn):
        q, k, v = qkv()
        with pytest.raises(TypeError, match=r"q must be a torch.Tensor, got list"):
            fn(q.tolist(), k, v)

    def test_wrong_rank(self, fn):
        q, k, v = qkv()
        with pytest.raises(ValueError, match=r"k must have 4 dimensions .* got 3 with shape \(2, 8, 16\)"):
            fn(q, k[0], v)

    def test_unsupported_dtype(self, fn):
        q, k, v = qkv()
        with pytest.raises(TypeError, match=r"q.dtype must be torch.float16, torch.bfloat16 or torch.float32, got torch.int32"):
            fn(q.to(torch.int32), k, v)

    def test_mixed_dtypes(self, fn):
        q, k, v = qkv()
        with pytest.raises(TypeError, match=r"v.dtype must equal q.dtype \(torch.float32\), got torch.float16"):
            fn(q, k, v.half())

    def test_mixed_devices(self, fn):
        q, k, v = qkv()
        with pytest.raises(ValueError, match=r"k must be on q's device .* got meta"):
            fn(q, k.to("meta"), v)

    def test_k_and_v_shapes_differ(self, fn):
        q, k, v = qkv()
        with pytest.raises(ValueError, match=r"k and v must have the same shape, got k \(1, 2, 8, 16\) and v \(1, 2, 9, 16\)"):
            fn(q, k, torch.cat([v, v[:, :, :1]], dim=2))

    def test_heads_differ(self, fn):
        q, _, _ = qkv()
        _, k, v = qkv(h=3)
        with pytest.raises(ValueError, match=r"k must have q's batch and heads \(1, 2\), got \(1, 3\)"):
            fn(q, k, v)

    def test_head_dims_differ(self, fn):
        q, _, _ = qkv(d=16)
        _, k, v = qkv(d=32)
        with pytest.raises(ValueError, match=r"k's head_dim must equal q's \(16\), got 32"):
            fn(q, k, v)

    def test_empty_sequence(self, fn):
        q, k, v = qkv(n=0)
        with pytest.raises(ValueError, match=r"q's seq length must be at least 1, got 0"):
            fn(q, k, v)

    def test_causal_must_be_bool(self, fn):
        q, k, v = qkv()
        with pytest.raises(TypeError, match=r"causal must be a bool, got int 1"):
            fn(q, k, v, causal=1)

    @pytest.mark.parametrize("scale,error", [("0.1", TypeError), (-1.0, ValueError), (float("nan"), ValueError), (0.0, ValueError)])
    def test_bad_scale(self, fn, scale, error):
        q, k, v = qkv()
        with pytest.raises(error, match=r"sm_scale must be"):
            fn(q, k, v, sm_scale=scale)


@pytest.mark.parametrize("head_dim", [8, 15, 129, 256])
def test_naive_head_dim_out_of_range(head_dim):
    q, k, v = qkv(d=head_dim)
    with pytest.raises(UnsupportedShape, match=rf"head_dim \(q.shape\[3\]\) must be between 16 and 128, got {head_dim}"):
        naive_attention(q, k, v)  # a ValueError, of the kind benchmarks record as "unsupported"


def test_out_buffer_is_checked():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"out must have shape \(1, 2, 8, 16\), got \(1, 2, 8, 8\)"):
        naive_attention(q, k, v, out=torch.empty(1, 2, 8, 8, device=DEVICE))
    with pytest.raises(TypeError, match=r"out.dtype must be torch.float32, got torch.float16"):
        naive_attention(q, k, v, out=torch.empty(1, 2, 8, 16, device=DEVICE, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"out must be contiguous"):
        naive_attention(q, k, v, out=torch.empty(1, 2, 16, 8, device=DEVICE).transpose(2, 3))


@pytest.mark.cpu("the interpreter's behaviour")
def test_cpu_tensors_without_the_interpreter(monkeypatch):
    q, k, v = qkv()
    monkeypatch.setenv(INTERPRET_VARIABLE, "0")
    with pytest.raises(ValueError, match=r"q, k and v: on the CPU but Triton's interpreter is off; move the tensors to a CUDA device, or set TRITON_INTERPRET=1"):
        naive_attention(q, k, v)
    assert eager_attention(q, k, v).shape == q.shape  # plain PyTorch runs anywhere


@pytest.mark.cpu("the interpreter's behaviour")
def test_bf16_under_the_interpreter_is_refused_not_wrong():
    q, k, v = qkv(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"q, k and v: dtype torch.bfloat16 is not supported under Triton's interpreter"):
        naive_attention(q, k, v)


@pytest.mark.gpu("mixed devices")  # needs a GPU to put a tensor on the CPU next to one on the GPU
def test_cpu_and_gpu_mixed():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"must be on q's device"):
        naive_attention(q, k.cpu(), v)


@pytest.mark.parametrize("make,dense", [
    (lambda: torch.empty(2, 3, 4, 5), True),
    (lambda: torch.empty(2, 4, 3, 5).transpose(1, 2), True),  # (B, N, H, d) memory seen as (B, H, N, d)
    (lambda: torch.empty(5, 4, 3, 2).permute(3, 2, 1, 0), True),  # column-major
    (lambda: torch.empty(2, 1, 4, 5).as_strided((2, 1, 4, 5), (20, 999, 5, 1)), True),  # a size-1 dim's stride is free
    (lambda: torch.empty(2, 1, 4, 5).expand(2, 3, 4, 5), False),  # stride 0: every head the same memory
    (lambda: torch.empty(2, 3, 4, 8)[..., :5], False),  # gaps between rows
    (lambda: torch.empty(100).as_strided((2, 3, 4, 5), (20, 5, 5, 1)), False),  # overlapping rows
])
def test_dense_layouts(make, dense):
    from tutorial_kernels.validation import _is_dense

    assert _is_dense(make()) is dense
