"""Chapter 8's decode kernel: how many splits read the KV cache fastest, and can a rule that counts the
programs resident per SM pick it? For each shape every number of splits from 1 to MAX_SPLITS is timed
(GPU time alone, a CUDA graph's replay), beside cuDNN, on a contiguous cache and on 16- and 256-token
pages; the partial kernel's registers and shared memory are recorded to count resident programs.

    PYTHONPATH=. python3 experiments/2026-11-29_decode_splits/sweep.py OUT.json
"""
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.testing

from tutorial_kernels import ch08_decode
from tutorial_kernels.bench.providers import paged_copy
from tutorial_kernels.bench.timing import measure_ceilings
from tutorial_kernels.provenance import provenance

out_path = sys.argv[1]
quick = "--quick" in sys.argv
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
SHAPES = [(b, h, hkv, n, d, False) for b, (h, hkv), n, d in itertools.product(
    (1, 8, 64), ((32, 8), (32, 32)), (4096, 32768, 131072), (64, 128)) if b * hkv * n * d <= 64 * 8 * 32768 * 128]
SHAPES += [(8, 32, 8, 32768, 64, True), (8, 32, 8, 32768, 128, True), (64, 32, 8, 4096, 128, True),
           (1, 32, 8, 131072, 128, True)]
if quick:
    SHAPES = SHAPES[:2]
sm = torch.cuda.get_device_properties(0).multi_processor_count
result = {"provenance": provenance(" ".join(["python3", *sys.argv])), "sm_count": sm,
          "ceilings": measure_ceilings(), "rows": [], "kernels": []}
started = time.time()


def graph_ms(f):
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f()
    ms = triton.testing.do_bench(g.replay, warmup=5, rep=25, return_mode="median")
    del g
    return ms


def kernel_resources():
    """(registers per thread, shared bytes, warps) of each compiled partial kernel so far."""
    found = []
    try:
        for cache in ch08_decode._decode_partial_kernel.device_caches.values():
            for key, k in cache[0].items():
                found.append(dict(n_regs=k.n_regs, shared=k.metadata.shared, num_warps=k.metadata.num_warps,
                                  num_stages=k.metadata.num_stages, key=str(key)[:300]))
    except Exception as err:  # noqa: BLE001 — best effort: Triton's cache layout is not an API
        found.append(dict(error=repr(err)))
    return found


for (b, h, hkv, n, d, varying) in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(b * 7 + n + d)
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kc, vc = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "kv")
    lens = (torch.randint(n // 2, n + 1, (b,), generator=torch.Generator().manual_seed(1)) if varying
            else torch.full((b,), n)).to(torch.int32).cuda()
    kv_bytes = 2 * hkv * d * 2 * int(lens.sum())
    shape = dict(batch=b, heads=h, kv_heads=hkv, n=n, head_dim=d, varying_lengths=varying)
    tiles = ch08_decode.decode_tiles(1, h // hkv, d)
    rule = ch08_decode.choose_num_splits(b, hkv, 1, n, sm, tiles["BLOCK_N"])
    want = ch08_decode.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=1).float()
    rows = []

    def add(**row):
        row["gb_per_s"] = kv_bytes / row["ms"] / 1e6
        rows.append(shape | row)

    if not varying:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            add(provider="sdpa-cudnn", ms=graph_ms(lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            add(provider="sdpa-flash", ms=graph_ms(lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)))
    layouts = [("contiguous", kc, vc, None)]
    for bs in (16, 256):
        kp, vp, table = paged_copy(kc, vc, lens, bs)
        layouts.append((f"paged{bs}", kp, vp, table))
    for name, kk, vv, table in layouts:
        for s in SPLITS:
            if s > max(1, n // tiles["BLOCK_N"]):
                continue
            f = lambda: ch08_decode.flash_attention_with_kvcache(q, kk, vv, cache_seqlens=lens, block_table=table,
                                                                 num_splits=s)
            err = (f().float() - want).abs().max().item()
            assert err < 2e-2, (shape, name, s, err)
            add(provider=name, num_splits=s, rule=s == rule, max_diff_vs_one_split=err, ms=graph_ms(f))
    del layouts, kp, vp
    result["rows"] += rows
    best = {p: max((r for r in rows if r["provider"] == p), key=lambda r: r["gb_per_s"]) for p in
            ("contiguous", "paged16", "paged256")}
    at_rule = {r["provider"]: r["gb_per_s"] for r in rows if r.get("rule")}
    print(shape, f"rule {rule}", " ".join(f"{p}: best {r['num_splits']} {r['gb_per_s']:.0f} (rule {at_rule.get(p, 0):.0f})"
                                          for p, r in best.items()),
          " ".join(f"{r['provider']} {r['gb_per_s']:.0f}" for r in rows if r["provider"].startswith("sdpa")),
          f"{time.time() - started:.0f}s", flush=True)
    json.dump(result, open(out_path, "w"), indent=1)
    del q, kc, vc
    torch.cuda.empty_cache()
result["kernels"] = kernel_resources()
json.dump(result, open(out_path, "w"), indent=1)
