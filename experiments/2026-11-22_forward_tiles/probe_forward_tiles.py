"""Probe: tile shapes beyond the autotuner's candidates (BLOCK_M 256, 16 warps, 4 stages, 64 × 128), each
forced through chapter 5's launcher with and without TMA, against cuDNN (tutorial_kernels.bench.run_probe:
checked against float64, three rotated rounds per shape).

    python3 tools/probe_forward_tiles.py OUT.json      # on a GPU; ~2.5 min on an H100
"""

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

import triton  # noqa: E402

from tutorial_kernels.bench import run_probe  # noqa: E402
from tutorial_kernels.ch05_flash_v2 import _launch  # noqa: E402

# (BLOCK_M, BLOCK_N, num_warps, num_stages); the first two are the autotuner's best candidates
TILES = [(128, 128, 8, 3), (128, 64, 8, 3), (256, 64, 8, 3), (256, 64, 16, 3), (256, 128, 16, 2), (256, 32, 8, 3),
         (128, 64, 8, 4), (128, 128, 8, 2), (64, 128, 4, 3)]


def forced(config: triton.Config):
    return lambda q, k, v, causal: _launch(q, k, v, causal, None, None, tuned=False, config=config)[0]


if __name__ == "__main__":
    candidates = {
        f"{bm}x{bn} w{w} s{st} tma{int(tma)}": forced(triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "USE_DESCRIPTORS": tma}, num_warps=w, num_stages=st))
        for (bm, bn, w, st), tma in itertools.product(TILES, (False, True))
    }
    run_probe(candidates, Path(sys.argv[1]), "python3 tools/probe_forward_tiles.py")
