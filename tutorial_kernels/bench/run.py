"""Running suites and probes: measurements with their provenance, as the JSON written under `data/`.

- `run_suite`: a suite (or a subset of its providers, lengths, dtypes), rewriting the output file
  after every shape; `--append` keeps an earlier run's rows that this one does not re-measure.
- `run_probe`: candidate kernels against torch's cuDNN backend, for experiments outside the suites.
- `measure_subset`: some shapes of a suite, returned and not written (the notebooks' "your GPU" cells).
- `summary`: one printed line per row.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import torch

from tutorial_kernels.bench.providers import PROVIDERS, Provider
from tutorial_kernels.bench.suites import SUITES, Suite, fa2_paper_shapes
from tutorial_kernels.bench.timing import ROUNDS, measure_ceilings, measure_shape
from tutorial_kernels.provenance import provenance
from tutorial_kernels.tolerances import tolerance


def suite_provenance(suite_name: str, argv: list[str]) -> dict:
    """The machine's provenance, plus what this harness did: the suite, how it timed, what memory means."""
    return provenance(" ".join(["python -m tutorial_kernels.bench", *argv])) | {
        "suite": suite_name,
        "timing": f"per shape, every provider timed in {ROUNDS} interleaved rounds (rotated order) of "
        "triton.testing.do_bench (warmup 25 ms, rep 100 ms, median); ms is the median over rounds, ms_rounds "
        "each round's; fresh torch.randn inputs",
        "peak_extra_memory": "torch.cuda.max_memory_allocated during one call minus memory allocated before it "
        "(inputs excluded, the output included)",
    }


def _progress(items: list, desc: str) -> Iterator:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: fall back to one line per item
        for i, item in enumerate(items):
            print(f"{desc}: {i + 1}/{len(items)}", file=sys.stderr, flush=True)
            yield item
        return
    yield from tqdm(items, desc=desc)


def _shape_of(row: dict, suite: Suite):
    """The suite's shape a data row was measured on (rows store the shape's fields)."""
    for s in suite.shapes:
        if all(row.get(k) == v for k, v in asdict(s).items()):
            return s
    return None


def run_suite(
    name: str, out_path: Path, argv: list[str], providers: list[str] | None = None,
    lengths: list[int] | None = None, dtypes: list[str] | None = None, append: bool = False,
) -> dict:
    """Measure suite `name` (restricted to `providers`, sequence `lengths` and `dtypes` when given) and
    write it to `out_path` after every shape, with provenance (`argv` as typed) and the ceilings;
    returns what it wrote. `complete` is true once every job of every part has been measured."""
    suite = SUITES[name]
    chosen = providers or suite.providers
    shapes = [
        s for s in suite.shapes
        if (lengths is None or getattr(s, "n", None) in lengths) and (dtypes is None or getattr(s, "dtype", None) in dtypes)
    ]
    jobs = [(p, s) for s in shapes for p in suite.providers_for(s, chosen)]
    ceilings = measure_ceilings()  # first: it also brings an idle GPU up to its working clocks
    result = {
        "description": suite.description,
        "notes": suite.notes,
        "provenance": suite_provenance(name, argv),
        "ceilings": ceilings,
        "results": [],
    }
    kept, earlier_complete = [], True
    if append and out_path.exists():
        # a suite too long for one sitting, run in parts (e.g. one dtype each): keep the earlier
        # parts' rows, each tagged with the run that measured it, and their provenance
        earlier = json.loads(out_path.read_text())
        if earlier["provenance"].get("suite") != name:
            raise SystemExit(f"--append: {out_path} holds suite {earlier['provenance'].get('suite')!r}, not {name!r}")
        earlier_complete = earlier.get("complete", False)
        runs = earlier.get("earlier_runs", []) + [{k: earlier[k] for k in ("provenance", "ceilings")}]
        result["earlier_runs"] = runs
        measuring = {(p, s) for p, s in jobs}
        kept = [r | {"run": r.get("run", len(runs) - 1)} for r in earlier["results"]
                if (r["provider_key"], _shape_of(r, suite)) not in measuring]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for s in _progress(shapes, name):
        keys = suite.providers_for(s, chosen)
        rows = measure_shape([PROVIDERS[p] for p in keys], s)
        result["results"] += [row | {"provider_key": p} for row, p in zip(rows, keys)]
        # rewritten after every shape: a run cut short by a time limit still leaves what it measured
        result["complete"] = len(result["results"]) == len(jobs) and earlier_complete
        out_path.write_text(json.dumps(result | {"results": kept + result["results"]}, indent=1) + "\n")
    return result | {"results": kept + result["results"]}


def run_probe(candidates: dict[str, Callable], out_path: Path, command: str,
              head_dims=(64, 128), lengths=(4096, 16384), dtype: str = "float16",
              baselines: tuple[str, ...] = ()) -> dict:
    """Time candidate kernels (label → fn(q, k, v, causal)) against torch's cuDNN backend, and the
    PROVIDERS named in `baselines`, on the FlashAttention-2 paper's shapes, with `measure_shape`'s
    checks and rotated rounds. A candidate that does not compile is recorded as "failed", one whose
    output is off as "wrong", never timed as "ok". For experiments outside the suites; writes
    `out_path` after every shape."""
    providers = [PROVIDERS["sdpa-cudnn"], *(PROVIDERS[key] for key in baselines),
                 *(Provider(label, fn) for label, fn in candidates.items())]
    result = {"description": "probe: candidate kernels against torch's cuDNN backend", "ceilings": measure_ceilings(),
              "provenance": suite_provenance("probe", []) | {"command": command}, "results": []}
    for shape in fa2_paper_shapes(head_dims, lengths, (dtype,)):
        rows = measure_shape(providers, shape, probing=True)
        for row in rows:
            if row.get("status") == "ok" and row["rel_err_head0"] > tolerance(getattr(torch, dtype)):
                row["status"] = "wrong"
        result["results"] += rows
        cudnn = rows[0].get("tflops")
        for row in rows:
            ratio = f"{row['tflops'] / cudnn:.3f}× cuDNN" if row.get("status") == "ok" and cudnn else row.get("error", "")
            print(f"d={shape.head_dim} causal={shape.causal} N={shape.n} {row['provider']:32} {row['status']:6} "
                  f"{row.get('tflops', 0):6.0f} TFLOP/s {ratio}", flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def measure_subset(name: str, keep: Callable[[object], bool]) -> dict:
    """Measure the shapes of suite `name` that `keep` selects, with all its providers, and return
    them in the same form as a data file (not written): what a notebook overlays on the recording."""
    suite = SUITES[name]
    rows = [
        row | {"provider_key": key}
        for shape in suite.shapes if keep(shape)
        for row, key in zip(measure_shape([PROVIDERS[key] for key in suite.providers_for(shape)], shape),
                            suite.providers_for(shape))
    ]
    return {"description": suite.description, "provenance": suite_provenance(name, ["(subset, not written)"]), "results": rows}


def summary(result: dict) -> str:
    """One line per measurement: the provider, the shape, the time, the rate and the check."""
    lines = []
    for r in result["results"]:
        shape = " ".join(f"{k}={v}" for k, v in r.items()
                         if k in ("head_dim", "n", "causal", "dtype", "mode", "m", "k", "rows", "cols"))
        if r["status"] != "ok":
            lines.append(f"{r['provider']:40} {shape:50} {r['status']}")
            continue
        rate = f"{r['tflops']:7.1f} TFLOP/s" if "tflops" in r else f"{r['gb_per_s']:7.0f} GB/s"
        err = r.get("rel_err_head0", r.get("rel_err"))
        lines.append(f"{r['provider']:40} {shape:50} {r['ms']:9.3f} ms {rate} {r['peak_extra_mib']:9.1f} MiB err {err:.1e}")
    if "ceilings" in result:
        c = result["ceilings"]
        lines.append(f"ceilings: copy {c['copy_tb_per_s']:.2f} TB/s, fp16 matmul {c['matmul_fp16_tflops']:.0f} TFLOP/s")
    return "\n".join(lines)
