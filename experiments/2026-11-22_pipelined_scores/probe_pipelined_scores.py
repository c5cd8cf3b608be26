"""Experiment: issue S_{j+1} = Q K_{j+1}^T before the softmax of tile j (FA3's intra-warpgroup overlap).

    python3 tools/probe_pipelined_scores.py OUT.json      # on a GPU; ~1.5 min on an H100

A stand-alone variant of chapter 5's kernel (contiguous float16 inputs, N a multiple of the tiles):
with PIPELINE the unmasked key loop computes the next tile's scores before the current tile's
softmax, so that the asynchronous wgmma could overlap the exponentials; without it, chapter 5's own
`_attend_to_key_tiles`. Both against cuDNN through tutorial_kernels.bench.run_probe. The result
(data/logs/2026-11-22_h100_pipelined_scores_probe.json, BENCHMARKS.md) was no gain, so the chapter's
kernel does not do this.
"""

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tutorial_kernels.ch05_flash_v2 import LOG2_E, _attend_to_key_tiles  # noqa: E402


@triton.jit
def _step(acc, l_i, m_i, s, v, qk_scale):
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _pipelined_kernel(q_ptr, k_ptr, v_ptr, o_ptr, n, qk_scale, stride_h, stride_n,
                      CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                      PIPELINE: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    base = bh * stride_h
    q = tl.load(q_ptr + base + offs_m[:, None] * stride_n + offs_d[None, :])
    k_src = k_ptr + base
    v_src = v_ptr + base
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # chapter 5's loop takes a second block of head-dimension columns; D is a power of two here, so
    # these are the placeholders of an unsplit head dimension (SPLIT_D=False: nothing reads them)
    offs_dt = D + tl.arange(0, 16)
    q_tail = tl.zeros([BLOCK_M, 16], q.dtype)
    acc_tail = tl.zeros([BLOCK_M, 16], tl.float32)
    if CAUSAL:
        unmasked_end = (pid_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N
        masked_end = tl.minimum((pid_m + 1) * BLOCK_M, n)
    else:
        unmasked_end = n
        masked_end = n
    if PIPELINE:
        if unmasked_end > 0:
            k_t = tl.load(k_src + offs_d[:, None] + offs_n[None, :] * stride_n)
            s_next = tl.dot(q, k_t)
            for start_n in range(0, unmasked_end - BLOCK_N, BLOCK_N):
                s = s_next
                k_t = tl.load(k_src + offs_d[:, None] + (start_n + BLOCK_N + offs_n)[None, :] * stride_n)
                s_next = tl.dot(q, k_t)  # in flight while the softmax of s runs
                v = tl.load(v_src + (start_n + offs_n)[:, None] * stride_n + offs_d[None, :])
                acc, l_i, m_i = _step(acc, l_i, m_i, s, v, qk_scale)
            v = tl.load(v_src + (unmasked_end - BLOCK_N + offs_n)[:, None] * stride_n + offs_d[None, :])
            acc, l_i, m_i = _step(acc, l_i, m_i, s_next, v, qk_scale)
    else:
        acc, acc_tail, l_i, m_i = _attend_to_key_tiles(
            acc, acc_tail, l_i, m_i, q, q_tail, k_src, v_src, 0, stride_n, 1, stride_n, 1,
            offs_m, offs_d, offs_dt, n, n, D, qk_scale, 0, unmasked_end,
            MASKED=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, EVEN_D=True, SPLIT_D=False, USE_DESCRIPTORS=False)
    acc, acc_tail, l_i, m_i = _attend_to_key_tiles(
        acc, acc_tail, l_i, m_i, q, q_tail, k_src, v_src, 0, stride_n, 1, stride_n, 1,
        offs_m, offs_d, offs_dt, n, n, D, qk_scale, unmasked_end, masked_end,
        MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, EVEN_D=True, SPLIT_D=False, USE_DESCRIPTORS=False)
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * stride_n + offs_d[None, :], out.to(o_ptr.dtype.element_ty))


def run(q, k, v, causal, bm, bn, warps, stages, pipeline):
    """Contiguous (B, H, N, d) q, k, v with N a multiple of bm and bn (the probe's shapes only)."""
    assert all(t.is_contiguous() for t in (q, k, v)) and q.shape == k.shape
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    grid = (n // bm, b * h)
    _pipelined_kernel[grid](q, k, v, o, n, d ** -0.5 * LOG2_E, q.stride(1), q.stride(2), CAUSAL=causal,
                            BLOCK_M=bm, BLOCK_N=bn, D=d, PIPELINE=pipeline, num_warps=warps, num_stages=stages)
    return o


def main():
    from tutorial_kernels.bench import run_probe

    tiles = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3)]
    candidates = {
        f"{bm}x{bn} w{w} s{st} pipe={int(pipe)}":
            lambda q, k, v, causal, bm=bm, bn=bn, w=w, st=st, pipe=pipe: run(q, k, v, causal, bm, bn, w, st, pipe)
        for (bm, bn, w, st), pipe in itertools.product(tiles, (False, True))
    }
    run_probe(candidates, Path(sys.argv[1]), "python3 tools/probe_pipelined_scores.py")


if __name__ == "__main__":
    main()
