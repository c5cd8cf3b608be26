import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[1]; data = rows[2:]
I = {h:i for i,h in enumerate(head)}
tot = sum(int(r[I["Warp Stall Sampling (All Samples)"]] or 0) for r in data)
print("total samples", tot, "instructions", len(data))
keys = ["stall_long_sb","stall_barrier","stall_wait","stall_short_sb","stall_mio","stall_gmma" if "stall_gmma" in I else "stall_math","stall_lg","stall_dispatch","stall_selected"]
ranked = sorted(range(len(data)), key=lambda i: -int(data[i][I["Warp Stall Sampling (All Samples)"]] or 0))
for i in ranked[:int(sys.argv[2]) if len(sys.argv)>2 else 40]:
    r = data[i]
    s = int(r[I["Warp Stall Sampling (All Samples)"]] or 0)
    top = sorted(((int(r[I[k]] or 0), k) for k in I if k.startswith("stall_") and "Not Issued" not in k), reverse=True)[:2]
    print(f"{i:5d} {100*s/tot:5.2f}% {r[I['Source']].strip()[:70]:70s} {top} conf={r[I['L1 Conflicts Shared N-Way']]}")
# totals by opcode class
from collections import Counter
c = Counter()
for r in data:
    op = r[I["Source"]].split()[0] if r[I["Source"]].strip() else "?"
    if op.startswith("@"): op = r[I["Source"]].split()[1]
    c[op.split(".")[0]] += int(r[I["Warp Stall Sampling (All Samples)"]] or 0)
print([(k, round(100*v/tot,1)) for k,v in c.most_common(20)])
