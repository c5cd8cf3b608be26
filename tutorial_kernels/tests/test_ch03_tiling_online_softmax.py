"""Chapter 3: tiled matmul (pointer tiles and tensor descriptors), softmax three ways, the online update.

`online_softmax_attention` itself (every shape, dtype, layout, scale, rows that see no key, bad input)
is checked by `test_conformance.py`, like every attention implementation."""

import math

import pytest
import torch

from tutorial_kernels.ch03_tiling_online_softmax import (
    SOFTMAX_BLOCK,
    matmul,
    online_softmax,
    online_softmax_trace,
    three_pass_softmax_rows,
)
from tutorial_kernels.reference import reference_softmax, relative_error
from tutorial_kernels.runtime import default_device
from tutorial_kernels.testing import KERNEL_DTYPES, ON_GPU, assert_close, fresh_seed, poisoned

# The matmul multiplies float32 in TF32 on a GPU (its docstring): TF32's bound, not full float32's.
MATMUL_TF32_BOUND = 5e-3


def _matmul_bound(dtype: torch.dtype) -> float | None:
    return MATMUL_TF32_BOUND if ON_GPU and dtype == torch.float32 else None

DEVICE = default_device()
DTYPES = KERNEL_DTYPES
SOFTMAXES = [three_pass_softmax_rows, online_softmax]


def randn(*shape, dtype=torch.float32, scale=1.0, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


# --- tiled matmul ----------------------------------------------------------------------------

MATMUL_SHAPES = [(1, 1, 1), (17, 33, 65), (64, 64, 64), (100, 257, 31), (128, 80, 256)]
if ON_GPU:
    MATMUL_SHAPES += [(1000, 1000, 1000), (4096, 2048, 1024), (3, 4097, 129)]


@pytest.mark.parametrize("method", ["pointers", "auto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", MATMUL_SHAPES, ids=lambda s: str(s))
def test_matmul_matches_float64(m, n, k, dtype, method):
    seed = fresh_seed()
    a, b = randn(m, k, dtype=dtype, seed=seed), randn(k, n, dtype=dtype, seed=seed + 1)
    c = matmul(a, b, method=method)
    assert_close(c, a.double() @ b.double(), dtype, seed=seed, what="C", bound=_matmul_bound(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", [(17, 40, 64), (100, 256, 32), (64, 72, 200)], ids=lambda s: str(s))
def test_matmul_descriptors_on_ragged_edges(m, n, k, dtype):
    # sizes not multiples of the tile: the descriptor's zero fill and clipped store do the masking
    seed = fresh_seed()
    a, b = randn(m, k, dtype=dtype, seed=seed), randn(k, n, dtype=dtype, seed=seed + 1)
    assert_close(matmul(a, b, method="descriptors"), a.double() @ b.double(), dtype, seed=seed, what="C",
                 bound=_matmul_bound(dtype))


def test_matmul_honours_strides():
    seed = fresh_seed()
    a = randn(48, 70, seed=seed).t()  # (70, 48), column-major
    b = randn(90, 48, seed=seed + 1)[::2].t()  # (48, 45), every other row: strided
    assert_close(matmul(a, b), a.double() @ b.double(), torch.float32, seed=seed, what="C",
                 bound=_matmul_bound(torch.float32))


def test_matmul_rejects_bad_input():
    a = randn(4, 5, seed=0)
    with pytest.raises(ValueError, match=r"a's columns \(5\) must equal b's rows \(4\)"):
        matmul(a, a)
    with pytest.raises(ValueError, match=r"b must be 2-D, got shape \(5,\)"):
        matmul(a, a[0])
    with pytest.raises(TypeError, match=r"b.dtype must equal a.dtype \(torch.float32\), got torch.float16"):
        matmul(a, a.t().half())
    with pytest.raises(TypeError, match=r"a.dtype must be .* got torch.int64"):
        matmul(a.long(), a.t().long())
    with pytest.raises(ValueError, match=r"method='descriptors' needs a and b row-major"):
        matmul(a, a.t(), method="descriptors")  # a has 5-element (20-byte) rows
    with pytest.raises(ValueError, match=r"method must be 'auto', 'descriptors' or 'pointers', got 'fast'"):
        matmul(a, a.t(), method="fast")


# --- softmax three ways ----------------------------------------------------------------------

ROW_LENGTHS = [1, 17, 1000, 65537]


@pytest.mark.parametrize("softmax", SOFTMAXES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("n_cols", ROW_LENGTHS, ids=lambda n: f"cols{n}")
def test_softmax_any_row_length(softmax, n_cols):
    seed = fresh_seed()
    x = randn(3, n_cols, scale=4.0, seed=seed)
    y = softmax(x, out=poisoned(tuple(x.shape), torch.float32, DEVICE))
    assert_close(y, reference_softmax(x), torch.float32, seed=seed, what="softmax")


@pytest.mark.parametrize("softmax", SOFTMAXES, ids=lambda f: f.__name__)
def test_softmax_masked_rows_and_huge_magnitudes(softmax):
    n = 2 * SOFTMAX_BLOCK + 3  # the special values straddle tile boundaries
    x = torch.randn(5, n, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    x[0, ::7] = 1e4  # e^{1e4} overflows unless the max is subtracted
    x[1, :] = -1e4
    x[2, : SOFTMAX_BLOCK + 5] = -math.inf  # the first tiles are fully masked: the running max stays −∞
    x[3, :] = -math.inf  # a query that sees no key
    x[4, SOFTMAX_BLOCK:] = -math.inf  # causal-style: the tail is masked
    y = softmax(x)
    assert torch.isfinite(y).all(), "NaN or inf in the output"
    assert torch.all(y[3] == 0)
    assert relative_error(y, reference_softmax(x)) < 1e-5


@pytest.mark.parametrize("softmax", SOFTMAXES, ids=lambda f: f.__name__)
def test_softmax_fp16_rows(softmax):
    seed = fresh_seed()
    x = randn(4, 3000, dtype=torch.float16, scale=3.0, seed=seed)
    assert_close(softmax(x), reference_softmax(x), torch.float16, seed=seed, what="softmax")


def test_softmax_rejects_bad_input():
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        online_softmax(randn(4, 6, seed=0).t())
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        online_softmax([1.0, 2.0])
    with pytest.raises(ValueError, match=r"x must have at least one non-empty axis"):
        online_softmax(torch.empty(3, 0, device=DEVICE))


# --- the specification of the online update --------------------------------------------------

@pytest.mark.parametrize("block", [1, 3, 8, 64])
def test_online_trace_ends_at_the_exact_softmax(block):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    s, v = torch.randn(37, generator=g) * 3, torch.randn(37, generator=g)
    steps = online_softmax_trace(s, v, block)
    p = reference_softmax(s[None])[0]
    assert steps[-1]["m"] == pytest.approx(s.double().max().item())
    assert steps[-1]["partial"] == pytest.approx((p * v.double()).sum().item(), rel=1e-12)
    assert steps[-1]["l"] == pytest.approx(torch.exp(s.double() - s.double().max()).sum().item(), rel=1e-12)
    assert all(0.0 <= st["alpha"] <= 1.0 for st in steps), "the max only grows, so α ≤ 1"
