"""Chapter 8's decode kernel, second probe: GPU time alone (CUDA-graph replay) per tile and number of
split waves, the paged kernel before and after the block size became a constant (one table read per
tile), and the host's cost per call of each entry point, beside torch's SDPA (flash, cuDNN).

    PYTHONPATH=. python3 experiments/2026-11-28_decode_tiles/probe2.py OUT.json
"""
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, "experiments/2026-11-28_decode_tiles")
import ch08_before  # the kernel module at 0a54ed9 (block size a runtime argument)

from tutorial_kernels import attention, ch08_decode
from tutorial_kernels.bench.providers import paged_copy
from tutorial_kernels.bench.timing import measure_ceilings
from tutorial_kernels.provenance import provenance

out_path = sys.argv[1]
SHAPES = [  # (B, H, H_kv, n, d), bf16
    (1, 32, 8, 4096, 128), (1, 32, 8, 32768, 128), (1, 32, 8, 131072, 128), (8, 32, 8, 32768, 128),
    (64, 32, 8, 4096, 128), (8, 32, 32, 32768, 128), (64, 32, 32, 4096, 64), (8, 32, 8, 32768, 64),
    (8, 32, 8, 1024, 128), (1, 32, 32, 1024, 128),
]
TILES = [dict(BLOCK_N=bn, num_warps=w, num_stages=s) for bn, w, s in
         ((32, 2, 4), (32, 4, 4), (64, 2, 3), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (128, 8, 2))]
WAVES = (1, 2, 4)
default_tiles = ch08_decode.decode_tiles
sm = torch.cuda.get_device_properties(0).multi_processor_count
result = {"provenance": provenance(" ".join(["python3", *sys.argv])), "ceilings": measure_ceilings(), "rows": []}


def graph_ms(f):
    """GPU time alone: the call captured in a CUDA graph, replays timed by do_bench (L2 flushed before each)."""
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f()
    return triton.testing.do_bench(g.replay, warmup=10, rep=40, return_mode="median")


def host_us(f, calls=300):
    """The host's time per call, the GPU kept ahead (each call only enqueues)."""
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        f()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def with_tiles(tiles):
    ch08_decode.decode_tiles = lambda *a, t=tiles: default_tiles(*a) | t


for (b, h, hkv, n, d) in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(b * 7 + n)
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kc, vc = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "kv")
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    kv_bytes = 2 * b * hkv * n * d * 2
    ref = F.scaled_dot_product_attention(q.float(), kc.float(), vc.float(), enable_gqa=True)
    shape = dict(batch=b, heads=h, kv_heads=hkv, n=n, head_dim=d)
    rows = []

    def add(**row):
        if "ms" in row:
            row["gb_per_s"] = kv_bytes / row["ms"] / 1e6
        rows.append(shape | row)

    for name, backend in (("sdpa-flash", "FLASH_ATTENTION"), ("sdpa-cudnn", "CUDNN_ATTENTION")):
        with torch.nn.attention.sdpa_kernel(getattr(torch.nn.attention.SDPBackend, backend)):
            f = lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            add(provider=name, ms=graph_ms(f), eager_ms=triton.testing.do_bench(f, warmup=10, rep=40, return_mode="median"),
                host_us=host_us(f))
    for tiles, waves in itertools.product(TILES, WAVES):
        with_tiles(tiles)
        splits = ch08_decode.choose_num_splits(b, hkv, 1, n, sm, tiles["BLOCK_N"], waves=waves)
        f = lambda: ch08_decode.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits)
        try:
            err = (f().float() - ref).abs().max().item()
            add(provider="kvcache", **tiles, waves=waves, num_splits=splits, ms=graph_ms(f), max_err=err)
        except Exception as e:
            add(provider="kvcache", **tiles, waves=waves, error=str(e).strip().splitlines()[-1][:200])
    ch08_decode.decode_tiles = default_tiles
    ranked = sorted((r for r in rows if r["provider"] == "kvcache" and "ms" in r), key=lambda r: r["ms"])
    for bs in (16, 256):
        kp, vp, table = paged_copy(kc, vc, lens, bs)
        for r in ranked[:3]:
            tiles = {k: r[k] for k in ("BLOCK_N", "num_warps", "num_stages")}
            with_tiles(tiles)
            f = lambda: ch08_decode.flash_attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table,
                                                                 num_splits=r["num_splits"])
            add(provider=f"kvcache-paged{bs}", **tiles, waves=r["waves"], num_splits=r["num_splits"], ms=graph_ms(f),
                max_err=(f().float() - ref).abs().max().item())
        ch08_decode.decode_tiles = default_tiles
        f = lambda: ch08_before.flash_attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table)
        add(provider=f"kvcache-paged{bs}-before", ms=graph_ms(f), max_err=(f().float() - ref).abs().max().item())
        del kp, vp
    # the defaults as a caller meets them: eager time and host cost per entry point
    f = lambda: ch08_decode.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens)
    add(provider="kvcache-default", ms=graph_ms(f), eager_ms=triton.testing.do_bench(f, warmup=10, rep=40, return_mode="median"),
        host_us=host_us(f))
    f = lambda: ch08_before.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens)
    add(provider="kvcache-before-default", ms=graph_ms(f), host_us=host_us(f))
    f = lambda: attention.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens)
    add(provider="front-door-kvcache", host_us=host_us(f))
    add(provider="host-check-only", host_us=host_us(lambda: ch08_decode.check_kvcache_inputs(
        q, kc, vc, None, None, lens, None, True, None, None)))
    add(provider="host-empty-x4", host_us=host_us(lambda: [torch.empty((b, h, 1, 8, d), device="cuda") for _ in range(4)]))
    result["rows"] += rows
    best = ranked[0]
    print(shape, "best", {k: best[k] for k in ("BLOCK_N", "num_warps", "num_stages", "waves", "num_splits")},
          round(best["gb_per_s"]), "GB/s;", ", ".join(f"{r['provider']} {r.get('gb_per_s', 0):.0f} GB/s {r.get('host_us', 0):.0f}us"
                                                        for r in rows if r["provider"] != "kvcache"), flush=True)
    json.dump(result, open(out_path, "w"), indent=1)
    del q, kc, vc
    torch.cuda.empty_cache()
json.dump(result, open(out_path, "w"), indent=1)
