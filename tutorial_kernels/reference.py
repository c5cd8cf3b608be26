"""The one float64 reference that every test, notebook and benchmark compares against.

    S = scale · Q Kᵀ                       (n_q × n_k scores per head)
    P = softmax(S) row by row              (masked entries get probability 0)
    O = P V

Conventions shared by every chapter:

* **Causal masks are aligned to the bottom-right**, as FlashAttention ≥ 2.1 does: query i may see
  key j when j ≤ i + (n_k − n_q). With n_q = n_k this is the usual lower triangle. With n_q < n_k
  (decoding with a cache) the last query sees every key. (`torch.nn.functional.scaled_dot_product_attention`
  with `is_causal=True` aligns to the top-left instead; the two agree only when n_q = n_k.)
* **A query that sees no key** (possible when causal and n_q > n_k) gets an output row of zeros and
  a log-sum-exp of −∞, rather than the NaN that softmax over an all-−∞ row would give.
"""

from __future__ import annotations

import math

import torch


def causal_mask(n_q: int, n_k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean (n_q, n_k) mask, True where query i may attend to key j: j ≤ i + (n_k − n_q)."""
    return variant_mask(n_q, n_k, causal=True, device=device)


def expand_kv_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention: repeat each of k's (or v's) heads for the query heads it serves.

    With kv_heads key/value heads and `heads` query heads, query head h reads key/value head
    h // (heads // kv_heads), so kv head g is repeated heads // kv_heads times, consecutively.
    """
    kv_heads = t.shape[1]
    return t if kv_heads == heads else t.repeat_interleave(heads // kv_heads, dim=1)


def reference_scores(
    q: torch.Tensor, k: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """S = scale · Q Kᵀ in float64, with −∞ where the causal mask hides a key. Shape (B, H, n_q, n_k)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    k = expand_kv_heads(k, q.shape[1])
    s = (q.double() @ k.double().transpose(-2, -1)) * scale  # (B, H, n_q, n_k)
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    return s


def reference_softmax(s: torch.Tensor) -> torch.Tensor:
    """Row softmax in float64; a row whose entries are all −∞ (or that has none) becomes all zeros."""
    s = s.double()
    if s.shape[-1] == 0:
        return s
    row_max = s.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(s - row_max)  # exp(−∞) = 0 for masked entries
    row_sum = e.sum(dim=-1, keepdim=True)
    return torch.where(row_sum > 0, e / row_sum, torch.zeros_like(e))


def reference_log_sum_exp(s: torch.Tensor) -> torch.Tensor:
    """log Σ_j exp(S_ij) per row, float64; −∞ for a row that sees no key. Shape (B, H, n_q)."""
    return torch.logsumexp(s.double(), dim=-1)


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """O = softmax(scale · Q Kᵀ) V in float64, on the inputs' device. Shape (B, H, n_q, head_dim)."""
    p = reference_softmax(reference_scores(q, k, causal, sm_scale))
    return p @ expand_kv_heads(v, q.shape[1]).double()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ (Frobenius norms, float64). NaN anywhere in `out` gives NaN, which fails any bound."""
    out64, ref64 = out.double(), ref.double().to(out.device)
    ref_norm = torch.linalg.vector_norm(ref64).item()
    err_norm = torch.linalg.vector_norm(out64 - ref64).item()
    if ref_norm == 0.0:
        return err_norm  # an all-zero reference (every query masked): compare absolutely
    return err_norm / ref_norm


def cached_keys(cache: torch.Tensor, b: int, n_keys: int, block_table: torch.Tensor | None = None) -> torch.Tensor:
    """Sequence b's first n_keys rows of a KV cache as (1, H_kv, n_keys, d): from a contiguous cache
    (B, H_kv, capacity, d), or a paged one (num_blocks, H_kv, block_size, d) through block_table (B, blocks)."""
    if block_table is None:
        return cache[b:b + 1, :, :n_keys]
    block_size = cache.shape[2]
    positions = torch.arange(n_keys, device=cache.device)
    blocks = block_table[b].long()[positions // block_size]
    return cache[blocks, :, positions % block_size].permute(1, 0, 2).unsqueeze(0)  # (1, H_kv, n_keys, d)


def reference_kvcache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                n_keys: torch.Tensor, block_table: torch.Tensor | None = None, causal: bool = True,
                                sm_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse) in float64 of q (B, H, n_q, d) against each sequence's first n_keys[b] cached keys and
    values (`cached_keys`), the causal mask bottom-right per sequence; a row that sees no key: O = 0, lse = −∞."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(n_keys[b])
        k, v = cached_keys(k_cache, b, n, block_table), cached_keys(v_cache, b, n, block_table)
        s = reference_scores(q[b:b + 1], k, causal, sm_scale)
        p = reference_softmax(s) if n else s  # (no key: an empty sum, O = 0)
        outs.append(p @ expand_kv_heads(v, q.shape[1]).double())
        lses.append(reference_log_sum_exp(s))
    return torch.cat(outs), torch.cat(lses)


def variant_mask(n_q: int, n_k: int, window_size: tuple[int, int] = (-1, -1), causal: bool = False,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean (n_q, n_k) mask of chapter 9's variants, True where query i may see key j, aligned to the
    bottom-right as every mask here: with d = j − (i + n_k − n_q), a key is seen when −left ≤ d ≤ right
    (a negative bound is no bound; causal sets right = 0), flash-attn's `window_size`."""
    left, right = window_size
    if causal:
        right = 0
    rows = torch.arange(n_q, device=device)[:, None]
    cols = torch.arange(n_k, device=device)[None, :]
    distance = cols - (rows + (n_k - n_q))
    seen = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= distance >= -left
    if right >= 0:
        seen &= distance <= right
    return seen


def reference_variant_scores(q: torch.Tensor, k: torch.Tensor, sm_scale: float | None = None, *, causal: bool = False,
                             window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: torch.Tensor | None = None,
                             attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Chapter 9's scores in float64, (B, H, n_q, n_k), as flash-attn's tests define them:
    S = c · tanh(scale · Q Kᵀ / c) when softcap c > 0 (else scale · Q Kᵀ), then + the ALiBi bias
    −slope_h · |i + n_k − n_q − j| when alibi_slopes ((H,) or (B, H)) is given, then PyTorch's attn_mask
    (broadcastable: a float one added, a boolean one −∞ where False), then −∞ outside the window."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    k = expand_kv_heads(k, q.shape[1])
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = s.shape[-2:]
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, q.shape[1], n_q, n_k, torch.float64)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.double()
    return s.masked_fill(~variant_mask(n_q, n_k, window_size, causal, q.device), -math.inf)


def alibi_bias(alibi_slopes: torch.Tensor, heads: int, n_q: int, n_k: int, dtype: torch.dtype) -> torch.Tensor:
    """ALiBi's bias −slope_h · |i + n_k − n_q − j| in `dtype`, (B or 1, H, n_q, n_k), from slopes (H,) or (B, H)."""
    rows = torch.arange(n_q, device=alibi_slopes.device)[:, None]
    cols = torch.arange(n_k, device=alibi_slopes.device)[None, :]
    distance = (rows + (n_k - n_q) - cols).abs().to(dtype)
    return -alibi_slopes.to(dtype).reshape(-1 if alibi_slopes.dim() == 2 else 1, heads, 1, 1) * distance


def reference_variant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                                **variants) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse) in float64 for chapter 9's variants (`reference_variant_scores`' keywords): O of shape
    (B, H, n_q, d), lse (B, H, n_q); a row that sees no key gets O = 0 and lse = −∞."""
    s = reference_variant_scores(q, k, sm_scale, **variants)
    return reference_softmax(s) @ expand_kv_heads(v, q.shape[1]).double(), reference_log_sum_exp(s)
