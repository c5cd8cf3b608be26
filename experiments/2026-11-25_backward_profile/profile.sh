#!/usr/bin/env bash
# Nsight Compute on the backward kernels (H100): our Hopper backward without and with the causal mask, and
# cuDNN's, at N = 4096 (B = 4, H = 16, d = 128, fp16). Clocks are left alone (--clock-control none).
#   OUT=dir bash experiments/2026-11-25_backward_profile/profile.sh [hopper]   (hopper: ours only)
# Leaves the text reports in $OUT (details and per-instruction SASS counters), the .ncu-rep files in /tmp/ncu.
set -uo pipefail
here=experiments/2026-11-25_backward_profile
export PYTHONPATH=$PWD
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
$ncu --version | tail -1
mkdir -p /tmp/ncu
for c in full causal; do
  $ncu --clock-control none --set full --import-source yes -k regex:_flash_hopper_bwd --launch-skip 2 --launch-count 1 \
    -f -o "/tmp/ncu/hopper_$c" python3 $here/target.py hopper 4096 $c > "/tmp/ncu/hopper_$c.log" 2>&1
  tail -2 "/tmp/ncu/hopper_$c.log"
  $ncu --import "/tmp/ncu/hopper_$c.ncu-rep" --page details --print-details all > "$OUT/hopper_${c}_details.txt" 2>&1
  $ncu --import "/tmp/ncu/hopper_$c.ncu-rep" --page source --csv --print-source sass > "$OUT/hopper_${c}_sass.csv" 2>&1
done
[[ "${1:-}" == "hopper" ]] && exit 0
# cuDNN: list its kernels first, then profile the longest one of the last backward
$ncu --clock-control none --section SpeedOfLight --csv python3 $here/target.py cudnn 4096 full > "$OUT/cudnn_list.csv" 2>&1
name=$(python3 - "$OUT/cudnn_list.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
i_name, i_metric, i_value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
dur = collections.defaultdict(float)
for r in rows:
    if r[i_metric] == "Duration":
        dur[r[i_name]] = max(dur[r[i_name]], float(r[i_value].replace(",", "")))
for k, v in sorted(dur.items(), key=lambda kv: -kv[1])[:6]:
    print(v, k, file=sys.stderr)
print(max(dur, key=dur.get).split("(")[0].split("<")[0].split()[-1])
PY
)
echo "cudnn kernel: $name"
$ncu --clock-control none --set full -k "regex:$name" --launch-skip 2 --launch-count 1 -f -o "/tmp/ncu/cudnn_full" \
  python3 $here/target.py cudnn 4096 full > "/tmp/ncu/cudnn_full.log" 2>&1
tail -2 "/tmp/ncu/cudnn_full.log"
$ncu --import "/tmp/ncu/cudnn_full.ncu-rep" --page details --print-details all > "$OUT/cudnn_full_details.txt" 2>&1
ls -la "$OUT"
