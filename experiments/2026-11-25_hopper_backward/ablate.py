"""Where the Hopper backward's time goes: variants of ch07_hopper_backward.py made by text
substitution (each drops or changes one piece; most give wrong gradients and are timed only).

    FA_GIT_COMMIT=... python experiments/2026-11-25_hopper_backward/ablate.py OUT.json
"""
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from triton.testing import do_bench

from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_with_lse

SRC = Path(__file__).resolve().parents[2] / "tutorial_kernels" / "ch07_hopper_backward.py"
ATOMIC = '    gl.atomic_add(ptrs, dq, mask=(rows < n_q)[:, None], sem="relaxed")'
RED = ('    gl.inline_asm_elementwise("red.global.add.f32 [$1], $2; mov.u32 $0, 0;", "=r,l,r", [ptrs.to(gl.int64, bitcast=True), dq], '
       'dtype=gl.int32, is_pure=False, pack=1)')
DQ_ADD = """    rows = m * block_m + gl.arange(0, block_m, gl.SliceLayout(1, dq_layout))
    cols = WG * (head_dim // 2) + gl.arange(0, head_dim // 2, gl.SliceLayout(0, dq_layout))
    ptrs = dq_acc_ptr + (bh * n_q + rows[:, None]) * head_dim + cols[None, :]
""" + ATOMIC
RED_V2 = DQ_ADD.replace(ATOMIC, '    gl.inline_asm_elementwise("red.global.add.v2.f32 [$2], {$4, $5}; mov.u32 $0, 0; mov.u32 $1, 0;", '
                        '"=r,=r,l,l,r,r", [ptrs.to(gl.int64, bitcast=True), dq], dtype=gl.int32, is_pure=False, pack=2)')
RED_V4 = """    red_layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    dq = gl.convert_layout(dq, red_layout)
    rows = m * block_m + gl.arange(0, block_m, gl.SliceLayout(1, red_layout))
    cols = WG * (head_dim // 2) + gl.arange(0, head_dim // 2, gl.SliceLayout(0, red_layout))
    ptrs = dq_acc_ptr + (bh * n_q + rows[:, None]) * head_dim + cols[None, :]
    gl.inline_asm_elementwise("red.global.add.v4.f32 [$4], {$8, $9, $10, $11}; mov.u32 $0, 0; mov.u32 $1, 0; "
                              "mov.u32 $2, 0; mov.u32 $3, 0;", "=r,=r,=r,=r,l,l,l,l,r,r,r,r",
                              [ptrs.to(gl.int64, bitcast=True), dq], dtype=gl.int32, is_pure=False, pack=4)
"""
TMA_EPILOGUE = """    first_row = first_key + WG * half
    dk_out = out_smem.index(2 * WG)
    dk_out.reshape([half, head_dim]).store((dk * sm_scale).to(dtype))  # dK = τ dSᵀ Q
    dv_out = out_smem.index(2 * WG + 1)
    dv_out.reshape([half, head_dim]).store(dv.to(dtype))
    fence_async_shared()  # the stores above, visible to the copy engine
    tma_store(dk_desc, [batch, kv_head, first_row, 0], dk_out)
    tma_store(dv_desc, [batch, kv_head, first_row, 0], dv_out)
    tma.store_wait(0)"""
PTR_EPILOGUE = """    rows = first_key + WG * half + gl.arange(0, half, gl.SliceLayout(1, kv_layout))
    cols = gl.arange(0, head_dim, gl.SliceLayout(0, kv_layout))
    keep = (rows < n_k)[:, None]
    offs = ((batch * (n_heads // group_size) + kv_head) * n_k + rows[:, None]).to(gl.int64) * head_dim + cols[None, :]
    gl.store(dk_desc + offs, (dk * sm_scale).to(dtype), mask=keep)
    gl.store(dv_desc + offs, dv.to(dtype), mask=keep)"""
PTR_LAUNCH = ("""*descs, lse, delta, dq_acc, TensorDescriptor.from_tensor(dk, q_block, q_layout),
        TensorDescriptor.from_tensor(dv, q_block, q_layout), heads,""", "*descs, lse, delta, dq_acc, dk, dv, heads,")
NO_OUT_SMEM = ("    out_smem = gl.allocate_shared_memory(dtype, [4, 1, 1, half, head_dim], dk_desc.layout)  # dK, dV per warpgroup\n", "    out_smem = 0\n")
VARIANTS = {
    "baseline": [],
    "red_asm": [(ATOMIC, RED)],
    "no_atomics": [(ATOMIC, "")],
    "no_dq": [("    dq = warpgroup_mma(ds, k_cols, no_dq, use_acc=False, is_async=True)", "    dq = no_dq"),
              ("    dq, dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=[dq, dv, dk])",
               "    dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=[dv, dk])"), (ATOMIC, "")],
}
# dK, dV as plain (B·H_kv = 1 head per batch here: kv_head = 0) pointers in the pointer epilogue
VARIANTS["red_v2"] = [(DQ_ADD, RED_V2)]
VARIANTS["red_v4_ptr_epilogue"] = [(DQ_ADD, RED_V4), (TMA_EPILOGUE, PTR_EPILOGUE), NO_OUT_SMEM, PTR_LAUNCH]
VARIANTS["red_v2_ptr_epilogue"] = [(DQ_ADD, RED_V2), (TMA_EPILOGUE, PTR_EPILOGUE), NO_OUT_SMEM, PTR_LAUNCH]
HEAD_FASTEST = [("    first_key = gl.program_id(0) * block_n\n    pid_bkv = gl.program_id(1)",
                 "    pid_bkv = gl.program_id(0)\n    first_key = gl.program_id(1) * block_n"),
                ("    grid = (triton.cdiv(shape.n_k, BLOCK_N), batch * shape.kv_heads)",
                 "    grid = (batch * shape.kv_heads, triton.cdiv(shape.n_k, BLOCK_N))")]
if os.environ.get("ABLATE_ONLY"):
    VARIANTS = {"baseline": [], "head_fastest": HEAD_FASTEST}
extra = json.loads(os.environ.get("ABLATE_EXTRA", "{}"))
VARIANTS.update({k: [tuple(p) for p in v] for k, v in extra.items()})

out_path = sys.argv[1]
results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("FA_GIT_COMMIT"),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "command": " ".join(sys.argv), "rows": []}
tmp = Path(tempfile.mkdtemp())
for name, subs in VARIANTS.items():
    text = SRC.read_text()
    for a, b in subs:
        assert a in text, (name, a)
        text = text.replace(a, b)
    path = tmp / f"hb_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"hb_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for n, causal in ((4096, False), (4096, True), (16384, True)):
        b, h = 16384 // n, 16
        q, k, v, do = (torch.randn(b, h, n, 128, device="cuda", dtype=torch.float16) for _ in range(4))
        o, lse = flash_attn_v2_with_lse(q, k, v, causal)
        row = {"variant": name, "n": n, "causal": causal}
        try:
            ms = do_bench(lambda: mod.flash_attn_hopper_backward(q, k, v, o, lse, do, causal), warmup=30, rep=150)
            row["ms"] = round(ms, 4)
            row["tflops"] = round(2.5 * 4 * b * h * n * n * 128 / (2 if causal else 1) / ms / 1e9, 1)
        except Exception:
            row["error"] = traceback.format_exc()[-600:]
        print(row, flush=True)
        results["rows"].append(row)
        json.dump(results, open(out_path, "w"), indent=1)
