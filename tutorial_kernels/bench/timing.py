"""Timing and memory measurement of providers on one shape.

`measure_shape(providers, shape)` returns one data row per provider: the shape's fields, the seed,
the check against float64, the peak extra memory of one call and, when it ran, `ms` (median over
`ROUNDS` interleaved rounds of `triton.testing.do_bench`, each round's in `ms_rounds`) and the rates.
A shape with `cuda_graph` (a decode step: microseconds of GPU work) is timed as a CUDA graph's replay,
the GPU's time alone, and its row adds the eager call's time and host cost (`_graphed`).
A provider that cannot run the shape gets status "oom" or "unsupported" (`refusal_reason`) instead of
an exception. Needs a CUDA GPU.
"""

from __future__ import annotations

from dataclasses import asdict
import time
from typing import TYPE_CHECKING, Callable

import torch
import triton.testing

from tutorial_kernels.turns import take_turns
from tutorial_kernels.validation import UnsupportedShape

if TYPE_CHECKING:
    from tutorial_kernels.bench.providers import Provider

# Each provider of a shape is timed in ROUNDS short rounds, interleaved with the others and in a
# rotated order, and its time is the median over rounds. Timing each provider once, one after the
# other, let the GPU's state set the order: the first measured after an idle gap (compiling,
# autotuning) ran at higher clocks than one measured straight after seconds of load
# (data/ch05_autotuner_diagnosis.json; docs/how-the-numbers-were-obtained.md, Benchmarks).
ROUNDS = 3


def refusal_reason(err: Exception) -> str | None:
    """'oom' or 'unsupported' for the failures a run records instead of raising; None for the others."""
    if isinstance(err, torch.OutOfMemoryError):
        return "oom"
    if isinstance(err, UnsupportedShape):  # one of our kernels refuses the shape (e.g. chapter 4 stops at d = 128)
        return "unsupported"
    if isinstance(err, RuntimeError) and ("No available kernel" in str(err) or "not supported" in str(err).lower()):
        return "unsupported"  # a pinned SDPA backend that refuses these inputs
    return None


HOST_CALLS = 50  # eager calls whose host time is averaged (few enough that the GPU's queue never fills)


def _graphed(call: Callable) -> tuple[Callable, dict]:
    """For a shape timed on the GPU alone (`shape.cuda_graph`): the call captured in a CUDA graph, whose
    replay is what the rounds time, and the eager call's own numbers over HOST_CALLS calls back to back:
    `host_us`, the host's time per call (until the last is enqueued), and `eager_ms`, the time per call
    until the GPU has finished them all, the slower of host and GPU. No L2 flush between these calls
    (do_bench's flush is GPU work that would hide the host's time)."""
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(HOST_CALLS):
        call()
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    host_us = (enqueued - start) / HOST_CALLS * 1e6
    eager_ms = (done - start) / HOST_CALLS * 1e3
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()

    def replay(graph=graph, call=call) -> None:  # `call` holds the inputs the graph reads: they must outlive it
        graph.replay()

    return replay, {"eager_ms": eager_ms, "host_us": host_us}


def _prepare(provider: Provider, shape, probing: bool = False) -> tuple[dict, Callable | None]:
    """Draw inputs, compile (and autotune), check the output against float64 and measure peak extra
    memory. Returns the row so far and the call to time, or None when the provider cannot run it.
    `probing`: any other failure (a candidate configuration that does not compile) is recorded with
    status "failed" instead of raised."""
    row: dict = {"provider": provider.label, **asdict(shape)}
    args, row["seed"] = shape.draw()
    try:
        with provider.context():
            call = shape.prepare(provider.fn, args) if hasattr(shape, "prepare") else lambda: provider.fn(*args)
            call()  # compile and autotune outside the measured region
            if provider.config is not None:
                row["config"] = provider.config(*args[:4])
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = call()
            torch.cuda.synchronize()
            row["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
            row.update(shape.check(out, args))
            del out
            if getattr(shape, "cuda_graph", False):
                call, measured = _graphed(call)
                row.update(measured)
    except Exception as err:
        status = refusal_reason(err)
        if status is None and not probing:
            raise
        lines = str(err).strip().splitlines() or [type(err).__name__]
        row["status"] = status or "failed"
        if status != "oom":  # a refusal says why on its first line; a compiler failure on its last
            row["error"] = (lines[0] if status else lines[-1])[:300]
        return row, None
    finally:
        torch.cuda.empty_cache()
    return row, call


def measure_shape(providers: list[Provider], shape, *, rounds: int = ROUNDS, rep_ms: int = 100,
                  probing: bool = False) -> list[dict]:
    """Check, measure memory and time every provider on one shape; never raises for OOM or refusal
    (nor, with `probing`, for a provider that fails to compile: its row says "failed"). Each provider
    keeps its own fresh inputs until the shape is done."""
    prepared = [_prepare(provider, shape, probing) for provider in providers]
    runnable = [i for i, (_, call) in enumerate(prepared) if call is not None]
    times: dict[int, list[float]] = {i: [] for i in runnable}
    for i in take_turns(runnable, rounds):
        row, call = prepared[i]
        if row.get("status") == "oom":
            continue
        try:
            with providers[i].context():
                times[i].append(triton.testing.do_bench(call, warmup=25, rep=rep_ms, return_mode="median"))
        except torch.OutOfMemoryError:
            row["status"] = "oom"
            torch.cuda.empty_cache()
    rows = []
    for i, (row, call) in enumerate(prepared):
        if call is not None and row.get("status") != "oom":
            ms = sorted(times[i])[len(times[i]) // 2]
            row.update(status="ok", ms=ms, ms_rounds=times[i], **shape.rates(ms))
        rows.append(row)
    del prepared
    torch.cuda.empty_cache()
    return rows


def measure(provider: Provider, shape, **options) -> dict:
    """One provider on one shape (see measure_shape)."""
    return measure_shape([provider], shape, **options)[0]


def measure_ceilings() -> dict:
    """The two roofs every figure is drawn against, measured in the same run: HBM copy bandwidth
    (bytes read + written) and fp16 matmul throughput (torch.matmul, 8192³, random data)."""
    # An idle H100 sits at a few hundred MHz and takes a moment to clock up: a second of matmuls
    # first, so neither the ceilings nor the suite's first shapes are measured on a cold GPU.
    warm = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    triton.testing.do_bench(lambda: warm @ warm, warmup=1000, rep=10)
    src = torch.randn(2**28, device="cuda", dtype=torch.float16)  # 512 MiB, ten times the L2
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    mm_ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
    return {
        "copy_tb_per_s": 2 * src.numel() * 2 / (copy_ms * 1e-3) / 1e12,
        "matmul_fp16_tflops": 2 * 8192**3 / (mm_ms * 1e-3) / 1e12,
    }
