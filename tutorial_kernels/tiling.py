"""What the attention kernels share: log₂ units, head-dimension blocks, and which tiles a causal mask cuts.

Causal attention here is bottom-right aligned (chapter 2): query i sees key j when
j ≤ i + (n_k − n_q). Cut the scores into tiles and every tile is one of three kinds: wholly
visible (no mask needed), crossing the diagonal or the end of the keys (masked), or wholly hidden
(never visited). The two `@triton.jit` helpers below draw that map for a query tile (the dQ loop
of chapter 6; chapter 5's forward writes the same lines out) and for a key tile (FlashAttention-1's
loop and dK/dV, chapters 4 and 6); `key_stages` and `query_stages` are the same arithmetic in Python, for the
byte models, the schedules the pages draw, and the tests that compare the two.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tutorial_kernels.runtime import interpreter_active

LOG2_E = 1.4426950408889634  # log₂ e: e^x = 2^(x·log₂e), and exp2 is one instruction (MUFU.EX2)

# Triton's interpreter runs programs one after another, at a cost that grows with programs × loop
# steps: on the CPU every kernel gets these small tiles.
INTERPRETER_TILES = dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)


@triton.jit
def to_log2_units(x):
    """x · log₂e: a natural-log quantity (a score, a log-sum-exp) in log₂ units, for exp2."""
    return x * 1.4426950408889634  # a kernel may read only constexpr globals: LOG2_E written out


@triton.jit
def from_log2_units(x):
    """x · ln 2: back from log₂ units to natural-log units."""
    return x * 0.6931471805599453  # ln 2


def head_dim_block(head_dim: int) -> int:
    """The head dimension as one block: tl.arange needs a power of two, tl.dot at least 16 (padded with zeros)."""
    return max(16, triton.next_power_of_2(head_dim))


def tuning_tiles(tiles: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """The (BLOCK_M, BLOCK_N, num_warps, num_stages) an autotuner may try: `tiles` on a GPU, the one
    interpreter tile on the CPU (the autotuner would otherwise run every candidate per shape)."""
    if interpreter_active():
        t = INTERPRETER_TILES
        return [(t["BLOCK_M"], t["BLOCK_N"], t["num_warps"], t["num_stages"])]
    return tiles


# --8<-- [start:causal_stages]
@triton.jit
def causal_key_stages(start_m, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query rows [start_m, start_m + BLOCK_M): keys [0, unmasked_end) are visible to every row
    (whole BLOCK_N tiles, no mask); keys [unmasked_end, masked_end) need the mask; none past."""
    first_row_sees = start_m + (n_k - n_q) + 1  # keys [0, this) are visible to the tile's first row
    last_row_sees = start_m + BLOCK_M + (n_k - n_q)  # no row of the tile sees a key at or past this
    unmasked_end = tl.maximum(tl.minimum(first_row_sees, n_k) // BLOCK_N * BLOCK_N, 0)
    masked_end = tl.maximum(tl.minimum(last_row_sees, n_k), 0)
    return unmasked_end, masked_end


@triton.jit
def causal_query_stages(start_n, n_q, n_k, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Key rows [start_n, start_n + BLOCK_N): query tiles before masked_start see none of them;
    [masked_start, unmasked_start) see some (mask); from unmasked_start on (BLOCK_M-aligned), all."""
    masked_start = tl.maximum(start_n - (n_k - n_q), 0) // BLOCK_M * BLOCK_M  # first query i ≥ j − (n_k − n_q)
    unmasked_start = (tl.maximum(start_n + BLOCK_N - 1 - (n_k - n_q), 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    return masked_start, unmasked_start
# --8<-- [end:causal_stages]


def key_stages(start_m: int, n_q: int, n_k: int, block_m: int, block_n: int) -> tuple[int, int]:
    """`causal_key_stages` on the host: (unmasked_end, masked_end) for the query tile at start_m."""
    unmasked_end = max(min(start_m + (n_k - n_q) + 1, n_k) // block_n * block_n, 0)
    return unmasked_end, max(min(start_m + block_m + (n_k - n_q), n_k), 0)


def query_stages(start_n: int, n_q: int, n_k: int, block_n: int, block_m: int) -> tuple[int, int]:
    """`causal_query_stages` on the host: (masked_start, unmasked_start) for the key tile at start_n."""
    masked_start = max(start_n - (n_k - n_q), 0) // block_m * block_m
    unmasked_start = (max(start_n + block_n - 1 - (n_k - n_q), 0) + block_m - 1) // block_m * block_m
    return masked_start, unmasked_start
