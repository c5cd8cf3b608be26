"""Benchmark harness shared by every chapter: `python -m tutorial_kernels.bench SUITE [--out PATH]`.

For each (provider, shape) it draws fresh random inputs, checks the output of one head against the
float64 reference, measures the peak extra memory of one call, and times the call with
`triton.testing.do_bench` (median after warm-up). torch's own attention runs in the same process:
eager PyTorch, and `scaled_dot_product_attention` with each backend pinned. Results and provenance
(GPU, versions, commit, date, exact command) go to a JSON file under `data/`.

    TFLOP/s = 4 · B · H · n_q · n_k · d / time   (× 0.5 when causal; FlashAttention-2 paper convention)

A provider that cannot run a shape is recorded, not dropped: status "oom" when the GPU runs out of
memory, "unsupported" when a pinned backend refuses the inputs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from tutorial_kernels.ch02_naive_attention import eager_attention, naive_attention
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.testing import random_qkv

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


@dataclass(frozen=True)
class Provider:
    """One attention implementation to time, and the context it must run in."""

    label: str
    fn: AttentionFn
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def _sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _pinned(backend_name: str) -> Callable[[], contextlib.AbstractContextManager]:
    def context():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, backend_name))

    return context


PROVIDERS: dict[str, Provider] = {
    "eager": Provider("eager PyTorch", eager_attention),
    "naive-triton": Provider("naive Triton (ch. 2)", naive_attention),
    "sdpa-default": Provider("torch SDPA (default pick)", _sdpa),
    "sdpa-flash": Provider("torch SDPA: flash", _sdpa, _pinned("FLASH_ATTENTION")),
    "sdpa-efficient": Provider("torch SDPA: mem-efficient", _sdpa, _pinned("EFFICIENT_ATTENTION")),
    "sdpa-cudnn": Provider("torch SDPA: cuDNN", _sdpa, _pinned("CUDNN_ATTENTION")),
    "sdpa-math": Provider("torch SDPA: math", _sdpa, _pinned("MATH")),
}


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    n: int
    head_dim: int
    causal: bool
    dtype: str = "float16"

    @property
    def flops(self) -> float:
        """4·B·H·N²·d: two matmuls of 2·N²·d each per head; half of S is skipped when causal."""
        full = 4.0 * self.batch * self.heads * self.n * self.n * self.head_dim
        return full * (0.5 if self.causal else 1.0)


@dataclass
class Suite:
    """A named sweep: which providers, on which shapes, written to which data file."""

    description: str
    providers: list[str]
    shapes: list[Shape]
    default_out: str
    notes: list[str] = field(default_factory=list)


SUITES: dict[str, Suite] = {
    "ch02-sweep": Suite(
        description="Chapter 2: time, TFLOP/s and peak extra memory vs N (B=1, H=32, d=128, fp16)",
        providers=["eager", "naive-triton", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"],
        shapes=[Shape(1, 32, n, 128, causal) for causal in (False, True) for n in (512, 1024, 2048, 4096, 8192, 16384)],
        default_out="ch02_sweep.json",
    ),
    "ch02-seed": Suite(
        description="The ROCm blog's sweep: B=1, H=32, d=128, fp16, causal, N=256..4096 step 256",
        providers=["eager", "sdpa-default", "naive-triton"],
        shapes=[Shape(1, 32, n, 128, True) for n in range(256, 4096 + 1, 256)],
        default_out="ch02_seed.json",
        notes=["The blog draws inputs with torch.rand; we use torch.randn (never zeros, mean zero)."],
    ),
}


def measure(provider: Provider, shape: Shape, *, warmup_ms: int = 25, rep_ms: int = 100) -> dict:
    """Check, measure memory and time one provider on one shape; never raises for OOM or refusal."""
    import triton.testing

    dtype = getattr(torch, shape.dtype)
    row: dict = {"provider": provider.label, **asdict(shape)}
    x = random_qkv(shape.batch, shape.heads, shape.n, shape.n, shape.head_dim, dtype, "cuda")
    row["seed"] = x.seed
    call = lambda: provider.fn(x.q, x.k, x.v, shape.causal)  # noqa: E731
    try:
        with provider.context():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = call()
            torch.cuda.synchronize()
            row["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
            # one head against the float64 reference: a fast wrong kernel must not be reported
            ref = reference_attention(x.q[:1, :1], x.k[:1, :1], x.v[:1, :1], shape.causal)
            row["rel_err_head0"] = relative_error(out[:1, :1], ref)
            del out, ref
            ms = triton.testing.do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    except torch.OutOfMemoryError:
        row["status"] = "oom"
        return row
    except RuntimeError as err:  # a pinned SDPA backend that refuses these inputs
        if "No available kernel" not in str(err) and "not supported" not in str(err).lower():
            raise
        row["status"] = "unsupported"
        row["error"] = str(err).splitlines()[0][:300]
        return row
    finally:
        del x
        torch.cuda.empty_cache()
    row.update(status="ok", ms=ms, tflops=shape.flops / (ms * 1e-3) / 1e12)
    return row


def provenance(suite_name: str, argv: list[str]) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "driver": _nvidia_smi("driver_version"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "command": " ".join(["python -m tutorial_kernels.bench", *argv]),
        "suite": suite_name,
        "timing": "triton.testing.do_bench median (warmup 25 ms, rep 100 ms); fresh torch.randn inputs",
        "peak_extra_memory": "torch.cuda.max_memory_allocated during one call minus memory allocated before it "
        "(inputs excluded, the output included)",
    }


def _triton_version() -> str:
    import triton

    return triton.__version__


def _nvidia_smi(field_name: str) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field_name}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _git_commit() -> str:
    """The commit measured: from git when the checkout has it, else from FA_GIT_COMMIT (set by the
    caller when only a copy of the working tree travels to the GPU machine)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FA_GIT_COMMIT", "unknown")


def _progress(items: list, desc: str) -> Iterator:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: fall back to one line per item
        for i, item in enumerate(items):
            print(f"{desc}: {i + 1}/{len(items)}", file=sys.stderr, flush=True)
            yield item
        return
    yield from tqdm(items, desc=desc)


def run_suite(name: str, out_path: Path, argv: list[str], providers: list[str] | None = None) -> dict:
    suite = SUITES[name]
    chosen = providers or suite.providers
    jobs = [(p, s) for s in suite.shapes for p in chosen]
    rows = [measure(PROVIDERS[p], s) | {"provider_key": p} for p, s in _progress(jobs, name)]
    result = {
        "description": suite.description,
        "notes": suite.notes,
        "provenance": provenance(name, argv),
        "results": rows,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _summary(result: dict) -> str:
    lines = [f"{'provider':28} {'causal':6} {'N':>6} {'ms':>9} {'TFLOP/s':>8} {'MiB':>9} {'rel.err':>8}"]
    for r in result["results"]:
        if r["status"] != "ok":
            lines.append(f"{r['provider']:28} {str(r['causal']):6} {r['n']:>6} {r['status']:>9}")
            continue
        lines.append(
            f"{r['provider']:28} {str(r['causal']):6} {r['n']:>6} {r['ms']:9.3f} {r['tflops']:8.1f} "
            f"{r['peak_extra_mib']:9.1f} {r['rel_err_head0']:8.1e}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.bench", description=__doc__.split("\n")[0])
    parser.add_argument("suite", choices=sorted(SUITES), help="which sweep to run")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: data/<suite's file>)")
    parser.add_argument("--providers", nargs="+", choices=sorted(PROVIDERS), help="subset of the suite's providers")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("benchmarks time real kernels and need a CUDA GPU; none is visible here")
    out = args.out or DATA_DIR / SUITES[args.suite].default_out
    result = run_suite(args.suite, out, argv, args.providers)
    print(_summary(result))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
