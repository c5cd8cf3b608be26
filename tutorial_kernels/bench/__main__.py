"""`python -m tutorial_kernels.bench SUITE`: run a benchmark suite (see `--help`)."""

from tutorial_kernels.bench.cli import main

main()
