#!/usr/bin/env bash
# The n_k = 1 fault, stage by stage, each in its own process with blocking launches; then under memcheck.
#   FA_GIT_COMMIT=... bash experiments/2026-11-28_nk1_fault/run.sh
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUDA_LAUNCH_BLOCKING=1
here=experiments/2026-11-28_nk1_fault
san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
one() { echo "== $*"; timeout 120 python3 $here/case.py "$@" 2>&1 | grep -E "^ok|lse ok|Error|error" | head -5; }
for stage in fwd lse chf teachf ch teach bwd; do one $stage 239 1 80 1 float16 0; done
for args in "239 1 64 1 float16 0" "239 1 80 9 float16 0" "239 2 80 1 float16 0" "239 3 80 1 float16 0" \
            "239 1 128 1 bfloat16 0" "239 1 80 1 float16 1" "799 3 80 1 float16 0" "2 1 80 1 float16 0" \
            "17 1 80 1 float16 0"; do
  one bwd $args
done
for stage in chf ch; do
  echo "== memcheck $stage"
  timeout 200 "$san" --tool memcheck --print-limit 8 python3 $here/case.py $stage 239 1 80 1 float16 0 2>&1 \
    | grep -vE "^\s*$" | head -60
done
