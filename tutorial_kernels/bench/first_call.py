"""How long the front door's first calls take in a fresh process: `python -m tutorial_kernels.bench.first_call`.

Each measurement runs in a new Python process with an empty Triton cache (its own TRITON_CACHE_DIR),
as a user's first run of a model on a new machine where Python's own bytecode is already compiled
(an installed environment: one discarded run first fills a bytecode cache, PYTHONPYCACHEPREFIX).
The process imports the package, then calls `flash_attention(q, q, q, causal=...)` with gradients
— the forward, then the backward, each timed to its synchronisation — in order:

* (1, 8, 1000, 64) float16 causal: the first call of the process;
* n = 900: the same length bucket and the same compiled kernels;
* n = 1024: a multiple of 16, which Triton compiles separately;
* n = 3000: another length bucket;
* (1, 8, 1000, 128) bfloat16, not causal: a new shape in a running process, every kernel new.

Once with the tile table (the default), once with the backward not compiled ahead, and once with
TUTORIAL_KERNELS_AUTOTUNE=1 (Triton's autotuner at every new bucket, the behaviour before the table).
A last process times torch's own SDPA at the first shape: what a process pays whatever attention it
runs. Writes data/first_call.json with provenance.
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

# (n, head_dim, dtype, causal) in the order called
CALLS = ((1000, 64, "float16", True), (900, 64, "float16", True), (1024, 64, "float16", True),
         (3000, 64, "float16", True), (1000, 128, "bfloat16", False))
_ONE_PROCESS = """
import json, sys, time
t0 = time.perf_counter()
import torch
import tutorial_kernels
imported = time.perf_counter() - t0
rows = []
for call in sys.argv[1:]:
    n, d, dtype, causal = call.split(":")
    n, d, dtype, causal = int(n), int(d), getattr(torch, dtype), causal == "causal"
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(1, 8, n, d, device="cuda", generator=g).to(dtype).requires_grad_()
    do = torch.randn(1, 8, n, d, device="cuda", generator=g).to(dtype)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o = tutorial_kernels.flash_attention(q, q, q, causal=causal)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    o.backward(do)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    assert torch.isfinite(q.grad).all()
    rows.append({"n": n, "head_dim": d, "dtype": str(dtype)[6:], "causal": causal,
                 "forward_s": round(t1 - t0, 4), "backward_s": round(t2 - t1, 4)})
print(json.dumps({"import_s": round(imported, 3), "calls": rows}))
"""
# torch's own first call at the first shape (SDPA, its default backend), timed the same way: what a process
# pays whatever attention it runs (the first backward imports torch's symbolic shapes, sympy)
_TORCH_FIRST_CALL = """
import json, time
import torch
import torch.nn.functional as F
g = torch.Generator(device="cuda").manual_seed(1000)
q = torch.randn(1, 8, 1000, 64, device="cuda", generator=g).half().requires_grad_()
do = torch.randn(1, 8, 1000, 64, device="cuda", generator=g).half()
torch.cuda.synchronize()
t0 = time.perf_counter()
o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
torch.cuda.synchronize()
t1 = time.perf_counter()
o.backward(do)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({"forward_s": round(t1 - t0, 4), "backward_s": round(t2 - t1, 4)}))
"""


def _run(script: str, args: list[str], env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-4000:]}")
    return {"stderr_lines": len([line for line in done.stderr.splitlines() if line.strip()]),
            **json.loads(done.stdout.splitlines()[-1])}


def measure(autotune: bool, bytecode: str, ahead: bool = True) -> dict:
    """One fresh process, an empty Triton cache, the calls of CALLS in order."""
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache, tempfile.TemporaryDirectory() as tiles:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "TUTORIAL_KERNELS_TILES": tiles, "PYTHONPYCACHEPREFIX": bytecode,
               "TUTORIAL_KERNELS_AUTOTUNE": "1" if autotune else "0", "TUTORIAL_KERNELS_COMPILE_AHEAD": str(int(ahead))}
        calls = [f"{n}:{d}:{dtype}:{'causal' if causal else 'full'}" for n, d, dtype, causal in CALLS]
        tiles = "autotuned at every new bucket" if autotune else "tile table" + ("" if ahead else ", compile ahead off")
        return {"tiles": tiles, **_run(_ONE_PROCESS, calls, env)}


def main(argv: list[str] | None = None) -> None:
    from tutorial_kernels.provenance import provenance

    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.bench.first_call", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=data_dir() / "first_call.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the first calls are timed on a CUDA GPU; none is visible here")
    with tempfile.TemporaryDirectory(prefix="pycache-") as bytecode:
        measure(autotune=False, bytecode=bytecode)  # discarded: fills Python's bytecode cache
        runs = [measure(autotune=False, bytecode=bytecode), measure(autotune=False, bytecode=bytecode, ahead=False),
                measure(autotune=True, bytecode=bytecode)]
        torch_share = _run(_TORCH_FIRST_CALL, [], {**os.environ, "PYTHONPYCACHEPREFIX": bytecode})
    document = {
        "description": "Seconds to the first results of tutorial_kernels.flash_attention(q, q, q, causal=...) with "
                       "gradients, (1, 8, n, head_dim), in a fresh process with an empty Triton cache and Python's "
                       "bytecode compiled: the forward and the backward, each to its synchronisation, for the calls "
                       "in order. One process per way of choosing tiles; 'compile ahead off' runs the table with "
                       "TUTORIAL_KERNELS_COMPILE_AHEAD=0 (the backward compiled when it is called). "
                       "torch_sdpa_first_call: torch's own scaled_dot_product_attention at the first call's "
                       "shape in a fresh process, timed the same way (what any attention pays: the first backward "
                       "imports torch's symbolic shapes). stderr_lines counts what a process printed on stderr "
                       "(compiler output included).",
        "provenance": provenance(" ".join(["python -m tutorial_kernels.bench.first_call", *(argv or sys.argv[1:])])),
        "first_calls": runs,
        "torch_sdpa_first_call": torch_share,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    for run in runs:
        print(run["tiles"], json.dumps(run["calls"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
