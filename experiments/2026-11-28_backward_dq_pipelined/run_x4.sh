#!/usr/bin/env bash
# One call on a machine of 4 H100s (eighteenth session): the native suite at the commit in FA_GIT_COMMIT
# (GPUs 0 and 1: test_conformance.py, then the rest), the variant against the package (GPUs 2 and 3, one
# BWD_DQ_QUEUE each), then compute-sanitizer over every target (GPU 2: chapter 7's, GPU 3: chapters 1-6).
#   FA_GIT_COMMIT=... bash experiments/2026-11-28_backward_dq_pipelined/run_x4.sh   (writes into $OUT)
set -u
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="/tmp/site:$PWD" || exit 1
export PYTHONUNBUFFERED=1
here=experiments/2026-11-28_backward_dq_pipelined
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu --format=csv >"$OUT/gpu_state.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >>"$OUT/gpu_state.txt"
(CUDA_VISIBLE_DEVICES=0 timeout 540 python3 -m pytest tutorial_kernels/tests/test_conformance.py -q -n 12 \
   -p no:cacheprovider -o addopts="-ra" >"$OUT/pytest_conformance.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 540 python3 -m pytest tutorial_kernels -q -n 12 -p no:cacheprovider -o addopts="-ra" \
   --ignore=tutorial_kernels/tests/test_conformance.py >"$OUT/pytest_rest.log" 2>&1) &
for g in 2 3; do
  (export CUDA_VISIBLE_DEVICES=$g BWD_DQ_QUEUE=$((g - 1)) TRITON_CACHE_DIR=/tmp/triton_cache_$g
   timeout 300 python3 $here/probe.py "$OUT/probe_queue$((g - 1)).json" >/tmp/probe_$g.log 2>&1
   if [[ $g == 2 ]]; then targets="ch07-forward ch07-backward"; else targets="ch01 ch02 ch03 ch04 ch05 ch06"; fi
   OUT=/tmp/san_$g timeout $((530 - SECONDS)) tools/gpu_checks --sanitize $targets >/tmp/san_$g.txt 2>&1) &
done
wait
cat /tmp/probe_2.log /tmp/probe_3.log >"$OUT/probe_stdout.log"
cat /tmp/san_2.txt /tmp/san_3.txt /tmp/san_2/sanitizer.json /tmp/san_3/sanitizer.json >"$OUT/sanitizer_summary.txt" 2>&1
tar czf "$OUT/sanitizer_logs.tgz" -C /tmp san_2 san_3 2>/dev/null
tail -n 2 "$OUT/pytest_conformance.log" "$OUT/pytest_rest.log"; cat "$OUT/sanitizer_summary.txt"; grep -h x_cudnn -c "$OUT"/probe_queue*.json
