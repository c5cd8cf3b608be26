"""Probe: tile shapes beyond the autotuner's candidates (BLOCK_M 256, 16 warps, 4 stages, 64 × 128), each
forced through chapter 5's launcher with and without TMA, against cuDNN, three rotated rounds per cell.

    OUT=/tmp python3 tools/probe_forward_tiles.py      # on a GPU; writes $OUT/tiles.json, ~2.5 min on an H100
"""
import sys, itertools, json
sys.path.insert(0, ".")
import torch, triton, triton.testing
from tutorial_kernels.ch05_flash_v2 import _launch
from tutorial_kernels.reference import reference_attention, relative_error
warm = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
triton.testing.do_bench(lambda: warm @ warm, warmup=1000, rep=10)
TILES = [(128,128,8,3),(128,64,8,3),(256,64,8,3),(256,64,16,3),(256,128,16,2),(256,32,8,3),(128,64,8,4),(128,128,8,2),(64,128,4,3)]
out = []
for d, causal, n in itertools.product((128, 64), (False, True), (4096, 16384)):
    b, h = 16384 // n, 2048 // d
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    flops = 4*b*h*n*n*d*(0.5 if causal else 1)
    ref = reference_attention(q[:1,:1], k[:1,:1], v[:1,:1], causal)
    def cudnn():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fns = {"cudnn": cudnn}
    for (bm, bn, w, st), tma in itertools.product(TILES, (False, True)):
        cfg = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "USE_DESCRIPTORS": tma}, num_warps=w, num_stages=st)
        fn = lambda cfg=cfg: _launch(q, k, v, causal, None, None, tuned=False, config=cfg)[0]
        try:
            o = fn(); torch.cuda.synchronize()
            e = relative_error(o[:1,:1], ref)
            if e < 3e-3: fns[f"{bm}x{bn} w{w} s{st} tma{int(tma)}"] = fn
            else: print("wrong", bm, bn, w, st, tma, e)
        except Exception as ex:
            print("fail", bm, bn, w, st, tma, str(ex).splitlines()[-1][:80])
    keys = list(fns); times = {k_: [] for k_ in keys}
    for r in range(3):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            times[key].append(triton.testing.do_bench(fns[key], return_mode="median"))
    tf = {k_: flops / sorted(t)[1] / 1e9 for k_, t in times.items()}
    best = sorted(((v_, k_) for k_, v_ in tf.items() if k_ != "cudnn"), reverse=True)[:5]
    print(d, causal, n, "cudnn %.0f" % tf["cudnn"], [(k_, round(v_), round(v_ / tf["cudnn"], 3)) for v_, k_ in best], flush=True)
    out.append(dict(d=d, causal=causal, n=n, tflops=tf))
import os; json.dump(out, open(os.environ["OUT"] + "/tiles.json", "w"), indent=1)
