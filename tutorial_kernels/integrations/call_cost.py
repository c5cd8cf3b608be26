"""One layer's attention call as a Hugging Face model makes it, ours against torch SDPA: what it costs
the CPU to issue and the GPU to run. `python -m tutorial_kernels.integrations.call_cost [--out PATH]`.

The query, key and value are captured from a one-layer model built from each prefill model's published
configuration (`prefill.MODELS`): the layouts, strides and head counts the prefill study's models hand
over. Each implementation is then called as the model calls it, through transformers' attention
interface: `sdpa_attention_forward` for SDPA, `tutorial_flash_attention` (`hf_attention`) for ours,
which goes through the front door (`tutorial_kernels.flash_attention`).

cpu_us: the CPU time to issue one call, from the wall time of CALLS back-to-back calls measured before
waiting for the GPU (the calls queue up on the stream, so the loop runs at the CPU's pace as long as the
queue does not fill; CALLS keeps it well below the driver's limit), median of rotated rounds, at N = 16
and at N = 2048. gpu_ms: `triton.testing.do_bench` medians at the longer lengths, the implementations
taking turns. profile: cProfile's top functions for ours, at N = 2048.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

from tutorial_kernels.paths import data_dir, repository_root
from tutorial_kernels.provenance import provenance
from tutorial_kernels.turns import take_turns

CPU_LENGTHS = (16, 2048)
GPU_LENGTHS = (2048, 4096, 16384)
CALLS = 200  # back-to-back calls per round: at most a few launches each, far from the launch queue's limit
ROUNDS = 7  # the CPU's pace varies from round to round by a quarter at times: the median of 7
MODELS = ("phi-2", "llama-3-8b")  # head_dim 80 (chapter 5's Triton kernel) and 128 (chapter 7's from 1024 keys)


def capture_attention_inputs(model_key: str, n: int) -> dict:
    """{module, query, key, value, mask, kwargs} of the first attention call of a one-layer model built
    from `model_key`'s published configuration, for a prompt of n tokens (batch 1, bfloat16)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from tutorial_kernels.integrations.hf_attention import tutorial_flash_mask
    from tutorial_kernels.integrations.prefill import MODELS as SPECS
    from tutorial_kernels.integrations.prefill import build_model

    captured = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured.update(module=module, query=query, key=key, value=value, mask=attention_mask, kwargs=kwargs)
        return torch.empty_like(query).transpose(1, 2), None

    AttentionInterface.register("capture_inputs", capture)
    AttentionMaskInterface.register("capture_inputs", tutorial_flash_mask)
    spec = SPECS[model_key]
    spec = type(spec)(spec.label, spec.source, spec.config_class, {**spec.config, "num_hidden_layers": 1})
    model = build_model(spec)
    model.set_attn_implementation("capture_inputs")
    ids = torch.randint(0, model.config.vocab_size, (1, n), device="cuda")
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    assert captured["mask"] is None, "a causal prompt without padding needs no mask"
    return captured


def issue_us(call, calls: int = CALLS) -> float:
    """µs of wall time per call to issue `calls` calls, the GPU's work left queued (see the docstring)."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / calls * 1e6


def profile(call, calls: int = CALLS) -> list[str]:
    """cProfile's 14 most expensive functions (own time) over `calls` calls."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    root = repository_root()  # the package's files named from the repository, not this machine's folders
    lines = text.getvalue().splitlines()[-24:]
    return [line.replace(f"{root}/", "") for line in lines] if root is not None else lines


def measure(models=MODELS) -> list[dict]:
    import triton.testing
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from tutorial_kernels.integrations.hf_attention import tutorial_flash_attention

    impls = {"sdpa": sdpa_attention_forward, "tutorial_fa2": tutorial_flash_attention}
    rows = []
    for model in models:
        for n in sorted(set(CPU_LENGTHS) | set(GPU_LENGTHS)):
            c = capture_attention_inputs(model, n)
            calls = {label: (lambda fn=fn: fn(c["module"], c["query"], c["key"], c["value"], None, **c["kwargs"]))
                     for label, fn in impls.items()}
            with torch.inference_mode():
                out = {label: call()[0].float() for label, call in calls.items()}  # compiles, autotunes
            err = ((out["tutorial_fa2"] - out["sdpa"]).norm() / out["sdpa"].norm()).item()
            shape = dict(model=model, n=n, heads=c["query"].shape[1], kv_heads=c["key"].shape[1],
                         head_dim=c["query"].shape[3], rel_err_vs_sdpa=err,
                         strides={name: list(c[name].stride()) for name in ("query", "key", "value")})
            assert err < 2e-2, f"ours differs from sdpa by {err:.3g} at {shape}"
            cpu = {label: [] for label in calls}
            gpu = {label: [] for label in calls}
            with torch.inference_mode():
                for label in take_turns(list(calls), ROUNDS):
                    if n in CPU_LENGTHS:
                        cpu[label].append(issue_us(calls[label]))
                    if n in GPU_LENGTHS:
                        gpu[label].append(triton.testing.do_bench(calls[label], warmup=25, rep=100,
                                                                  return_mode="median"))
                for label in calls:
                    row = {**shape, "impl": label}
                    if cpu[label]:
                        row.update(cpu_us=statistics.median(cpu[label]), cpu_us_rounds=cpu[label])
                    if gpu[label]:
                        row.update(gpu_ms=statistics.median(gpu[label]), ms_rounds=gpu[label])
                    if label == "tutorial_fa2" and n == max(CPU_LENGTHS):
                        row["profile"] = profile(calls[label])
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
            del c, calls, out
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.integrations.call_cost",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write (default: data/launch_overhead.json)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("call_cost measures GPU launches: it needs a CUDA GPU")
    out = args.out or data_dir() / "launch_overhead.json"
    info = provenance(" ".join(["python -m tutorial_kernels.integrations.call_cost", *(argv or sys.argv[1:])]))
    info["timing"] = (f"cpu_us: median over {ROUNDS} rotated rounds of the wall time per call of {CALLS} back-to-back "
                      "calls, measured before waiting for the GPU; gpu_ms: median over the rounds of "
                      "triton.testing.do_bench (warmup 25 ms, rep 100 ms, median)")
    rows = measure(args.models)
    out.write_text(json.dumps({"description": __doc__.split("\n")[0], "provenance": info, "results": [],
                               "measurements": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
