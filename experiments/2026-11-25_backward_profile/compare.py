"""The Hopper backward as committed against an earlier version of it (a file), chapter 6's Triton backward and
torch's cuDNN backend: backward-only time, interleaved rounds, fp16 and bf16, B·N = 16k, H = 16, d = 128.

    FA_GIT_COMMIT=... python experiments/2026-11-25_backward_profile/compare.py OUT.json BEFORE.py [N ...]
"""
import importlib.util
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tutorial_kernels import ch07_hopper_backward as now
from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse
from tutorial_kernels.ch06_backward import flash_attn_backward

out_path, before_path = sys.argv[1], sys.argv[2]
sizes = [int(a) for a in sys.argv[3:]] or [4096, 16384]
spec = importlib.util.spec_from_file_location("before", before_path)
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)
results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("FA_GIT_COMMIT"),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "command": " ".join(sys.argv), "rows": []}
for dtype in (torch.float16, torch.bfloat16):
    for n in sizes:
        for causal in (False, True):
            b, h, d = 16384 // n, 16, 128
            g = torch.Generator(device="cuda").manual_seed(n + causal)
            q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
            o, lse = flash_attn_v2_with_lse(q, k, v, causal)
            ref = now.flash_attn_hopper_backward(q, k, v, o, lse, do, causal)
            old = before.flash_attn_hopper_backward(q, k, v, o, lse, do, causal)
            same = [float((a.float() - c.float()).abs().max()) for a, c in zip(ref, old)]
            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                oc = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            runs = {
                "now": lambda: now.flash_attn_hopper_backward(q, k, v, o, lse, do, causal),
                "before": lambda: before.flash_attn_hopper_backward(q, k, v, o, lse, do, causal),
                "triton": lambda: flash_attn_backward(q, k, v, o, lse, do, causal, tuned=True),
                "cudnn": lambda: torch.autograd.grad(oc, (qg, kg, vg), do, retain_graph=True),
            }
            ms = {name: [] for name in runs}
            for r in range(3):
                names = list(runs)[r:] + list(runs)[:r]
                for name in names:
                    ms[name].append(do_bench(runs[name], warmup=25, rep=100))
            flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
            row = {"dtype": str(dtype), "n": n, "causal": causal, "max_diff_now_vs_before": same,
                   "ms": {k: sorted(v)[1] for k, v in ms.items()}, "ms_rounds": ms}
            row["tflops"] = {k: round(flops / v / 1e9, 1) for k, v in row["ms"].items()}
            row["x_cudnn"] = {k: round(row["ms"]["cudnn"] / v, 3) for k, v in row["ms"].items()}
            print(dtype, n, causal, row["x_cudnn"], row["max_diff_now_vs_before"], flush=True)
            results["rows"].append(row)
            json.dump(results, open(out_path, "w"), indent=1)
