#!/usr/bin/env bash
# The probe; then, in this copy of the tree only, MIN_KEYS = 2048 if the Hopper backward was ahead of the
# Triton one in every 2048-token cell (its median the lower), and the front door's and the backward's
# tests natively on that tree.   FA_GIT_COMMIT=... bash experiments/2026-11-28_backward_min_keys/run.sh
set -u
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="/tmp/site:$PWD" || exit 1
export PYTHONUNBUFFERED=1
timeout 300 python3 experiments/2026-11-28_backward_min_keys/probe.py "$OUT/probe_min_keys.json" 2>&1 | tee "$OUT/probe.log"
python3 - "$OUT/probe_min_keys.json" <<'PY' || exit 0
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["times"] if r["n"] == 2048]
ahead = [r["ms"]["hopper"] < r["ms"]["triton"] for r in rows]
print(f"2048 tokens: Hopper ahead in {sum(ahead)} of {len(ahead)} cells")
sys.exit(0 if len(rows) == 8 and all(ahead) else 1)
PY
sed -i 's/^MIN_KEYS = 4096$/MIN_KEYS = 2048/' tutorial_kernels/ch07_hopper_backward.py
grep -n "^MIN_KEYS" tutorial_kernels/ch07_hopper_backward.py | tee "$OUT/min_keys_tested.txt"
timeout 200 python3 -m pytest tutorial_kernels/tests/test_ch07_hopper_backward.py tutorial_kernels/tests/test_attention.py \
  -q -n 12 -p no:cacheprovider -o addopts="-ra" 2>&1 | tail -n 15 | tee "$OUT/pytest_min_keys.log"
