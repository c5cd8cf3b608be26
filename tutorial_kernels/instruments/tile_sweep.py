"""Chapter 4's tile sweep: FlashAttention-1 timed with every tile configuration in `TILE_CONFIGS`.

    python -m tutorial_kernels.instruments.tile_sweep    # → data/ch04_tiles.json (CUDA GPU only)

`ch04_flash_v1.gpu_blocks` took its configuration from this sweep's fastest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton.testing

from tutorial_kernels import ch04_flash_v1 as ch04
from tutorial_kernels.paths import data_dir
from tutorial_kernels.provenance import provenance
from tutorial_kernels.reference import reference_attention, relative_error

# (block_m, block_n, num_warps, num_stages) timed per head dimension; `ch04.default_blocks` picked from them
TILE_CONFIGS = {
    64: [(64, 128, 4, 2), (64, 128, 8, 2), (64, 256, 4, 2), (64, 256, 8, 2), (128, 128, 8, 2), (128, 256, 8, 2),
         (32, 256, 4, 2), (64, 64, 4, 2), (64, 128, 4, 1), (64, 128, 4, 3)],
    128: [(64, 128, 4, 2), (64, 128, 8, 2), (64, 256, 4, 2), (64, 256, 8, 2), (128, 128, 8, 2), (32, 128, 4, 2),
          (64, 64, 4, 2), (64, 128, 8, 1), (64, 128, 8, 3)],
}


def time_tile_configs(lengths: tuple[int, ...] = (2048, 16384)) -> dict:
    """Time every configuration of TILE_CONFIGS (fp16, not causal, B·N = 16384, H·d = 2048) on this GPU."""
    rows = []
    for head_dim, configs in TILE_CONFIGS.items():
        for n in lengths:
            batch, heads = 16384 // n, 2048 // head_dim
            gen = torch.Generator(device="cuda").manual_seed(n + head_dim)
            q, k, v = (torch.randn(batch, heads, n, head_dim, generator=gen, device="cuda", dtype=torch.float16)
                       for _ in range(3))
            ref = reference_attention(q[:1, :1], k[:1, :1], v[:1, :1])
            for block_m, block_n, num_warps, num_stages in configs:
                def call():
                    return ch04.flash_attn_v1_with_lse(q, k, v, block_m=block_m, block_n=block_n,
                                                    num_warps=num_warps, num_stages=num_stages)[0]
                err = relative_error(call()[:1, :1], ref)
                ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
                rows.append(dict(head_dim=head_dim, n=n, batch=batch, heads=heads, block_m=block_m, block_n=block_n,
                                 num_warps=num_warps, num_stages=num_stages, ms=ms, rel_err_head0=err,
                                 tflops=4.0 * batch * heads * n * n * head_dim / (ms * 1e-3) / 1e12,
                                 default=ch04.gpu_blocks(head_dim) == dict(block_m=block_m, block_n=block_n,
                                                                      num_warps=num_warps, num_stages=num_stages)))
                print(f"d={head_dim:3} N={n:5} {block_m:3}×{block_n:3} warps={num_warps} stages={num_stages}: "
                      f"{ms:8.3f} ms {rows[-1]['tflops']:6.1f} TFLOP/s err {err:.1e}", flush=True)
    return {
        "description": "Chapter 4: FlashAttention-1 tile configurations, fp16, not causal, B·N = 16384, H·d = 2048",
        "notes": ["triton.testing.do_bench median (warmup 25 ms, rep 100 ms), after one checked call."],
        "tiles": rows,
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.instruments.tile_sweep",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="JSON file to write (default: data/ch04_tiles.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the tile sweep times kernels on a CUDA GPU; none is visible here")
    out = args.out or data_dir() / "ch04_tiles.json"
    results = time_tile_configs()
    info = provenance(" ".join(["python -m tutorial_kernels.instruments.tile_sweep", *argv])) | {"suite": "ch04-tiles"}
    data = {"description": results.pop("description"), "notes": results.pop("notes"), "provenance": info,
            "results": [], **results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
