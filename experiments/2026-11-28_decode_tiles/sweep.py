"""Chapter 8's decode kernel: which tile (BLOCK_N, warps, stages) and how many waves of splits read the
KV cache fastest, beside torch's flash and cuDNN SDPA on the same cache, in one run on one GPU.

    PYTHONPATH=. python3 experiments/2026-11-28_decode_tiles/sweep.py OUT.json [--quick]
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
SHAPES = [  # (B, H, H_kv, n, d), bf16
    (1, 32, 8, 4096, 128), (1, 32, 8, 32768, 128), (1, 32, 8, 131072, 128), (8, 32, 8, 32768, 128),
    (64, 32, 8, 4096, 128), (8, 32, 32, 32768, 128), (64, 32, 32, 4096, 64), (8, 32, 8, 32768, 64),
    (8, 32, 8, 1024, 128),
]
TILES = [dict(BLOCK_N=bn, num_warps=w, num_stages=s) for bn, w, s in itertools.product((32, 64, 128), (2, 4, 8), (2, 3, 4))]
WAVES = (1, 2, 4, 8)
default_tiles = ch08_decode.decode_tiles
sm = torch.cuda.get_device_properties(0).multi_processor_count
result = {"provenance": provenance(" ".join(["python3", *sys.argv])), "ceilings": measure_ceilings(), "rows": []}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


for (b, h, hkv, n, d) in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(b * 7 + n)
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kc, vc = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "kv")
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    kv_bytes = 2 * b * hkv * n * d * 2
    ref = F.scaled_dot_product_attention(q.float(), kc.float(), vc.float(), enable_gqa=True)
    shape = dict(batch=b, heads=h, kv_heads=hkv, n=n, head_dim=d)
    for name, backend in (("sdpa-flash", "FLASH_ATTENTION"), ("sdpa-cudnn", "CUDNN_ATTENTION")):
        try:
            with torch.nn.attention.sdpa_kernel(getattr(torch.nn.attention.SDPBackend, backend)):
                f = lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
                f()
                ms = bench(f)
            result["rows"].append(shape | {"provider": name, "ms": ms, "gb_per_s": kv_bytes / ms / 1e6})
        except Exception as e:
            result["rows"].append(shape | {"provider": name, "error": str(e)[:200]})
    t0 = time.time()
    for tiles, waves in itertools.product(TILES[:1] if quick else TILES, WAVES):
        ch08_decode.decode_tiles = lambda n_q, group, head_dim, t=tiles: default_tiles(n_q, group, head_dim) | t
        bm = ch08_decode.decode_tiles(1, h // hkv, d)["BLOCK_M"]
        splits = ch08_decode.choose_num_splits(b, hkv, 1, n, sm, tiles["BLOCK_N"], waves=waves)
        row = shape | tiles | {"provider": "kvcache", "waves": waves, "num_splits": splits}
        try:
            f = lambda: ch08_decode.flash_attention_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits)
            o = f()
            row["max_err"] = (o.float() - ref).abs().max().item()
            row["ms"] = bench(f)
            row["gb_per_s"] = kv_bytes / row["ms"] / 1e6
        except Exception as e:
            row["error"] = str(e).strip().splitlines()[-1][:200]
        result["rows"].append(row)
    ch08_decode.decode_tiles = default_tiles
    print(shape, "tiles swept in", round(time.time() - t0, 1), "s", flush=True)
    # the best tile, paged with 16- and 256-token blocks
    ok = [r for r in result["rows"] if r.get("provider") == "kvcache" and "ms" in r and all(r[k] == shape[k] for k in shape)]
    best = min(ok, key=lambda r: r["ms"])
    tiles = {k: best[k] for k in ("BLOCK_N", "num_warps", "num_stages")}
    ch08_decode.decode_tiles = lambda n_q, group, head_dim, t=tiles: default_tiles(n_q, group, head_dim) | t
    for bs in (16, 256):
        kp, vp, table = paged_copy(kc, vc, lens, bs)
        f = lambda: ch08_decode.flash_attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table,
                                                             num_splits=best["num_splits"])
        o = f()
        ms = bench(f)
        result["rows"].append(shape | tiles | {"provider": f"kvcache-paged{bs}", "waves": best["waves"],
                              "num_splits": best["num_splits"], "ms": ms, "gb_per_s": kv_bytes / ms / 1e6,
                              "max_err": (o.float() - ref).abs().max().item()})
        del kp, vp
    ch08_decode.decode_tiles = default_tiles
    fl = [r for r in result["rows"] if r.get("provider") == "sdpa-flash" and all(r[k] == shape[k] for k in shape)]
    print("  best", tiles, best["waves"], round(best["gb_per_s"]), "GB/s; sdpa-flash", [round(r.get("gb_per_s", 0)) for r in fl],
          "paged", [round(r["gb_per_s"]) for r in result["rows"][-2:]], flush=True)
    json.dump(result, open(out_path, "w"), indent=1)
    del q, kc, vc
    torch.cuda.empty_cache()
json.dump(result, open(out_path, "w"), indent=1)
