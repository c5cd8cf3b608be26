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
VARIANTS = {
    "baseline": [],
    "red_asm": [(ATOMIC, RED)],
    "no_atomics": [(ATOMIC, "")],
    "no_dq": [("    dq = warpgroup_mma(ds, k_cols, no_dq, use_acc=False, is_async=True)", "    dq = no_dq"),
              ("    dq, dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=[dq, dv, dk])",
               "    dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=[dv, dk])"), (ATOMIC, "")],
}
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
    for n, causal in ((4096, False), (4096, True)):
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
