"""Record of an experiment (fifth session; data/logs/2026-11-22_h100_gluon_one_warpgroup_probe_e41ecf4.json):
FA3's intra-warpgroup overlap without warp specialisation. Written for Triton 3.6 (tma.async_copy_global_to_shared).

Scratch: FlashAttention forward in Gluon for Hopper with FA3's intra-warpgroup overlap.

The loop issues S_t = Q K_tᵀ and O += P̃_{t-1} V_{t-1} as asynchronous wgmma, waits for S_t only,
runs the softmax of S_t while P̃_{t-1} V_{t-1} is still on the tensor cores, then waits for it and
rescales O. K/V arrive by TMA into a ring of STAGES shared-memory buffers, one mbarrier each.
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
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2_E = 1.4426950408889634


@gluon.jit
def _load_tile(k_desc, v_desc, k_smem, v_smem, bars, t, n_tiles, kv_row0,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copies of key/value tile t into stage t % STAGES (nothing past the last tile)."""
    stage = t % STAGES
    ok = t < n_tiles
    bar = bars.index(stage)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=ok)
    tma.async_copy_global_to_shared(k_desc, [kv_row0 + t * BLOCK_N, 0], bar, k_smem.index(stage), pred=ok)
    tma.async_copy_global_to_shared(v_desc, [kv_row0 + t * BLOCK_N, 0], bar, v_smem.index(stage), pred=ok)


@gluon.jit
def _scaled_scores(s, t, n_full, offs_m, n_q, n_k, qk_scale,
                   CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, cols_layout: gl.constexpr):
    """s · scale in log2 units; −∞ where key tile t hides a key (the diagonal, the ragged end)."""
    s = s * qk_scale
    if t >= n_full:
        cols = t * BLOCK_N + gl.arange(0, BLOCK_N, cols_layout)
        visible = cols[None, :] < n_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))
        s = gl.where(visible, s, float("-inf"))
    return s


@gluon.jit
def _fa3_fwd(q_desc, k_desc, v_desc, o_ptr, n_heads, group, n_q, n_k, qk_scale,
             CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
             STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, OVERLAP: gl.constexpr, MASK_IN_LOOP: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    cols_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)
    bh = gl.program_id(1)
    batch = bh // n_heads
    head = bh % n_heads
    kv_row0 = (batch * (n_heads // group) + head // group) * n_k
    q_row0 = bh * n_q + pid_m * BLOCK_M

    if CAUSAL:
        first_row_sees = pid_m * BLOCK_M + (n_k - n_q) + 1
        last_row_sees = (pid_m + 1) * BLOCK_M + (n_k - n_q)
        n_full = gl.maximum(gl.minimum(first_row_sees, n_k), 0) // BLOCK_N
        n_tiles = gl.cdiv(gl.maximum(gl.minimum(last_row_sees, n_k), 0), BLOCK_N)
    else:
        n_full = n_k // BLOCK_N
        n_tiles = gl.cdiv(n_k, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_bars.index(i), count=1)
    fence_async_shared()

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_tile(k_desc, v_desc, k_smem, v_smem, kv_bars, i, n_tiles, kv_row0, BLOCK_N, STAGES)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, rows_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)

    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, rows_s)
    first_masked = n_full * 0
    if MASK_IN_LOOP:
        loop_end = n_tiles
    else:
        loop_end = n_full
    if OVERLAP:
      if loop_end > 0:
        # tile 0: scores and softmax alone; its P̃ V is issued with tile 1's scores
        mbarrier.wait(kv_bars.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
        s = _scaled_scores(s, 0, n_full, offs_m, n_q, n_k, qk_scale, CAUSAL, BLOCK_N, cols_s)
        m_i = gl.max(s, axis=1)
        p = gl.exp2(s - gl.where(m_i == float("-inf"), 0.0, m_i)[:, None])
        l_i = gl.sum(p, axis=1)
        p_prev = gl.convert_layout(p.to(dtype), p_layout)
        for t in range(1, loop_end):
            stage = t % STAGES
            prev = (t - 1) % STAGES
            mbarrier.wait(kv_bars.index(stage), (t // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=[s])  # S_t done; P̃_{t-1} V_{t-1} may still run
            if MASK_IN_LOOP:
                s = _scaled_scores(s, t, n_full, offs_m, n_q, n_k, qk_scale, CAUSAL, BLOCK_N, cols_s)
                m_new = gl.maximum(m_i, gl.max(s, axis=1))
                shift = gl.where(m_new == float("-inf"), 0.0, m_new)
                p = gl.exp2(s - shift[:, None])
                alpha = gl.exp2(m_i - shift)
            else:
                m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
                p = gl.exp2(s * qk_scale - m_new[:, None])
                alpha = gl.exp2(m_i - m_new)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_prev])
            gl.thread_barrier()  # both warpgroups are done with tile t-1's buffers
            _load_tile(k_desc, v_desc, k_smem, v_smem, kv_bars, t - 1 + STAGES, n_tiles, kv_row0, BLOCK_N, STAGES)
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            p_prev = gl.convert_layout(p.to(dtype), p_layout)
            m_i = m_new
        last = (loop_end - 1) % STAGES
        acc = warpgroup_mma(p_prev, v_smem.index(last), acc)
        gl.thread_barrier()
        _load_tile(k_desc, v_desc, k_smem, v_smem, kv_bars, loop_end - 1 + STAGES, n_tiles, kv_row0, BLOCK_N, STAGES)
        first_masked = loop_end

    # the rest one tile at a time, masked: the diagonal and the ragged end (all tiles without OVERLAP)
    for t in range(first_masked, n_tiles):
        stage = t % STAGES
        mbarrier.wait(kv_bars.index(stage), (t // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False)
        cols = t * BLOCK_N + gl.arange(0, BLOCK_N, cols_s)
        visible = cols[None, :] < n_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + (n_k - n_q))
        s = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - shift[:, None])
        alpha = gl.exp2(m_i - shift)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(stage), acc)
        m_i = m_new
        gl.thread_barrier()
        _load_tile(k_desc, v_desc, k_smem, v_smem, kv_bars, t + STAGES, n_tiles, kv_row0, BLOCK_N, STAGES)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bars.index(i))
    l_o = gl.convert_layout(l_i, rows_o)
    out = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, rows_o)
    cols_d = gl.arange(0, HEAD_DIM, cols_o)
    ptrs = o_ptr + (bh * n_q + rows)[:, None].to(gl.int64) * HEAD_DIM + cols_d[None, :]
    gl.store(ptrs, out.to(dtype), mask=(rows < n_q)[:, None])


def attention(q, k, v, causal, block_m=128, block_n=128, stages=2, warps=8, overlap=True, mask_in_loop=False):
    """Contiguous (B, H, N, d) q and (B, H_kv, N_k, d) k, v; bf16/fp16; d = 64 or 128."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    dt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q2, k2, v2 = q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)
    q_desc = TensorDescriptor.from_tensor(q2, [block_m, d], gl.NVMMASharedLayout.get_default_for([block_m, d], dt))
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], dt)
    k_desc = TensorDescriptor.from_tensor(k2, [block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v2, [block_n, d], kv_layout)
    o = torch.empty_like(q)
    grid = (triton.cdiv(n_q, block_m), b * h)
    _fa3_fwd[grid](q_desc, k_desc, v_desc, o, h, h // k.shape[1], n_q, n_k, d ** -0.5 * LOG2_E,
                   CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d, STAGES=stages,
                   NUM_WARPS=warps, OVERLAP=overlap, MASK_IN_LOOP=mask_in_loop, num_warps=warps)
    return o


def check():
    torch.manual_seed(1)
    worst = 0.0
    for dtype in (torch.bfloat16, torch.float16):
        for (b, h, hkv, nq, nk, d) in [(1, 4, 2, 256, 256, 128), (2, 4, 1, 300, 300, 128), (1, 2, 2, 1, 1, 128),
                                       (1, 4, 4, 1000, 1000, 64), (1, 2, 1, 100, 357, 128), (1, 2, 2, 129, 129, 128)]:
            for causal in (False, True):
                for cfg in [dict(), dict(overlap=False), dict(block_m=64, block_n=64, warps=4, stages=3),
                            dict(block_m=64, block_n=64, warps=4, stages=3, mask_in_loop=True),
                            dict(block_m=64, block_n=32, warps=4, stages=3, mask_in_loop=True)]:
                    q = torch.randn(b, h, nq, d, device="cuda", dtype=dtype)
                    k = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype)
                    v = torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype)
                    rep = h // hkv
                    kf, vf = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
                    s = q.double() @ kf.transpose(-1, -2) * d ** -0.5
                    if causal:
                        i = torch.arange(nq, device="cuda")[:, None]
                        j = torch.arange(nk, device="cuda")[None, :]
                        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
                    ref = torch.nan_to_num(torch.softmax(s, -1)) @ vf
                    try:
                        o = attention(q, k, v, causal, **cfg).double()
                        err = ((o - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                    except Exception as e:  # noqa: BLE001
                        print("FAIL", dtype, (b, h, hkv, nq, nk, d), causal, cfg, type(e).__name__, str(e)[:800], flush=True)
                        continue
                    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
                    flag = "ok" if err < tol else "WRONG"
                    if flag != "ok":
                        print(flag, dtype, (b, h, hkv, nq, nk, d), causal, cfg, f"{err:.2e}", flush=True)
                    worst = max(worst, err / tol)
    print(f"check done, worst err/tol = {worst:.3f}", flush=True)


def bench(out_dir: Path):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_tuned

    results = []
    for dtype_name, causal, n in [("bfloat16", True, 2048), ("bfloat16", True, 4096), ("bfloat16", True, 16384),
                                  ("bfloat16", False, 16384), ("float16", True, 16384)]:
        dtype = getattr(torch, dtype_name)
        b, h, hkv, d = 1, 32, 8, 128
        q = torch.randn(b, h, n, d, device="cuda", dtype=dtype)
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=dtype)
        v = torch.randn(b, hkv, n, d, device="cuda", dtype=dtype)
        kf, vf = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, kf, vf, is_causal=causal)

        providers = {"cudnn": cudnn, "ch05-tuned": lambda: flash_attn_v2_tuned(q, k, v, causal)}
        for cfg in [dict(block_m=64, block_n=64, warps=4, stages=3), dict(block_m=64, block_n=64, warps=4, stages=2),
                    dict(block_m=64, block_n=64, warps=4, stages=3, mask_in_loop=True),
                    dict(block_m=64, block_n=64, warps=4, stages=2, mask_in_loop=True),
                    dict(block_m=64, block_n=32, warps=4, stages=3, mask_in_loop=True),
                    dict(block_m=64, block_n=64, warps=4, stages=3, overlap=False),
                    dict(block_m=128, block_n=64, warps=8, stages=3, mask_in_loop=True)]:
            name = "gluon " + " ".join(f"{k_}={v_}" for k_, v_ in cfg.items())
            providers[name] = lambda cfg=cfg: attention(q, k, v, causal, **cfg)
        rows = {}
        for name, fn in providers.items():
            try:
                fn()
                torch.cuda.synchronize()
                rows[name] = {"times": []}
            except Exception as e:  # noqa: BLE001
                rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
        for _ in range(3):
            for name, fn in providers.items():
                if "error" not in rows[name]:
                    rows[name]["times"].append(triton.testing.do_bench(fn, warmup=25, rep=150))
        cud = statistics.median(rows["cudnn"]["times"])
        for name, r in rows.items():
            if "error" in r:
                print(f"{dtype_name} causal={causal} N={n} {name:44} FAILED {r['error'][:200]}", flush=True)
                continue
            t = statistics.median(r["times"])
            r.update(ms=t, tflops=flops / t / 1e9, vs_cudnn=cud / t)
            print(f"{dtype_name} causal={causal} N={n} {name:44} {r['tflops']:6.0f} TFLOP/s {r['vs_cudnn']:.3f}x cuDNN",
                  flush=True)
        results.append({"dtype": dtype_name, "causal": causal, "n": n, "b": b, "h": h, "h_kv": hkv, "d": d,
                         "rows": rows})
        (out_dir / "gluon_fa3.json").write_text(json.dumps(
            {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
             "commit": os.environ.get("FA_GIT_COMMIT"), "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
             "command": "python3 .device_scratch/gluon_fa3.py $OUT", "results": results}, indent=1))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    check()
    if "--check-only" not in sys.argv:
        bench(out)
