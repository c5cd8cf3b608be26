"""Probe: chapter 5's Hopper kernel (FA3's schedule in Gluon, `tutorial_kernels.ch05_hopper`) against
cuDNN, torch's flash backend and chapter 5's tuned Triton kernel, on the FlashAttention-2 paper's
shapes at head_dim 128 (the only one it is built for), bfloat16 as the prefill models run
(tutorial_kernels.bench.run_probe: checked against float64, three rotated rounds per shape).

    python3 tools/probe_hopper_schedule.py data/ch05_hopper.json      # on an H100/H200; ~2 min
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from tutorial_kernels.bench import run_probe  # noqa: E402

if __name__ == "__main__":
    run_probe({}, Path(sys.argv[1]), "python3 tools/probe_hopper_schedule.py data/ch05_hopper.json",
              head_dims=(128,), lengths=(1024, 2048, 4096, 8192, 16384), dtype="bfloat16",
              baselines=("sdpa-flash", "flash-v2-tuned", "flash-v2-hopper"))
