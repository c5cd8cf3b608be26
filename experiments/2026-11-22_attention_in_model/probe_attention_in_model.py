"""Probe: our attention inside a model against the same call timed alone.

    python3 tools/probe_attention_in_model.py --out data/prefill_attention_in_model.json   # H100, ~3 min

Mistral-7B (random weights, as in `tutorial_kernels.prefill`) at a few prompt lengths. For torch
SDPA as transformers calls it and for ours (`tutorial_kernels.hf_attention`), three GPU times of one
layer's attention call:

* alone, L2 warm: the call on layer 0's own q, k, v, captured in a CUDA graph and replayed
  (`triton.testing.do_bench_cudagraph`, as tools/probe_hopper_prefill_shape.py times): every replay
  finds q, k and v in the 50 MB L2 cache, where the previous replay left them;
* alone, L2 cleared: the same call with the L2 cache overwritten before each one
  (`triton.testing.do_bench`), so q, k and v come from HBM. The flush is about 80 µs of GPU work;
  a call whose CPU cost outlasts it has part of that cost timed as well;
* in the model: the profiler's time of the attention kernels during whole forwards, per call.

And the forward's latency for sdpa, ours, and two of our other paths forced on (the Hopper kernel
with one program per work item, and chapter 5's Triton kernel), the implementations taking turns
forward by forward as in the prefill study. Each implementation's last-position logits are first
checked against sdpa's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

ATTENTION_KERNELS = ("_flash_hopper_fwd", "_flash_v2_fwd", "sdpa", "fmha", "flash_fwd")  # names' fragments


def register_variants() -> dict[str, str]:
    """Register our adapter with one path forced on, under extra names; returns name → description."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from tutorial_kernels import ch05_hopper, hf_attention
    from tutorial_kernels.launch_plan import LaunchPlans

    hf_attention.register()

    def forced(one_program_per_item: bool = False, triton_kernel: bool = False):
        plans = LaunchPlans(ch05_hopper._flash_hopper_fwd)  # its own: a remembered launch keeps its schedule

        def attention(module, query, key, value, attention_mask, **kwargs):
            saved = ch05_hopper._launches, ch05_hopper.runs_persistent, hf_attention.preferred_over_triton
            ch05_hopper._launches = plans
            if one_program_per_item:
                ch05_hopper.runs_persistent = lambda *args: False
            if triton_kernel:
                hf_attention.preferred_over_triton = lambda *args: False
            try:
                return hf_attention.tutorial_flash_attention(module, query, key, value, attention_mask, **kwargs)
            finally:
                ch05_hopper._launches, ch05_hopper.runs_persistent, hf_attention.preferred_over_triton = saved
        return attention

    # (forcing one program per item also moves the adapter's threshold to MIN_KEYS: from 2048 tokens, as
    # measured here, the variant is the Hopper kernel; below, it would be the Triton kernel)
    variants = {"hopper_one_program_per_item": ("ours, Hopper kernel forced to one program per work item",
                                                forced(one_program_per_item=True)),
                "triton_tuned": ("ours, chapter 5's tuned Triton kernel forced", forced(triton_kernel=True))}
    for name, (_, fn) in variants.items():
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, hf_attention.tutorial_flash_mask)
    return {name: text for name, (text, _) in variants.items()}


def layer0_call(model, inputs: dict, impl: str):
    """A zero-argument call of `impl`'s attention function on layer 0's own q, k, v (and module)."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    captured = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured.setdefault("call", (module, query, key, value, attention_mask, kwargs))
        return AttentionInterface._global_mapping["sdpa"](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("capture_layer0", capture)
    AttentionMaskInterface.register("capture_layer0", AttentionMaskInterface._global_mapping[impl])
    model.set_attn_implementation("capture_layer0")
    with torch.inference_mode():
        model(**inputs)
    module, q, k, v, mask, kwargs = captured["call"]
    fn = AttentionInterface._global_mapping[impl]
    return lambda: fn(module, q, k, v, mask, **kwargs)[0]


def attention_us_in_model(model, inputs: dict, impl: str, forwards: int = 3) -> float:
    """Mean GPU time of one attention call (µs) during whole forwards, from the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model.set_attn_implementation(impl)
    layers = model.config.num_hidden_layers
    with torch.inference_mode():
        model(**inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(forwards):
                model(**inputs)
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"
               and any(part in e.name for part in ATTENTION_KERNELS)]
    assert len(kernels) == forwards * layers, f"{impl}: expected {forwards * layers} attention kernels, got " \
        f"{len(kernels)}: {sorted({e.name[:60] for e in kernels})}"
    return sum(e.device_time for e in kernels) / len(kernels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "prefill_attention_in_model.json")
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048, 4096, 8192],
                        help="prompt lengths, 2048 or more (see register_variants)")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    import torch
    import triton.testing

    from tutorial_kernels import bench, prefill

    variants = register_variants()
    impls = ["sdpa", "tutorial_fa2", *variants]
    model = prefill.build_model(prefill.MODELS["mistral-7b"])
    checks, results = [], []
    for n in args.lengths:
        check = prefill.check_model(model, "mistral-7b", n, impls)
        check["passed"] = all(err <= check["tolerance"] for err in check["rel_err_last_logits"].values())
        checks.append(check)
        print(json.dumps(check), flush=True)
        inputs = prefill._inputs(model, n, seed=1)
        timed = prefill.time_implementations(model, inputs, impls, warmup=2, seconds=args.seconds)
        for impl in impls:
            row = {"model": "mistral-7b", "impl": impl, "n": n, **timed[impl]}
            if impl in ("sdpa", "tutorial_fa2"):
                call = layer0_call(model, inputs, impl)
                warm, cleared = [], []
                for _ in range(3):  # rounds: the two timings alternate
                    warm.append(triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median") * 1e3)
                    cleared.append(triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3)
                row.update(alone_l2_warm_us=statistics.median(warm), alone_l2_cleared_us=statistics.median(cleared))
            row["in_model_us"] = attention_us_in_model(model, inputs, impl)
            results.append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    info = bench.provenance("attention-in-model", sys.argv[1:])
    info["command"] = "python3 tools/probe_attention_in_model.py " + " ".join(sys.argv[1:])
    info["transformers"] = __import__("transformers").__version__
    args.out.write_text(json.dumps({
        "description": "Mistral-7B prefill: one layer's attention timed alone (L2 warm, L2 cleared) and inside "
                       "whole forwards, and the forward's latency, for sdpa and our paths",
        "implementations": {"sdpa": "torch SDPA (transformers' call)", "tutorial_fa2": "ours, as registered",
                            **variants},
        "notes": ["ms, ms_min, reps: forward latency as in data/prefill.json (turns forward by forward)",
                  "alone_l2_warm_us: do_bench_cudagraph median on layer 0's q, k, v; alone_l2_cleared_us: do_bench "
                  "median (L2 overwritten before each call; a call whose CPU cost outlasts the flush has part of it "
                  "timed too); in_model_us: the profiler's mean attention-kernel time per call over 3 forwards"],
        "provenance": info, "checks": checks, "results": results,
    }, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
