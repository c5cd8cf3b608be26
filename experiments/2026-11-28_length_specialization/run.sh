#!/usr/bin/env bash
# Lengths not compiled in (do_not_specialize) and eager training without torch's operators: their speed
# against the package before the change (.before_pkg, `git archive <before> tutorial_kernels`), each in its
# own process, A/B/A/B, the front door normalised by cuDNN in the same process; then the first-call harness.
#   OUT=dir bash experiments/2026-11-28_length_specialization/run.sh
set -u
root=$PWD
for round in 1 2; do
  for version in before after; do
    dir=$root; [ $version = before ] && dir=$root/.before_pkg
    for suite in front-door-fwd front-door-bwd; do
      (cd $dir && python -m tutorial_kernels.bench $suite --n 1024 4096 --dtype bfloat16 \
         --providers front-door sdpa-cudnn --out $OUT/${suite}_${version}_${round}.json) > $OUT/${suite}_${version}_${round}.log 2>&1
    done
  done
done
# the d = 128 causal backward cell: the table with the backward compiled ahead, without, and autotuned
for mode in table ahead-off autotune; do
  env_args=""
  [ $mode = ahead-off ] && env_args="TUTORIAL_KERNELS_COMPILE_AHEAD=0"
  [ $mode = autotune ] && env_args="TUTORIAL_KERNELS_AUTOTUNE=1 TUTORIAL_KERNELS_TILES=$(mktemp -d)"
  env $env_args python -m tutorial_kernels.bench front-door-bwd --n 1024 --dtype float16 \
      --providers front-door sdpa-cudnn --out $OUT/bwd1024_$mode.json > $OUT/bwd1024_$mode.log 2>&1
done
python -m tutorial_kernels.bench.first_call --out $OUT/first_call.json > $OUT/first_call.log 2>&1
