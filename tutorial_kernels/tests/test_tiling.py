"""The shared tile arithmetic: the causal stage bounds agree between kernels and host, and with the mask."""

import itertools

import torch
import triton
import triton.language as tl

from tutorial_kernels.runtime import default_device
from tutorial_kernels.tiling import (
    causal_key_stages, causal_query_stages, from_log2_units, head_dim_block, key_stages, query_stages, to_log2_units)

# (n_q, n_k) with n_q < n_k, n_q = n_k and n_q > n_k (rows that see no key), mostly not multiples of the
# tiles, and every offset n_k − n_q from −20 to 20, so that each lands on and beside a tile boundary
LENGTHS = [(1, 1), (1, 70), (70, 1), (64, 64), (40, 130), (130, 40), (100, 257)] + [(40, 40 + d) for d in range(-20, 21)]
BLOCK_M, BLOCK_N = 32, 16


@triton.jit
def _stages_kernel(out_ptr, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start = tl.program_id(0) * 16  # every multiple of 16 is a tile start for both tile sizes below
    unmasked_end, masked_end = causal_key_stages(start, n_q, n_k, BLOCK_M, BLOCK_N)
    masked_start, unmasked_start = causal_query_stages(start, n_q, n_k, BLOCK_N, BLOCK_M)
    row = out_ptr + tl.program_id(0) * 6
    tl.store(row, unmasked_end)
    tl.store(row + 1, masked_end)
    tl.store(row + 2, masked_start)
    tl.store(row + 3, unmasked_start)
    tl.store(row + 4, to_log2_units(1.0 * start))
    tl.store(row + 5, from_log2_units(1.0 * start))


def _visible(i: int, j: int, n_q: int, n_k: int) -> bool:
    return j <= i + (n_k - n_q)  # bottom-right causal alignment (chapter 2)


def test_kernel_and_host_stages_agree():
    for n_q, n_k in LENGTHS:
        starts = max(n_q, n_k) // 16 + 1
        out = torch.full((starts, 6), -7.0, dtype=torch.float32, device=default_device())
        _stages_kernel[(starts,)](out, n_q, n_k, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        for p, row in enumerate(out.cpu().tolist()):
            start = 16 * p
            assert row[:2] == list(key_stages(start, n_q, n_k, BLOCK_M, BLOCK_N)), (n_q, n_k, start)
            assert row[2:4] == list(query_stages(start, n_q, n_k, BLOCK_N, BLOCK_M)), (n_q, n_k, start)
            assert abs(row[4] - start * 1.4426950408889634) <= 1e-4 * max(start, 1)
            assert abs(row[5] - start * 0.6931471805599453) <= 1e-4 * max(start, 1)


def test_key_stages_split_the_keys_as_the_mask_does():
    for (n_q, n_k), block_m, block_n in itertools.product(LENGTHS, (16, 32), (16, 64)):
        for start_m in range(0, n_q, block_m):
            rows = range(start_m, min(start_m + block_m, n_q))
            unmasked_end, masked_end = key_stages(start_m, n_q, n_k, block_m, block_n)
            assert unmasked_end % block_n == 0 and unmasked_end <= masked_end <= n_k
            for j in range(n_k):
                seen_by = [_visible(i, j, n_q, n_k) for i in range(start_m, start_m + block_m)]
                if j < unmasked_end:  # the unmasked stage: every row of the tile (even past n_q) sees j
                    assert all(seen_by), (n_q, n_k, start_m, j)
                if j >= masked_end:  # never visited: no real row sees j
                    assert not any(_visible(i, j, n_q, n_k) for i in rows), (n_q, n_k, start_m, j)


def test_query_stages_split_the_queries_as_the_mask_does():
    for (n_q, n_k), block_m, block_n in itertools.product(LENGTHS, (16, 32), (16, 64)):
        for start_n in range(0, n_k, block_n):
            keys = range(start_n, min(start_n + block_n, n_k))
            masked_start, unmasked_start = query_stages(start_n, n_q, n_k, block_n, block_m)
            assert masked_start % block_m == 0 and unmasked_start % block_m == 0 and masked_start <= unmasked_start
            for i in range(n_q):
                if i < masked_start:  # query tiles skipped: they see none of these keys
                    assert not any(_visible(i, j, n_q, n_k) for j in keys), (n_q, n_k, start_n, i)
                if i >= unmasked_start:  # no mask needed: every key of the tile (even past n_k) is visible
                    assert all(_visible(i, j, n_q, n_k) for j in range(start_n, start_n + block_n))


def test_head_dim_block():
    assert [head_dim_block(d) for d in (1, 16, 17, 64, 80, 128, 129, 256)] == [16, 16, 32, 64, 128, 128, 256, 256]
