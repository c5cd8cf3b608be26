"""Where the first call's seconds go: python first_call_profile.py OUT_PREFIX (run with an empty TRITON_CACHE_DIR, then again
with the same, now filled, cache). cProfile around the first forward and the first backward, (1, 8, 1000, 64)
fp16 causal with gradients; the top functions by cumulative and by own time; the kernels the call compiled."""
import cProfile, io, json, os, pstats, sys, time
t0 = time.perf_counter()
import torch
import tutorial_kernels
from tutorial_kernels import attention
imported = time.perf_counter() - t0
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, 8, 1000, 64, device="cuda", generator=g).half().requires_grad_()
do = torch.randn(1, 8, 1000, 64, device="cuda", generator=g).half()
torch.cuda.synchronize()
report = {"import_s": imported}
for name, fn in (("forward", lambda: tutorial_kernels.flash_attention(q, q, q, causal=True)),
                 ("backward", lambda: out.backward(do))):
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    res = fn()
    torch.cuda.synchronize()
    prof.disable()
    report[name + "_s"] = time.perf_counter() - t
    if name == "forward":
        out = res
    for sort in ("cumulative", "tottime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(sort).print_stats(45)
        open(f"{sys.argv[1]}_{name}_{sort}.txt", "w").write(s.getvalue())
report["decisions"] = {str(k): str(v[0]) for k, v in attention._DECISIONS.items()}
cache = os.environ.get("TRITON_CACHE_DIR")
report["cache_entries"] = sorted(os.listdir(cache)) if cache else None
report["cache_files"] = sorted(f for d in (report["cache_entries"] or []) for f in os.listdir(os.path.join(cache, d)))
print(json.dumps(report, indent=1))
