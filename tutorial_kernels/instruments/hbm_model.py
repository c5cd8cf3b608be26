"""How many bytes a schedule moves between HBM and the chip, counted from its loops.

Chapter 4 counts FlashAttention-1's accesses (Algorithm 1 of Dao et al. 2022) and chapter 2's three
kernels; chapter 5 counts FlashAttention-2's (Algorithm 1 of Dao 2023). Each count assumes no cache
helps: every tile a program loads comes from HBM. Nsight Compute's DRAM counters
(`tools/measure_hbm_bytes.py`) measure what the GPU really moved, which the L2 cache can bring far
below the count; `data/ch04_hbm_bytes.json` holds both.
"""

from __future__ import annotations

from tutorial_kernels.tiling import key_stages, query_stages


# --8<-- [start:flash_v1]
def flash_v1_hbm_bytes(
    batch: int, heads: int, n_q: int, n_k: int, head_dim: int, element_size: int,
    block_m: int, block_n: int, causal: bool = False,
) -> dict[str, int]:
    """Bytes this schedule reads and writes in HBM if no cache helps: every access of Algorithm 1 counted.

    init    writes O (float32), ℓ and m once: torch.zeros / torch.full before the launch;
    kernel  reads K and V once; on every visit (j, i) reads Q_i, O_i, ℓ_i, m_i and writes O_i, ℓ_i,
            m_i; at the end reads O, ℓ, m once more and writes o (input dtype) and lse.
    """
    b, f32 = element_size, 4
    d = head_dim
    rows_visited = 0  # Σ over visits of the Q tile's real rows (the masked tail moves nothing)
    for start_n in range(0, n_k, block_n):
        first_m = query_stages(start_n, n_q, n_k, block_n, block_m)[0] if causal else 0
        rows_visited += max(n_q - first_m, 0)
    per_head = {
        "init_write": n_q * (d + 2) * f32,
        "kernel_read": 2 * n_k * d * b  # K and V, once each
        + rows_visited * (d * b + d * f32 + 2 * f32)  # Q_i, O_i, ℓ_i, m_i on every visit
        + n_q * (d + 2) * f32,  # epilogue: O, ℓ, m
        "kernel_write": rows_visited * (d * f32 + 2 * f32)  # O_i, ℓ_i, m_i on every visit
        + n_q * (d * b + f32),  # epilogue: o and lse
    }
    return {key: batch * heads * value for key, value in per_head.items()}


def naive_kernel_bytes(batch: int, heads: int, n_q: int, n_k: int, head_dim: int, element_size: int) -> dict[str, int]:
    """Chapter 2's three kernels, each tensor moved once (its `naive_hbm_bytes`, split by kernel)."""
    bh, b, d = batch * heads, element_size, head_dim
    return {
        "_scores_kernel_read": bh * (n_q + n_k) * d * b, "_scores_kernel_write": bh * n_q * n_k * b,
        "_softmax_kernel_read": bh * n_q * n_k * b, "_softmax_kernel_write": bh * n_q * n_k * b,
        "_pv_kernel_read": bh * (n_q * n_k + n_k * d) * b, "_pv_kernel_write": bh * n_q * d * b,
    }
# --8<-- [end:flash_v1]


def flash_v2_hbm_bytes(
    batch: int, heads: int, n_q: int, n_k: int, head_dim: int, element_size: int,
    block_m: int, block_n: int, causal: bool = False,
) -> dict[str, int]:
    """Bytes this schedule reads and writes in HBM if no cache helps (chapter 4's model, for Algorithm 1
    of FlashAttention-2): each program reads its Q tile once and every K/V tile it visits once, and
    writes its O tile and lse once. The L2 cache lets the programs of one head share K and V, so the
    measured DRAM bytes can fall far below this count; Q, O and lse cannot."""
    b, d = element_size, head_dim
    kv_rows_read = 0  # Σ over query tiles of the keys their programs load
    for start_m in range(0, n_q, block_m):
        if causal:  # keys up to the last row's horizon, whole tiles (the masked tile is loaded in full)
            horizon = key_stages(start_m, n_q, n_k, block_m, block_n)[1]
            kv_rows_read += min(-(-horizon // block_n) * block_n, n_k)
        else:
            kv_rows_read += n_k
    per_head = {
        "kernel_read": n_q * d * b + 2 * kv_rows_read * d * b,  # Q once; K and V per visiting program
        "kernel_write": n_q * (d * b + 4),  # O and the float32 lse
    }
    return {key: batch * heads * value for key, value in per_head.items()}
