#!/usr/bin/env bash
# The backward at n = 1024 with and without do_not_specialize on chapter 6's kernels (.variant_pkg: this tree
# with chapter 6's decorators plain), twice each, A/B/A/B; then the first call profiled, compile-ahead on and off.
#   OUT=dir bash experiments/2026-11-28_length_specialization/run2.sh
set -u
root=$PWD
mkdir -p $OUT/ab $OUT/profile
for round in 1 2; do
  for version in after variant; do
    dir=$root; [ $version = variant ] && dir=$root/.variant_pkg
    (cd $dir && python -m tutorial_kernels.bench front-door-bwd --n 1024 --dtype bfloat16 float16 \
       --providers front-door sdpa-cudnn --out $OUT/ab/front-door-bwd_${version}_${round}.json) > $OUT/ab/bwd_${version}_${round}.log 2>&1
  done
done
here=experiments/2026-11-28_first_call_profile
for ahead in 1 0; do
  TUTORIAL_KERNELS_COMPILE_AHEAD=$ahead TRITON_CACHE_DIR=$(mktemp -d) TUTORIAL_KERNELS_TILES=$(mktemp -d) \
    python3 $here/first_call_profile.py $OUT/profile/ahead$ahead > $OUT/profile/ahead$ahead.json 2> $OUT/profile/ahead$ahead.err
done
