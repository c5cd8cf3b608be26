"""Probe: the CPU cost of one attention call through the front door against the kernels it wraps
and torch's SDPA, at the prefill models' attention shape (B=1, 32 query heads, 8 key/value heads,
d=128, bf16, causal), GPU work made small (N=128) so that the loop is bound by the CPU, and at N=2048.

    PYTHONPATH=. python3 experiments/2026-11-24_front_door/probe_front_door.py OUT.json
"""

import json
import sys
import time

import torch
import torch.nn.functional as F

from tutorial_kernels.attention import flash_attention
from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_tuned
from tutorial_kernels.ch07_hopper import flash_attn_hopper
from tutorial_kernels.provenance import provenance


def per_call_us(fn, calls=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    cpu = (time.perf_counter() - t) / calls * 1e6  # issuing the calls
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / calls * 1e6  # until the GPU has finished them
    return cpu, wall


rows = []
for n in (128, 2048):
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(1, n, 32, 128, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(1, n, 8, 128, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(1, n, 8, 128, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
    out = torch.empty(1, n, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    variants = {
        "front door, out=": lambda: flash_attention(q, k, v, True, out=out),
        "front door": lambda: flash_attention(q, k, v, True),
        "flash_attn_v2_tuned, out=": lambda: flash_attn_v2_tuned(q, k, v, True, out=out),
        "flash_attn_hopper, out=": lambda: flash_attn_hopper(q, k, v, True, out=out),
        "torch SDPA (enable_gqa)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    }
    with torch.no_grad():
        for name, fn in variants.items():
            cpu, wall = per_call_us(fn)
            rows.append({"n": n, "variant": name, "cpu_us_per_call": round(cpu, 2), "wall_us_per_call": round(wall, 2)})
            print(f"N={n:5d} {name:28s} cpu {cpu:8.1f} us/call  wall {wall:8.1f} us/call", flush=True)

json.dump({"provenance": provenance(" ".join(["python3", *sys.argv])), "results": rows}, open(sys.argv[1], "w"), indent=1)
