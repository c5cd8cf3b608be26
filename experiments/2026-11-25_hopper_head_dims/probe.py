"""The Hopper forward at head_dim 64 and 256 (ch07_hopper.TILES) against torch's cuDNN and flash
backends and chapter 5's tuned Triton kernel, FlashAttention-2 paper shapes (B·N = 16k, H·d = 2048),
with `run_probe`'s output checks; at d = 64 two depths of the K/V ring (4 and 6 stages).

    FA_GIT_COMMIT=$(git rev-parse --short HEAD) PYTHONPATH=. python experiments/2026-11-25_hopper_head_dims/probe.py OUT_DIR [DTYPE]
"""
import sys
from pathlib import Path

from tutorial_kernels import ch07_hopper
from tutorial_kernels.bench.run import run_probe

out_dir, dtype = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "float16")
LENGTHS = (1024, 2048, 4096, 8192, 16384)


def hopper(stages=None):
    def call(q, k, v, causal):
        d = q.shape[3]
        default = ch07_hopper.TILES[d]
        if stages is not None:
            ch07_hopper.TILES[d] = default._replace(stages=stages)
        try:
            out = q.new_empty(q.shape)
            return ch07_hopper._launch(q, k, v, causal, d ** -0.5, out)  # plan=None: nothing remembered
        finally:
            ch07_hopper.TILES[d] = default
    return call


command = " ".join(["python", *sys.argv])
run_probe({"hopper-4-stages": hopper(4), "hopper-6-stages": hopper(6)}, out_dir / f"d64_{dtype}.json", command,
          head_dims=(64,), lengths=LENGTHS, dtype=dtype, baselines=("sdpa-flash", "flash-v2-tuned"))
run_probe({"hopper": hopper()}, out_dir / f"d256_{dtype}.json", command,
          head_dims=(256,), lengths=LENGTHS, dtype=dtype, baselines=("sdpa-flash", "flash-v2-tuned"))
