"""Where a decode call's host time goes: cProfile of flash_attention_with_kvcache, and the host cost
of one launch through Triton's JIT (`kernel[grid](…)`) against the compiled kernel's own runner.

    PYTHONPATH=. python3 experiments/2026-11-28_decode_tiles/probe3.py OUTDIR
"""
import cProfile
import inspect
import io
import json
import pstats
import sys
import time

import torch
import triton
import triton.language as tl

from tutorial_kernels import ch08_decode

out = sys.argv[1]


def host_us(f, calls=500):
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        f()
    us = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return us


@triton.jit
def _tiny(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


b, h, hkv, n, d = 8, 32, 8, 4096, 128
q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
kc, vc = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in "kv")
lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
res = {}
f = lambda: ch08_decode.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens)
res["call_us"] = host_us(f)
res["call_1split_us"] = host_us(lambda: ch08_decode.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=1))
x = torch.randn(1024, device="cuda")
res["tiny_jit_launch_us"] = host_us(lambda: _tiny[(1,)](x, 1000, BLOCK=1024))
compiled = _tiny[(1,)](x, 1000, BLOCK=1024)
runner = compiled[(1, 1, 1)]
try:
    res["tiny_runner_us"] = host_us(lambda: runner(x, 1000, 1024))
except Exception as e:
    res["tiny_runner_error"] = repr(e)[:300]
res["empty_us"] = host_us(lambda: torch.empty((b, h, 1, 8, d), device="cuda"))
res["sdpa_us"] = host_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, kc, vc, enable_gqa=True))
pr = cProfile.Profile()
pr.enable()
for _ in range(500):
    f()
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
s.write("\n\nBY CUMULATIVE\n")
pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(35)
open(f"{out}/profile.txt", "w").write(s.getvalue())
from triton.runtime import jit
from triton.compiler import compiler
open(f"{out}/triton_run_source.txt", "w").write(inspect.getsource(jit.JITFunction.run) + "\n\n" +
    inspect.getsource(jit.compute_cache_key) + "\n\n" + inspect.getsource(compiler.CompiledKernel.__getitem__) + "\n\n" +
    inspect.getsource(compiler.CompiledKernel.launch_metadata) + "\n\n" + inspect.getsource(jit.create_function_from_signature))
json.dump(res, open(f"{out}/host.json", "w"), indent=1)
print(res)
