"""Per-call CPU cost and GPU time of chapter 5's tuned launcher against torch SDPA, at the attention
shapes of the prefill study (batch 1, N = 2048, bfloat16, causal). One GPU run:

    python3 tools/launch_overhead.py --out data/launch_overhead.json

cpu_us: wall time of 300 back-to-back calls with a tiny N (the GPU finishes each call before the CPU
issues the next, so the loop measures the CPU's cost per call); gpu_ms: do_bench median at N = 2048.
profile: the ten functions with the most cumulative time in cProfile over those calls (ours only).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

SHAPES = {"phi-2": (32, 32, 80), "llama-3-8b": (32, 8, 128)}  # (query heads, key/value heads, head_dim)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "launch_overhead.json")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F
    import triton.testing

    from tutorial_kernels import bench
    from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_tuned

    def sdpa(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])

    rows = []
    for model, (h, h_kv, d) in SHAPES.items():
        for n in (16, 2048):
            q = torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(1, h_kv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            for label, fn in (("sdpa", sdpa), ("tutorial_fa2", flash_attn_v2_tuned)):
                fn(q, k, v, True)
                torch.cuda.synchronize()
                row = {"model": model, "n": n, "impl": label}
                if n == 16:
                    for _ in range(50):
                        fn(q, k, v, True)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(300):
                        fn(q, k, v, True)
                    torch.cuda.synchronize()
                    row["cpu_us"] = (time.perf_counter() - t0) / 300 * 1e6
                    if label == "tutorial_fa2":
                        prof = cProfile.Profile()
                        prof.enable()
                        for _ in range(300):
                            fn(q, k, v, True)
                        prof.disable()
                        torch.cuda.synchronize()
                        text = io.StringIO()
                        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
                        row["profile"] = text.getvalue().splitlines()[-24:]
                else:
                    row["gpu_ms"] = triton.testing.do_bench(lambda: fn(q, k, v, True), return_mode="median")
                rows.append(row)
                print(json.dumps(row, indent=1), flush=True)
    info = bench.provenance("launch-overhead", sys.argv[1:])
    info["command"] = "python3 tools/launch_overhead.py"
    args.out.write_text(json.dumps({"description": __doc__.split("\n")[0], "provenance": info, "results": [],
                                    "measurements": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
