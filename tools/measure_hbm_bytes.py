"""Measure the HBM bytes that naive attention (ch. 2), FlashAttention-1 (ch. 4) and FlashAttention-2 (ch. 5) move.

    python3 tools/measure_hbm_bytes.py                     # → data/ch04_hbm_bytes.json
    python3 tools/measure_hbm_bytes.py --series fa2-by-n --merge   # one series, the others kept
    python3 tools/measure_hbm_bytes.py --out /tmp/x.json --ncu /usr/local/cuda/bin/ncu

Needs an NVIDIA GPU, Nsight Compute (`ncu`) and the package installed (`pip install -e '.[bench]'`,
as for the benchmark harness). The script runs itself under `ncu` in "driver" mode:
the driver launches every configuration once to compile it, then once more between
`torch.cuda.profiler.start()` and `stop()`, and only those launches are profiled
(`--profile-from-start off`). For each profiled kernel ncu reports

    dram__bytes_read.sum, dram__bytes_write.sum       bytes that crossed the HBM interface
    lts__t_sectors_srcunit_tex_op_{read,write}.sum    32-byte sectors the SMs asked of the L2 cache

with the clocks left alone (`--clock-control none`) and every cache flushed before each kernel
(`--cache-control all`), so each kernel starts cold. The parent parses ncu's CSV, lines each
kernel up with its configuration, adds the bytes predicted by the IO model
(`tutorial_kernels.instruments.hbm_model`: `naive_kernel_bytes`, `flash_v1_hbm_bytes`,
`flash_v2_hbm_bytes`) and writes one JSON file with the measurement's provenance
(`tutorial_kernels.provenance.provenance`, plus ncu's version and command line).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = "python3 tools/measure_hbm_bytes.py"  # how the provenance names this tool (from the repository root)
SUITE = "ch04-hbm-bytes"
TIMING = "not timed: ncu serialises kernels and flushes caches; see data/ch04_sweep.json for times"
METRICS = [
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_write.sum",
]
SECTOR_BYTES = 32
UNIT_PREFIXES = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}  # ncu's scaled units (Kbyte, Msector, …) when not base
NAIVE_KERNELS = ["_scores_kernel", "_softmax_kernel", "_pv_kernel"]
FLASH_KERNEL = "_flash_v1_kernel"
FLASH2_KERNEL = "_flash_v2_fwd_kernel"
INIT_MARK = "FillFunctor"  # torch.zeros / torch.full: Algorithm 1's lines 1–4, before the launch
KERNEL_REGEX = "|".join([*NAIVE_KERNELS, FLASH_KERNEL, FLASH2_KERNEL, INIT_MARK])


def configurations() -> list[dict]:
    """What to measure. FlashAttention-2 paper convention: B·N = 16384 tokens, H·d = 2048, fp16."""
    from tutorial_kernels.ch04_flash_v1 import gpu_blocks

    def shape(n: int, d: int) -> dict:
        return {"batch": 16384 // n, "heads": 2048 // d, "n": n, "head_dim": d, "dtype": "float16"}

    configs = []
    for block_m, block_n in [(64, 16), (64, 32), (64, 64), (64, 128), (64, 256), (32, 128), (128, 128)]:
        configs.append({"series": "by-block", "schedule": "flash-v1", **shape(4096, 64), "causal": False,
                        "block_m": block_m, "block_n": block_n})
    from tutorial_kernels.ch05_flash_v2 import teaching_config

    for d in (64, 128):
        v1, v2 = gpu_blocks(d), teaching_config(d)  # chapter 4's tiles; chapter 5's teaching tiles
        for n in (512, 1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                configs.append({"series": "by-n", "schedule": "flash-v1", **shape(n, d), "causal": causal,
                                "block_m": v1["block_m"], "block_n": v1["block_n"]})
                # chapter 5, its own series so that it can be measured alone (`--series fa2-by-n --merge`)
                configs.append({"series": "fa2-by-n", "schedule": "flash-v2", **shape(n, d), "causal": causal,
                                "block_m": v2["BLOCK_M"], "block_n": v2["BLOCK_N"]})
            configs.append({"series": "by-n", "schedule": "naive", **shape(n, d), "causal": False})
    return configs


# --- driver: runs under ncu ------------------------------------------------------------------------

def drive(config_path: Path) -> None:
    import torch

    from tutorial_kernels.ch02_naive_attention import naive_attention
    from tutorial_kernels.ch04_flash_v1 import flash_attn_v1_with_lse
    from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse

    configs = json.loads(config_path.read_text())
    for index, c in enumerate(configs):
        gen = torch.Generator(device="cuda").manual_seed(index)
        dtype = getattr(torch, c["dtype"])
        q, k, v = (torch.randn(c["batch"], c["heads"], c["n"], c["head_dim"], generator=gen, device="cuda", dtype=dtype)
                   for _ in range(3))
        if c["schedule"] == "naive":
            run = lambda: naive_attention(q, k, v, c["causal"])  # noqa: E731
        elif c["schedule"] == "flash-v2":
            # with the lse, as the byte model counts it (and as chapter 6's training forward runs)
            run = lambda: flash_attn_v2_with_lse(q, k, v, c["causal"])  # noqa: E731
        else:
            run = lambda: flash_attn_v1_with_lse(q, k, v, c["causal"], block_m=c["block_m"], block_n=c["block_n"])  # noqa: E731
        run()  # compile, outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        result = run()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        del result, q, k, v
        torch.cuda.empty_cache()
        print(f"driver: {index + 1}/{len(configs)} {c}", flush=True)


# --- parent: runs ncu, parses, predicts --------------------------------------------------------------

def find_ncu(explicit: str | None) -> str:
    for candidate in (explicit, shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("Nsight Compute (ncu) not found: pass --ncu PATH")


def run_ncu(ncu: str, configs: list[dict], metrics: list[str], timeout_s: int) -> tuple[list[dict], str]:
    """Profile `configs` in one ncu session; return one record per profiled kernel, in launch order."""
    try:
        return _run_ncu(ncu, configs, metrics, timeout_s, ["--print-units", "base"])
    except RuntimeError as err:
        if "print-units" not in str(err):
            raise
        return _run_ncu(ncu, configs, metrics, timeout_s, [])  # an older ncu: parse_csv scales the units


def _run_ncu(ncu: str, configs: list[dict], metrics: list[str], timeout_s: int, units: list[str]) -> tuple[list[dict], str]:
    with tempfile.TemporaryDirectory() as tmp:
        config_path, log_path = Path(tmp) / "configs.json", Path(tmp) / "ncu.csv"
        config_path.write_text(json.dumps(configs))
        cmd = [
            ncu, "--csv", "--log-file", str(log_path), *units,
            "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off",
            "--kernel-name-base", "demangled", "-k", f"regex:{KERNEL_REGEX}",
            "--metrics", ",".join(metrics),
            sys.executable, str(Path(__file__).resolve()), "--driver", str(config_path),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        log = log_path.read_text() if log_path.exists() else ""
        if proc.returncode != 0:
            raise RuntimeError(f"ncu exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{log[-2000:]}")
    # the command as recorded: the run's scratch folder, not this machine's temporary path
    return parse_csv(log), " ".join(cmd[:-3] + [f"{COMMAND} --driver CONFIGS"]).replace(tmp, "$TMP")


def parse_csv(text: str) -> list[dict]:
    """ncu's CSV (one row per kernel and metric) → [{"id", "kernel", metric: value, …}] in launch order."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    kernels: dict[int, dict] = {}
    for row in csv.DictReader(lines):
        kid = int(row["ID"])
        record = kernels.setdefault(kid, {"id": kid, "kernel": row["Kernel Name"]})
        value = row["Metric Value"].replace(",", "")
        unit = row.get("Metric Unit", "")
        scale = next((f for prefix, f in UNIT_PREFIXES.items() if unit.startswith(prefix) and unit != prefix), 1.0)
        record[row["Metric Name"]] = float(value) * scale if value not in ("", "n/a") else None
    return [kernels[k] for k in sorted(kernels)]


def short_name(kernel: str) -> str:
    for name in [*NAIVE_KERNELS, FLASH_KERNEL, FLASH2_KERNEL]:
        if name in kernel:
            return name
    return "init (torch fill)" if INIT_MARK in kernel else kernel[:80]


def assign(configs: list[dict], records: list[dict]) -> list[dict]:
    """Line the profiled kernels up with the configurations that launched them (launch order)."""
    rows, pos = [], 0
    for c in configs:
        kernels = []
        if c["schedule"] == "naive":
            expected = NAIVE_KERNELS
        elif c["schedule"] == "flash-v2":
            expected = [FLASH2_KERNEL]  # O and lse come from torch.empty: no fill kernels before it
        else:
            while pos < len(records) and INIT_MARK in records[pos]["kernel"]:
                kernels.append(records[pos])
                pos += 1
            expected = [FLASH_KERNEL]
        for name in expected:
            if pos >= len(records) or name not in records[pos]["kernel"]:
                got = records[pos]["kernel"][:80] if pos < len(records) else "nothing"
                raise RuntimeError(f"expected {name} for {c}, ncu reported {got}")
            kernels.append(records[pos])
            pos += 1
        rows.append({**c, "kernels": [measured(r) for r in kernels], **predicted(c)})
    if pos != len(records):
        raise RuntimeError(f"{len(records) - pos} profiled kernels were not expected")
    return rows


def measured(record: dict) -> dict:
    def get(metric: str, scale: float = 1.0):
        value = record.get(metric)
        return None if value is None else value * scale

    return {
        "kernel": short_name(record["kernel"]),
        "dram_read_bytes": get("dram__bytes_read.sum"),
        "dram_write_bytes": get("dram__bytes_write.sum"),
        "l2_read_bytes": get("lts__t_sectors_srcunit_tex_op_read.sum", SECTOR_BYTES),
        "l2_write_bytes": get("lts__t_sectors_srcunit_tex_op_write.sum", SECTOR_BYTES),
    }


def predicted(c: dict) -> dict:
    from tutorial_kernels.instruments.hbm_model import flash_v1_hbm_bytes, flash_v2_hbm_bytes, naive_kernel_bytes

    size = {"float16": 2, "bfloat16": 2, "float32": 4}[c["dtype"]]
    args = (c["batch"], c["heads"], c["n"], c["n"], c["head_dim"], size)
    if c["schedule"] == "naive":
        model = naive_kernel_bytes(*args)
        return {"predicted": {name: {"read": model[f"{name}_read"], "write": model[f"{name}_write"]}
                              for name in NAIVE_KERNELS}}
    if c["schedule"] == "flash-v2":
        model = flash_v2_hbm_bytes(*args, c["block_m"], c["block_n"], c["causal"])
        return {"predicted": {FLASH2_KERNEL: {"read": model["kernel_read"], "write": model["kernel_write"]}}}
    model = flash_v1_hbm_bytes(*args, c["block_m"], c["block_n"], c["causal"])
    return {"predicted": {"init (torch fill)": {"read": 0, "write": model["init_write"]},
                          FLASH_KERNEL: {"read": model["kernel_read"], "write": model["kernel_write"]}}}


def earlier_runs(previous: dict, kept_series: set[str]) -> list[dict]:
    """With --merge, the kept rows were measured by earlier runs: which run measured which kept series,
    with that run's provenance. A file's own provenance covers the series no earlier run claims."""
    runs = previous.get("earlier_runs", [])
    claimed = {name for run in runs for name in run["series"]}
    latest = sorted({r["series"] for r in previous["measurements"]} - claimed)
    runs = [*runs, {"series": latest, "provenance": previous["provenance"]}]
    return [{"series": [name for name in run["series"] if name in kept_series], "provenance": run["provenance"]}
            for run in runs if kept_series & set(run["series"])]


def run_provenance(argv: list[str], ncu_version: str) -> dict:
    """The file's provenance: the machine's (`tutorial_kernels.provenance`), then this tool's suite name,
    what its timing means, and ncu's version; `ncu_command` is added once ncu has run."""
    from tutorial_kernels.provenance import provenance

    return provenance(" ".join([COMMAND, *argv])) | {"suite": SUITE, "timing": TIMING, "ncu": ncu_version}


def write(out: Path, info: dict, metrics: list[str], rows: list[dict], earlier_runs: list[dict] | None = None) -> None:
    data = {
        "description": "Chapter 4: HBM bytes per kernel, measured with Nsight Compute's DRAM counters, "
                       "against the IO model (each access of Algorithm 0 / Algorithm 1 counted once)",
        "notes": [
            "FlashAttention-2 paper convention: batch = 16384 / N, heads = 2048 / d, fp16.",
            "Caches are flushed before every kernel (--cache-control all); clocks are left alone (--clock-control none).",
            "dram_* bytes crossed the HBM interface; l2_* bytes are 32-byte sectors requested by the SMs from L2.",
            "DRAM writes can read low: dirty lines still in the 50 MB L2 when a kernel ends are not counted for it.",
            "predicted: tutorial_kernels.instruments.hbm_model (naive_kernel_bytes, flash_v1_hbm_bytes, "
            "flash_v2_hbm_bytes).",
        ],
        "provenance": info,
        "metrics": metrics,
        "results": [],  # bench-style timing rows; this file stores byte counts in "measurements"
        "measurements": rows,
    }
    if earlier_runs:  # --merge: the series measured by earlier runs, with those runs' provenance
        data["earlier_runs"] = earlier_runs
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="default: data/ch04_hbm_bytes.json (tutorial_kernels.paths.data_dir())")
    parser.add_argument("--ncu", help="path to ncu (default: on PATH, else /usr/local/cuda/bin/ncu)")
    parser.add_argument("--driver", type=Path, help=argparse.SUPPRESS)  # internal: run under ncu
    parser.add_argument("--timeout", type=int, default=1500, help="seconds per ncu session")
    parser.add_argument("--series", nargs="+", choices=["by-n", "by-block", "fa2-by-n"], help="measure only these series")
    parser.add_argument("--merge", action="store_true", help="keep the other series already in --out")
    args = parser.parse_args(argv)
    if args.driver is not None:
        drive(args.driver)
        return

    import torch

    from tutorial_kernels.paths import data_dir

    if not torch.cuda.is_available():
        parser.error("measuring HBM traffic needs a CUDA GPU and Nsight Compute; none is visible here")
    if args.out is None:
        args.out = data_dir() / "ch04_hbm_bytes.json"
    ncu = find_ncu(args.ncu)
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    configs = [c for c in configurations() if args.series is None or c["series"] in args.series]
    measuring = {c["series"] for c in configs}
    kept = []
    earlier = None
    if args.merge and args.out.exists():
        previous = json.loads(args.out.read_text())
        kept = [r for r in previous["measurements"] if r["series"] not in measuring]
        earlier = earlier_runs(previous, {r["series"] for r in kept})
    info = run_provenance(sys.argv[1:] if argv is None else argv, version)
    metrics = list(METRICS)
    rows: list[dict] = []
    started = time.time()
    # One ncu session per series, the file rewritten after each: a failure loses one series, not all.
    for series in dict.fromkeys(c["series"] for c in configs):
        group = [c for c in configs if c["series"] == series]
        try:
            records, command = run_ncu(ncu, group, metrics, args.timeout)
        except RuntimeError as err:
            if metrics == METRICS and "lts__" in str(err):  # an older ncu without these L2 metric names
                metrics = METRICS[:2]
                records, command = run_ncu(ncu, group, metrics, args.timeout)
            else:
                raise
        rows += assign(group, records)
        info["ncu_command"] = command
        write(args.out, info, metrics, kept + rows, earlier)
        print(f"{series}: {len(group)} configurations, {len(records)} kernels, {time.time() - started:.0f} s", flush=True)
        for r in rows[-len(group):]:
            got = sum((k["dram_read_bytes"] or 0) + (k["dram_write_bytes"] or 0) for k in r["kernels"])
            model = sum(p["read"] + p["write"] for p in r["predicted"].values())
            print(f"  {r['schedule']:9} N={r['n']:6} d={r['head_dim']:4} causal={r['causal']!s:5} "
                  f"tiles={r.get('block_m', '-')}x{r.get('block_n', '-')}: DRAM {got / 1e9:8.3f} GB, model {model / 1e9:8.3f} GB",
                  flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
