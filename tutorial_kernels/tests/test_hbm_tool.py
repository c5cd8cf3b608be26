"""tools/measure_hbm_bytes.py's bookkeeping when series are measured in separate runs (--merge)."""

import importlib.util
import json
from pathlib import Path

from tutorial_kernels.paths import data_dir

TOOL = Path(__file__).resolve().parents[2] / "tools" / "measure_hbm_bytes.py"


def _tool():
    spec = importlib.util.spec_from_file_location("measure_hbm_bytes", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_merge_keeps_the_provenance_of_the_run_that_measured_each_kept_series():
    tool = _tool()
    first = {"provenance": {"git_commit": "aaa"}, "measurements": [{"series": "by-n"}, {"series": "by-block"}]}
    # a second run re-measured nothing of the first's and added fa2-by-n
    second = {"provenance": {"git_commit": "bbb"}, "earlier_runs": tool.earlier_runs(first, {"by-n", "by-block"}),
              "measurements": first["measurements"] + [{"series": "fa2-by-n"}]}
    assert second["earlier_runs"] == [{"series": ["by-block", "by-n"], "provenance": {"git_commit": "aaa"}}]
    # a third run re-measures by-n: the kept series keep their own runs, by-n's old row is dropped
    kept = {"by-block", "fa2-by-n"}
    runs = tool.earlier_runs(second, kept)
    assert runs == [{"series": ["by-block"], "provenance": {"git_commit": "aaa"}},
                    {"series": ["fa2-by-n"], "provenance": {"git_commit": "bbb"}}]


def test_committed_file_names_a_run_for_every_series():
    data = json.loads((data_dir() / "ch04_hbm_bytes.json").read_text())
    series = {r["series"] for r in data["measurements"]}
    claimed = [name for run in data.get("earlier_runs", []) for name in run["series"]]
    assert len(claimed) == len(set(claimed)), "a series is claimed by two earlier runs"
    assert set(claimed) <= series
    # the series no earlier run claims are the file's own run's: at least one must be
    assert series - set(claimed), "the file's own provenance would describe no series"
