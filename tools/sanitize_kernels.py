"""Launch every kernel of the package once, at odd shapes, for NVIDIA's compute-sanitizer to watch.

    compute-sanitizer --tool memcheck python3 tools/sanitize_kernels.py TARGET
    tools/gpu_checks --sanitize                # every target under memcheck, racecheck and synccheck, a summary

One target per process, so that a report names its kernel. The shapes are small (the sanitizer
slows a kernel down by orders of magnitude) and odd: lengths that are not multiples of a tile,
n_q ≠ n_k both ways (causal rows that see no key), grouped-query attention, d = 80, strided views.
The Triton kernels run their teaching configurations (autotuning would launch every candidate).
`python3 tools/sanitize_kernels.py --list` prints the targets.
"""

from __future__ import annotations

import sys

import torch

from tutorial_kernels.inputs import random_qkv


def _qkv(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout="bhnd"):
    x = random_qkv(batch, heads, n_q, n_k, head_dim, dtype, "cuda", layout=layout)
    return x.q, x.k[:, :kv_heads], x.v[:, :kv_heads]


def _train(fn, q, k, v, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    fn(q, k, v, causal).backward(torch.randn_like(q))


def ch01():
    from tutorial_kernels.ch01_gpu_hierarchy import triton_sum

    for method in ("two-pass", "atomic"):
        triton_sum(torch.randn(100_003, device="cuda"), method=method)


def ch02():
    from tutorial_kernels.ch02_naive_attention import naive_attention

    for causal in (False, True):
        naive_attention(*_qkv(1, 2, 2, 70, 33, 80, torch.float16), causal)


def ch03():
    from tutorial_kernels.ch03_tiling_online_softmax import matmul, online_softmax_attention

    matmul(torch.randn(70, 90, device="cuda", dtype=torch.float16), torch.randn(90, 33, device="cuda",
                                                                               dtype=torch.float16))
    for causal in (False, True):
        online_softmax_attention(*_qkv(1, 2, 2, 33, 70, 64, torch.float16), causal)


def ch04():
    from tutorial_kernels.ch04_flash_v1 import flash_attn_v1

    for causal in (False, True):
        flash_attn_v1(*_qkv(1, 2, 2, 70, 33, 80, torch.float16), causal)


def ch05():
    from tutorial_kernels.ch05_flash_v2 import flash_attn_v2, flash_attn_v2_minimal, flash_attn_v2_with_lse

    for causal in (False, True):
        flash_attn_v2_minimal(*_qkv(1, 2, 2, 70, 33, 64, torch.float16), causal)
        flash_attn_v2(*_qkv(2, 4, 2, 33, 70, 80, torch.bfloat16, layout="bnhd"), causal)
        flash_attn_v2_with_lse(*_qkv(1, 4, 1, 70, 33, 128, torch.float16), causal)


def ch06():
    from tutorial_kernels.ch06_backward import flash_attention

    for causal in (False, True):
        _train(flash_attention, *_qkv(1, 4, 2, 70, 33, 80, torch.float16), causal)
        _train(flash_attention, *_qkv(1, 2, 1, 33, 70, 128, torch.bfloat16, layout="bnhd"), causal)


def ch07_forward():
    from tutorial_kernels.ch07_hopper import _launch, flash_attn_hopper, flash_attn_hopper_with_lse  # noqa: PLC2701

    for causal in (False, True):
        for head_dim in (64, 128, 256):  # each with its own key tile and ring (ch07_hopper.TILES)
            q, k, v = _qkv(1, 2, 1, 200, 300, head_dim, torch.bfloat16, layout="bnhd")
            flash_attn_hopper(q, k, v, causal)
            flash_attn_hopper_with_lse(*_qkv(1, 2, 2, 300, 200, head_dim, torch.float16), causal)
            # persistent programs that run several work items each, the ring carried across them
            _launch(q, k, v, causal, head_dim ** -0.5, torch.empty_like(q), programs=2, section=1)


def ch07_backward():
    from tutorial_kernels.ch07_hopper import flash_attn_hopper_with_lse
    from tutorial_kernels.ch07_hopper_backward import HEAD_DIMS, flash_attn_hopper_backward

    for causal in (False, True):
        for head_dim in HEAD_DIMS:  # each with its own query tile (ch07_hopper_backward.BLOCK_M_FOR)
            for shape in ((1, 2, 1, 200, 300), (1, 2, 2, 300, 200)):
                q, k, v = _qkv(*shape, head_dim, torch.bfloat16, layout="bnhd")
                out, lse = flash_attn_hopper_with_lse(q, k, v, causal)
                flash_attn_hopper_backward(q, k, v, out, lse, torch.randn_like(q), causal)


TARGETS = {"ch01": ch01, "ch02": ch02, "ch03": ch03, "ch04": ch04, "ch05": ch05, "ch06": ch06,
           "ch07-forward": ch07_forward, "ch07-backward": ch07_backward}

if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print(" ".join(TARGETS))
    else:
        for name in sys.argv[1:]:
            if name not in TARGETS:
                sys.exit(f"sanitize_kernels: unknown target {name!r}; the targets are: {', '.join(TARGETS)}")
            TARGETS[name]()
        torch.cuda.synchronize()
