"""Probe schedules for chapter 5's forward kernel against cuDNN, in one run on one GPU.

    python3 tools/probe_forward_schedules.py --out data/ch05_schedule_probe.json

Each variant is the same kernel with one configuration forced (no autotuner): tile sizes, warps,
pipeline depth, pointer or descriptor loads, and two experimental switches —

* WARP_SPECIALIZE: Triton's automatic warp specialisation of the key loop (`tl.range(...,
  warp_specialize=True)`): producer warps issue the loads, consumer warps the matmuls and softmax;
* LAZY_RESCALE: rescale the accumulator only when some row's running maximum grew by more than 8
  (log₂ units, a factor 256) — the conditional rescaling of FlashAttention-4 (Zadouri, Shah, Dao et
  al. 2025): exact, because m only has to be an upper-bound-ish shift that keeps 2^(s − m) finite.

Every variant's output is checked against the float64 reference on head 0 before it is timed; a
variant that fails to compile or is wrong is recorded as such. cuDNN, torch flash and the tuned
launcher (`flash_attn_v2_tuned`) are timed in the same process for the ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

TILES = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 4, 3)]
SWITCHES = [(False, False), (False, True), (True, False), (True, True)]  # (WARP_SPECIALIZE, LAZY_RESCALE)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "ch05_schedule_probe.json")
    parser.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args(argv)

    import torch
    import triton

    from tutorial_kernels import bench
    from tutorial_kernels.ch05_flash_v2 import _launch

    info = bench.provenance("ch05-schedule-probe", sys.argv[1:] if argv is None else argv)
    info["command"] = "python3 tools/probe_forward_schedules.py " + " ".join(sys.argv[1:] if argv is None else argv)
    info["ceilings"] = bench.measure_ceilings()
    rows = []
    for d, causal, n in itertools.product(args.head_dim, (False, True), args.n):
        shape = bench.Shape(16384 // n, 2048 // d, n, d, causal, args.dtype)
        for name in ("sdpa-cudnn", "sdpa-flash", "flash-v2-tuned"):
            rows.append(bench.measure(bench.PROVIDERS[name], shape) | {"variant": name})
            print(f"{shape} {name}: {rows[-1].get('tflops', rows[-1].get('status')):.1f}" if "tflops" in rows[-1]
                  else f"{shape} {name}: {rows[-1].get('status')}", flush=True)
        for (bm, bn, warps, stages), (ws, lazy), tma in itertools.product(TILES, SWITCHES, (False, True)):
            config = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "USE_DESCRIPTORS": tma,
                                    "WARP_SPECIALIZE": ws, "LAZY_RESCALE": lazy}, num_warps=warps, num_stages=stages)
            label = f"{bm}x{bn} w{warps} s{stages} tma={int(tma)} ws={int(ws)} lazy={int(lazy)}"
            provider = bench.Provider(label, lambda q, k, v, c, config=config: _launch(q, k, v, c, None, None, tuned=False, config=config)[0])
            try:
                row = bench.measure(provider, shape)
            except Exception as err:  # a configuration that does not compile or run: recorded, not fatal
                row = {"provider": label, **shape.__dict__, "status": "failed",
                       "error": (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]}
                traceback.print_exc(limit=1)
                torch.cuda.synchronize()
            row.update(variant="forced", block_m=bm, block_n=bn, num_warps=warps, num_stages=stages,
                       descriptors=tma, warp_specialize=ws, lazy_rescale=lazy)
            if row.get("status") == "ok" and row["rel_err_head0"] > 2e-2:
                row["status"] = "wrong"
            rows.append(row)
            print(f"  {label}: {row.get('status')} {row.get('tflops', 0):.1f} TFLOP/s err {row.get('rel_err_head0', float('nan')):.1e}",
                  flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"description": __doc__.split("\n")[0], "provenance": info, "results": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
