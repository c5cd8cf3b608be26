"""variant.py's backward (dS K pipelined into the next step) against the package's and cuDNN's: gradients
against float64 autograd on odd shapes first, then backward-only time at the FlashAttention-2 paper's shapes
(B·N = 16k, H·d = 2048), d = 64 and 128, fp16 and bf16, causal and not, 3 interleaved rounds.

    BWD_DQ_QUEUE=1 FA_GIT_COMMIT=... python experiments/2026-11-28_backward_dq_pipelined/probe.py OUT.json
"""
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tutorial_kernels.ch07_hopper import flash_attn_hopper_with_lse
from tutorial_kernels.ch07_hopper_backward import flash_attn_hopper_backward
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.tolerances import grad_tolerance

spec = importlib.util.spec_from_file_location("variant", Path(__file__).with_name("variant.py"))
variant = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variant)
out_path = sys.argv[1]
results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("FA_GIT_COMMIT"),
           "queue": int(variant.QUEUE), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "command": " ".join(sys.argv), "checks": [], "times": []}


def save():
    json.dump(results, open(out_path, "w"), indent=1)


for d in (128, 64):
    for b, h, hkv, nq, nk in [(1, 1, 1, 1, 1), (2, 4, 2, 300, 300), (1, 3, 1, 200, 517), (1, 2, 2, 517, 200)]:
        for causal in (False, True):
            for dtype in (torch.float16, torch.bfloat16):
                g = torch.Generator(device="cuda").manual_seed(nq * 7 + nk + d)
                q = torch.randn(b, h, nq, d, device="cuda", generator=g).to(dtype)
                k, v = (torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
                do = torch.randn(q.shape, device="cuda", generator=g).to(dtype)
                o, lse = flash_attn_hopper_with_lse(q, k, v, causal)
                row = {"d": d, "shape": [b, h, hkv, nq, nk], "causal": causal, "dtype": str(dtype),
                       "bound": grad_tolerance(dtype)}
                try:
                    dq, dk, dv = variant.flash_attn_hopper_backward(q, k, v, o, lse, do, causal)
                    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
                    reference_attention(q64, k64, v64, causal).backward(do.double())
                    for name, got, ref in (("dq", dq, q64.grad), ("dk", dk, k64.grad), ("dv", dv, v64.grad)):
                        row[name] = {"nan": int(torch.isnan(got).sum()), "err": relative_error(got, ref)}
                    row["ok"] = all(row[n]["nan"] == 0 and row[n]["err"] <= row["bound"] for n in ("dq", "dk", "dv"))
                except Exception:
                    row["error"] = traceback.format_exc()[-800:]
                    row["ok"] = False
                print(row, flush=True)
                results["checks"].append(row)
                save()
if not all(r["ok"] for r in results["checks"]):
    sys.exit("gradients wrong: not timed")
for d in (128, 64):
    for dtype in (torch.float16, torch.bfloat16):
        for n in (4096, 8192, 16384):
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                g = torch.Generator(device="cuda").manual_seed(n + causal + d)
                q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
                o, lse = flash_attn_hopper_with_lse(q, k, v, causal)
                qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    oc = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                runs = {"variant": lambda: variant.flash_attn_hopper_backward(q, k, v, o, lse, do, causal),
                        "package": lambda: flash_attn_hopper_backward(q, k, v, o, lse, do, causal),
                        "cudnn": lambda: torch.autograd.grad(oc, (qg, kg, vg), do, retain_graph=True)}
                ms = {name: [] for name in runs}
                for r in range(3):
                    for name in list(runs)[r % 3:] + list(runs)[:r % 3]:
                        ms[name].append(do_bench(runs[name], warmup=25, rep=100))
                med = {k: sorted(v)[1] for k, v in ms.items()}
                row = {"d": d, "dtype": str(dtype), "n": n, "causal": causal, "ms": med, "ms_rounds": ms,
                       "x_cudnn": {k: round(med["cudnn"] / v, 3) for k, v in med.items()}}
                print(d, dtype, n, causal, row["x_cudnn"], flush=True)
                results["times"].append(row)
                save()
