"""Chapter 2: the eager PyTorch attention and the three-kernel naive Triton schedule.

The output of `naive_attention` and `eager_attention` on every shape, dtype, layout and bad input is
checked by `test_conformance.py` (both are in `implementations.IMPLEMENTATIONS`); here, each of the
three stages alone, and the eager function against PyTorch's fused SDPA as the ROCm blog checks it."""

import math

import pytest
import torch
import torch.nn.functional as F

from tutorial_kernels.ch02_naive_attention import (
    SOFTMAX_BLOCK,
    attention_scores,
    eager_attention,
    probs_times_values,
    row_softmax,
)
from tutorial_kernels.reference import (
    reference_attention,
    reference_scores,
    reference_softmax,
    relative_error,
)
from tutorial_kernels.runtime import default_device
from tutorial_kernels.testing import ON_GPU, assert_close, fresh_seed, poisoned, random_qkv, tolerance


# --- each stage alone ------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_scores_stage(causal):
    x = random_qkv(2, 2, 100, 70, 80, torch.float32)
    s = attention_scores(x.q, x.k, causal, out=poisoned((2, 2, 100, 70), torch.float32, x.q.device))
    ref = reference_scores(x.q, x.k, causal)
    hidden = torch.isinf(ref)
    assert torch.equal(torch.isinf(s).cpu(), hidden.cpu()), f"masked entries differ; seed={x.seed}"
    assert_close(s[~hidden], ref[~hidden], torch.float32, seed=x.seed, what="S")


@pytest.mark.parametrize(
    "n_cols", [1, 17, 1000, SOFTMAX_BLOCK + 1, 3 * SOFTMAX_BLOCK + 5], ids=lambda n: f"cols{n}"
)
def test_softmax_stage_any_row_length(n_cols):
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    s = (torch.randn(3, n_cols, generator=gen) * 5).to(default_device())
    p = row_softmax(s, out=poisoned(tuple(s.shape), torch.float32, s.device))
    assert_close(p, reference_softmax(s), torch.float32, seed=seed, what="P")


def test_softmax_stage_masked_rows_and_huge_magnitudes():
    s = torch.tensor(
        [
            [1e4, -1e4, 0.0, 3.0],  # would overflow exp() without subtracting the row max
            [-math.inf, 2.0, -math.inf, 2.0],  # causal-style −∞ entries
            [-math.inf] * 4,  # a query that sees no key: zeros, not NaN
            [-1e4, -1e4, -1e4, -1e4],
        ],
        device=default_device(),
    )
    p = row_softmax(s)
    assert torch.isfinite(p).all()
    assert relative_error(p, reference_softmax(s)) < 1e-6
    assert torch.all(p[2] == 0)


def test_pv_stage():
    x = random_qkv(2, 3, 33, 65, 80, torch.float16)
    p = reference_softmax(reference_scores(x.q, x.k)).to(torch.float16)
    out = probs_times_values(p, x.v, out=poisoned((2, 3, 33, 80), torch.float16, x.q.device))
    assert_close(out, p.double() @ x.v.double(), torch.float16, seed=x.seed, what="PV")


# --- the eager PyTorch version (the seed's "eager SDPA") ---------------------------------------

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [1, 64, 257])
def test_eager_matches_torch_sdpa_like_the_seed(causal, n):
    # The ROCm blog checks its eager function against F.scaled_dot_product_attention; so do we, with
    # n_q = n_k, where torch's top-left causal mask and our bottom-right one coincide.
    device = "cuda" if ON_GPU else "cpu"
    dtype = torch.float16 if ON_GPU else torch.float32
    x = random_qkv(1, 32, n, n, 128, dtype, device)
    eager = eager_attention(x.q, x.k, x.v, causal)
    fused = F.scaled_dot_product_attention(x.q, x.k, x.v, is_causal=causal)
    # The blog compares elementwise on torch.rand inputs; on mean-zero randn inputs we compare norms.
    err = relative_error(eager, fused)
    assert err <= tolerance(dtype), f"eager vs SDPA: relative error {err:.2e}; seed={x.seed}"
    assert_close(eager, reference_attention(x.q, x.k, x.v, causal), dtype, seed=x.seed)
