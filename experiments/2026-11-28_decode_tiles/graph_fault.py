"""Which decode provider faults when its call is captured in a CUDA graph and replayed (the suite's first
cell, B=1, H=32, H_kv=8, n=1024, d=64, bf16)? One provider per process: a fault poisons the context.

    PYTHONPATH=. python3 experiments/2026-11-28_decode_tiles/graph_fault.py PROVIDER [eager-first|graph-only]
"""
import sys

import torch
import triton.testing

from tutorial_kernels.bench.providers import PROVIDERS
from tutorial_kernels.bench.shapes import DecodeShape

provider = PROVIDERS[sys.argv[1]]
shape = DecodeShape(1, 32, 8, 1024, 64, "bfloat16")
args, _ = shape.draw()
with provider.context():
    call = shape.prepare(provider.fn, args)
    out = call()
    torch.cuda.synchronize()
    if sys.argv[2] == "eager-first":
        for _ in range(3):
            call()
        torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed = call()
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    print(sys.argv[1:], "replay ok; max |graphed - eager|", (graphed.float() - out.float()).abs().max().item())
    triton.testing.do_bench(g.replay, warmup=10, rep=40)
    torch.cuda.synchronize()
    print(sys.argv[1:], "do_bench ok")
