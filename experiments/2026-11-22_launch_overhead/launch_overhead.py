"""One layer's attention call as a Hugging Face model makes it, ours against torch SDPA: CPU cost per
call and GPU time, on the tensors the model itself hands over (batch 1, bfloat16, causal). One GPU run:

    python3 tools/launch_overhead.py --out data/launch_overhead.json

The query, key and value are captured from a one-layer model with each prefill model's published
dimensions (`tutorial_kernels.prefill.MODELS`): the same layouts, strides and head counts as in the
prefill study. Each implementation is then called exactly as the model calls it, through
transformers' attention interface (`sdpa_attention_forward` for SDPA, `tutorial_flash_attention` for
ours), output layout included.

cpu_us: wall time of back-to-back calls at N = 16 (the GPU finishes each call before the CPU issues
the next, so the loop measures the CPU's cost per call), median of rounds; for ours also the cost of
the bare kernel launch two ways, no validation, no autotuner lookup, no allocation: through
Triton's dispatch (what our first call with a new signature pays), and the remembered launch of
`tutorial_kernels/launch_plan.py` (what every later call pays). gpu_ms: do_bench median at the longer
lengths, the implementations taking turns in rounds. profile: cProfile's top functions for ours.
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

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

CPU_LENGTH = 16
GPU_LENGTHS = (2048, 4096, 16384)
CALLS = 300


def capture_attention_inputs(model_key: str, n: int):
    """(module, query, key, value, kwargs) of the first attention call of a one-layer model built
    from `model_key`'s published config, for a prompt of n tokens."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from tutorial_kernels.hf_attention import tutorial_flash_mask
    from tutorial_kernels.prefill import MODELS, build_model

    captured = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured.update(module=module, query=query, key=key, value=value, mask=attention_mask, kwargs=kwargs)
        return torch.empty_like(query).transpose(1, 2), None

    AttentionInterface.register("capture_inputs", capture)
    AttentionMaskInterface.register("capture_inputs", tutorial_flash_mask)
    spec = MODELS[model_key]
    spec = type(spec)(spec.label, spec.source, spec.config_class, {**spec.config, "num_hidden_layers": 1})
    model = build_model(spec)
    model.set_attn_implementation("capture_inputs")
    ids = torch.randint(0, model.config.vocab_size, (1, n), device="cuda")
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    assert captured["mask"] is None, "a causal prompt without padding needs no mask"
    return captured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "launch_overhead.json")
    parser.add_argument("--models", nargs="+", default=["phi-2", "llama-3-8b"])
    args = parser.parse_args()
    import torch
    import triton
    import triton.testing
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from tutorial_kernels import bench
    from tutorial_kernels import ch05_flash_v2 as ch05
    from tutorial_kernels.hf_attention import tutorial_flash_attention

    impls = {"sdpa": sdpa_attention_forward, "tutorial_fa2": tutorial_flash_attention}
    rows = []
    for model in args.models:
        for n in (CPU_LENGTH, *GPU_LENGTHS):
            c = capture_attention_inputs(model, n)
            layout = {name: tuple(c[name].stride()) for name in ("query", "key", "value")}
            calls = {label: (lambda fn=fn: fn(c["module"], c["query"], c["key"], c["value"], None, **c["kwargs"]))
                     for label, fn in impls.items()}
            out = {label: call()[0].float() for label, call in calls.items()}  # compiles, autotunes
            err = ((out["tutorial_fa2"] - out["sdpa"]).norm() / out["sdpa"].norm()).item()
            shape = dict(model=model, n=n, heads=c["query"].shape[1], kv_heads=c["key"].shape[1],
                         head_dim=c["query"].shape[3], strides=layout, rel_err_vs_sdpa=err)
            assert err < 2e-2, f"ours differs from sdpa by {err:.3g} at {shape}"
            if n == CPU_LENGTH:
                calls.update(bare_launches(ch05, c))
                per_call = {label: [] for label in calls}
                for label in bench.take_turns(list(calls)):
                    for _ in range(50):
                        calls[label]()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(CALLS):
                        calls[label]()
                    torch.cuda.synchronize()
                    per_call[label].append((time.perf_counter() - t0) / CALLS * 1e6)
                for label, us in per_call.items():
                    row = {**shape, "impl": label, "cpu_us": statistics.median(us), "cpu_us_rounds": us}
                    if label == "tutorial_fa2":
                        row["profile"] = profile(calls[label])
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
            else:
                ms = {label: [] for label in calls}
                for label in bench.take_turns(list(calls)):
                    ms[label].append(triton.testing.do_bench(calls[label], warmup=25, rep=100, return_mode="median"))
                for label, rounds in ms.items():
                    rows.append({**shape, "impl": label, "gpu_ms": statistics.median(rounds), "ms_rounds": rounds})
                    print(json.dumps(rows[-1]), flush=True)
            del c, calls, out
            torch.cuda.empty_cache()
    info = bench.provenance("launch-overhead", sys.argv[1:])
    info["command"] = "python3 tools/launch_overhead.py " + " ".join(sys.argv[1:])
    info["timing"] = ("cpu_us: median over 3 rotated rounds of the mean over 300 back-to-back calls at N = 16; "
                      "gpu_ms: median over 3 rotated rounds of triton.testing.do_bench (warmup 25 ms, rep 100 ms, median)")
    args.out.write_text(json.dumps({"description": __doc__.split("\n")[0], "provenance": info, "results": [],
                                    "measurements": rows}, indent=1) + "\n")


def bare_launches(ch05, c) -> dict:
    """Ours without the Python around the kernel, two ways, each replayed on its own: the launch our
    launcher makes the first time through Triton's dispatch (same grid, arguments and tuned
    configuration, recorded from one call), and the remembered launch it makes every later time
    (tutorial_kernels/launch_plan.py)."""
    from unittest import mock

    import torch

    from tutorial_kernels.launch_plan import LaunchPlans

    q, k, v = c["query"], c["key"], c["value"]
    ch05.flash_attn_v2_tuned(q, k, v, True)  # tunes, if not done yet
    kernel, plans, recorded = ch05._flash_v2_fwd_kernel, LaunchPlans(ch05._flash_v2_fwd_kernel), []
    remember = plans.launch
    plans.launch = lambda key, grid, *args, **kwargs: recorded.append((key, grid, args, kwargs)) or remember(
        key, grid, *args, **kwargs)
    with mock.patch.object(ch05, "_tuned_launches", plans):
        ch05.flash_attn_v2_tuned(q, k, v, True)  # launches the tuned choice, remembers it
    key, grid, args, kwargs = recorded[0]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return {"tutorial_fa2, Triton's dispatch only": lambda: kernel[grid](*args, **kwargs),
            "tutorial_fa2, remembered launch only": lambda: plans.relaunch(key, *tensors)}


def profile(call) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        call()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    return text.getvalue().splitlines()[-24:]


if __name__ == "__main__":
    main()
