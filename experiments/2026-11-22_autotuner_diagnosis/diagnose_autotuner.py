"""Why does the tuned launcher time slower than the same configuration forced? (one GPU run)

    python3 tools/diagnose_autotuner.py --out data/ch05_autotuner_diagnosis.json

For a few shapes of the FlashAttention-2 paper grid:
1. the autotuner's own timing of every candidate (`configs_timings`);
2. the same candidates timed again on a warm GPU (one second of matmuls first), one after another;
3. the tuned launcher and its chosen configuration forced, timed alternately three times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

SHAPES = [(128, False, 16384), (128, True, 4096), (64, True, 16384), (64, False, 16384)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "ch05_autotuner_diagnosis.json")
    args = parser.parse_args()

    import torch
    import triton
    import triton.testing

    from tutorial_kernels import bench
    from tutorial_kernels import ch05_flash_v2 as ch05
    from tutorial_kernels.testing import random_qkv

    warm = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)

    def warm_up():
        triton.testing.do_bench(lambda: warm @ warm, warmup=1000, rep=10)

    info = bench.provenance("ch05-autotuner-diagnosis", sys.argv[1:])
    info["command"] = "python3 tools/diagnose_autotuner.py"
    rows = []
    for d, causal, n in SHAPES:
        x = random_qkv(16384 // n, 2048 // d, n, n, d, torch.float16, "cuda")
        q, k, v = x.q, x.k, x.v
        warm_up()
        ch05.flash_attn_v2_tuned(q, k, v, causal)  # autotunes
        choice = next(c for key, c in ch05._flash_v2_fwd_tuned.cache.items()
                           if key[0] == triton.next_power_of_2(n) and key[1] == d and key[2] == causal)
        autotuner = {str(c): t[0] for c, t in ch05._flash_v2_fwd_tuned.configs_timings.items()}
        flops = bench.Shape(16384 // n, 2048 // d, n, d, causal).flops
        rewarm = {}
        for config in ch05._flash_v2_fwd_tuned.configs_timings:
            warm_up()
            ms = triton.testing.do_bench(lambda: ch05._launch(q, k, v, causal, None, None, tuned=False, config=config),
                                         return_mode="median")
            rewarm[str(config)] = ms
        alternating = []
        forced = triton.Config(dict(choice.kwargs), num_warps=choice.num_warps, num_stages=choice.num_stages)
        warm_up()
        for _ in range(3):
            for label, fn in (("tuned", lambda: ch05.flash_attn_v2_tuned(q, k, v, causal)),
                              ("forced", lambda: ch05._launch(q, k, v, causal, None, None, tuned=False, config=forced))):
                ms = triton.testing.do_bench(fn, return_mode="median")
                alternating.append({"launcher": label, "ms": ms, "tflops": flops / ms / 1e9})
        row = {"head_dim": d, "causal": causal, "n": n, "choice": str(choice),
               "autotuner_ms": autotuner, "warm_ms": rewarm, "alternating": alternating}
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"description": __doc__.split("\n")[0], "provenance": info, "results": [],
                                             "measurements": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
