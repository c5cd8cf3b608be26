"""How much device memory does one process hold beyond PyTorch's allocator after running one attention
path, and which compiled kernels spill? (The GPU suite at -n 16 ran out of memory with ~70 MiB allocated
by PyTorch per worker but 4-6 GiB in use.) Run one case per process:
    python probe_memory.py CASE DTYPE HEAD_DIM PRECISION   -> one JSON line on stdout
"""
import json
import sys

import torch

from tutorial_kernels import attention, ch04_flash_v1, ch05_flash_v2, ch06_backward
from tutorial_kernels.inputs import random_qkv


def used_mib():
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def compiled(fn):
    """Every CompiledKernel a JITFunction (or autotuner) holds: name, registers, spills."""
    jit = getattr(fn, "fn", fn)
    rows = []
    try:
        for cache in getattr(jit, "device_caches", {}).values():
            for ck in cache[0].values():
                ck._init_handles()
                rows.append(dict(name=ck.name, regs=ck.n_regs, spills=ck.n_spills, warps=ck.metadata.num_warps,
                                 shared=ck.metadata.shared, const=dict(ck.src.constants) if hasattr(ck, "src") else None))
    except Exception as e:  # the probe reports what it cannot read rather than dying
        rows.append(dict(error=repr(e)))
    return rows


CASES = {
    "ch04": lambda q, k, v: ch04_flash_v1.flash_attn_v1(q, k, v, True),
    "ch05_minimal": lambda q, k, v: ch05_flash_v2.flash_attn_v2_minimal(q, k, v, True),
    "ch05_teaching": lambda q, k, v: ch05_flash_v2.flash_attn_v2(q, k, v, True),
    "ch05_tuned": lambda q, k, v: ch05_flash_v2.flash_attn_v2_tuned(q, k, v, True),
    "ch06_teaching": lambda q, k, v: ch06_backward.flash_attention(q, k, v, True).sum().backward(),
    "ch06_tuned": lambda q, k, v: ch06_backward.flash_attention(q, k, v, True, tuned=True).sum().backward(),
    "front_door": lambda q, k, v: attention.flash_attention(q, k, v, True).sum().backward(),
}
KERNELS = {
    "ch04": [ch04_flash_v1._flash_v1_kernel],
    "ch05_minimal": [ch05_flash_v2._flash_v2_minimal_kernel],
    "ch05_teaching": [ch05_flash_v2._flash_v2_fwd_kernel],
    "ch05_tuned": [ch05_flash_v2._flash_v2_fwd_kernel],
    "ch06_teaching": [ch05_flash_v2._flash_v2_fwd_kernel, ch06_backward._attn_bwd_dkdv_kernel,
                      ch06_backward._attn_bwd_dq_kernel],
    "ch06_tuned": [ch05_flash_v2._flash_v2_fwd_kernel, ch06_backward._attn_bwd_dkdv_kernel,
                   ch06_backward._attn_bwd_dq_kernel],
    "front_door": [ch05_flash_v2._flash_v2_fwd_kernel, ch06_backward._attn_bwd_dkdv_kernel,
                   ch06_backward._attn_bwd_dq_kernel],
}

if __name__ == "__main__":
    case, dtype, head_dim, precision = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_float32_matmul_precision(precision)
    torch.zeros(1, device="cuda")
    base = used_mib()
    x = random_qkv(1, 4, 1000, 1000, head_dim, dtype)
    q, k, v = (t.requires_grad_(case.startswith("ch06") or case == "front_door") for t in (x.q, x.k, x.v))
    CASES[case](q, k, v)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    extra = used_mib() - base - torch.cuda.memory_reserved() / 2**20
    print(json.dumps(dict(case=case, dtype=sys.argv[2], head_dim=head_dim, precision=precision,
                          beyond_torch_mib=round(extra, 1),
                          kernels=[r for kern in KERNELS[case] for r in compiled(kern)])))
