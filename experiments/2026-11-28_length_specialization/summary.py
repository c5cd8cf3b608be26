"""Front door ÷ cuDNN per cell, before and after, from run.sh's output folder: python3 summary.py DIR"""
import glob
import json
import sys
from collections import defaultdict

ratios = defaultdict(list)
for path in sorted(glob.glob(f"{sys.argv[1]}/*.json")):
    if "first_call" in path:
        continue
    rows = json.load(open(path))["results"]
    by = defaultdict(dict)
    for r in rows:
        if r.get("status") == "ok":
            by[(r["head_dim"], r["causal"], r["n"], r["dtype"], r.get("mode", "fwd"))][r["provider_key"]] = r["ms"]
    name = path.split("/")[-1]
    if any(f"_{v}_" in name for v in ("before", "after", "variant")):
        name = name.rsplit("_", 1)[0]  # the rounds of one version together
    for cell, ms in sorted(by.items()):
        if "front-door" in ms and "sdpa-cudnn" in ms:
            ratios[(name, cell)].append(ms["front-door"] / ms["sdpa-cudnn"])
for (name, cell), r in sorted(ratios.items()):
    print(f"{name:28s} {cell}  front door / cuDNN: " + " ".join(f"{x:.3f}" for x in r))
