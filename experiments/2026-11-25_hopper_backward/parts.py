"""The Hopper backward's parts on the GPU's own clock (torch.profiler): the Δ kernel, the dQ
accumulator's zeroing, the main kernel and dQ's conversion, at B·N = 16k, H = 16, d = 128.

    FA_GIT_COMMIT=... python experiments/2026-11-25_hopper_backward/parts.py OUT.json
"""
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse
from tutorial_kernels.ch07_hopper_backward import flash_attn_hopper_backward

results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("FA_GIT_COMMIT"),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "command": " ".join(sys.argv), "rows": []}
for n in (4096, 16384):
    for causal in (False, True):
        b, h = 16384 // n, 16
        q, k, v, do = (torch.randn(b, h, n, 128, device="cuda", dtype=torch.float16) for _ in range(4))
        o, lse = flash_attn_v2_with_lse(q, k, v, causal)
        for _ in range(3):
            flash_attn_hopper_backward(q, k, v, o, lse, do, causal)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                flash_attn_hopper_backward(q, k, v, o, lse, do, causal)
            torch.cuda.synchronize()
        parts = {}
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.count:
                parts[e.key[:60]] = round(e.device_time_total / e.count / 1000, 4)  # ms per call
        row = {"n": n, "causal": causal, "parts_ms": parts}
        print(row, flush=True)
        results["rows"].append(row)
        json.dump(results, open(sys.argv[1], "w"), indent=1)
