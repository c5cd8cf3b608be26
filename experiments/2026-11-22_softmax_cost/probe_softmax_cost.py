"""Record of an experiment (fifth session; raw results in data/logs/2026-11-22_h100_softmax_cost_probe_e41ecf4.json,
run as .device_scratch/probe_exp.py before it was committed here). Verdict: the exponentials are not what
holds chapter 5's Triton kernel back on Hopper; every wgmma is waited for at once (wait_group 0).

Scratch probe: is the d=128 forward limited by the exponentials (MUFU) on an H100?

Variants of the unmasked key loop (the masked stage keeps exp2 in float32):
  mufu   : exp2 in float32 (chapter 5's math)
  poly2  : odd columns through a degree-3 polynomial on the FMA pipe, even columns through MUFU
  packed : exponent and P in the input's 16-bit type, two per instruction (ex2.approx.*x2)
  poly   : every column through the polynomial (diagnostic: FMA pipe alone)
  noexp  : no exponential at all (diagnostic, wrong results: the floor of what exp costs)
Timed against cuDNN and chapter 5's tuned launcher at the prefill shape (B=1, H=32, H_kv=8, d=128).
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

from tutorial_kernels.ch05_flash_v2 import LOG2_E, _attend_to_key_tiles, flash_attn_v2_tuned

MODES = {"mufu": 0, "poly2": 1, "packed": 2, "poly": 3, "noexp": 4}


@triton.jit
def _exp2_poly(x):
    # 2^x = 2^j · 2^f with j = round(x), f ∈ [-½, ½]; 2^f by a degree-3 polynomial (rel. err 7.7e-5);
    # 2^j added straight into the exponent bits. Rounding by the 1.5·2²³ trick: no FRND instruction.
    x = tl.maximum(x, -126.0)
    t = x + 12582912.0
    j = t - 12582912.0
    f = x - j
    p = 0.05508868380751114 * f + 0.24260405145947936
    p = p * f + 0.6932762416819607
    p = p * f + 0.9999289403695112
    bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _probs(x, dtype: tl.constexpr, MODE: tl.constexpr):
    """P̃ = 2^x in `dtype` (x ≤ 0, float32), and its row sums in float32."""
    BM: tl.constexpr = x.shape[0]
    BN: tl.constexpr = x.shape[1]
    if MODE == 0:
        p32 = tl.math.exp2(x)
        return p32.to(dtype), tl.sum(p32, axis=1)
    elif MODE == 1:
        xa, xb = x.reshape(BM, BN // 2, 2).split()
        p32 = tl.join(tl.math.exp2(xa), _exp2_poly(xb)).reshape(BM, BN)
        return p32.to(dtype), tl.sum(p32, axis=1)
    elif MODE == 2:
        x16 = x.to(dtype)
        if dtype == tl.bfloat16:
            p16 = tl.inline_asm_elementwise("ex2.approx.ftz.bf16x2 $0, $1;", "=r,r", [x16], dtype=tl.bfloat16,
                                            is_pure=True, pack=2)
        else:
            p16 = tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [x16], dtype=tl.float16,
                                            is_pure=True, pack=2)
        return p16, tl.sum(p16.to(tl.float32), axis=1)
    elif MODE == 3:
        p32 = _exp2_poly(x)
        return p32.to(dtype), tl.sum(p32, axis=1)
    else:
        p32 = x + 1.0
        return p32.to(dtype), tl.sum(p32, axis=1)


@triton.jit
def _probe_kernel(q_ptr, k_ptr, v_ptr, o_ptr, n, qk_scale, n_heads, group,
                  CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  MODE: tl.constexpr, ORDER: tl.constexpr = 0):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    kv_bh = (bh // n_heads) * (n_heads // group) + (bh % n_heads) // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * n * D + offs_m[:, None] * D + offs_d[None, :])
    k_src = k_ptr + kv_bh * n * D
    v_src = v_ptr + kv_bh * n * D
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if CAUSAL:
        unmasked_end = (pid_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N
        masked_end = tl.minimum((pid_m + 1) * BLOCK_M, n)
    else:
        unmasked_end = n
        masked_end = n
    if ORDER == 1:
        # FA3's order: issue S_j = Q K_jᵀ, then O += P̃_{j-1} V_{j-1}; the softmax of S_j can run
        # while the second product is still on the tensor cores; O is rescaled by α_j after both.
        if unmasked_end > 0:
            k_t = tl.load(k_src + offs_d[:, None] + offs_n[None, :] * D)
            s = tl.dot(q, k_t)
            m_i = tl.max(s, axis=1) * qk_scale
            p32 = tl.math.exp2(s * qk_scale - m_i[:, None])
            l_i = tl.sum(p32, axis=1)
            p_prev = p32.to(q.dtype)
            for start_n in range(BLOCK_N, unmasked_end, BLOCK_N):
                k_t = tl.load(k_src + offs_d[:, None] + (start_n + offs_n)[None, :] * D)
                v = tl.load(v_src + (start_n - BLOCK_N + offs_n)[:, None] * D + offs_d[None, :])
                s = tl.dot(q, k_t)
                acc = tl.dot(p_prev, v, acc)
                m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
                p32 = tl.math.exp2(s * qk_scale - m_new[:, None])
                alpha = tl.math.exp2(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p32, axis=1)
                acc = acc * alpha[:, None]
                p_prev = p32.to(q.dtype)
                m_i = m_new
            v = tl.load(v_src + (unmasked_end - BLOCK_N + offs_n)[:, None] * D + offs_d[None, :])
            acc = tl.dot(p_prev, v, acc)
    for start_n in range(0, unmasked_end if ORDER == 0 else 0, BLOCK_N):
        k_t = tl.load(k_src + offs_d[:, None] + (start_n + offs_n)[None, :] * D)
        s = tl.dot(q, k_t)
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        p, row_sum = _probs(s * qk_scale - m_new[:, None], q.dtype, MODE)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + row_sum
        v = tl.load(v_src + (start_n + offs_n)[:, None] * D + offs_d[None, :])
        acc = tl.dot(p, v, acc * alpha[:, None])
        m_i = m_new
    offs_dt = D + tl.arange(0, 16)
    q_tail = tl.zeros([BLOCK_M, 16], q.dtype)
    acc_tail = tl.zeros([BLOCK_M, 16], tl.float32)
    acc, acc_tail, l_i, m_i = _attend_to_key_tiles(
        acc, acc_tail, l_i, m_i, q, q_tail, k_src, v_src, 0, D, 1, D, 1,
        offs_m, offs_d, offs_dt, n, n, D, qk_scale, unmasked_end, masked_end,
        MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, EVEN_D=True, SPLIT_D=False, USE_DESCRIPTORS=False)
    out = acc / l_i[:, None]
    tl.store(o_ptr + bh * n * D + offs_m[:, None] * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty))


def run(q, k, v, causal, bm, bn, warps, stages, mode, order=0):
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    compiled = _probe_kernel[(n // bm, b * h)](q, k, v, o, n, d ** -0.5 * LOG2_E, h, h // k.shape[1], CAUSAL=causal,
                                     BLOCK_M=bm, BLOCK_N=bn, D=d, MODE=MODES[mode], ORDER=order, num_warps=warps,
                                     num_stages=stages)
    key = (causal, bm, bn, warps, stages, mode, order, str(q.dtype))
    if key not in KERNEL_FACTS:
        import re
        ptx = compiled.asm["ptx"]
        KERNEL_FACTS[key] = {"n_regs": compiled.n_regs, "n_spills": compiled.n_spills,
                             "shared": compiled.metadata.shared,
                             "waits": re.findall(r"wgmma.wait_group.sync.aligned\s+(\d+)", ptx),
                             "wgmma": len(re.findall(r"wgmma.mma_async", ptx)),
                             "bar_sync": len(re.findall(r"bar.sync|barrier.sync", ptx)),
                             "mbarrier_wait": len(re.findall(r"mbarrier.try_wait", ptx))}
        print("facts", key, KERNEL_FACTS[key], flush=True)
    return o


KERNEL_FACTS = {}
TILES = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 64, 4, 3)]
SHAPES = [("bfloat16", True, 4096), ("bfloat16", True, 16384), ("bfloat16", False, 16384), ("float16", True, 16384)]
ORDERS = [("mufu", 0), ("mufu", 1), ("noexp", 0)]


def main():
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    shapes = SHAPES
    tiles = [(128, 128, 8, 3), (128, 64, 8, 3)]
    results = []
    for dtype_name, causal, n in shapes:
        dtype = getattr(torch, dtype_name)
        b, h, hkv, d = 1, 32, 8, 128
        q = torch.randn(b, h, n, d, device="cuda", dtype=dtype)
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=dtype)
        v = torch.randn(b, hkv, n, d, device="cuda", dtype=dtype)
        k_full, v_full = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[:, :2].float(), k_full[:, :2].float(), v_full[:, :2].float(), is_causal=causal)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k_full, v_full, is_causal=causal)

        providers = {"cudnn": cudnn, "ch05-tuned": lambda: flash_attn_v2_tuned(q, k, v, causal)}
        for bm, bn, w, st in TILES:
            for mode, order in ORDERS:
                if mode == "noexp" and (bm, bn, w, st) not in [(128, 128, 8, 3), (128, 64, 8, 3)]:
                    continue
                providers[f"{bm}x{bn}w{w}s{st} {mode} order{order}"] = (
                    lambda bm=bm, bn=bn, w=w, st=st, mode=mode, order=order:
                    run(q, k, v, causal, bm, bn, w, st, mode, order))
        rows = {}
        for name, fn in providers.items():
            try:
                o = fn()
                torch.cuda.synchronize()
                err = ((o[:, :2].float() - ref).norm() / ref.norm()).item()
                rows[name] = {"err": err, "times": []}
            except Exception as e:  # noqa: BLE001
                rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
        for _ in range(3):
            for name, fn in providers.items():
                if "error" in rows[name]:
                    continue
                rows[name]["times"].append(triton.testing.do_bench(fn, warmup=25, rep=150))
        cud = statistics.median(rows["cudnn"]["times"])
        for name, r in rows.items():
            if "error" in r:
                print(f"{dtype_name} causal={causal} N={n} {name:28} FAILED {r['error'][:200]}", flush=True)
                continue
            t = statistics.median(r["times"])
            r.update(ms=t, tflops=flops / t / 1e9, vs_cudnn=cud / t)
            print(f"{dtype_name} causal={causal} N={n} {name:28} {r['tflops']:6.0f} TFLOP/s "
                  f"{r['vs_cudnn']:.3f}x cuDNN err={r['err']:.2e}", flush=True)
        results.append({"dtype": dtype_name, "causal": causal, "n": n, "rows": rows})
        (out_dir / "probe_exp.json").write_text(json.dumps(
            {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
             "commit": os.environ.get("FA_GIT_COMMIT"), "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
             "command": "python3 .device_scratch/probe_exp.py $OUT", "results": results, "facts": {str(k): v for k, v in KERNEL_FACTS.items()}}, indent=1))


if __name__ == "__main__":
    main()
