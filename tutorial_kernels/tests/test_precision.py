"""float32 products follow PyTorch's float32 matmul precision (`tutorial_kernels.precision`)."""

from __future__ import annotations

import pytest
import torch

from tutorial_kernels.ch05_flash_v2 import flash_attn_v2, flash_attn_v2_minimal, flash_attn_v2_tuned
from tutorial_kernels.ch06_backward import flash_attention as ch06_flash_attention
from tutorial_kernels.precision import autotunes, dot_precision, full_float32_tiles, tiles_for
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.testing import random_qkv


@pytest.mark.parametrize("setting, expected", [("highest", "tf32x3"), ("high", "tf32"), ("medium", "tf32")])
def test_float32_products_follow_torchs_setting(matmul_precision, setting, expected):
    matmul_precision(setting)
    assert dot_precision(torch.float32) == expected
    assert dot_precision(torch.float16) == dot_precision(torch.bfloat16) == "tf32"  # exact either way


def test_only_full_float32_on_a_gpu_skips_autotuning(matmul_precision):
    matmul_precision("highest")
    assert autotunes(torch.ones(1))  # the CPU: the tuned path runs as for every dtype
    if torch.cuda.is_available():
        assert not autotunes(torch.ones(1, device="cuda"))
        assert autotunes(torch.ones(1, device="cuda", dtype=torch.float16))
        matmul_precision("high")
        assert autotunes(torch.ones(1, device="cuda"))


@pytest.mark.parametrize("head_dim", [16, 64, 128, 256])
def test_full_float32_takes_the_small_tiles_on_a_gpu_only(matmul_precision, head_dim):
    own = dict(BLOCK_M=64, BLOCK_N=64)
    matmul_precision("highest")
    expected = own if interpreter_active() else full_float32_tiles(head_dim)
    assert tiles_for(torch.float32, head_dim, **own) == expected
    assert tiles_for(torch.float16, head_dim, **own) == own
    matmul_precision("high")
    assert tiles_for(torch.float32, head_dim, **own) == own


KERNELS = {"flash_attn_v2": flash_attn_v2, "flash_attn_v2_minimal": flash_attn_v2_minimal,
           "flash_attn_v2_tuned": flash_attn_v2_tuned,
           "ch06 forward + backward": lambda q, k, v, causal: ch06_flash_attention(q, k, v, causal, tuned=True)}


@pytest.mark.gpu("float32 precision")
@pytest.mark.parametrize("name", KERNELS)
def test_highest_is_full_float32_and_high_is_tf32(matmul_precision, name):
    """The same call twice at one shape: "highest" within 1e-5 of float64, "high" visibly TF32 (a
    remembered launch of the first call must not serve the second)."""
    x = random_qkv(2, 3, 300, 300, 64, torch.float32)
    ref = reference_attention(x.q, x.k, x.v, True)
    errors = {}
    for setting in ("highest", "high", "highest"):
        matmul_precision(setting)
        errors.setdefault(setting, []).append(relative_error(KERNELS[name](x.q, x.k, x.v, True), ref))
    assert max(errors["highest"]) < 1e-5, f"{name}: {errors}; seed={x.seed}"
    assert errors["high"][0] > 1e-4, f"{name}: TF32 expected under 'high', {errors}; seed={x.seed}"
