"""The benchmark harness's conventions, and the integrity of the committed benchmark data."""

import json
import re
import math
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

import torch

from tutorial_kernels.bench import PROVIDERS, SUITES, Shape, TrainingShape, measure_subset, refusal_reason, take_turns
from tutorial_kernels.bench.providers import paged_copy
from tutorial_kernels.bench.shapes import DecodeShape
from tutorial_kernels.bench.suites import DECODE_MEMORY_BYTES, DECODE_PROVIDERS
from tutorial_kernels.paths import data_dir
from tutorial_kernels.reference import cached_keys
from tutorial_kernels.testing import ON_GPU, grad_tolerance
from tutorial_kernels.tolerances import tolerance

DATA_FILES = sorted(data_dir().glob("*.json"))
PROVENANCE_KEYS = {"gpu", "sm_count", "torch", "triton", "cuda", "date_utc", "git_commit", "command"}
# Bound on the head-0 error a benchmarked output may have (fp16/bf16 on a GPU): a fast wrong kernel
# must never reach a figure.
MAX_BENCH_ERROR = {"float16": 3e-3, "bfloat16": 2e-2, "float32": 5e-3}


def max_error(row: dict) -> float:
    if "mode" in row:  # gradients (TrainingShape): the backward's looser bound
        return grad_tolerance(getattr(torch, row["dtype"]))
    return MAX_BENCH_ERROR[row["dtype"]]


def test_every_suite_shape_can_draw_check_and_rate():
    for suite in SUITES.values():
        for shape in suite.shapes:
            assert callable(shape.draw) and callable(shape.check) and shape.rates(1.0)


def test_flop_convention():
    # 4·B·H·N²·d: QKᵀ and PV are each 2·N²·d multiply-adds per head; causal counts half.
    assert Shape(2, 3, 128, 64, causal=False).flops == 4 * 2 * 3 * 128 * 128 * 64
    assert Shape(2, 3, 128, 64, causal=True).flops == 2 * 2 * 3 * 128 * 128 * 64
    # the backward: five matmuls to the forward's two
    assert TrainingShape(2, 3, 128, 64, False, mode="bwd").flops == 2.5 * Shape(2, 3, 128, 64, False).flops
    assert TrainingShape(2, 3, 128, 64, True, mode="fwd+bwd").flops == 3.5 * Shape(2, 3, 128, 64, True).flops


def test_providers_take_turns_so_none_is_always_timed_first():
    order = list(take_turns(["a", "b", "c"], rounds=3))
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [order[i] for i in (0, 3, 6)] == ["a", "b", "c"]  # each round opens with a different one
    assert list(take_turns([], rounds=3)) == []


def test_refusals_are_recorded_and_other_failures_raised():
    from tutorial_kernels.bench import refusal_reason
    from tutorial_kernels.validation import UnsupportedShape

    assert refusal_reason(torch.OutOfMemoryError("CUDA out of memory")) == "oom"
    assert refusal_reason(UnsupportedShape("head_dim must be between 16 and 128, got 256")) == "unsupported"
    assert refusal_reason(RuntimeError("No available kernel. Aborting execution.")) == "unsupported"
    # anything else is a bug in a kernel the suite runs: raised (recorded as "failed" only by probes)
    assert refusal_reason(RuntimeError("PassManager::run failed")) is None
    assert refusal_reason(ValueError("q must have 4 dimensions")) is None


def test_every_suite_names_known_providers():
    for name, suite in SUITES.items():
        assert set(suite.providers) <= set(PROVIDERS), name
        assert suite.shapes, name


@pytest.mark.cpu("the message shown without a GPU")
def test_refuses_to_run_without_a_gpu():
    run = subprocess.run([sys.executable, "-m", "tutorial_kernels.bench", "ch02-rocm"], capture_output=True, text=True)
    assert run.returncode == 2
    assert "need a CUDA GPU" in run.stderr


def test_there_is_committed_data():
    assert DATA_FILES, "data/ holds no benchmark file"


@pytest.mark.parametrize("path", DATA_FILES, ids=[p.name for p in DATA_FILES])
def test_committed_data_records_no_machines_paths(path: Path):
    """Commands and notes name paths relative to the repository ($OUT / $TMP for a run's scratch), never
    the folders of the machine that measured (`provenance.portable_command`)."""
    found = re.findall(r"(?<![\w$])/(?:root|home|tmp|work)/[^\s\"']*", path.read_text())
    assert not found, f"{path.name} records machine paths: {sorted(set(found))[:5]}"


def test_a_commands_paths_are_made_portable():
    from tutorial_kernels.paths import repository_root
    from tutorial_kernels.provenance import portable_command

    inside = repository_root() / "data" / "x.json"
    assert portable_command(f"python -m m --out /root/out/r/x.json --data {inside} -n 3") == (
        "python -m m --out $OUT/x.json --data data/x.json -n 3")


@pytest.mark.parametrize("path", DATA_FILES, ids=[p.name for p in DATA_FILES])
def test_committed_data_has_provenance_and_checked_results(path: Path):
    data = json.loads(path.read_text())
    missing = PROVENANCE_KEYS - set(data["provenance"])
    assert not missing, f"{path.name}: provenance lacks {sorted(missing)}"
    assert data["provenance"]["git_commit"] != "unknown", f"{path.name}: no commit recorded"
    if "runs" in data and "gpus" in data["runs"][0]:  # bench.context_parallel: timed, and checked before timing
        for run in data["runs"]:
            assert all(r["seconds"] > 0 for r in run["rows"] if "seconds" in r)
            assert all(r["communication_s"] > 0 and r["computation_s"] > 0 for r in run["rows"] if "computation_s" in r)
            if run["gpus"] > 1:  # several GPUs against one, bfloat16: the largest |difference| of O and gradients
                for method, diffs in run["checks"].items():
                    assert all(math.isfinite(x) and x <= 0.1 for x in diffs.values()), (path.name, method, diffs)
        return
    if "runs" in data:  # a training comparison (tutorial_kernels.integrations.gpt): every step's loss, finite
        for run in data["runs"]:
            assert len(run["losses"]) == data["config"]["steps"] and all(math.isfinite(x) for x in run["losses"])
        return
    if "checks" in data:  # the prefill study: models' logits checked against SDPA's before any timing counts
        assert data["checks"] and all(c["passed"] for c in data["checks"]), data["checks"]
        assert all(r["ms"] > 0 for r in data["results"] if r["status"] == "ok")
        return
    if "comparisons" in data:  # integrations.generate: every timed run's logits checked against sdpa's
        assert all(r["decode_tokens_per_s"] > 0 for r in data["rows"] if r["status"] == "ok")
        assert all(c["logits_within_bound"] for c in data["comparisons"] if "logits_within_bound" in c)
        return
    if "first_calls" in data:  # tutorial_kernels.bench.first_call: seconds per call, every call timed
        for process in data["first_calls"]:
            assert process["calls"] and all(c["forward_s"] > 0 and c["backward_s"] > 0 for c in process["calls"])
        return
    for row in data["results"]:
        # failed: a probed configuration that did not compile (data/ch05_schedule_probe.json); never timed
        assert row["status"] in ("ok", "oom", "unsupported", "failed"), row
        if row["status"] == "ok":
            assert row["ms"] > 0 and (row.get("tflops", 0) > 0 or row.get("gb_per_s", 0) > 0)
            if "max_diff_vs_one_split_below" in row:  # the split sweep: each count against the one-split call
                assert row["max_diff_vs_one_split_below"] <= 0.02, row
                continue
            err = row.get("rel_err_head0", row.get("rel_err"))
            assert err <= max_error(row), (
                f"{path.name}: {row['provider']} was timed but its output was wrong (relative error {err:.2e}): {row}"
            )


@pytest.mark.gpu("benchmarks")
def test_measure_subset_on_the_gpu():
    # the notebooks' "your GPU" cells call this; every row must be measured and checked
    result = measure_subset("ch02-rocm", lambda shape: shape.n == 256)
    assert {r["provider_key"] for r in result["results"]} == set(SUITES["ch02-rocm"].providers)
    for row in result["results"]:
        assert row["status"] == "ok" and row["rel_err_head0"] < MAX_BENCH_ERROR["float16"], row


def test_the_front_door_ratios_flag_the_cells_below_its_bars():
    pytest.importorskip("plotly")  # the figures package draws with plotly
    from tutorial_kernels.figures.ratios import below_bar, ratio_rows

    def row(provider, d, n, tflops):
        return dict(status="ok", provider_key=provider, head_dim=d, causal=True, dtype="float16", n=n, tflops=tflops)

    data = {"results": [row("front-door", 128, 4096, 99.0), row("sdpa-cudnn", 128, 4096, 100.0),
                        row("front-door", 128, 1024, 50.0), row("sdpa-cudnn", 128, 1024, 100.0),
                        row("front-door", 64, 4096, 98.0), row("sdpa-cudnn", 64, 4096, 100.0)]}
    rows = {(r["head_dim"], r["n"]): r for r in ratio_rows(data, "front door, forward")}
    assert below_bar(rows[(128, 4096)], "front-door")  # 0.99 < 1.00 at d = 128
    assert not below_bar(rows[(64, 4096)], "front-door")  # 0.98 meets d = 64's bar
    assert not below_bar(rows[(128, 1024)], "front-door")  # no bar below N = 4096
    assert rows[(128, 1024)]["ratios"][("front-door", "sdpa-cudnn")] == 0.5


def test_a_figures_command_reads_as_a_reader_reruns_it():
    # a run on the lent machine writes into its output folder; the command a caption shows writes the
    # committed file (the default, under data/), and a repository path after --out stays as it was
    pytest.importorskip("plotly")  # the figures package draws with plotly
    from tutorial_kernels.figures.runs import current_command

    assert current_command("python -m tutorial_kernels.bench ch07-head-dims --out /root/out/data/x.json") == (
        "python -m tutorial_kernels.bench ch07-head-dims")
    assert current_command("python -m tutorial_kernels.bench ch02-rocm --out data/ch02_rocm.json") == (
        "python -m tutorial_kernels.bench ch02-rocm --out data/ch02_rocm.json")


# the decoding suite (chapter 8): the issue's cells, KV bandwidth, every provider checked before timing
ONE_LENGTH_PER_CALL = {"sdpa-flash-gqa", "sdpa-cudnn-gqa", "front-door-decode"}


def test_the_decode_suite_sweeps_the_issues_cells_that_fit_an_80_gb_gpu():
    suite = SUITES["decode"]
    assert suite.providers == DECODE_PROVIDERS == ["kvcache", "kvcache-paged16", "kvcache-paged256", "sdpa-flash-gqa",
                                                   "sdpa-cudnn-gqa", "front-door-decode"]
    every = {(b, h, h_kv, n, d, dtype, varying) for b in (1, 8, 64) for h, h_kv in ((32, 8), (32, 32))
             for n in (1024, 4096, 32768, 131072) for d in (64, 128) for dtype in ("bfloat16", "float16")
             for varying in (False, True)}
    cells = [(s.batch, s.heads, s.kv_heads, s.n, s.head_dim, s.dtype, s.varying_lengths) for s in suite.shapes]
    # the harness holds one cache per provider until a cell is timed: those that cannot fit are left out
    fits = {c for c in every if len(DECODE_PROVIDERS) * 2 * c[0] * c[2] * c[3] * c[4] * 2 <= DECODE_MEMORY_BYTES}
    assert len(cells) == len(set(cells)) and set(cells) == fits
    assert (8, 32, 8, 131072, 128, "bfloat16", True) in fits and (64, 32, 32, 131072, 128, "float16", False) not in fits
    assert len(every - fits) == 7 * 4  # seven (B, H_kv, n, d), in both dtypes and both kinds of lengths
    for s in suite.shapes:
        assert s.seqlens == s.seqlens and len(s.seqlens) == s.batch  # drawn from a fixed seed: the same every time
        assert all(s.n // 2 <= n <= s.n for n in s.seqlens) if s.varying_lengths else set(s.seqlens) == {s.n}
    assert all(len(set(s.seqlens)) > 1 for s in suite.shapes if s.varying_lengths and s.batch > 1)


def test_decode_bandwidth_counts_the_keys_and_values_each_step_reads():
    equal = DecodeShape(8, 32, 8, 4096, 128, "bfloat16")
    assert equal.rates(2.0) == {"gb_per_s": 8 * 4096 * 8 * 128 * 2 * 2 / 2e-3 / 1e9}  # B·n·H_kv·d·(K, V)·2 bytes
    varying = DecodeShape(8, 32, 8, 4096, 128, "bfloat16", varying_lengths=True)
    assert varying.kv_bytes == sum(varying.seqlens) * 8 * 128 * 2 * 2 < equal.kv_bytes
    assert varying.cache_bytes == equal.cache_bytes  # drawn with room for n keys per sequence either way


def test_the_paged_copy_holds_each_sequences_keys_in_shuffled_blocks():
    k, v = torch.randn(3, 2, 40, 16), torch.randn(3, 2, 40, 16)
    seqlens = torch.tensor([40, 17, 1], dtype=torch.int32)
    k_pool, v_pool, table = paged_copy(k, v, seqlens, 16)
    assert k_pool.shape == v_pool.shape == (3 + 2 + 1, 2, 16, 16)  # only the blocks the sequences fill
    assert table.shape == (3, 3) and table.dtype == torch.int32
    used = torch.cat([table[b, :count] for b, count in enumerate((3, 2, 1))]).tolist()
    assert sorted(used) == list(range(6)) and used != list(range(6))  # each block once, not in order
    for b, n in enumerate(seqlens.tolist()):
        assert torch.equal(cached_keys(k_pool, b, n, table), cached_keys(k, b, n))
        assert torch.equal(cached_keys(v_pool, b, n, table), cached_keys(v, b, n))


@pytest.mark.parametrize("varying", [False, True], ids=["equal-lengths", "varying-lengths"])
def test_every_decode_provider_runs_a_tiny_cell_and_is_checked(varying):
    """What measure_shape does with each provider before timing (draw, prepare, call, check against
    float64, rates), on a cell small enough for Triton's interpreter; n = 48 leaves a last block partly
    filled for 16-token blocks and 256-token blocks longer than the cache."""
    shape = DecodeShape(2, 4, 2, 48, 16, "float16", varying, lengths_seed=3)
    for key in DECODE_PROVIDERS:
        if key == "sdpa-cudnn-gqa" and not ON_GPU:
            continue  # a CUDA backend
        provider = PROVIDERS[key]
        args, seed = shape.draw()
        row = {"provider_key": key, **asdict(shape), "seed": seed}
        try:
            with provider.context():
                call = shape.prepare(provider.fn, args)
                row.update(shape.check(call(), args), status="ok", **shape.rates(1.0))
        except Exception as err:
            row["status"] = refusal_reason(err)
            if row["status"] is None:
                raise
        if (varying and key in ONE_LENGTH_PER_CALL) or (key == "sdpa-cudnn-gqa" and row["status"] == "unsupported"):
            assert row["status"] == "unsupported", row  # cuDNN may refuse grouped-query inputs or d = 16
            continue
        assert row["status"] == "ok" and row["rel_err_head0"] <= tolerance(torch.float16), row
        assert row["gb_per_s"] == shape.kv_bytes / 1e-3 / 1e9 and row["n"] == 48 and row["kv_heads"] == 2
        assert row.get("seqlens") == (shape.seqlens if varying else None)


def test_a_cudnn_plan_failure_is_recorded_as_a_refusal(monkeypatch):
    import torch.nn.functional as F

    from tutorial_kernels.validation import UnsupportedShape

    def no_plan(*args, **kwargs):
        raise RuntimeError("cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph.")

    monkeypatch.setattr(F, "scaled_dot_product_attention", no_plan)
    shape = DecodeShape(1, 4, 2, 32, 16)
    call = shape.prepare(PROVIDERS["sdpa-cudnn-gqa"].fn, shape.draw()[0])
    with pytest.raises(UnsupportedShape) as refused:
        call()
    assert refusal_reason(refused.value) == "unsupported" and "No execution plans" in str(refused.value)
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: 1 / 0)  # anything else is not a refusal
    with pytest.raises(ZeroDivisionError):
        shape.prepare(PROVIDERS["sdpa-cudnn-gqa"].fn, shape.draw()[0])()


@pytest.mark.gpu("benchmarks")
def test_the_decode_suite_measures_on_the_gpu():
    result = measure_subset("decode", lambda s: s.batch == 1 and s.n == 1024 and s.head_dim == 64 and s.kv_heads == 8)
    assert {r["provider_key"] for r in result["results"]} == set(DECODE_PROVIDERS)
    for row in result["results"]:
        if row["status"] == "unsupported":  # one length per call; cuDNN may refuse grouped-query inputs
            assert row["provider_key"] == "sdpa-cudnn-gqa" or (
                row["varying_lengths"] and row["provider_key"] in ONE_LENGTH_PER_CALL), row
            continue
        assert row["status"] == "ok" and row["rel_err_head0"] <= MAX_BENCH_ERROR[row["dtype"]], row
        assert row["gb_per_s"] > 0 and row["ms"] > 0, row


# chapter 9's suite: the pairs each mask keeps, a packed batch drawn the same every time, the providers checked
def test_the_variant_shapes_count_the_pairs_their_masks_keep():
    from tutorial_kernels.bench.shapes import PackedShape, VariantShape

    n, w = 1000, 100
    causal = VariantShape(2, 3, n, 64, True)
    assert causal.flops == 4 * 2 * 3 * 64 * n * (n + 1) // 2  # N(N + 1)/2 pairs
    window = VariantShape(2, 3, n, 64, True, window=w, mode="bwd")
    assert window.flops == 2.5 * 4 * 2 * 3 * 64 * sum(min(i, w) + 1 for i in range(n))
    assert VariantShape(1, 1, n, 64, False, softcap=5.0).flops == 4 * 64 * n * n
    packed = PackedShape(65536, 16, 128, True)
    lengths = packed.seqlens
    assert lengths == packed.seqlens and sum(lengths) == 65536 and len(set(lengths)) > 1
    assert all(128 <= n <= 8192 for n in lengths)
    assert packed.flops == 4 * 16 * 128 * sum(n * (n + 1) // 2 for n in lengths)


def test_the_variants_suite_pairs_each_provider_with_its_shapes():
    from tutorial_kernels.bench.shapes import PackedShape

    suite = SUITES["ch09-variants"]
    for shape in suite.shapes:
        keys = suite.providers_for(shape)
        if isinstance(shape, PackedShape):
            assert keys == ["ch09-front-door-varlen", "ch09-flex-document"]
        else:
            assert keys[0] == "ch09-front-door" and not {"ch09-front-door-varlen", "ch09-flex-document"} & set(keys)
            assert ("ch09-flex" in keys) == (shape.n == 32768)
    assert {s.mode for s in suite.shapes} == {"fwd", "bwd"}


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_every_variant_provider_runs_a_tiny_cell_and_is_checked(mode):
    """What measure_shape does before timing (draw, prepare, call, check against float64), on cells small
    enough for Triton's interpreter; FlexAttention is left to the GPU (compiled, and its backward needs one)."""
    from tutorial_kernels.bench.shapes import PackedShape, VariantShape

    cells = [(VariantShape(1, 2, 70, 16, True, "float32", window=20, mode=mode), "ch09-front-door"),
             (VariantShape(2, 2, 40, 16, False, "float32", softcap=5.0, mode=mode), "ch09-front-door-wide"),
             (VariantShape(2, 2, 40, 16, False, "float32", alibi=True, mode=mode), "ch09-front-door"),
             (PackedShape(300, 2, 16, True, "float32", shortest=10, longest=90, mode=mode), "ch09-front-door-varlen")]
    if ON_GPU:
        cells += [(VariantShape(1, 2, 256, 64, True, "float16", window=100, mode=mode), "ch09-flex"),
                  (PackedShape(640, 2, 64, True, "float16", shortest=16, longest=256, mode=mode), "ch09-flex-document")]
    for shape, key in cells:
        provider = PROVIDERS[key]
        args, _ = shape.draw()
        with provider.context():
            row = shape.check(shape.prepare(provider.fn, args)(), args)
        bound = grad_tolerance(getattr(torch, shape.dtype)) if mode == "bwd" else tolerance(getattr(torch, shape.dtype))
        assert row["rel_err_head0"] <= bound, (key, shape, row)
