"""Probe: head dimensions that are not a power of two (Phi-2's 80, 96) computed as two column blocks
(64 + 16, 64 + 32: chapter 5's `_head_dim_blocks`) against one block padded to 128, both through the
tuned launcher, with torch's flash backend beside them and cuDNN as the reference
(tutorial_kernels.bench.run_probe: checked against float64, three rotated rounds per shape).
d = 128 is the control: it has one block either way.

    python3 tools/probe_head_dim_split.py OUT.json      # on a GPU; ~2 min on an H100
"""

import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from tutorial_kernels import ch05_flash_v2 as ch05  # noqa: E402
from tutorial_kernels.bench import run_probe  # noqa: E402


def one_padded_block(q, k, v, causal):
    # BLOCK_D is part of the autotuner's key, so this variant is tuned on its own
    with mock.patch.object(ch05, "_head_dim_blocks", lambda d: (ch05._block_d(d), 0)):
        return ch05.flash_attn_v2_tuned(q, k, v, causal)


if __name__ == "__main__":
    candidates = {"tuned, two blocks when they save columns": ch05.flash_attn_v2_tuned,
                  "tuned, one padded block": one_padded_block}
    run_probe(candidates, Path(sys.argv[1]), "python3 tools/probe_head_dim_split.py", head_dims=(80, 96, 128),
              lengths=(2048, 16384), dtype="bfloat16", baselines=("sdpa-flash",))
