"""Check chapter 5's teaching launcher at head dimensions on a GPU, each in a fresh process, with the
head dimension split as `_head_dim_blocks` says or forced to one padded block; the fourth session's
failures of the dropped splits (BENCHMARKS.md) were found this way.

    python3 tools/check_head_dims_on_gpu.py                     # d = 48 72 80 96 160, N = 100, 17, 1
    python3 tools/check_head_dims_on_gpu.py --dims 80 --lengths 1 17
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python3 tools/check_head_dims_on_gpu.py --dims 80 --one-process

Fresh processes matter: an illegal address poisons the CUDA context of the process that made it, and one
failure above showed only in a particular order of compilations. Prints one line per case: the relative
error against the float64 reference (float16 inputs), or the error raised.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from unittest import mock

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def check(head_dim: int, lengths: list[int], blocks: str) -> bool:
    import torch

    from tutorial_kernels import ch05_flash_v2 as ch05
    from tutorial_kernels.reference import reference_attention

    one_block = mock.patch.object(ch05, "_head_dim_blocks", lambda d: (ch05._block_d(d), 0))
    for n in lengths:
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v = (torch.randn(2, 3, n, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
            try:
                if blocks == "one":
                    with one_block:
                        out = ch05.flash_attn_v2(q, k, v, causal)
                else:
                    out = ch05.flash_attn_v2(q, k, v, causal)
                torch.cuda.synchronize()
                ref = reference_attention(q, k, v, causal).double()
                err = ((out.double() - ref).norm() / ref.norm()).item()
                print(f"d={head_dim} blocks={blocks} n={n} causal={causal} rel_err={err:.2e}", flush=True)
            except Exception as e:  # report and stop: the CUDA context may be unusable now
                print(f"d={head_dim} blocks={blocks} n={n} causal={causal} ERROR {str(e)[:100]}", flush=True)
                return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", nargs="+", type=int, default=[48, 72, 80, 96, 160])
    parser.add_argument("--lengths", nargs="+", type=int, default=[100, 17, 1])
    parser.add_argument("--blocks", choices=["split", "one", "both"], default="both",
                        help="the launcher's choice ('split'), one padded block ('one'), or each in turn")
    parser.add_argument("--one-process", action="store_true", help="run every case here (for compute-sanitizer)")
    args = parser.parse_args()
    variants = ["split", "one"] if args.blocks == "both" else [args.blocks]
    ok = True
    for d in args.dims:
        for blocks in variants:
            if args.one_process:
                ok &= check(d, args.lengths, blocks)
            else:
                cmd = [sys.executable, __file__, "--dims", str(d), "--blocks", blocks, "--one-process",
                       "--lengths", *map(str, args.lengths)]
                ok &= subprocess.run(cmd, cwd=REPO_ROOT).returncode == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
