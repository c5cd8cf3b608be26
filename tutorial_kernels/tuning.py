"""Autotuning as an explicit step: `tune(q, k, v, causal)` for one shape, `python -m tutorial_kernels.tuning
build` for a GPU's whole tile table.

The front door's Triton kernels launch with the configuration their tile table gives
(`perf.tile_table`): one compilation at a new shape, no timing. `tune` times every candidate
configuration of the forward (inference and training) and of both backward kernels at the shape of
its inputs — what Triton's autotuner did at every first call before — and keeps the fastest in the
user's table, which the lookup prefers to the shipped one from then on. TUTORIAL_KERNELS_AUTOTUNE=1
does the same for every new shape bucket a process meets.

`build` tunes a grid of keys (head_dim × causal × dtype × length bucket) on the FlashAttention-2
paper's shapes (B·N = 16384 tokens, H·d = 2048) and writes a table file with the provenance of the
run: what ships as `perf/tiles_<architecture>.json`. Compiling every candidate takes longer than
timing them, so `--jobs N` first compiles in N processes (each timing nothing: its autotuner runs
each candidate once), and one process then times them all, alone on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton

from tutorial_kernels import ch05_flash_v2, ch06_backward
from tutorial_kernels.perf import tile_table
from tutorial_kernels.validation import check_attention_inputs

_TUNED = (ch05_flash_v2.TUNED, ch06_backward.TUNED_DKDV, ch06_backward.TUNED_DQ)


def tune(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, *,
         backward: bool = True) -> dict:
    """Time every candidate configuration of the front door's Triton kernels at the shape bucket of
    these inputs (CUDA tensors, `flash_attention`'s contract) and keep the fastest in the user's tile
    table for this GPU (`tile_table.user_table_path`), which later calls, in this process and others,
    then use. Returns {kernel: configuration}. The Hopper (Gluon) kernels have fixed tiles: not tuned.
    Raises ValueError for CPU tensors (the interpreter has one configuration) and as `flash_attention`."""
    check_attention_inputs(q, k, v, causal, None, max_head_dim=256, allow_gqa=True)
    if not q.is_cuda:
        raise ValueError(f"q: tuning times kernels on a CUDA GPU, got tensors on {q.device}")
    for kernel in _TUNED:
        kernel.forget()  # a new choice for every key this call meets
    with tile_table.autotuning(), torch.no_grad():
        ch05_flash_v2.flash_attn_v2_tuned(q, k, v, causal)  # inference: no log-sum-exp
        o, lse = ch05_flash_v2.flash_attn_v2_with_lse(q, k, v, causal, tuned=True)  # training
        if backward:
            ch06_backward.flash_attn_backward(q, k, v, o, lse, torch.randn_like(o), causal, tuned=True)
    torch.cuda.synchronize()
    chosen = {"flash_v2_fwd": ch05_flash_v2.tuned_choice(q, k, v, causal)}
    if backward:
        chosen |= {f"flash_v2_bwd_{name}": c for name, c in (ch06_backward.tuned_backward_choice(q, k, v, causal)
                                                             or {}).items()}
    return chosen


def _compile_only() -> None:
    """Every autotuner of this process runs each candidate once and times nothing (its disk cache of
    timings off): what `build --jobs` does in its helper processes, to fill Triton's compile cache."""
    for kernel in _TUNED:
        kernel.autotuner.cache_results = False
        kernel.autotuner.do_bench = lambda call, quantiles: (call(), [1.0, 1.0, 1.0])[1]


def _grid(head_dims, causals, dtypes, buckets) -> list[tuple[int, bool, str, int]]:
    return [(d, c, t, n) for t in dtypes for d in head_dims for c in causals for n in buckets]


def _tune_key(head_dim: int, causal: bool, dtype: str, n: int, seed: int) -> None:
    """One key of the grid on the FA-2 paper's shape for it: B = 16384 / N, H = 2048 / d (at least 1)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    batch, heads = max(1, 16384 // n), max(1, 2048 // head_dim)
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=gen, device="cuda").to(getattr(torch, dtype))
               for _ in range(3))
    tune(q, k, v, causal)


def build(args: argparse.Namespace) -> Path:
    """Tune every key of the grid and write the table with its provenance to `args.out`."""
    from tutorial_kernels.provenance import provenance

    grid = _grid(args.head_dims, (False, True), args.dtypes, args.buckets)
    if args.compile_only:  # every bucket compiles the same kernels (its lengths and strides divide by 16)
        grid = _grid(args.head_dims, (False, True), args.dtypes, [min(args.buckets)])
    if args.part:
        index, count = (int(x) for x in args.part.split("/"))
        grid = grid[index::count]
    scratch = Path(tempfile.mkdtemp(prefix="tiles-"))
    os.environ[tile_table.USER_TABLE_VARIABLE] = str(scratch)  # this run's choices only
    if args.compile_only:
        _compile_only()
    elif args.jobs > 1:
        started = time.perf_counter()
        command = [sys.executable, "-m", "tutorial_kernels.tuning", "build", "--compile-only", "--out", os.devnull,
                   "--head-dims", *map(str, args.head_dims), "--dtypes", *args.dtypes,
                   "--buckets", *map(str, args.buckets)]
        helpers = [subprocess.Popen([*command, "--part", f"{i}/{args.jobs}"]) for i in range(args.jobs)]
        failed = [h.args[-1] for h in helpers if h.wait() != 0]
        print(f"compiled the candidates in {args.jobs} processes in {time.perf_counter() - started:.0f} s"
              + (f"; parts {failed} failed" if failed else ""), flush=True)
    arch = tile_table.architecture(torch.device("cuda"))
    started = time.perf_counter()
    for i, (head_dim, causal, dtype, n) in enumerate(grid):
        _tune_key(head_dim, causal, dtype, n, seed=i)
        if not args.compile_only:
            print(f"[{i + 1}/{len(grid)}] d={head_dim} causal={causal} {dtype} N={n}: "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    if args.compile_only:
        return Path(os.devnull)
    rows = json.loads(tile_table.user_table_path(arch).read_text())["rows"]
    run = {"grid": {"head_dims": args.head_dims, "causal": [False, True], "dtypes": args.dtypes,
                    "length_buckets": args.buckets},
           "provenance": provenance(" ".join(["python -m tutorial_kernels.tuning", *sys.argv[1:]]))}
    runs, kept = [], {}
    if args.merge and args.out.exists():  # an earlier run's rows stay, unless this run measured their key
        earlier = json.loads(args.out.read_text())
        runs, kept = earlier["runs"], {tile_table.row_key(r): r for r in earlier["rows"]}
    kept.update({tile_table.row_key(r): r for r in rows})
    document = {
        "description": "Per tuning key, the configuration Triton's autotuner chose for the front door's Triton kernels "
                       "(chapter 5's forward without and with the log-sum-exp, chapter 6's dK/dV and dQ kernels), "
                       "timed on the FlashAttention-2 paper's shapes (B = 16384 / N, H = 2048 / d) with N = the "
                       "length bucket; ms is the chosen one's median time there. `perf.tile_table` looks keys up "
                       "here.",
        "architecture": arch,
        "runs": [*runs, run],
        "rows": sorted(kept.values(), key=lambda r: tuple(str(v) for v in tile_table.row_key(r))),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {len(document['rows'])} rows ({len(rows)} from this run) to {args.out}")
    return args.out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.tuning", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="tune a grid of keys into a tile table file (needs a CUDA GPU)")
    b.add_argument("--out", type=Path, required=True, help="the table file to write, e.g. "
                   "tutorial_kernels/perf/tiles_sm90.json")
    b.add_argument("--head-dims", type=int, nargs="+", default=[32, 64, 80, 128, 256])
    b.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    b.add_argument("--buckets", type=int, nargs="+", default=[128, 512, 2048, 8192],
                   help="length buckets (powers of two) to tune at")
    b.add_argument("--merge", action="store_true", help="keep the rows of --out that this run does not measure")
    b.add_argument("--jobs", type=int, default=1, help="compile the candidates in this many processes first")
    b.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    b.add_argument("--part", help=argparse.SUPPRESS)  # i/N: every N-th key from the i-th
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("build needs a CUDA GPU")
    if any(n != triton.next_power_of_2(n) for n in args.buckets):
        parser.error(f"--buckets must be powers of two, got {args.buckets}")
    build(args)


if __name__ == "__main__":
    main()


__all__ = ["tune"]
