"""Full-precision float32 on the GPU: `tl.dot(input_precision="ieee")` (the CUDA cores) against
"tf32x3" (three TF32 products on the tensor cores, the low-order bits kept) and plain "tf32".
For each mode, in its own process: the relative error of every attention path against float64 (forward
and gradients, odd shapes), the time of a forward and a forward + backward at N = 4096, d = 128, the
largest number of registers spilled by any compiled kernel, and the device memory the process holds
beyond PyTorch's allocator (local memory for spills is reserved for every resident thread).
    PYTHONPATH=. python3 probe_fp32_modes.py MODE   -> one JSON line
"""
import json
import sys

import torch
import triton
import triton.testing

from tutorial_kernels import ch04_flash_v1, ch05_flash_v2, ch06_backward
from tutorial_kernels.inputs import random_qkv
from tutorial_kernels.reference import reference_attention, relative_error

MODE = sys.argv[1]
for module in (ch04_flash_v1, ch05_flash_v2, ch06_backward):  # every launcher asks its own imported name
    module.dot_precision = lambda dtype: MODE if dtype == torch.float32 else "tf32"


def spills(jit):
    worst = []
    for cache in jit.device_caches.values():
        for ck in cache[0].values():
            ck._init_handles()
            worst.append((ck.n_spills, ck.n_regs))
    return max(worst) if worst else None


def used_mib():
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


FORWARD = {"ch04": lambda q, k, v, c: ch04_flash_v1.flash_attn_v1(q, k, v, c),
           "minimal": lambda q, k, v, c: ch05_flash_v2.flash_attn_v2_minimal(q, k, v, c),
           "ch05": lambda q, k, v, c: ch05_flash_v2.flash_attn_v2(q, k, v, c)}
SHAPES = [(1, 4, 1000, 1000), (2, 3, 257, 130), (1, 2, 1, 77)]
torch.zeros(1, device="cuda")
base = used_mib()
errors = {}
for d in (64, 80, 128, 256):
    for b, h, nq, nk in SHAPES:
        for causal in (False, True):
            x = random_qkv(b, h, nq, nk, d, torch.float32)
            ref = reference_attention(x.q, x.k, x.v, causal)
            for name, fn in FORWARD.items():
                if name == "ch04" and d > 128:  # chapter 4's kernel takes d <= 128
                    continue
                try:
                    err = relative_error(fn(x.q, x.k, x.v, causal), ref)
                except Exception as e:  # a configuration that does not compile in this mode: say so
                    errors[name + "_error"] = f"d={d}: {type(e).__name__}: {str(e)[:120]}"
                    continue
                errors[name] = max(errors.get(name, 0.0), err)
            q, k, v = (t.detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
            ch06_backward.flash_attention(q, k, v, causal).backward(x.q.clone())
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (x.q, x.k, x.v))
            reference_attention(q64, k64, v64, causal).backward(x.q.double())
            for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
                errors[name] = max(errors.get(name, 0.0), relative_error(got, want))
    print(json.dumps(dict(mode=MODE, through_head_dim=d, max_rel_error=errors)), file=sys.stderr, flush=True)
times = {}
x = random_qkv(1, 16, 4096, 4096, 128, torch.float32)
for name, fn in FORWARD.items():
    try:
        times[name + "_fwd_ms"] = triton.testing.do_bench(lambda: fn(x.q, x.k, x.v, True))
    except Exception as e:
        times[name + "_fwd_ms"] = f"{type(e).__name__}"
q, k, v = (t.detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
times["ch06_fwd_bwd_ms"] = triton.testing.do_bench(
    lambda: ch06_backward.flash_attention(q, k, v, True).backward(x.q), grad_to_none=[q, k, v])
torch.cuda.synchronize()
torch.cuda.empty_cache()
print(json.dumps(dict(
    mode=MODE, max_rel_error=errors, times=times,
    spills_regs={n: spills(j) for n, j in (("ch04", ch04_flash_v1._flash_v1_kernel),
                                           ("minimal", ch05_flash_v2._flash_v2_minimal_kernel),
                                           ("ch05", ch05_flash_v2._flash_v2_fwd_kernel),
                                           ("dkdv", ch06_backward._attn_bwd_dkdv_kernel),
                                           ("dq", ch06_backward._attn_bwd_dq_kernel))},
    beyond_torch_mib=round(used_mib() - base - torch.cuda.memory_reserved() / 2**20),
    gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)))
