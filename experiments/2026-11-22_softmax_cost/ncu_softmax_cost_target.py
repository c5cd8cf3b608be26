"""Record of an experiment (fifth session): the program profiled by
`ncu --clock-control none --profile-from-start off --section ... --page raw --csv python3 tools/ncu_softmax_cost_target.py 4096`
(data/logs/2026-11-22_h100_ncu_causal4096_e41ecf4.csv).

Scratch: one launch each of cuDNN, chapter 5's tuned kernel and probe variants at the prefill shape,
between profiler start/stop, for `ncu --profile-from-start off`."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import probe_softmax_cost as P
from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_tuned

torch.manual_seed(0)
n, causal, dtype = int(sys.argv[1]), True, torch.bfloat16
q = torch.randn(1, 32, n, 128, device="cuda", dtype=dtype)
k = torch.randn(1, 8, n, 128, device="cuda", dtype=dtype)
v = torch.randn(1, 8, n, 128, device="cuda", dtype=dtype)
kf, vf = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, kf, vf, is_causal=causal)
calls = [cudnn, lambda: flash_attn_v2_tuned(q, k, v, causal),
         lambda: P.run(q, k, v, causal, 128, 128, 8, 3, "noexp", 0),
         lambda: P.run(q, k, v, causal, 64, 64, 4, 3, "mufu", 0)]
for c in calls:
    c()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for c in calls:
    c()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
