"""`python -m tutorial_kernels.bench SUITE [--out PATH] [--providers …] [--n …] [--dtype …] [--append]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from tutorial_kernels.bench.providers import PROVIDERS
from tutorial_kernels.bench.run import run_suite, summary
from tutorial_kernels.bench.suites import SUITES
from tutorial_kernels.paths import data_dir

DESCRIPTION = "Benchmark harness shared by every chapter: `python -m tutorial_kernels.bench SUITE [--out PATH]`."


def main(argv: list[str] | None = None) -> None:
    """Run one suite and write its JSON (default `data/<suite's file>`); exit code 2 without a CUDA GPU."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.bench", description=DESCRIPTION)
    parser.add_argument("suite", choices=sorted(SUITES), help="which sweep to run")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: data/<suite's file>)")
    parser.add_argument("--providers", nargs="+", choices=sorted(PROVIDERS), help="subset of the suite's providers")
    parser.add_argument("--n", nargs="+", type=int, dest="lengths", help="only these sequence lengths")
    parser.add_argument("--dtype", nargs="+", dest="dtypes", help="only these dtypes (e.g. float16)")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of an existing output file that this run does not re-measure")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("benchmarks time real kernels and need a CUDA GPU; none is visible here")
    out = args.out or data_dir() / SUITES[args.suite].default_out
    result = run_suite(args.suite, out, argv, args.providers, args.lengths, args.dtypes, args.append)
    print(summary(result))
    print(f"wrote {out}")
