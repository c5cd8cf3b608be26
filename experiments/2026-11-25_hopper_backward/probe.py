"""Hopper backward (ch07_hopper_backward): gradients against float64 autograd on odd shapes, then
backward-only time against chapter 6's tuned Triton backward and torch's cuDNN and flash backends.

    FA_GIT_COMMIT=$(git rev-parse HEAD) python experiments/2026-11-25_hopper_backward/probe.py OUT.json [check|time|all]
"""
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse
from tutorial_kernels.ch06_backward import flash_attn_backward
from tutorial_kernels.ch07_hopper_backward import flash_attn_hopper_backward
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.tolerances import grad_tolerance

out_path, what = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "all")
results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("FA_GIT_COMMIT"),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "command": " ".join(sys.argv),
           "checks": [], "times": []}


def save():
    json.dump(results, open(out_path, "w"), indent=1)


def check(b, h, hkv, nq, nk, causal, dtype, layout="bhnd"):
    g = torch.Generator(device="cuda").manual_seed(nq * 7 + nk)
    if layout == "bhnd":
        q = torch.randn(b, h, nq, 128, device="cuda", generator=g).to(dtype)
        k = torch.randn(b, hkv, nk, 128, device="cuda", generator=g).to(dtype)
        v = torch.randn(b, hkv, nk, 128, device="cuda", generator=g).to(dtype)
    else:
        q = torch.randn(b, nq, h, 128, device="cuda", generator=g).to(dtype).transpose(1, 2)
        k = torch.randn(b, nk, hkv, 128, device="cuda", generator=g).to(dtype).transpose(1, 2)
        v = torch.randn(b, nk, hkv, 128, device="cuda", generator=g).to(dtype).transpose(1, 2)
    do = torch.randn(q.shape, device="cuda", generator=g).to(dtype)
    o, lse = flash_attn_v2_with_lse(q, k, v, causal)
    t0 = time.time()
    dq, dk, dv = flash_attn_hopper_backward(q, k, v, o, lse, do, causal)
    torch.cuda.synchronize()
    secs = time.time() - t0
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    grp = h // hkv
    reference_attention(q64, k64, v64, causal).backward(do.double())
    row = {"shape": [b, h, hkv, nq, nk], "causal": causal, "dtype": str(dtype), "layout": layout,
           "first_call_s": round(secs, 2), "bound": grad_tolerance(dtype)}
    for name, got, ref in (("dq", dq, q64.grad), ("dk", dk, k64.grad), ("dv", dv, v64.grad)):
        row[name] = {"nan": int(torch.isnan(got).sum()), "err": relative_error(got, ref)}
    row["ok"] = all(row[n]["nan"] == 0 and row[n]["err"] <= row["bound"] for n in ("dq", "dk", "dv"))
    print(row, flush=True)
    results["checks"].append(row)
    save()


if what in ("check", "all"):
    for args in [(1, 2, 2, 128, 128, False), (1, 2, 2, 128, 128, True), (2, 4, 2, 300, 300, False),
                 (2, 4, 2, 300, 300, True), (1, 1, 1, 1, 1, False), (1, 3, 1, 200, 517, True),
                 (1, 2, 2, 517, 200, True), (1, 2, 1, 517, 200, False), (1, 4, 4, 1000, 1000, True)]:
        for dtype in (torch.bfloat16, torch.float16):
            try:
                check(*args, dtype)
            except Exception:
                traceback.print_exc()
                results["checks"].append({"shape": list(args), "dtype": str(dtype), "error": traceback.format_exc()[-800:]})
                save()
    try:
        check(2, 4, 2, 300, 300, True, torch.bfloat16, layout="bnhd")
    except Exception:
        traceback.print_exc()


def bwd_flops(b, h, n, causal):
    return 2.5 * 4 * b * h * n * n * 128 / (2 if causal else 1)


if what in ("time", "all"):
    for n in (1024, 4096, 16384):
        b, h = 16384 // n, 16
        for causal in (False, True):
            for dtype in (torch.float16, torch.bfloat16):
                q, k, v = (torch.randn(b, h, n, 128, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
                do = torch.randn(b, h, n, 128, device="cuda", dtype=dtype)
                o, lse = flash_attn_v2_with_lse(q.detach(), k.detach(), v.detach(), causal)
                row = {"b": b, "h": h, "n": n, "causal": causal, "dtype": str(dtype)}
                fns = {"hopper": lambda: flash_attn_hopper_backward(q, k, v, o, lse, do, causal),
                       "triton": lambda: flash_attn_backward(q, k, v, o, lse, do, causal, tuned=True)}
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                    with sdpa_kernel(backend):
                        ot = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    fns[name] = (lambda ot=ot: torch.autograd.grad(ot, (q, k, v), do, retain_graph=True))
                for name, fn in fns.items():
                    try:
                        ms = do_bench(fn, warmup=50, rep=200)
                        row[name + "_ms"] = round(ms, 4)
                        row[name + "_tflops"] = round(bwd_flops(b, h, n, causal) / ms / 1e9, 1)
                    except Exception:
                        row[name + "_error"] = traceback.format_exc()[-500:]
                print(row, flush=True)
                results["times"].append(row)
                save()
