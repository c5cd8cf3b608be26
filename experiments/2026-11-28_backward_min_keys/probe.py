"""Where should the front door switch from chapter 6's tuned Triton backward to chapter 7's Hopper backward?
MIN_KEYS is 4096 because 2048 was never measured. Backward alone, 1024 and 2048 tokens, the FlashAttention-2
paper's shapes (B·N = 16k, H·d = 2048), d = 64 and 128, fp16 and bf16, causal and not, 3 interleaved rounds
against cuDNN; the Triton backward is autotuned before it is timed.

    FA_GIT_COMMIT=... python experiments/2026-11-28_backward_min_keys/probe.py OUT.json
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tutorial_kernels.ch06_backward import flash_attn_backward
from tutorial_kernels.ch07_hopper import flash_attn_hopper_with_lse
from tutorial_kernels.ch07_hopper_backward import flash_attn_hopper_backward

out_path = sys.argv[1]
results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("FA_GIT_COMMIT"),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "command": " ".join(sys.argv), "times": []}
for n in (2048, 1024):
    for d in (128, 64):
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                g = torch.Generator(device="cuda").manual_seed(n + causal + d)
                q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
                o, lse = flash_attn_hopper_with_lse(q, k, v, causal)
                qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    oc = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                runs = {"hopper": lambda: flash_attn_hopper_backward(q, k, v, o, lse, do, causal),
                        "triton": lambda: flash_attn_backward(q, k, v, o, lse, do, causal, tuned=True),
                        "cudnn": lambda: torch.autograd.grad(oc, (qg, kg, vg), do, retain_graph=True)}
                for run in runs.values():  # compile, and autotune the Triton kernels, before any timing
                    run()
                ms = {name: [] for name in runs}
                for r in range(3):
                    for name in list(runs)[r % 3:] + list(runs)[:r % 3]:
                        ms[name].append(do_bench(runs[name], warmup=25, rep=100))
                med = {key: sorted(val)[1] for key, val in ms.items()}
                row = {"n": n, "d": d, "dtype": str(dtype), "causal": causal, "ms": med, "ms_rounds": ms,
                       "x_cudnn": {key: round(med["cudnn"] / val, 3) for key, val in med.items()}}
                print(n, d, dtype, causal, row["x_cudnn"], flush=True)
                results["times"].append(row)
                json.dump(results, open(out_path, "w"), indent=1)
