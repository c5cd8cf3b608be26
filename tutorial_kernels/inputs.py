"""Random attention inputs drawn from a fresh, printed seed — never zeros, which hide unwritten
outputs and wrong indexing. Shared by the tests (`testing`) and the benchmark harness (`bench`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from tutorial_kernels.runtime import default_device


def fresh_seed() -> int:
    """A new seed for every draw; printed by `assert_close` so a failure can be replayed."""
    return int.from_bytes(os.urandom(4), "little")


@dataclass
class AttentionInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    seed: int


def random_qkv(
    batch: int,
    heads: int,
    n_q: int,
    n_k: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    *,
    seed: int | None = None,
    layout: str = "bhnd",
) -> AttentionInputs:
    """Random normal q (B, H, n_q, d), k and v (B, H, n_k, d).

    `layout="bnhd"` allocates (B, N, H, d) and returns a transposed view — non-contiguous tensors,
    as Hugging Face models pass them — to check that kernels honour strides.
    """
    seed = fresh_seed() if seed is None else seed
    device = default_device() if device is None else torch.device(device)
    # Drawn where they are used: benchmark inputs reach 3 × 2²⁵ numbers, a second of CPU time each.
    # (The same seed gives different numbers on the CPU and on a GPU; each is reproducible.)
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(n: int) -> torch.Tensor:
        if layout == "bhnd":
            t = torch.randn(batch, heads, n, head_dim, generator=gen, device=device)
        elif layout == "bnhd":
            t = torch.randn(batch, n, heads, head_dim, generator=gen, device=device).transpose(1, 2)
        else:
            raise ValueError(f"layout must be 'bhnd' or 'bnhd', got {layout!r}")
        return t.to(dtype=dtype)

    return AttentionInputs(draw(n_q), draw(n_k), draw(n_k), seed)
