"""Chapter 5: FlashAttention-2 forward — the minimal kernel, the teaching and tuned launchers: what is
particular to them.

The three launchers' output on every shape (head dimensions 16 to 256, 48/80/96 in two blocks, 72/160 in
one), dtype, layout (inputs and `out=` in a model's (B, N, H, d) memory), scale, grouped-/multi-query
attention and bad input (an `out=` that overlaps or leaves gaps included) is checked by
`test_conformance.py`."""

from unittest import mock

import pytest
import torch

from tutorial_kernels import ch05_flash_v2 as ch05
from tutorial_kernels.perf import tile_table
from tutorial_kernels.ch05_flash_v2 import (
    TUNED,
    _head_dim_blocks,
    _launch_teaching,
    flash_attn_v2,
    flash_attn_v2_minimal,
    flash_attn_v2_tuned,
    flash_attn_v2_with_lse,
    teaching_config,
    tuned_choice,
)
from tutorial_kernels.reference import reference_attention, reference_log_sum_exp, reference_scores
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.testing import Case, assert_close, check_attention, random_qkv


@pytest.mark.parametrize("head_dim,blocks", [(16, (16, 0)), (24, (32, 0)), (40, (64, 0)), (48, (32, 16)),
                                             (64, (64, 0)), (72, (128, 0)), (80, (64, 16)), (96, (64, 32)),
                                             (112, (128, 0)), (144, (256, 0)), (160, (256, 0)), (200, (256, 0)),
                                             (256, (256, 0))])
def test_head_dim_blocks(head_dim, blocks):
    assert _head_dim_blocks(head_dim) == blocks


def _tiles(head_dim: int, dtype: torch.dtype = torch.float32) -> tuple[int, int]:
    config = teaching_config(head_dim, dtype)  # the minimal launcher's tiles too
    return config["BLOCK_M"], config["BLOCK_N"]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_minimal_kernel_at_tile_edges(causal):
    """Lengths one short of, equal to and one past a whole tile, and n_q ≫ n_k, where the causal bound
    `hi` of the first query tiles is ≤ 0 (their loop runs zero times and their rows must be zeros)."""
    bm, bn = _tiles(80)
    for n_q, n_k in [(bm - 1, bn - 1), (bm, bn), (bm + 1, bn + 1), (2 * bm + 3, 5), (3, 2 * bn + 1)]:
        check_attention(flash_attn_v2_minimal, Case(1, 2, n_q, n_k, 80), causal, torch.float32)


@pytest.mark.filterwarnings("ignore:.*:RuntimeWarning")  # the other query tile computes with the NaNs
def test_minimal_kernel_never_loads_hidden_tiles():
    """Causal, n_q = n_k: the first query tile sees keys [0, BLOCK_M) only, so it must not even load the
    tiles after them. Filled with NaN there, any load of those tiles would reach its rows (0 · NaN = NaN)."""
    bm, _ = _tiles(64)
    x = random_qkv(1, 2, 2 * bm, 2 * bm, 64, torch.float32)
    k, v = x.k.clone(), x.v.clone()
    k[:, :, bm:] = float("nan")
    v[:, :, bm:] = float("nan")
    out = flash_attn_v2_minimal(x.q, k, v, causal=True)
    ref = reference_attention(x.q[:, :, :bm], x.k[:, :, :bm], x.v[:, :, :bm], True)
    assert_close(out[:, :, :bm], ref, torch.float32, seed=x.seed)


@pytest.mark.parametrize("with_lse", [False, True], ids=["no-lse", "lse"])
def test_tuned_launcher_takes_its_tiles_by_rule_and_keeps_them(with_lse):
    """A new key takes the tile table's configuration (the teaching one where the table has none, as
    in the interpreter) without asking the autotuner, and later calls reuse it."""
    x = random_qkv(1, 2, 37, 37, 48, torch.float16)  # d = 48: two blocks
    ref = reference_attention(x.q, x.k, x.v, True)
    launch = flash_attn_v2_with_lse if with_lse else flash_attn_v2_tuned
    kwargs = dict(tuned=True) if with_lse else {}
    before = set(TUNED.choices)
    with mock.patch.object(TUNED.autotuner, "run", side_effect=AssertionError("asked the autotuner")):
        first = launch(x.q, x.k, x.v, True, **kwargs)
        new_keys = set(TUNED.choices) - before
        assert len(new_keys) <= 1  # a key chosen by an earlier test is reused
        # this call's tuning key (length bucket, d, causal, …, dtype, lse)
        key = next(k for k in TUNED.choices if k[:3] == (64, 48, True) and k[-2:] == (torch.float16, with_lse))
        by_rule = ch05._table_rule(key) or ch05._teaching_fallback(key)
        assert tile_table.config_dict(TUNED.choices[key]) == by_rule
        reported = tuned_choice(x.q, x.k, x.v, causal=True)  # what reports print: the same choice
        assert reported is not None and reported["BLOCK_M"] == TUNED.choices[key].kwargs["BLOCK_M"]
        assert TUNED.choice_for(64, 48, True, dtype=torch.float64) is None  # a dtype never chosen for
        with pytest.raises(ValueError, match="key_prefix has 9 values"):
            TUNED.choice_for(*range(9), dtype=torch.float16)
        second = launch(x.q, x.k, x.v, True, **kwargs)
    first, (second, lse) = (first[0], second) if with_lse else (first, (second, None))
    assert (lse is not None) == with_lse
    for out in (first, second):
        assert_close(out, ref, torch.float16, seed=x.seed)


def test_lse_only_when_asked():
    x = random_qkv(1, 2, 9, 9, 32, torch.float32)
    assert _launch_teaching(x.q, x.k, x.v, False, None, None)[1] is None
    out, lse = flash_attn_v2_with_lse(x.q, x.k, x.v, False, tuned=True)
    assert lse.shape == (1, 2, 9) and torch.isfinite(lse).all()
    assert_close(lse.double(), reference_log_sum_exp(reference_scores(x.q, x.k, False)), torch.float32, seed=x.seed)


@pytest.mark.parametrize("head_dim", [32, 80], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("n_q,n_k", [(1, 1), (17, 100), (100, 17), (64, 64), (129, 65)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_log_sum_exp(n_q, n_k, causal, head_dim):
    x = random_qkv(1, 3, n_q, n_k, head_dim, torch.float32)
    out, lse = flash_attn_v2_with_lse(x.q, x.k, x.v, causal)
    ref_lse = reference_log_sum_exp(reference_scores(x.q, x.k, causal))
    assert lse.dtype == torch.float32 and lse.shape == (1, 3, n_q)
    hidden = torch.isinf(ref_lse)  # queries that see no key: lse = −∞, output 0
    assert torch.equal(torch.isinf(lse).cpu(), hidden.cpu()), f"seed={x.seed}"
    assert torch.all(out[hidden] == 0)
    if (~hidden).any():
        err = (lse[~hidden].double() - ref_lse[~hidden]).abs().max().item()
        bound = 1e-4 if interpreter_active() else 1e-2  # a GPU's float32 tl.dot rounds to TF32 (~1e-3)
        assert err < bound, f"lse off by {err:.2e}; seed={x.seed}"
    assert_close(out, reference_attention(x.q, x.k, x.v, causal), torch.float32, seed=x.seed)


def test_rejects_what_it_cannot_do():
    x = random_qkv(1, 4, 8, 8, 16, torch.float32)
    with pytest.raises(ValueError, match=r"k's heads \(3\) must divide q's heads \(4\)"):
        flash_attn_v2(x.q, x.k[:, :3], x.v[:, :3])
    y = random_qkv(1, 1, 8, 8, 264, torch.float32)
    with pytest.raises(ValueError, match=r"head_dim \(q.shape\[3\]\) must be between 16 and 256, got 264"):
        flash_attn_v2(y.q, y.k, y.v)
    with pytest.raises(ValueError, match=r"k and v must have the same shape"):
        flash_attn_v2(x.q, x.k, x.v[:, :2])
    with pytest.raises(TypeError, match=r"descriptors must be None, True or False, got str 'yes'"):
        flash_attn_v2_tuned(x.q, x.k, x.v, descriptors="yes")
    with pytest.raises(TypeError, match=r"config must be a triton.Config or None, got str 'fast'"):
        flash_attn_v2(x.q, x.k, x.v, config="fast")


@pytest.mark.gpu("long sequences")  # too slow for the interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_sequences_on_gpu(causal, dtype):
    for case in (Case(1, 4, 4096, 4096, 128), Case(2, 2, 3000, 5000, 64), Case(1, 2, 8192, 2048, 256)):
        check_attention(flash_attn_v2_tuned, case, causal, dtype)


@pytest.mark.parametrize("head_dim", [64, 80], ids=lambda d: f"d{d}")  # 80: one padded block with descriptors
@pytest.mark.parametrize("descriptors", [False, True], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tuned_with_and_without_descriptors(descriptors, causal, head_dim):
    # ragged n_k: descriptor tiles run past this head's keys into the next head's, which must not count
    x = random_qkv(2, 4, 50, 77, head_dim, torch.float16)
    out = flash_attn_v2_tuned(x.q, x.k, x.v, causal, descriptors=descriptors)
    assert_close(out, reference_attention(x.q, x.k, x.v, causal), torch.float16, seed=x.seed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_descriptor_tiles_past_n_k_ignore_infinities_in_the_next_head(causal):
    # K/V descriptors span all heads: the last tile of batch 0's last head reads batch 1's first head,
    # which here is all infinities. Batch 0 must come out as if they were not there (0 · inf is NaN).
    x = random_qkv(2, 2, 40, 77, 64, torch.float16)
    k, v = x.k.clone(), x.v.clone()
    k[1, 0] = float("inf")
    v[1, 0] = float("inf")
    out = flash_attn_v2_tuned(x.q, k, v, causal, descriptors=True)
    assert_close(out[:1], reference_attention(x.q[:1], k[:1], v[:1], causal), torch.float16, seed=x.seed)


def test_descriptors_need_contiguous_rows():
    x = random_qkv(1, 2, 8, 8, 64, torch.float16, layout="bnhd")
    with pytest.raises(ValueError, match=r"descriptors=True needs contiguous float16 or bfloat16 k and v"):
        flash_attn_v2_tuned(x.q, x.k, x.v, descriptors=True)


TUNING_CONFIGS = TUNED.configs


@pytest.mark.gpu("autotuning candidates")  # the interpreter has one tuning config, the teaching one's tiles
@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float16), (72, torch.float16), (80, torch.bfloat16),
                                            (256, torch.float16)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", TUNING_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.all_kwargs().items()))
def test_every_tuning_config(config, causal, head_dim, dtype):
    """Whatever the autotuner picks on whatever GPU must be right: every candidate, at ragged n_q ≠ n_k."""
    from triton.runtime.errors import OutOfResources

    x = random_qkv(2, 3, 200, 333, head_dim, dtype)
    try:
        out = flash_attn_v2(x.q, x.k, x.v, causal, config=config)
    except OutOfResources as err:  # the autotuner skips such configs too
        pytest.skip(f"does not fit at head_dim {head_dim}: {err}")
    assert_close(out, reference_attention(x.q, x.k, x.v, causal), dtype, seed=x.seed)
