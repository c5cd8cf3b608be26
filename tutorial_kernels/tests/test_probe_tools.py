"""The GPU probe tools in tools/ reuse chapter 5's kernel internals; they must keep running when those
change. Each is run here on a tiny shape (under the interpreter on a CPU)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from tutorial_kernels.reference import reference_attention
from tutorial_kernels.testing import assert_close, random_qkv

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit reads the function's module by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipelined"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_pipelined_scores_probe_kernel(causal, pipeline):
    probe = _tool("probe_pipelined_scores")
    x = random_qkv(1, 2, 64, 64, 32, torch.float16)
    out = probe.run(x.q, x.k, x.v, causal, 32, 16, 4, 1, pipeline)
    assert_close(out, reference_attention(x.q, x.k, x.v, causal), torch.float16, seed=x.seed)


def test_head_dim_split_probe_variants():
    probe = _tool("probe_head_dim_split")
    x = random_qkv(1, 2, 40, 40, 80, torch.float16)
    ref = reference_attention(x.q, x.k, x.v, True)
    assert_close(probe.one_padded_block(x.q, x.k, x.v, True), ref, torch.float16, seed=x.seed)


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                    reason="the Hopper kernel (Gluon) runs on GPUs of compute capability 9.x only")
def test_hopper_prefill_shape_probe_implementations():
    probe = _tool("probe_hopper_prefill_shape")
    x = random_qkv(1, 8, 300, 300, 128, torch.bfloat16, "cuda", layout="bnhd")
    k, v = x.k[:, :2], x.v[:, :2]  # 4 query heads per key/value head, as in the probe
    ref = reference_attention(x.q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), True)
    out = torch.empty_like(x.q)
    for label, call in probe.implementations(x.q, k, v, out, 128 ** -0.5).items():
        out.fill_(float("nan"))
        result = call()
        assert_close(out if result is None else result, ref, torch.bfloat16, seed=x.seed, what=label)
