#!/usr/bin/env bash
# FA_GIT_COMMIT=... bash experiments/2026-11-28_first_call_profile/run.sh  (writes $OUT/profile_*)
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
here=experiments/2026-11-28_first_call_profile
export TRITON_CACHE_DIR=$(mktemp -d) TUTORIAL_KERNELS_TILES=$(mktemp -d)
python3 $here/first_call_profile.py "$OUT/profile_cold" > "$OUT/profile_cold.json" 2>"$OUT/profile_cold.err"; cat "$OUT/profile_cold.json" | head -30
python3 $here/first_call_profile.py "$OUT/profile_warm" > "$OUT/profile_warm.json" 2>"$OUT/profile_warm.err"; grep _s "$OUT/profile_warm.json"
