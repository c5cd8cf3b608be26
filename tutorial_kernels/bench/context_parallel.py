"""Chapter 10's measurements on a machine with several GPUs: `python -m tutorial_kernels.bench.context_parallel`.

One causal attention layer (bf16, H = 32, d = 128, batch 1) over a sequence of N positions, on 1, 2 and 4
GPUs of one host (one process per GPU, NCCL), side by side in one run:

* one GPU: the front door, and torch's SDPA (its flash and cuDNN backends) — the single-GPU baselines;
* P GPUs: `ring_attention` and `ulysses_attention` (chapter 10), and PyTorch's own context parallelism
  (`torch.distributed.tensor.experimental.context_parallel`, ring attention over SDPA, its default rotation
  and load balancing) with SDPA's flash and cuDNN backends.

Each configuration is timed forward and forward + backward: one warm-up call, then `--iters` calls, each
timed by CUDA events on every rank, the slowest rank's time kept and the median over calls reported;
peak memory per GPU is max_memory_allocated over a forward + backward. The ring's parts are also timed
alone: its P − 1 key/value hops without computing (communication), and its P steps' kernels without
sending (computation). Before timing, each distributed method's output and gradients at N = 8192 are
compared with the one-GPU front door's (largest elementwise difference, recorded). Writes
data/ch10_context_parallel.json with provenance (GPU count, NCCL version).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tutorial_kernels.attention import flash_attention, flash_attention_forward
from tutorial_kernels.ch10_context_parallel import (ring_attention, ring_blocks, sharded_versus_whole, ulysses_attention,
                                                    zigzag_chunks)
from tutorial_kernels.paths import data_dir
from tutorial_kernels.ranks import run_ranks

HEADS, HEAD_DIM, BATCH = 32, 128, 1
CHECK_N = 8192


def causal_flops(n: int, backward: bool) -> float:
    """4·B·H·N²·d / 2 for the forward's two matmuls over the causal half; the backward's five add 2.5×."""
    forward = 4 * BATCH * HEADS * n * n * HEAD_DIM / 2
    return forward * (3.5 if backward else 1.0)


def _timed(fn, iters: int, backward: bool) -> dict:
    """Median over calls of the slowest rank's time (s); peak memory (GiB) of a forward + backward."""
    times = []
    for i in range(iters + 1):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.reset_peak_memory_stats()
        start.record()
        out, grad = fn()
        if backward:
            out.backward(grad)
        end.record()
        torch.cuda.synchronize()
        seconds = torch.tensor(start.elapsed_time(end) / 1e3, device="cuda")
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if i:  # the first call warms up
            times.append(seconds.item())
    peak = torch.tensor(torch.cuda.max_memory_allocated() / 2**30, device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return {"seconds": statistics.median(times), "peak_gib_per_gpu": round(peak.item(), 2) if backward else None}


def _inputs(n: int, world: int, rank: int, grad: bool):
    """This rank's shards of q, k, v and dO (random, drawn per rank: timing needs no whole tensor)."""
    n_local = n // world
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    make = lambda: torch.randn(BATCH, HEADS, n_local, HEAD_DIM, device="cuda", generator=g,  # noqa: E731
                               dtype=torch.bfloat16)
    q, k, v, do = make(), make(), make(), make()
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v, do


def _torch_cp(n: int, world: int, backend):
    """PyTorch's context parallelism: full-length buffers sharded in place by its context manager, SDPA
    inside it running its ring; returns a call for `_timed` and the context to enter."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import sdpa_kernel

    mesh = init_device_mesh("cuda", (world,))
    g = torch.Generator(device="cuda").manual_seed(7)
    full = [torch.randn(BATCH, HEADS, n, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4)]
    context = context_parallel(mesh, buffers=full, buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(full))
    return full, context, sdpa_kernel(backend)


def _ring_parts(n: int, world: int, rank: int, iters: int) -> dict:
    """The ring's forward split in two: its key/value hops alone, and its steps' kernels alone."""
    q, k, v, _ = _inputs(n, world, rank, grad=False)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    buffers = [torch.empty_like(k), torch.empty_like(v)]

    def hops():
        held = [k, v]
        for _ in range(world - 1):
            ops = [dist.P2POp(dist.isend, t, nxt) for t in held] + [dist.P2POp(dist.irecv, t, prv) for t in buffers]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
            held = list(buffers)
        return held[0], None

    chunks = [b - a for a, b in zigzag_chunks(n, world)]

    def kernels():
        for step in range(world):
            source = (rank - step) % world
            for rows, keys, causal in ring_blocks(rank, source, True, (chunks[rank], chunks[-1 - rank]),
                                                  (chunks[source], chunks[-1 - source])):
                out = flash_attention_forward(q[:, :, rows], k[:, :, keys], v[:, :, keys], causal)
        return out[0], None

    return {"communication_s": _timed(hops, iters, False)["seconds"],
            "computation_s": _timed(kernels, iters, False)["seconds"]}


def _check(world: int, rank: int) -> dict:
    """Largest |difference| of ring's and Ulysses' output and gradients from the one-GPU front door's."""
    return {method: sharded_versus_whole(rank, world, CHECK_N, HEADS, HEADS, HEAD_DIM, True, method, seed=11,
                                         dtype=torch.bfloat16)
            for method in ("ring", "ulysses")}


def _ours_and_baselines(n: int, world: int, rank: int, iters: int, backward: bool) -> list[dict]:
    """One GPU: the front door and torch's SDPA; several: ring and Ulysses. Inputs freed on return."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, do = _inputs(n, world, rank, grad=backward)
    calls = {}
    if world == 1:
        calls["front door"] = lambda: (flash_attention(q, k, v, True), do)
        for label, backend in (("torch SDPA (flash)", SDPBackend.FLASH_ATTENTION),
                               ("torch SDPA (cuDNN)", SDPBackend.CUDNN_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True), do
            calls[label] = sdpa
    else:
        calls["ring"] = lambda: (ring_attention(q, k, v, True), do)
        calls["ulysses"] = lambda: (ulysses_attention(q, k, v, True), do)
    return [{"gpus": world, "n": n, "method": label, "backward": backward, **_timed(fn, iters, backward)}
            for label, fn in calls.items()]


def _torch_context_parallel(n: int, world: int, iters: int, backward: bool) -> list[dict]:
    """PyTorch's context parallelism with SDPA's flash and cuDNN backends (a refusal is recorded)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    rows = []
    for label, backend in (("torch context_parallel (flash)", SDPBackend.FLASH_ATTENTION),
                           ("torch context_parallel (cuDNN)", SDPBackend.CUDNN_ATTENTION)):
        row = {"gpus": world, "n": n, "method": label, "backward": backward}
        try:
            full, context, kernel = _torch_cp(n, world, backend)
            with context, kernel:
                shards = [t.detach().requires_grad_(backward) for t in full[:3]]
                row.update(_timed(lambda: (F.scaled_dot_product_attention(*shards, is_causal=True), full[3]),
                                  iters, backward))
            # its buffers keep their whole-sequence storage (sharded by resize_), so its peak is not comparable
            row["peak_gib_per_gpu"] = None
        except Exception as e:  # noqa: BLE001  (a backend PyTorch refuses here is recorded, not fatal)
            row["refused"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
    return rows


def _measure_on_rank(rank: int, world: int, lengths: list[int], iters: int) -> dict:
    rows = []
    checks = _check(world, rank) if world > 1 else None
    for n in lengths:
        for backward in (False, True):
            rows += _ours_and_baselines(n, world, rank, iters, backward)
            if world > 1:
                rows += _torch_context_parallel(n, world, iters, backward)
            torch.cuda.empty_cache()
        if world > 1:
            rows.append({"gpus": world, "n": n, "method": "ring parts", "backward": False,
                         **_ring_parts(n, world, rank, iters)})
    return {"rows": rows, "checks": checks, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}


def _interconnect() -> list[str] | None:
    """`nvidia-smi topo -m`'s matrix (how each pair of GPUs is linked), or None where it does not answer."""
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    matrix = done.stdout.split("Legend")[0].replace("\x1b[4m", "").replace("\x1b[0m", "")
    return [line.rstrip() for line in matrix.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> None:
    from tutorial_kernels.provenance import provenance

    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.bench.context_parallel",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32768, 131072, 262144])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--out", type=Path, default=data_dir() / "ch10_context_parallel.json")
    args = parser.parse_args(argv)
    available = torch.cuda.device_count()
    if available == 0:
        parser.error("chapter 10 is measured on CUDA GPUs; none is visible here")
    runs = []
    for world in [w for w in args.gpus if w <= available]:
        found = run_ranks(_measure_on_rank, world, args.lengths, args.iters, backend="nccl")
        runs.append({"gpus": world, **found})
        for row in found["rows"]:
            print(json.dumps(row), flush=True)
        if found["checks"]:
            print(world, "GPUs, differences from one GPU:", json.dumps(found["checks"]), flush=True)
    document = {
        "description": __doc__.split("\n\n", 1)[1].strip(),
        "shape": {"batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": "bfloat16", "causal": True},
        "provenance": {**provenance(" ".join(["python -m tutorial_kernels.bench.context_parallel",
                                              *(argv if argv is not None else sys.argv[1:])])),
                       "gpus_on_host": available, "nccl": runs[0]["nccl"] if runs else None,
                       "interconnect": _interconnect()},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
