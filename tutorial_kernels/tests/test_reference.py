"""The float64 reference itself, checked against PyTorch's attention and against the definition."""

import math

import pytest
import torch
import torch.nn.functional as F

from tutorial_kernels.reference import (
    causal_mask,
    reference_attention,
    reference_log_sum_exp,
    reference_scores,
    reference_softmax,
    relative_error,
)
from tutorial_kernels.testing import random_qkv


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 17, 100])
def test_matches_torch_sdpa_in_float64(causal, n):
    x = random_qkv(2, 3, n, n, 32, torch.float64, "cpu")
    ref = reference_attention(x.q, x.k, x.v, causal)
    torch_out = F.scaled_dot_product_attention(x.q, x.k, x.v, is_causal=causal)
    assert relative_error(ref, torch_out) < 1e-12, f"seed={x.seed}"


def test_causal_mask_is_bottom_right_aligned():
    mask = causal_mask(2, 4)
    # with n_q < n_k the last query sees every key, the first one all but the last
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert torch.equal(causal_mask(5, 5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_query_that_sees_no_key_outputs_zero():
    x = random_qkv(1, 2, 6, 3, 16, torch.float64, "cpu")  # causal, n_q > n_k: first 3 queries see nothing
    out = reference_attention(x.q, x.k, x.v, causal=True)
    assert torch.all(out[:, :, :3] == 0)
    assert torch.isfinite(out).all()
    lse = reference_log_sum_exp(reference_scores(x.q, x.k, causal=True))
    assert torch.all(lse[:, :, :3] == -math.inf) and torch.isfinite(lse[:, :, 3:]).all()


def test_softmax_rows_sum_to_one_and_survive_large_scores():
    s = torch.tensor([[1e4, -1e4, 0.0], [-math.inf, 5.0, 5.0]], dtype=torch.float64)
    p = reference_softmax(s)
    assert torch.allclose(p.sum(-1), torch.ones(2, dtype=torch.float64))
    assert torch.allclose(p[1], torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64))


def test_relative_error_sees_nan():
    ref = torch.ones(4)
    out = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    assert not relative_error(out, ref) <= 1.0  # NaN compares false with every bound
