"""The benchmark harness's conventions, and the integrity of the committed benchmark data."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import torch

from tutorial_kernels.bench import PROVIDERS, SUITES, Shape, TrainingShape, measure_subset, take_turns
from tutorial_kernels.paths import data_dir
from tutorial_kernels.testing import grad_tolerance

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
def test_committed_data_has_provenance_and_checked_results(path: Path):
    data = json.loads(path.read_text())
    missing = PROVENANCE_KEYS - set(data["provenance"])
    assert not missing, f"{path.name}: provenance lacks {sorted(missing)}"
    assert data["provenance"]["git_commit"] != "unknown", f"{path.name}: no commit recorded"
    if "runs" in data:  # a training comparison (tutorial_kernels.integrations.gpt): every step's loss, finite
        for run in data["runs"]:
            assert len(run["losses"]) == data["config"]["steps"] and all(math.isfinite(x) for x in run["losses"])
        return
    if "checks" in data:  # the prefill study: models' logits checked against SDPA's before any timing counts
        assert data["checks"] and all(c["passed"] for c in data["checks"]), data["checks"]
        assert all(r["ms"] > 0 for r in data["results"] if r["status"] == "ok")
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
