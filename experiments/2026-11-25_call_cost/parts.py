"""Where the CPU time of one Hopper-path attention call goes, Llama-3-8B's prefill shape at N = 2048
(B = 1, 32 query heads, 8 key/value heads, d = 128, bf16, causal, the (B, N, H, d) layout transformers
hands over): each layer of the call timed on its own, µs per call of CPU time to issue it (median of 5
rounds of 200 calls, the GPU's work left queued; parts that launch nothing: 2000 calls).

    FA_GIT_COMMIT=$(git rev-parse --short HEAD) PYTHONPATH=. python experiments/2026-11-25_call_cost/parts.py OUT.json
"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from triton import knobs
from triton.runtime.driver import driver

from tutorial_kernels import ch07_hopper
from tutorial_kernels.attention import flash_attention
from tutorial_kernels.perf import launch_plan
from tutorial_kernels.perf.launch_plan import attention_call_key
from tutorial_kernels.provenance import provenance

n, heads, kv_heads, d = 2048, 32, 8, 128
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, n, heads, d, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
k = torch.randn(1, n, kv_heads, d, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
v = torch.randn(1, n, kv_heads, d, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
out = torch.empty(1, n, heads, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
with torch.no_grad():
    flash_attention(q, k, v, True, out=out)
    flash_attention(q, k, v, True, out=out)
    from tutorial_kernels import attention
    (kernel, scale, plan_key), = attention._DECISIONS.values()  # the front door's remembered Hopper launch
    assert kernel == "hopper" and plan_key in ch07_hopper._launches
    plan = ch07_hopper._launches._plans[plan_key]
    arguments = list(plan.arguments)
    for position, template, tensor in zip(plan.replaced, plan.templates, (q, k, v, out, out)):
        arguments[position] = launch_plan._over(template, tensor) if template is not None else tensor
    compiled, grid = plan.compiled, plan.grid
    stream = driver.active.get_current_stream(0)

    def run_only():
        compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, None,
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *arguments)

    parts = {
        "attention_call_key (4 tensors)": (False, lambda: attention_call_key(q, k, v, out, True, None, False)),
        "torch.empty + transpose (the adapter's output)": (False, lambda: torch.empty((1, n, heads, d), dtype=q.dtype, device=q.device).transpose(1, 2)),
        "3 descriptors over new tensors (_over)": (False, lambda: [launch_plan._over(t, x) for t, x in zip(plan.templates[:3], (q, k, v))]),
        "driver: current device + stream": (False, lambda: driver.active.get_current_stream(driver.active.get_current_device())),
        "knobs: both launch hooks": (False, lambda: (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)),
        "compiled.run only (Triton's launcher, descriptors expanded inside)": (True, run_only),
        "LaunchPlans.relaunch": (True, lambda: ch07_hopper._launches.relaunch(plan_key, q, k, v, out, out)),
        "flash_attn_hopper(out=)": (True, lambda: ch07_hopper.flash_attn_hopper(q, k, v, True, scale, out=out)),
        "flash_attention(out=) (the front door)": (True, lambda: flash_attention(q, k, v, True, out=out)),
        "F.scaled_dot_product_attention(enable_gqa=True)": (True, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)),
    }
    rows = []
    for name, (launches, fn) in parts.items():
        calls = 200 if launches else 2000
        rounds = []
        for _ in range(5):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            rounds.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
        rows.append({"part": name, "cpu_us": statistics.median(rounds), "cpu_us_rounds": rounds})
        print(f"{name:70s} {statistics.median(rounds):7.2f} us", flush=True)
json.dump({"provenance": provenance(" ".join(["python", *sys.argv])), "results": rows}, open(sys.argv[1], "w"), indent=1)
