"""`perf.tile_table` and `TunedKernel`'s rule: tiles looked up, not searched, and autotuning on request."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import torch
import triton
from triton.runtime.errors import OutOfResources

from tutorial_kernels import ch05_flash_v2, ch06_backward
from tutorial_kernels.perf import tile_table
from tutorial_kernels.perf.autotune import TunedKernel
from tutorial_kernels.testing import assert_close, random_qkv
from tutorial_kernels.reference import reference_attention


def _row(kernel="flash_v2_bwd_dq", head_dim=64, causal=False, dtype="float16", bucket=1024, block_m=64, **extra):
    return {"kernel": kernel, "head_dim": head_dim, "causal": causal, "dtype": dtype, "length_bucket": bucket,
            "best": {"BLOCK_M": block_m, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3}, **extra}


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """An empty shipped folder and an empty user folder for architecture "sm00"."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    shipped.mkdir()
    monkeypatch.setattr(tile_table, "SHIPPED", shipped)
    monkeypatch.setenv(tile_table.USER_TABLE_VARIABLE, str(user))
    tile_table.forget()
    yield shipped
    tile_table.forget()


def _ship(folder, rows):
    (folder / "tiles_sm00.json").write_text(json.dumps({"architecture": "sm00", "rows": rows}))
    tile_table.forget()


def test_a_key_between_the_grids_points_takes_the_nearest_bucket_and_the_next_larger_head(tables):
    _ship(tables, [_row(bucket=512, block_m=1), _row(bucket=2048, block_m=2), _row(head_dim=128, bucket=512, block_m=3),
                   _row(causal=True, block_m=4), _row(dtype="bfloat16", block_m=5)])
    look = lambda d, n, causal=False, dtype=torch.float16: tile_table.lookup(  # noqa: E731
        "sm00", "flash_v2_bwd_dq", d, causal, dtype, n)["BLOCK_M"]
    assert look(64, 512) == 1 and look(64, 4096) == 2 and look(64, 128) == 1
    assert look(64, 1024) == 1  # equally far from 512 and 2048: the smaller bucket
    assert look(40, 2048) == 2  # the smallest measured head_dim ≥ 40 is 64
    assert look(80, 2048) == 3  # the next measured head_dim, 128
    assert tile_table.lookup("sm00", "flash_v2_bwd_dq", 256, False, torch.float16, 2048) is None  # wider than all
    assert look(64, 99, causal=True) == 4 and look(64, 99, dtype=torch.bfloat16) == 5
    assert tile_table.lookup("sm00", "flash_v2_bwd_dq", 64, False, torch.float32, 512) is None  # no float32 rows
    assert tile_table.lookup("sm99", "flash_v2_bwd_dq", 64, False, torch.float16, 512) is None  # no table at all
    assert tile_table.lookup("sm00", "flash_v2_bwd_dq", 64, False, torch.float16, 512, "pointers") is None


def test_the_users_rows_replace_the_shipped_ones(tables):
    _ship(tables, [_row(block_m=1), _row(bucket=128, block_m=7)])
    path = tile_table.record("sm00", [_row(block_m=9)])
    assert path == tile_table.user_table_path("sm00") and path.exists()
    assert tile_table.lookup("sm00", "flash_v2_bwd_dq", 64, False, torch.float16, 1024)["BLOCK_M"] == 9
    assert tile_table.lookup("sm00", "flash_v2_bwd_dq", 64, False, torch.float16, 128)["BLOCK_M"] == 7
    tile_table.record("sm00", [_row(block_m=11)])  # the same key again: replaced, not added
    assert len(json.loads(path.read_text())["rows"]) == 1


def test_a_tuning_pass_becomes_a_row_with_the_fastest_of_each_way_of_loading():
    fast_tma = triton.Config({"BLOCK_M": 128, "USE_DESCRIPTORS": True}, num_warps=8, num_stages=3)
    fast_ptr = triton.Config({"BLOCK_M": 64, "USE_DESCRIPTORS": False}, num_warps=4, num_stages=3)
    slow_ptr = triton.Config({"BLOCK_M": 32, "USE_DESCRIPTORS": False}, num_warps=4, num_stages=2)
    broken = triton.Config({"BLOCK_M": 256, "USE_DESCRIPTORS": False}, num_warps=8, num_stages=4)
    timings = {fast_tma: [1.0, 0.9, 1.1], fast_ptr: [1.5, 1.4, 1.6], slow_ptr: [3.0, 2.9, 3.1],
               broken: [float("inf")] * 3}
    row = tile_table.tuned_row("flash_v2_fwd", 64, True, torch.bfloat16, 2048, fast_tma, timings)
    assert row["dtype"] == "bfloat16" and row["ms"] == 1.0
    assert row["best"] == {"BLOCK_M": 128, "USE_DESCRIPTORS": True, "num_warps": 8, "num_stages": 3}
    assert row["pointers"]["BLOCK_M"] == 64 and row["pointers_ms"] == 1.5 and row["descriptors"]["BLOCK_M"] == 128
    # a launch that allowed pointer loads only (strided K/V) timed one kind: it says nothing of "best"
    only = tile_table.tuned_row("flash_v2_fwd", 64, True, torch.bfloat16, 2048, fast_ptr,
                                {fast_ptr: [1.5] * 3, slow_ptr: [3.0] * 3})
    assert "best" not in only and "descriptors" not in only and only["pointers"]["BLOCK_M"] == 64


def test_a_users_pass_over_one_kind_of_load_keeps_the_shipped_rows_other_entries(tables):
    _ship(tables, [_row(kernel="flash_v2_fwd", block_m=1, pointers={"BLOCK_M": 2}, descriptors={"BLOCK_M": 3})])
    tile_table.record("sm00", [{k: v for k, v in _row(kernel="flash_v2_fwd").items() if k != "best"}
                               | {"pointers": {"BLOCK_M": 4}}])
    look = lambda which: tile_table.lookup("sm00", "flash_v2_fwd", 64, False, torch.float16, 1024, which)  # noqa: E731
    assert (look("best")["BLOCK_M"], look("pointers")["BLOCK_M"], look("descriptors")["BLOCK_M"]) == (1, 4, 3)


def _kernel(rule, fallback=lambda key: {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}):
    return TunedKernel(ch06_backward._attn_bwd_dq_kernel, ch06_backward.TUNED_DQ.configs, key=["head_dim"],
                       rule=rule, fallback=fallback)


def test_a_tuned_kernel_launches_the_rules_choice_and_never_times(monkeypatch):
    monkeypatch.delenv(tile_table.AUTOTUNE_VARIABLE, raising=False)
    launched = []
    tuned = _kernel(lambda key: {"BLOCK_M": 64, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2})
    with mock.patch.object(tuned.autotuner, "run", side_effect=AssertionError("timed")), \
            mock.patch.object(tuned, "_launch_with", side_effect=lambda c, *a, **k: launched.append(c)):
        tuned.launch(lambda meta: (1,), ("key",), None)
        tuned.launch(lambda meta: (1,), ("key",), None)
    assert [c.kwargs["BLOCK_M"] for c in launched] == [64, 64] and tuned.choices[("key",)] is launched[0]


def test_a_choice_that_does_not_fit_falls_back_to_the_teaching_configuration(monkeypatch):
    monkeypatch.delenv(tile_table.AUTOTUNE_VARIABLE, raising=False)
    tried = []

    def launch_with(config, *args, **kwargs):
        tried.append(config.kwargs["BLOCK_M"])
        if config.kwargs["BLOCK_M"] == 128:
            raise OutOfResources(300_000, 232_448, "shared memory")

    tuned = _kernel(lambda key: {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3})
    with mock.patch.object(tuned, "_launch_with", side_effect=launch_with):
        tuned.launch(lambda meta: (1,), ("key",), None)
        tuned.launch(lambda meta: (1,), ("key",), None)
    assert tried == [128, 32, 32]  # the fallback is kept for the key


def test_without_a_rule_or_fallback_a_key_is_an_error(monkeypatch):
    monkeypatch.delenv(tile_table.AUTOTUNE_VARIABLE, raising=False)
    with pytest.raises(LookupError, match="no configuration"):
        _kernel(lambda key: None, fallback=None).launch(lambda meta: (1,), ("key",), None)


@pytest.mark.cpu("the interpreter's one candidate (a GPU's float32 runs the teaching configuration, untuned)")
def test_autotuning_runs_only_when_asked_and_reports_its_choice(monkeypatch):
    """Inside `tile_table.autotuning()` a new key goes to the autotuner (the interpreter's one candidate
    here), and the choice reaches `on_tuned`; outside it, the rule decides."""
    heard = []
    x = random_qkv(1, 2, 20, 20, 16, torch.float32)
    tuned = ch05_flash_v2.TUNED
    monkeypatch.setattr(tuned, "_on_tuned", lambda key, best, timings: heard.append(key))
    tuned.forget()
    with tile_table.autotuning():
        assert tile_table.autotuning_requested()
        out = ch05_flash_v2.flash_attn_v2_tuned(x.q, x.k, x.v, True)
    assert not tile_table.autotuning_requested()
    assert len(heard) == 1 and heard[0][1] == 16  # (length bucket, head_dim, …)
    assert_close(out, reference_attention(x.q, x.k, x.v, True), torch.float32, seed=x.seed)
    monkeypatch.setenv(tile_table.AUTOTUNE_VARIABLE, "1")
    assert tile_table.autotuning_requested()


@pytest.mark.cpu("tensors on the CPU where no GPU is")
def test_tune_needs_a_gpu():
    from tutorial_kernels import tune

    x = random_qkv(1, 2, 8, 8, 16, torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"q: tuning times kernels on a CUDA GPU, got tensors on cpu"):
        tune(x.q, x.k, x.v)


def test_the_shipped_table_holds_candidates_only_with_its_provenance():
    """Every row of the Hopper table names one of its kernel's candidate tiles, for a key of its grid,
    and every run that wrote rows says where and how."""
    document = json.loads(tile_table.shipped_table_path("sm90").read_text())
    candidates = {"flash_v2_fwd": ch05_flash_v2.TILE_CONFIGS, "flash_v2_fwd_lse": ch05_flash_v2.TILE_CONFIGS,
                  "flash_v2_bwd_dkdv": ch06_backward.DKDV_TILES, "flash_v2_bwd_dq": ch06_backward.DQ_TILES}
    for run in document["runs"]:
        assert {"gpu", "triton", "torch", "git_commit", "command", "date_utc"} <= set(run["provenance"])
    keys = set()
    for row in document["rows"]:
        for choice in ("best", "pointers", "descriptors"):
            if choice in row:
                c = row[choice]
                assert (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]) in candidates[row["kernel"]], row
        keys.add(tile_table.row_key(row))
    grid = {(k, d, c, t, n) for run in document["runs"] for k in candidates for d in run["grid"]["head_dims"]
            for c in (False, True) for t in run["grid"]["dtypes"] for n in run["grid"]["length_buckets"]}
    assert keys == grid, f"missing {sorted(grid - keys)[:5]}, extra {sorted(keys - grid)[:5]}"


def test_the_forward_takes_a_row_at_least_as_wide_as_the_columns_it_computes(monkeypatch):
    """72 runs as one 128-wide block and must not take d = 80's tiles (80 = 64 + 16, two exact blocks);
    48 and 96 split, 40 and 59 pad to 64, 160 to 256: every head dimension gets a row at least as wide."""
    picked = {}

    def rule(kernel, head_dim, causal, dtype, bucket, which="best"):
        picked[kernel] = head_dim  # the width the forward asks the Hopper table for
        return tile_table.lookup("sm90", kernel, head_dim, causal, dtype, bucket, which)

    monkeypatch.setattr(tile_table, "rule", rule)
    rows = tile_table.table("sm90").values()
    for d, width, row_dim in ((72, 128, 128), (80, 80, 80), (48, 48, 64), (96, 96, 128), (40, 64, 64), (59, 64, 64),
                              (160, 256, 256), (256, 256, 256)):
        block_d, block_dt = ch05_flash_v2._head_dim_blocks(d)
        key = (1024, d, True, block_d, ch05_flash_v2.POINTERS_ONLY, torch.float16, False)
        config = ch05_flash_v2._table_rule(key)
        assert picked["flash_v2_fwd"] == width, (d, picked)
        assert config in [r["pointers"] for r in rows if r["kernel"] == "flash_v2_fwd" and r["head_dim"] == row_dim
                          and r["causal"] and r["dtype"] == "float16" and r["length_bucket"] == 1024], (d, config)
