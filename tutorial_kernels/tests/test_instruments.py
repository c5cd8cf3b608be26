"""Instruments: the byte models of chapters 4 and 5, and the timelines of FlashAttention-1 and -2."""

import pytest
import torch

from tutorial_kernels.ch02_naive_attention import naive_hbm_bytes
from tutorial_kernels.instruments.hbm_model import flash_v1_hbm_bytes, flash_v2_hbm_bytes, naive_kernel_bytes
from tutorial_kernels.instruments.timeline import flash_v1_timeline, flash_v2_timeline
from tutorial_kernels.recorder import TimelineUnavailable
from tutorial_kernels.testing import ON_GPU


def test_hbm_model_closed_form():
    # non-causal, tiles dividing N: T_c passes over Q, O, ℓ, m plus K, V once and the epilogue
    B, H, N, d, b, bm, bn = 2, 3, 1024, 64, 2, 64, 128
    got = flash_v1_hbm_bytes(B, H, N, N, d, b, bm, bn)
    t_c = N // bn
    per_pass_read = N * d * b + N * d * 4 + 2 * N * 4
    per_pass_write = N * d * 4 + 2 * N * 4
    assert got["kernel_read"] == B * H * (2 * N * d * b + t_c * per_pass_read + N * (d + 2) * 4)
    assert got["kernel_write"] == B * H * (t_c * per_pass_write + N * d * b + N * 4)
    assert got["init_write"] == B * H * N * (d + 2) * 4
    # causal visits about half the tiles: (T_c + 1) / (2 T_c) of the passes when block_m == block_n
    causal = flash_v1_hbm_bytes(B, H, N, N, d, b, 128, 128, causal=True)
    full = flash_v1_hbm_bytes(B, H, N, N, d, b, 128, 128)
    assert causal["kernel_write"] < 0.6 * full["kernel_write"]


def test_naive_split_matches_chapter_2():
    split = naive_kernel_bytes(2, 3, 300, 500, 80, 2)
    assert sum(split.values()) == naive_hbm_bytes(2, 3, 300, 500, 80, 2)


def test_hbm_byte_model_counts_each_programs_loads():
    d, b = 64, 2
    full = flash_v2_hbm_bytes(1, 1, 128, 128, d, b, block_m=64, block_n=64)
    assert full["kernel_read"] == 128 * d * b + 2 * (2 * 128) * d * b  # Q once, K and V by both query tiles
    assert full["kernel_write"] == 128 * (d * b + 4)  # O and the float32 lse
    causal = flash_v2_hbm_bytes(1, 1, 128, 128, d, b, block_m=64, block_n=64, causal=True)
    assert causal["kernel_read"] == 128 * d * b + 2 * (64 + 128) * d * b  # tile 0 sees keys < 64, tile 1 all
    assert flash_v2_hbm_bytes(2, 3, 128, 128, d, b, 64, 64)["kernel_read"] == 6 * full["kernel_read"]


@pytest.mark.gpu("timelines")  # the timeline reads %smid and %globaltimer: GPU only
def test_timeline_records_one_program_per_head():
    run = flash_v1_timeline(1, 8, 512, 64)
    assert run.n_programs == 8
    assert run.sms_used == 8, "eight programs, each on its own SM: the other SMs idle"
    assert all(e > s for s, e in zip(run.start_ns, run.end_ns))


@pytest.mark.gpu("timelines")  # the timeline reads %smid and %globaltimer: GPU only
def test_timeline_fills_the_gpu_where_flash_attention_1_cannot():
    fa1, fa2 = flash_v1_timeline(1, 8, 4096, 64), flash_v2_timeline(1, 8, 4096, 64)
    assert fa1.n_programs == 8 and fa2.n_programs == 8 * 4096 // 64
    assert fa2.sms_used > fa1.sms_used, (fa1.sms_used, fa2.sms_used)
    assert all(e > s for s, e in zip(fa2.start_ns, fa2.end_ns))


@pytest.mark.cpu("the message shown without a GPU")
def test_timeline_says_why_it_cannot_run_here():
    with pytest.raises(TimelineUnavailable, match="needs a CUDA GPU"):
        flash_v2_timeline(1, 8, 256, 64)


def test_a_trace_buffer_is_checked_before_a_launch():
    from tutorial_kernels.ch04_flash_v1 import flash_attn_v1_with_lse
    from tutorial_kernels.ch05_flash_v2 import flash_attn_v2
    from tutorial_kernels.testing import random_qkv

    x = random_qkv(1, 2, 40, 40, 32, torch.float16)  # 64-row tiles: one program per head in both chapters
    for call in (lambda t: flash_attn_v2(x.q, x.k, x.v, trace=t), lambda t: flash_attn_v1_with_lse(x.q, x.k, x.v, trace=t)):
        if ON_GPU:
            with pytest.raises(ValueError, match=r"trace must be new_trace\(2\)"):
                call(torch.zeros(1, 3, dtype=torch.int64, device=x.q.device))  # one row short: would be overrun
        else:
            with pytest.raises(TimelineUnavailable, match="needs a CUDA GPU"):
                call("x")
