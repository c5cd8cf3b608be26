"""One front-door case in its own process: python case.py STAGE N_Q N_K D HEADS_KV DTYPE CAUSAL [CONFIGS]
STAGE: fwd (inference forward), lse (training forward), bwd (forward + backward), ch (chapter kernels
directly with the table's configurations), teach (chapter kernels with the teaching configurations)."""
import sys, torch
import tutorial_kernels
from tutorial_kernels import flash_attention
from tutorial_kernels.inputs import random_qkv

stage, n_q, n_k, d, kv, dt, causal = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6], sys.argv[7] == "1"
dtype = getattr(torch, dt)
x = random_qkv(2, 9, n_q, n_k, d, dtype, "cuda")
q, k, v = x.q, x.k[:, :kv], x.v[:, :kv]
if stage == "fwd":
    o = flash_attention(q, k, v, causal)
elif stage == "lse":
    q.requires_grad_()
    o = flash_attention(q, k, v, causal)
elif stage == "bwd":
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = flash_attention(q, k, v, causal)
    o.backward(torch.randn_like(o))
elif stage in ("ch", "teach", "chf", "teachf"):
    from tutorial_kernels import ch05_flash_v2 as c5, ch06_backward as c6
    tuned = stage.startswith("ch")
    o, lse = c5.flash_attn_v2_with_lse(q, k, v, causal, tuned=tuned)
    torch.cuda.synchronize(); print("lse ok", flush=True)
    if not stage.endswith("f"):
        o = o.clone()
        dq, dk, dv = c6.flash_attn_backward(q, k, v, o, lse, torch.randn_like(o), causal, tuned=tuned)
torch.cuda.synchronize()
print("ok", stage, sys.argv[2:], flush=True)
