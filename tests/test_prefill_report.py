"""What the prefill benchmark reports against sdpa (its summary, and the site's table), from data
made up for the test. The statistic itself, `prefill.paired_ratio`, is tested with the kernels
(tutorial_kernels/tests/test_hf_attention.py); the table needs plotly, a site dependency."""

from __future__ import annotations

import pytest

from tests.conftest import require


def prefill_data_one_model() -> dict:
    """A data/prefill.json in miniature: ours 1 % slower than sdpa in every turn at 2048 tokens; at
    4096 two rows without per-forward times, as in files written before they were recorded; at 8192
    ours out of memory."""
    fast = [60.0 + 0.01 * k for k in range(12)]
    return {
        "models": {"m": {"label": "Model"}},
        "implementations": {"sdpa": "torch SDPA", "tutorial_fa2": "ours"},
        "results": [
            {"model": "m", "impl": "sdpa", "n": 2048, "status": "ok", "ms": 60.0, "ms_all": fast},
            {"model": "m", "impl": "tutorial_fa2", "n": 2048, "status": "ok", "ms": 61.0,
             "ms_all": [t * 1.01 for t in fast]},
            {"model": "m", "impl": "sdpa", "n": 4096, "status": "ok", "ms": 120.0},
            {"model": "m", "impl": "tutorial_fa2", "n": 4096, "status": "ok", "ms": 119.0},
            {"model": "m", "impl": "sdpa", "n": 8192, "status": "ok", "ms": 250.0, "ms_all": [250.0] * 12},
            {"model": "m", "impl": "tutorial_fa2", "n": 8192, "status": "oom"},
        ],
        "checks": [],
        "provenance": {"gpu": "test", "torch": "t", "triton": "t", "cuda": "t", "date_utc": "2026-11-23",
                       "git_commit": "0", "command": "test"},
    }


def test_prefill_summary_compares_with_sdpa_turn_by_turn():
    from tutorial_kernels.integrations import prefill

    lines = prefill.summary(prefill_data_one_model()).splitlines()
    assert "  Model          2048: 1.0100 [1.0100, 1.0100] slower" in lines
    assert not any(line.startswith(("  Model          4096:", "  Model          8192:")) for line in lines)


def test_prefill_vs_sdpa_table_shows_ratio_interval_and_verdict():
    require("plotly")  # a site dependency: the GPU machine's image may lack it
    from tutorial_kernels.figures import prefill as figures_prefill
    from tutorial_kernels.integrations import prefill

    data = prefill_data_one_model()
    compared = prefill.compare_with_sdpa(data)
    assert compared[("m", 2048)]["verdict"] == "slower" and compared[("m", 2048)]["ratio"] == pytest.approx(1.01)
    assert compared[("m", 4096)] == {"ratio": pytest.approx(119 / 120), "low": None, "high": None, "verdict": None}
    table = figures_prefill.prefill_vs_sdpa(data).data[0]
    assert "[1.0100, 1.0100]" in table.cells.values[1][0] and "✗ slower" in table.cells.values[1][0]
    assert table.cells.values[2][0] == f"{119 / 120:.3f}"  # no per-forward times: no interval, no verdict
    assert table.cells.values[3][0] == "—" and ("m", 8192) not in compared  # ours ran out of memory
    assert table.cells.fill.color[1][0] == figures_prefill.VERDICT_MARKS["slower"][1]  # judged: N ≥ 2048

