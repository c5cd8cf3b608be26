"""Timelines recorded on a GPU: where every program of a launch ran, and when (`recorder`'s traces).

    python -m tutorial_kernels.instruments.timeline ch01-residency    # → data/ch01_timelines.json
    python -m tutorial_kernels.instruments.timeline ch04-timeline     # → data/ch04_timeline.json
    python -m tutorial_kernels.instruments.timeline ch05-fa1-vs-fa2   # → data/ch05_timeline.json

Chapter 1 records a probe kernel at several grid sizes and footprints; chapters 4 and 5 record
FlashAttention-1 (one program per (batch, head)) against FlashAttention-2 (one per query tile too).
Every recorder needs a CUDA GPU: the interpreter cannot read %smid and %globaltimer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import torch
import triton

from tutorial_kernels import ch01_gpu_hierarchy as ch01
from tutorial_kernels import ch04_flash_v1 as ch04
from tutorial_kernels import ch05_flash_v2 as ch05
from tutorial_kernels import recorder
from tutorial_kernels.paths import data_dir
from tutorial_kernels.provenance import provenance


# --- chapter 1: the residency probe ------------------------------------------------------------------

def compiled_reduction_facts() -> list[dict]:
    """What Triton chose when it compiled `partial_sums_kernel` for float32 on this GPU, for a length
    that is a multiple of 16 and for one that is not (Triton specialises integer arguments on that).

    We chose BLOCK and num_warps; Triton chose how the tile is spread over threads (the layout), the
    width of each load, the registers and the shared memory, and how tl.sum crosses threads and warps.
    """
    recorder.require_recording()  # needs the real compiler, not the interpreter
    x = torch.randn(ch01.REDUCTION_BLOCK, device="cuda")
    partial = torch.empty(1, device="cuda")
    facts = []
    for n in (ch01.REDUCTION_BLOCK, ch01.REDUCTION_BLOCK - 1):
        kernel = ch01.partial_sums_kernel[(1,)](x, partial, n, BLOCK=ch01.REDUCTION_BLOCK, num_warps=ch01.REDUCTION_WARPS)
        lines = kernel.asm["ptx"].splitlines()
        loads = [line for line in lines if "ld.global" in line]
        facts.append({
            "kernel": "partial_sums_kernel", "dtype": "float32", "n": n, "BLOCK": ch01.REDUCTION_BLOCK,
            "num_warps": ch01.REDUCTION_WARPS, "threads": 32 * ch01.REDUCTION_WARPS,
            "elements_per_thread": ch01.REDUCTION_BLOCK // (32 * ch01.REDUCTION_WARPS),
            "regs_per_thread": int(kernel.n_regs), "shared_bytes": int(kernel.metadata.shared),
            "global_loads": len(loads),
            "global_load_widths": sorted({"v4" if ".v4" in ln else "v2" if ".v2" in ln else "scalar" for ln in loads}),
            "warp_shuffles": sum("shfl.sync" in ln for ln in lines),
            "barriers": sum("bar.sync" in ln or "barrier.sync" in ln for ln in lines),
            "shared_stores": sum("st.shared" in ln for ln in lines),
        })
    return facts


def record_residency_experiments() -> dict:
    """Chapter 1's recording (`python -m tutorial_kernels.instruments.timeline ch01-residency`).

    Timelines: 132 light programs (one per SM), then 3 · 132 + 17 = 413 programs with each footprint.
    Sweep: the launch's duration against the grid size, 33 to 1056 programs, for each footprint.
    """
    device = ch01.device_properties()
    sms = device["sm_count"]
    for scenario in ch01.RESIDENCY_SCENARIOS:  # compile every variant before anything is timed
        ch01.record_probe(1, scenario, spin_ns=1000, device=device)
    runs = [ch01.record_probe(sms, "light", device=device)]
    runs += [ch01.record_probe(3 * sms + 17, s, device=device) for s in ch01.RESIDENCY_SCENARIOS]
    sweep = []
    for scenario in ch01.RESIDENCY_SCENARIOS:
        for grid in range(sms // 4, 8 * sms + 1, sms // 4):
            run = ch01.record_probe(grid, scenario, device=device)
            sweep.append({"scenario": scenario, "grid": grid, "makespan_us": run.makespan_us,
                          "measured_per_sm": run.meta["measured_per_sm"], "predicted_per_sm": run.meta["predicted_per_sm"],
                          "predicted_waves": run.meta["predicted_waves"], "sms_used": run.sms_used})
    return {
        "description": "Chapter 1: where the programs of a probe kernel ran (SM, start, end), for several grid "
                       "sizes and per-program footprints",
        "notes": [f"Every probe program busy-waits {ch01.PROBE_SPIN_NS / 1e3:.0f} µs from its start, so a launch's "
                  "duration counts the waves of programs the GPU had to run one after another.",
                  "predicted_per_sm comes from ch01.resident_programs_per_sm with the compiled kernel's registers "
                  "and shared memory; measured_per_sm is the most programs whose [start, end) overlapped on one SM."],
        "scenarios": {k: {"label": v[0], "num_warps": v[1], "stages": v[2], "held_floats": v[3]}
                      for k, v in ch01.RESIDENCY_SCENARIOS.items()},
        "compiled_reduction": compiled_reduction_facts(),
        "timelines": [r.to_dict() for r in runs],
        "sweep": sweep,
    }


# --- chapters 4 and 5: FlashAttention-1 against FlashAttention-2 ---------------------------------------

def flash_v1_timeline(
    batch: int, heads: int, n: int, head_dim: int, causal: bool = False, dtype: torch.dtype = torch.float16,
    *, seed: int = 0,
) -> recorder.Timeline:
    """Run FlashAttention-1 once on random inputs and record, per program, its SM and start/end time.

    Needs a CUDA GPU (the recorder reads %smid and %globaltimer with inline assembly).
    """
    recorder.require_recording()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=gen, device="cuda", dtype=dtype) for _ in range(3))
    ch04.flash_attn_v1(q, k, v, causal)  # compile first: the recorded launch is a warm one
    buffer = recorder.new_trace(batch * heads)
    ch04.flash_attn_v1_with_lse(q, k, v, causal, trace=buffer)
    torch.cuda.synchronize()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    config = ch04.default_blocks(head_dim, dtype)
    return recorder.Timeline.from_trace(
        buffer, f"FlashAttention-1, B·H = {batch * heads}", sm_count=sm_count,
        grid=batch * heads, batch=batch, heads=heads, n=n, head_dim=head_dim, causal=causal,
        dtype=str(dtype).removeprefix("torch."), **config,
    )


TIMELINE_SHAPES = [  # (batch, heads, n, head_dim): 8 programs, then enough to cover (almost) every SM
    (1, 8, 4096, 64),
    (4, 32, 4096, 64),
]


def record_flash_v1_timelines() -> dict:
    """The chapter's timeline experiment: B·H = 8 and B·H = 128 at N = 4096, d = 64, fp16."""
    runs = [flash_v1_timeline(*shape) for shape in TIMELINE_SHAPES]
    return {
        "description": "Chapter 4: where FlashAttention-1's programs ran (one per (batch, head)), fp16, not causal",
        "notes": ["One launch per timeline, after a warm-up launch of the same shape.",
                  "Times are %globaltimer stamps at each program's start and end, relative to the first start."],
        "timelines": [r.to_dict() for r in runs],
    }


def flash_v2_timeline(
    batch: int, heads: int, n: int, head_dim: int, causal: bool = False, dtype: torch.dtype = torch.float16,
    *, seed: int = 0,
) -> recorder.Timeline:
    """Run the teaching FlashAttention-2 once on random inputs and record, per program, its SM and
    start/end time. Needs a CUDA GPU (the recorder reads %smid and %globaltimer with inline assembly)."""
    recorder.require_recording()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=gen, device="cuda", dtype=dtype) for _ in range(3))
    ch05.flash_attn_v2(q, k, v, causal)  # compile first: the recorded launch is a warm one
    config = ch05.teaching_config(head_dim, dtype)
    programs = triton.cdiv(n, config["BLOCK_M"]) * batch * heads
    buffer = recorder.new_trace(programs)
    ch05.flash_attn_v2(q, k, v, causal, trace=buffer)
    torch.cuda.synchronize()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    return recorder.Timeline.from_trace(
        buffer, f"FlashAttention-2, B·H = {batch * heads}", sm_count=sm_count,
        grid=programs, batch=batch, heads=heads, n=n, head_dim=head_dim, causal=causal,
        dtype=str(dtype).removeprefix("torch."), **config,
    )


def record_fa1_vs_fa2_timelines() -> dict:
    """FlashAttention-1 (chapter 4: one program per (batch, head)) against FlashAttention-2 (one per
    query tile too) at B·H = 8, N = 4096, d = 64, fp16: 8 programs against 8 · 4096 / BLOCK_M."""
    shape = (1, 8, 4096, 64)
    return {
        "description": "Chapter 5: where FlashAttention-1's and FlashAttention-2's programs ran at B·H = 8, fp16, not causal",
        "notes": ["One launch per timeline, after a warm-up launch of the same shape; the teaching configurations.",
                  "Times are %globaltimer stamps at each program's start and end, relative to the first start."],
        "timelines": [flash_v1_timeline(*shape).to_dict(), flash_v2_timeline(*shape).to_dict()],
    }


# --- the command line ---------------------------------------------------------------------------------


# name → (function returning a dict of JSON-able results, default data file)
EXPERIMENTS: dict[str, tuple[Callable[[], dict], str]] = {
    "ch01-residency": (record_residency_experiments, "ch01_timelines.json"),
    "ch04-timeline": (record_flash_v1_timelines, "ch04_timeline.json"),
    "ch05-fa1-vs-fa2": (record_fa1_vs_fa2_timelines, "ch05_timeline.json"),
}


def run_experiment(name: str, out: Path, argv: list[str]) -> dict:
    function, _ = EXPERIMENTS[name]
    results = function()
    info = provenance(" ".join(["python -m tutorial_kernels.instruments.timeline", *argv])) | {
        "suite": name,
        "timing": "per-program %globaltimer stamps (ns) read with inline PTX; one launch per timeline",
    }
    data = {
        "description": results.pop("description"),
        "notes": results.pop("notes", []),
        "provenance": info,
        "device": ch01.device_properties(),
        "results": [],  # bandwidth-style rows (see tutorial_kernels.bench); these experiments store timelines instead
        **results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    return data


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.instruments.timeline", description=__doc__.split("\n")[0])
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS), help="which recording to make")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: data/<experiment's file>)")
    args = parser.parse_args(argv)
    if (reason := recorder.unavailable_reason()) is not None:
        parser.error(reason)
    out = args.out or data_dir() / EXPERIMENTS[args.experiment][1]
    data = run_experiment(args.experiment, out, argv)
    for run in data.get("timelines", []):
        m = run["meta"]
        print(f"{run['label']:48} {len(run['sm']):5} programs on {len(set(run['sm'])):3} SMs, "
              f"≤{m.get('measured_per_sm')} at once per SM (predicted {m.get('predicted_per_sm')}), "
              f"{max(run['end_ns']) / 1e3:8.1f} µs")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
