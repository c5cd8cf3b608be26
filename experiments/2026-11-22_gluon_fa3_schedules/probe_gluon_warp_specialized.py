"""Record of an experiment (fifth session; data/logs/2026-11-22_h100_gluon_warp_specialized_probe_e41ecf4.json):
the warp-specialised schedule with and without explicit ping-pong, 2 or 3 stages, 64- or 128-key tiles. The
version without ping-pong, 3 stages, 128 keys became tutorial_kernels/ch05_hopper.py. Triton 3.6 API.

Scratch: FA3's design in Gluon: a loader warp, two consumer warpgroups taking turns (ping-pong).

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
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars,
            q_row0, kv_row0, n_tiles):
    """One warp: both halves of the Q tile once, then every K/V tile into the ring, each stage as soon
    as both consumer warpgroups have released it."""
    HALF_M: gl.constexpr = q_smem.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row0 + HALF_M, 0], q_bar, q_smem.index(1))
    for t in range(n_tiles):
        stage = t % STAGES
        mbarrier.wait(empty_bars.index(stage), ((t // STAGES) + 1) & 1, pred=t >= STAGES)
        bar = full_bars.index(stage)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row0 + t * BLOCK_N, 0], bar, k_smem.index(stage))
        tma.async_copy_global_to_shared(v_desc, [kv_row0 + t * BLOCK_N, 0], bar, v_smem.index(stage))


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
              bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale,
              WG: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr):
    """One warpgroup: rows [WG·64, WG·64 + 64) of the 128-row query tile, FA3's order inside the loop,
    and (PINGPONG) its tensor-core work taking turns with the other warpgroup's."""
    dtype: gl.constexpr = k_smem.dtype
    HALF_M: gl.constexpr = q_smem.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    cols_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    q = q_smem.index(WG)
    row0 = pid_m * (2 * HALF_M) + WG * HALF_M
    offs_m = row0 + gl.arange(0, HALF_M, rows_s)

    m_i = gl.full([HALF_M], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([HALF_M], gl.float32, rows_s)
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)

    first_masked = n_full * 0
    if n_full > 0:
        mbarrier.wait(full_bars.index(0), 0)
        s = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
        m_i = gl.max(s, axis=1) * qk_scale
        p = gl.exp2(s * qk_scale - m_i[:, None])
        l_i = gl.sum(p, axis=1)
        p_prev = gl.convert_layout(p.to(dtype), p_layout)
        for t in range(1, n_full):
            stage = t % STAGES
            prev = (t - 1) % STAGES
            mbarrier.wait(full_bars.index(stage), (t // STAGES) & 1)
            if PINGPONG:
                mbarrier.wait(turn_bars.index(WG), (t - 1) & 1)
            s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn_bars.index(1 - WG), count=1)
            s = warpgroup_mma_wait(num_outstanding=1, deps=[s])
            m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
            p = gl.exp2(s * qk_scale - m_new[:, None])
            alpha = gl.exp2(m_i - m_new)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_prev])
            mbarrier.arrive(empty_bars.index(prev), count=1)
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            p_prev = gl.convert_layout(p.to(dtype), p_layout)
            m_i = m_new
        last = (n_full - 1) % STAGES
        acc = warpgroup_mma(p_prev, v_smem.index(last), acc)
        mbarrier.arrive(empty_bars.index(last), count=1)
        first_masked = n_full

    for t in range(first_masked, n_tiles):
        stage = t % STAGES
        mbarrier.wait(full_bars.index(stage), (t // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False)
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
        mbarrier.arrive(empty_bars.index(stage), count=1)
        m_i = m_new

    l_o = gl.convert_layout(l_i, rows_o)
    out = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
    rows = row0 + gl.arange(0, HALF_M, rows_o)
    cols_d = gl.arange(0, HEAD_DIM, cols_o)
    ptrs = o_ptr + (bh * n_q + rows)[:, None].to(gl.int64) * HEAD_DIM + cols_d[None, :]
    gl.store(ptrs, out.to(dtype), mask=(rows < n_q)[:, None])


@gluon.jit
def _consumer_0(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
                bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr):
    _consumer(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
              bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale, 0, CAUSAL, PINGPONG)


@gluon.jit
def _consumer_1_causal_pingpong(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
        bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale):
    # worker partitions take no constexpr arguments (Triton 3.6): one wrapper per flag combination
    _consumer(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
              bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale, 1, True, True)


@gluon.jit
def _consumer_1_causal_free(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
        bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale):
    # worker partitions take no constexpr arguments (Triton 3.6): one wrapper per flag combination
    _consumer(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
              bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale, 1, True, False)


@gluon.jit
def _consumer_1_full_pingpong(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
        bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale):
    # worker partitions take no constexpr arguments (Triton 3.6): one wrapper per flag combination
    _consumer(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
              bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale, 1, False, True)


@gluon.jit
def _consumer_1_full_free(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
        bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale):
    # worker partitions take no constexpr arguments (Triton 3.6): one wrapper per flag combination
    _consumer(q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
              bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale, 1, False, False)


@gluon.jit
def _fa3_ws_fwd(q_desc, k_desc, v_desc, o_ptr, n_heads, group, n_q, n_k, qk_scale,
                CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    HALF_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = 2 * HALF_M
    dtype: gl.constexpr = q_desc.dtype
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

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(full_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)  # both consumer warpgroups release a stage
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    fence_async_shared()
    mbarrier.arrive(turn_bars.index(0), count=1)  # warpgroup 0 takes the first turn

    consumer_args = (q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars, turn_bars, o_ptr,
                     bh, pid_m, n_q, n_k, n_full, n_tiles, qk_scale)
    loader_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, full_bars, empty_bars,
                   q_row0, kv_row0, n_tiles)
    # worker partitions take no constexpr arguments: one call per flag combination
    if CAUSAL:
        if PINGPONG:
            gl.warp_specialize([
                (_consumer_0, consumer_args + (CAUSAL, PINGPONG)),
                (_consumer_1_causal_pingpong, consumer_args),
                (_loader, loader_args),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([
                (_consumer_0, consumer_args + (CAUSAL, PINGPONG)),
                (_consumer_1_causal_free, consumer_args),
                (_loader, loader_args),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        if PINGPONG:
            gl.warp_specialize([
                (_consumer_0, consumer_args + (CAUSAL, PINGPONG)),
                (_consumer_1_full_pingpong, consumer_args),
                (_loader, loader_args),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([
                (_consumer_0, consumer_args + (CAUSAL, PINGPONG)),
                (_consumer_1_full_free, consumer_args),
                (_loader, loader_args),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])



def attention(q, k, v, causal, block_n=128, stages=2, pingpong=True, regs=(240, 24)):
    """Contiguous (B, H, N, d) q and (B, H_kv, N_k, d) k, v; bf16/fp16; d = 64 or 128."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    dt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q2, k2, v2 = q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)
    q_desc = TensorDescriptor.from_tensor(q2, [64, d], gl.NVMMASharedLayout.get_default_for([64, d], dt))
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], dt)
    k_desc = TensorDescriptor.from_tensor(k2, [block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v2, [block_n, d], kv_layout)
    o = torch.empty_like(q)
    grid = (triton.cdiv(n_q, 128), b * h)
    _fa3_ws_fwd[grid](q_desc, k_desc, v_desc, o, h, h // k.shape[1], n_q, n_k, d ** -0.5 * LOG2_E,
                      CAUSAL=causal, BLOCK_N=block_n, HEAD_DIM=d, STAGES=stages, PINGPONG=pingpong,
                      CONSUMER_REGS=regs[0], LOADER_REGS=regs[1], num_warps=4)
    return o


CHECK_CONFIGS = [dict(), dict(pingpong=False), dict(block_n=64, stages=3), dict(stages=3)]
BENCH_CONFIGS = [dict(), dict(pingpong=False), dict(stages=3), dict(stages=3, pingpong=False),
                 dict(block_n=64, stages=3), dict(block_n=64, stages=4)]


def check():
    torch.manual_seed(1)
    worst = 0.0
    for dtype in (torch.bfloat16, torch.float16):
        for (b, h, hkv, nq, nk, d) in [(1, 4, 2, 256, 256, 128), (2, 4, 1, 300, 300, 128), (1, 2, 2, 1, 1, 128),
                                       (1, 4, 4, 1000, 1000, 64), (1, 2, 1, 100, 357, 128), (1, 2, 2, 129, 129, 128)]:
            for causal in (False, True):
                for cfg in CHECK_CONFIGS:
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
        for cfg in BENCH_CONFIGS:
            name = "ws " + " ".join(f"{k_}={v_}" for k_, v_ in cfg.items())
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
        (out_dir / "gluon_fa3ws.json").write_text(json.dumps(
            {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
             "commit": os.environ.get("FA_GIT_COMMIT"), "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
             "command": "python3 .device_scratch/gluon_fa3ws.py $OUT", "results": results}, indent=1))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    check()
    if "--check-only" not in sys.argv:
        bench(out)
