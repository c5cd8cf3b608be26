"""Compile chapter 7's Gluon kernels for Hopper (sm_90a) on a machine without a GPU.

Gluon kernels do not run in Triton's interpreter, but Triton compiles them for any target it ships
a back end for, down to a cubin through its own ptxas: a typing, layout or shared-memory error
shows up here, on the CPU, before any GPU sees the code. Run it with TRITON_INTERPRET=0 (under the
interpreter, which the package switches on where there is no GPU, the kernels' helpers are
interpreted functions that the compiler refuses); it prints one JSON line per kernel variant: its
name, shared memory and ptxas's register spills.

    TRITON_INTERPRET=0 python -m tutorial_kernels.tests.gluon_offline
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from tutorial_kernels import ch07_hopper, ch07_hopper_backward

HOPPER = GPUTarget("cuda", 90, 32)


def _descriptor(rows: int, head_dim: int) -> str:
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], gl.float16)
    return f"tensordesc<fp16[1,1,{rows},{head_dim}],{layout!r}>"


def _signature(kernel, types: dict[str, str], constants: dict[str, object]) -> tuple[dict, dict]:
    """Triton's (signature, constexprs) for `kernel`, every parameter named in `types` or `constants`."""
    names = kernel.arg_names
    signature = {name: ("constexpr" if name in constants else types[name]) for name in names}
    return signature, {(names.index(name),): value for name, value in constants.items()}


def _backward_types(head_dim: int) -> dict[str, str]:
    block_m, block_n = ch07_hopper_backward.BLOCK_M_FOR[head_dim], ch07_hopper_backward.BLOCK_N
    return {"q_desc": _descriptor(block_m, head_dim), "do_desc": _descriptor(block_m, head_dim),
            "k_desc": _descriptor(block_n, head_dim), "v_desc": _descriptor(block_n, head_dim),
            "stats_desc": f"tensordesc<fp32[1,1,{block_m}],{ch07_hopper_backward.STATS_LAYOUT!r}>",
            "dq_acc_ptr": "*fp32", "dk_ptr": "*fp16", "dv_ptr": "*fp16", "qk_scale": "fp32", "sm_scale": "fp32"}


def variants() -> dict[str, tuple]:
    """name → (kernel, signature, constexprs) of every Gluon kernel the package launches, float16,
    at each head dimension it runs."""
    found = {}
    fwd, bwd = ch07_hopper._flash_hopper_fwd, ch07_hopper_backward._flash_hopper_bwd  # noqa: SLF001
    for causal in (False, True):
        tag = "causal" if causal else "full"
        for head_dim, tiles in ch07_hopper.TILES.items():
            forward_types = {"q_desc": _descriptor(ch07_hopper.ROWS_PER_WARPGROUP, head_dim),
                             "k_desc": _descriptor(tiles.block_n, head_dim),
                             "v_desc": _descriptor(tiles.block_n, head_dim), "o_ptr": "*fp16", "lse_ptr": "*fp32",
                             "qk_scale": "fp32"}
            for window in (False, True) if head_dim == 128 else (False,):  # a window's code at one head_dim
                found[f"forward-d{head_dim}-{tag}" + "-window" * window] = (fwd, *_signature(
                    fwd, {n: forward_types.get(n, "i32") for n in fwd.arg_names},
                    {"CAUSAL": causal, "WINDOW": window, "STAGES": tiles.stages,
                     "CONSUMER_REGS": ch07_hopper.CONSUMER_REGS, "LOADER_REGS": ch07_hopper.LOADER_REGS}))
        for head_dim in ch07_hopper_backward.HEAD_DIMS:
            types = _backward_types(head_dim)
            found[f"backward-d{head_dim}-{tag}"] = (bwd, *_signature(
                bwd, {n: types.get(n, "i32") for n in bwd.arg_names},
                {"CAUSAL": causal, "STAGES": ch07_hopper_backward.STAGES,
                 "CONSUMER_REGS": ch07_hopper_backward.CONSUMER_REGS,
                 "LOADER_REGS": ch07_hopper_backward.LOADER_REGS, "WRITER_REGS": ch07_hopper_backward.WRITER_REGS}))
    return found


def spills(ptx: str) -> int:
    """Bytes of register spill stores ptxas reports for this PTX (Triton's own ptxas, sm_90a)."""
    ptxas = get_ptxas(90).path  # the one Triton compiled with (its version reads this PTX)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        report = subprocess.run([str(ptxas), "-v", "-arch=sm_90a", "k.ptx", "-o", "k.cubin"], cwd=tmp,
                                capture_output=True, text=True, check=True).stderr
    return int(re.search(r"(\d+) bytes spill stores", report).group(1))


def main() -> None:
    for name, (kernel, signature, constants) in variants().items():
        compiled = triton.compile(GluonASTSource(kernel, signature, constants), target=HOPPER,
                                  options={"num_warps": 4})
        print(json.dumps({"kernel": name, "shared_bytes": compiled.metadata.shared,
                          "spill_bytes": spills(compiled.asm["ptx"])}), flush=True)


if __name__ == "__main__":
    main()
