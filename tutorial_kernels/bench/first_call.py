"""How long the front door's first calls take in a fresh process: `python -m tutorial_kernels.bench.first_call`.

Each measurement runs in a new Python process with an empty Triton cache (its own TRITON_CACHE_DIR),
as a user's first run of a model on a new machine: import, then `flash_attention(q, q, q, causal=True)`
with gradients at (1, 8, 1000, 64) float16 — the forward, then the backward, each timed to its
synchronisation — then the same at other lengths: 900 (the same length bucket and the same compiled
kernels), 1024 (a multiple of 16, which Triton compiles separately) and 3000 (another bucket). Once
with the tile table (the default) and once with TUTORIAL_KERNELS_AUTOTUNE=1 (Triton's autotuner at
every new bucket, the behaviour before the table). Writes data/first_call.json with provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from tutorial_kernels.paths import data_dir

LENGTHS = (1000, 900, 1024, 3000)
_ONE_PROCESS = """
import json, sys, time
t0 = time.perf_counter()
import torch
import tutorial_kernels
imported = time.perf_counter() - t0
rows = []
for n in map(int, sys.argv[1:]):
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(1, 8, n, 64, device="cuda", generator=g).half().requires_grad_()
    do = torch.randn(1, 8, n, 64, device="cuda", generator=g).half()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o = tutorial_kernels.flash_attention(q, q, q, causal=True)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    o.backward(do)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    assert torch.isfinite(q.grad).all()
    rows.append({"n": n, "forward_s": round(t1 - t0, 4), "backward_s": round(t2 - t1, 4)})
print(json.dumps({"import_s": round(imported, 3), "calls": rows}))
"""


def measure(autotune: bool) -> dict:
    """One fresh process, an empty Triton cache, the calls of LENGTHS in order."""
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache, tempfile.TemporaryDirectory() as tiles:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "TUTORIAL_KERNELS_TILES": tiles,
               "TUTORIAL_KERNELS_AUTOTUNE": "1" if autotune else "0"}
        done = subprocess.run([sys.executable, "-c", _ONE_PROCESS, *map(str, LENGTHS)], env=env,
                              capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-4000:]}")
    return {"tiles": "autotuned at every new bucket" if autotune else "tile table", "stderr_lines":
            len([line for line in done.stderr.splitlines() if line.strip()]), **json.loads(done.stdout.splitlines()[-1])}


def main(argv: list[str] | None = None) -> None:
    from tutorial_kernels.provenance import provenance

    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.bench.first_call", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=data_dir() / "first_call.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the first calls are timed on a CUDA GPU; none is visible here")
    runs = [measure(autotune=False), measure(autotune=True)]
    document = {
        "description": "Seconds to the first results of tutorial_kernels.flash_attention(q, q, q, causal=True) with "
                       "gradients, (1, 8, n, 64) float16, in a fresh process with an empty Triton cache: the forward "
                       "and the backward, each to its synchronisation, for n in order " + ", ".join(map(str, LENGTHS))
                       + ". stderr_lines counts what the process printed on stderr (compiler output included).",
        "provenance": provenance(" ".join(["python -m tutorial_kernels.bench.first_call", *(argv or sys.argv[1:])])),
        "first_calls": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    for run in runs:
        print(run["tiles"], json.dumps(run["calls"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
