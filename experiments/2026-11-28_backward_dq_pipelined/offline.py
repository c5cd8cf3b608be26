"""Compile the package's Hopper backward and variant.py for sm_90a on a machine without a GPU (Triton's own
ptxas): shared memory, spill bytes and any ptxas warning (a serialised wgmma pipeline would show here).

    TRITON_INTERPRET=0 PYTHONPATH=<Triton 3.6, as on the H100> python experiments/2026-11-28_backward_dq_pipelined/offline.py
"""
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource

from tutorial_kernels.tests import gluon_offline

spec = importlib.util.spec_from_file_location("variant", Path(__file__).with_name("variant.py"))
variant = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variant)
package = gluon_offline.ch07_hopper_backward

for label, module in (("package", package), ("variant", variant)):
    gluon_offline.ch07_hopper_backward = module
    for name, (kernel, signature, constants) in gluon_offline.variants().items():
        if not name.startswith("backward") or (kernel is not module._flash_hopper_bwd):
            continue
        compiled = triton.compile(GluonASTSource(kernel, signature, constants), target=gluon_offline.HOPPER,
                                  options={"num_warps": 4})
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "k.ptx").write_text(compiled.asm["ptx"])
            report = subprocess.run([str(get_ptxas(90).path), "-v", "-arch=sm_90a", "k.ptx", "-o", "k.cubin"],
                                    cwd=tmp, capture_output=True, text=True, check=True).stderr
        warnings = [line for line in report.splitlines() if "arning" in line]
        print(json.dumps({"module": label, "kernel": name, "triton": triton.__version__,
                          "shared_bytes": compiled.metadata.shared,
                          "spill_bytes": int(re.search(r"(\d+) bytes spill stores", report).group(1)),
                          "ptxas_warnings": warnings}), flush=True)
