"""How precisely a prefill run compares ours with sdpa, two ways, from its data file (no GPU):

    python3 tools/prefill_comparison_noise.py data/prefill.json --length 2048

* median over median: the ratio of the two implementations' median forwards, with a 95 % bootstrap
  interval (each implementation's forwards resampled with replacement, seeded, 4000 times);
* by pairs of turns: `tutorial_kernels.prefill.paired_ratio`, its sign-test interval.

The prefill page quotes both at 2048 tokens to show why the paired comparison is the one judged.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tutorial_kernels.prefill import format_paired, paired_ratio  # noqa: E402

RESAMPLES = 4000


def median_ratio_interval(ours: list[float], base: list[float], seed: int = 1) -> tuple[float, float, float]:
    """The ratio of the medians and its 95 % percentile-bootstrap interval."""
    rng = random.Random(seed)
    def resampled_median(times: list[float]) -> float:
        return statistics.median(rng.choices(times, k=len(times)))

    ratios = sorted(resampled_median(ours) / resampled_median(base) for _ in range(RESAMPLES))
    low, high = ratios[int(0.025 * RESAMPLES)], ratios[int(0.975 * RESAMPLES) - 1]
    return statistics.median(ours) / statistics.median(base), low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", type=Path, help="a data file written by python -m tutorial_kernels.prefill")
    parser.add_argument("--length", type=int, default=2048, help="prompt length to compare at")
    args = parser.parse_args()
    result = json.loads(args.data.read_text())
    rows = {(r["model"], r["impl"], r["n"]): r for r in result["results"]}
    for key in result["models"]:
        ours, sdpa = rows.get((key, "tutorial_fa2", args.length)), rows.get((key, "sdpa", args.length))
        if not (ours and sdpa and "ms_all" in ours and "ms_all" in sdpa):
            print(f"{key:12} N={args.length}: no per-forward times for both")
            continue
        ratio, low, high = median_ratio_interval(ours["ms_all"], sdpa["ms_all"])
        paired = format_paired(paired_ratio(ours["ms_all"], sdpa["ms_all"]))
        print(f"{key:12} N={args.length}: median over median {ratio:.4f} [{low:.4f}, {high:.4f}] (bootstrap); "
              f"by pairs of turns {paired}")


if __name__ == "__main__":
    main()
