"""Chapter 8's decode kernel: does the order of the programs explain why the contiguous cache reads slower
than a shuffled paged pool (exercise 7), do more splits help sequences of different lengths, and which tile
reads 16-token blocks fastest? GPU time alone (CUDA-graph replay), cuDNN beside it in the same run.

    PYTHONPATH=. python3 experiments/2026-11-28_decode_order/probe.py OUT.json

Orders (ch08_decode.ORDER): "heads" — the grid (B·H_kv, row tiles, splits), consecutive programs in different
(sequence, KV head)s at the same split; "stagger" — the same, each program starting at its own key tile and
wrapping around; "splits" — one axis with a (sequence, KV head)'s splits next to each other; "splits+stagger".
"""
import json
import sys

import torch
import torch.nn.functional as F
import triton.testing

from tutorial_kernels import ch08_decode
from tutorial_kernels.bench.providers import paged_copy
from tutorial_kernels.provenance import provenance

out_path = sys.argv[1]
SHAPES = [  # (B, H, H_kv, n, d, varying lengths), bf16
    (64, 32, 8, 4096, 128, False), (64, 32, 8, 32768, 128, False), (8, 32, 32, 32768, 128, False),
    (8, 32, 8, 131072, 64, True), (8, 32, 8, 32768, 64, True), (8, 32, 8, 32768, 64, False),
    (1, 32, 8, 32768, 64, False), (1, 32, 8, 131072, 64, False), (64, 32, 8, 32768, 64, False),
]
ORDERS = {"heads": dict(STAGGER=False, SPLITS_FASTEST=False), "stagger": dict(STAGGER=True, SPLITS_FASTEST=False),
          "splits": dict(STAGGER=False, SPLITS_FASTEST=True), "splits+stagger": dict(STAGGER=True, SPLITS_FASTEST=True)}
WAVES = (2, 4, 8)
PAGED_TILES = [dict(BLOCK_N=bn, num_stages=st) for bn, st in ((16, 4), (16, 6), (32, 3), (32, 4), (64, 3))]
default_tiles = ch08_decode.decode_tiles
sm = torch.cuda.get_device_properties(0).multi_processor_count
result = {"provenance": provenance(" ".join(["python3", *sys.argv])), "rows": []}


def graph_ms(f):
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f()
    return triton.testing.do_bench(g.replay, warmup=10, rep=40, return_mode="median")


for (b, h, hkv, n, d, varying) in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(b * 7 + n)
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kc, vc = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "kv")
    lens = (torch.randint(n // 2, n + 1, (b,), generator=torch.Generator().manual_seed(1)) if varying
            else torch.full((b,), n)).to(torch.int32).cuda()
    kv_bytes = 2 * hkv * d * 2 * int(lens.sum())
    shape = dict(batch=b, heads=h, kv_heads=hkv, n=n, head_dim=d, varying_lengths=varying)
    rows = []

    def add(**row):
        row["gb_per_s"] = kv_bytes / row["ms"] / 1e6
        rows.append(shape | row)

    def check(f):
        want = ch08_decode.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=1)
        err = (f().float() - want.float()).abs().max().item()
        assert err < 2e-2, err
        return err

    if not varying:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            add(provider="sdpa-cudnn", ms=graph_ms(lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)))
    for order, flags in ORDERS.items():
        ch08_decode.ORDER.update(flags)
        for waves in WAVES:
            splits = ch08_decode.choose_num_splits(b, hkv, 1, n, sm, 64, waves=waves)
            f = lambda: ch08_decode.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits)
            add(provider="kvcache", order=order, waves=waves, num_splits=splits, max_diff=check(f), ms=graph_ms(f))
    best = min((r for r in rows if r["provider"] == "kvcache"), key=lambda r: r["ms"])
    for bs in (16, 256):
        kp, vp, table = paged_copy(kc, vc, lens, bs)
        for order in ("heads", best["order"]):
            ch08_decode.ORDER.update(ORDERS[order])
            for tiles in (PAGED_TILES if bs == 16 and order == "heads" else [{}]):
                ch08_decode.decode_tiles = lambda *a, t=tiles: default_tiles(*a) | t
                f = lambda: ch08_decode.flash_attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table,
                                                                     num_splits=best["num_splits"])
                add(provider=f"kvcache-paged{bs}", order=order, waves=best["waves"], num_splits=best["num_splits"],
                    **tiles, max_diff=check(f), ms=graph_ms(f))
                ch08_decode.decode_tiles = default_tiles
        del kp, vp
    ch08_decode.ORDER.update(ORDERS["heads"])
    result["rows"] += rows
    print(shape, "; ".join(f"{r['provider']} {r.get('order', '')} w{r.get('waves', '')} "
                           f"{r.get('BLOCK_N', '')}/{r.get('num_stages', '')} {r['gb_per_s']:.0f}" for r in rows), flush=True)
    json.dump(result, open(out_path, "w"), indent=1)
    del q, kc, vc
    torch.cuda.empty_cache()
json.dump(result, open(out_path, "w"), indent=1)
