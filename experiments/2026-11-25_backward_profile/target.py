"""One backward, for Nsight Compute to profile: our Hopper backward (Gluon), chapter 6's Triton backward, or
torch's cuDNN backward, at B·N = 16k, H = 16, d = 128, fp16 (the front-door benchmark's shapes).

    python experiments/2026-11-25_backward_profile/target.py {hopper|triton|cudnn} N {causal|full}

Each runs the backward three times (the first compiles and tunes; ncu's --launch-skip picks a later one).
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse
from tutorial_kernels.ch06_backward import flash_attn_backward
from tutorial_kernels.ch07_hopper_backward import flash_attn_hopper_backward

which, n, causal = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "causal"
b, h, d = 16384 // n, 16, 128
g = torch.Generator(device="cuda").manual_seed(n)
q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
if which == "cudnn":
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    for _ in range(3):
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
else:
    o, lse = flash_attn_v2_with_lse(q, k, v, causal)
    run = flash_attn_hopper_backward if which == "hopper" else flash_attn_backward
    for _ in range(3):
        run(q, k, v, o, lse, do, causal)
torch.cuda.synchronize()
print(which, n, causal, "done")
