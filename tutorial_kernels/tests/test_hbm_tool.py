"""tools/measure_hbm_bytes.py (a supported tool, not a module of the package, hence loaded by path): its
configurations and byte models, its provenance record, and its bookkeeping when series are measured in
separate runs (--merge). Measuring itself needs a GPU and Nsight Compute."""

import importlib.util
import json
from pathlib import Path

from tutorial_kernels import provenance as provenance_module
from tutorial_kernels.instruments.hbm_model import flash_v2_hbm_bytes
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


def test_configurations_use_the_public_teaching_tiles_and_every_row_has_a_prediction():
    from tutorial_kernels.ch05_flash_v2 import teaching_config

    tool = _tool()
    configs = tool.configurations()
    assert {c["series"] for c in configs} == {"by-n", "by-block", "fa2-by-n"}
    for c in configs:
        if c["schedule"] == "flash-v2":
            assert (c["block_m"], c["block_n"]) == (teaching_config(c["head_dim"])["BLOCK_M"],
                                                    teaching_config(c["head_dim"])["BLOCK_N"])
        predicted = tool.predicted(c)["predicted"]
        assert all(p["read"] >= 0 and p["write"] > 0 for p in predicted.values())
    c = next(c for c in configs if c["schedule"] == "flash-v2")
    model = flash_v2_hbm_bytes(c["batch"], c["heads"], c["n"], c["n"], c["head_dim"], 2, c["block_m"], c["block_n"],
                               c["causal"])
    assert tool.predicted(c)["predicted"][tool.FLASH2_KERNEL] == {"read": model["kernel_read"],
                                                                   "write": model["kernel_write"]}


def test_provenance_has_the_keys_of_the_committed_file(monkeypatch):
    """The machine's record from tutorial_kernels.provenance, then the tool's own fields (ncu_command is added
    after ncu has run): the same keys as data/ch04_hbm_bytes.json's provenance."""
    committed = json.loads((data_dir() / "ch04_hbm_bytes.json").read_text())["provenance"]
    machine = {key: committed[key] for key in ("gpu", "sm_count", "gpu_memory_gib", "driver", "cuda", "cudnn",
                                               "torch", "triton", "python", "date_utc", "git_commit")}
    monkeypatch.setattr(provenance_module, "provenance", lambda command: {**machine, "command": command})
    info = _tool().run_provenance(["--series", "fa2-by-n", "--merge"], "ncu 1.0")
    info["ncu_command"] = "ncu ..."
    assert list(info) == list(committed)
    assert info["command"] == "python3 tools/measure_hbm_bytes.py --series fa2-by-n --merge"
    assert info["suite"] == committed["suite"] and info["timing"] == committed["timing"] and info["ncu"] == "ncu 1.0"
