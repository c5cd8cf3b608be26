"""Which tiles let full-precision float32 run without spilling registers, in "ieee" (CUDA cores) or
"tf32x3" (three TF32 products on the tensor cores)? For one mode and one head dimension, each candidate
(BLOCK_M, BLOCK_N, warps, stages) of each kernel: does it compile, how many registers does it spill, its
error against float64 and its time at B=1, H=8, N=2048, causal.
    PYTHONPATH=. python3 probe_fp32_configs.py MODE HEAD_DIM   -> one JSON line per candidate
"""
import json
import sys

import torch
import triton
import triton.testing

from tutorial_kernels import ch04_flash_v1, ch05_flash_v2, ch06_backward
from tutorial_kernels.inputs import random_qkv
from tutorial_kernels.reference import reference_attention, relative_error

MODE, D = sys.argv[1], int(sys.argv[2])
for module in (ch04_flash_v1, ch05_flash_v2, ch06_backward):
    module.dot_precision = lambda dtype: MODE if dtype == torch.float32 else "tf32"


def worst_spills(*jits):
    out = []
    for jit in jits:
        for cache in jit.device_caches.values():
            for ck in cache[0].values():
                ck._init_handles()
                out.append((ck.n_spills, ck.n_regs))
    return max(out) if out else None


def clear(*jits):
    for jit in jits:
        for cache in jit.device_caches.values():
            cache[0].clear()


x = random_qkv(1, 8, 2048, 2048, D, torch.float32)
ref = reference_attention(x.q, x.k, x.v, True)
q, k, v = (t.detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
FWD = [(64, 64, 4, 1), (64, 32, 4, 1), (32, 32, 4, 1), (64, 64, 8, 1), (128, 32, 8, 1), (32, 64, 4, 1), (16, 32, 4, 1)]
BWD = [(64, 64, 4, 1), (32, 64, 4, 1), (64, 32, 4, 1), (32, 32, 4, 1), (64, 64, 8, 1), (16, 32, 4, 1), (32, 32, 2, 1)]
cases = [("minimal", c) for c in FWD] + [("ch05", c) for c in FWD] + [("bwd", c) for c in BWD]
if D <= 128:
    cases += [("ch04", c) for c in FWD[:4]]
for name, (bm, bn, w, s) in cases:
    row = dict(mode=MODE, head_dim=D, kernel=name, config=[bm, bn, w, s])
    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
    try:
        if name in ("minimal", "ch05"):
            ch05_flash_v2.teaching_config = lambda head_dim: dict(cfg)
            jits = (ch05_flash_v2._flash_v2_minimal_kernel if name == "minimal" else ch05_flash_v2._flash_v2_fwd_kernel,)
            fn = (ch05_flash_v2.flash_attn_v2_minimal if name == "minimal" else ch05_flash_v2.flash_attn_v2)
            call = lambda: fn(x.q, x.k, x.v, True)
            row["error"] = relative_error(call(), ref)
        elif name == "ch04":
            jits = (ch04_flash_v1._flash_v1_kernel,)
            call = lambda: ch04_flash_v1.flash_attn_v1_with_lse(x.q, x.k, x.v, True, block_m=bm, block_n=bn,
                                                                 num_warps=w, num_stages=s)[0]
            row["error"] = relative_error(call(), ref)
        else:
            jits = (ch06_backward._attn_bwd_dkdv_kernel, ch06_backward._attn_bwd_dq_kernel)
            o, lse = ch05_flash_v2.flash_attn_v2_with_lse(x.q, x.k, x.v, True)
            do = torch.randn_like(o)
            conf = triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn), num_warps=w, num_stages=s)
            call = lambda: ch06_backward.flash_attn_backward(x.q, x.k, x.v, o, lse, do, True, configs=(conf, conf))
            dq, dk, dv = call()
            row["finite"] = bool(torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all())
        row["spills_regs"] = worst_spills(*jits)
        row["ms"] = triton.testing.do_bench(call, warmup=5, rep=20)
    except Exception as e:
        row["failed"] = f"{type(e).__name__}: {str(e)[:100]}"
    print(json.dumps(row), flush=True)
    clear(*jits) if "jits" in dir() else None
