cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
P=experiments/2026-11-24_gpu_test_memory/probe_memory.py
for d in 128 256; do
 for c in ch06_teaching front_door ch05_teaching ch05_minimal ch04; do timeout 120 python3 $P $c float32 $d highest >> $OUT/mem.jsonl 2>>$OUT/mem.err; done
 for c in ch06_tuned ch05_tuned ch06_teaching front_door; do timeout 150 python3 $P $c float16 $d highest >> $OUT/mem.jsonl 2>>$OUT/mem.err; done
 for c in ch06_tuned ch06_teaching; do timeout 150 python3 $P $c float32 $d high >> $OUT/mem.jsonl 2>>$OUT/mem.err; done
done
python3 -c "
import json
for l in open('$OUT/mem.jsonl'):
    r=json.loads(l); ks=r['kernels']
    print(r['case'],r['dtype'],r['head_dim'],r['precision'],'beyond',r['beyond_torch_mib'],'MiB; max spills',max([k.get('spills',-1) for k in ks] or [-1]), len(ks),'kernels')
"
tail -5 $OUT/mem.err
