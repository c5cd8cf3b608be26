"""Experiment record: how chapter 5's Hopper kernel hands out its work items, and what that does to its
speed. Compares `ch05_hopper._launch` as it stands (its default, and forced persistent launches with
all heads in one section or sections of ½ L2) with the kernel before persistent programs ("before": one program
per 128-row tile, `tutorial_kernels/ch05_hopper.py` at commit 7ff4db9, read with `git show`), torch SDPA
as transformers calls it and SDPA pinned to cuDNN, at the prefill models' attention shape (1 × 32 query
heads / 8 key/value heads) and the FlashAttention-2 paper's shapes, d = 128, bfloat16. GPU time through
CUDA graphs (see tools/probe_hopper_prefill_shape.py for why), three rotated rounds.

    python3 tools/probe_hopper_work_items.py out.json     # H100/H200 with the repository's git history; ~6 min

It grew one variant per run of the sixth session (BENCHMARKS.md); each log in
data/logs/2026-11-22_h100_hopper_scheduling_*.json records the variants its run had. Not part of the
test suite: it needs a Hopper GPU and the git history.
"""
import importlib.util, json, math, os, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from tutorial_kernels import ch05_hopper as H


def _kernel_before():
    source = subprocess.run(["git", "show", "7ff4db9:tutorial_kernels/ch05_hopper.py"], check=True,
                            capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "hopper_before.py")  # triton.jit needs a file to read
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("hopper_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


B4 = None
dev = "cuda"
dt = torch.bfloat16

def make(b, h, hkv, n, layout):
    if layout == "bnhd":
        q = torch.randn(b, n, h, 128, device=dev, dtype=dt).transpose(1, 2)
        k = torch.randn(b, n, hkv, 128, device=dev, dtype=dt).transpose(1, 2)
        v = torch.randn(b, n, hkv, 128, device=dev, dtype=dt).transpose(1, 2)
    else:
        q = torch.randn(b, h, n, 128, device=dev, dtype=dt)
        k = torch.randn(b, hkv, n, 128, device=dev, dtype=dt)
        v = torch.randn(b, hkv, n, 128, device=dev, dtype=dt)
    return q, k, v

def variants(q, k, v, causal):
    scale = 1 / math.sqrt(128)
    b, h, n, d = q.shape
    out = torch.empty(b, n, h, d, device=dev, dtype=dt).transpose(1, 2)
    gqa = k.shape[1] != h
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    half = max(1, int(l2 / 2 // (2 * n * 128 * 2 / (h // k.shape[1]))))
    def sdpa(backend):
        def f():
            with sdpa_kernel([backend]) if backend else torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
        return f
    return {
        "before": lambda: B4._launch(q, k, v, causal, scale, out),
        "default": lambda: H._launch(q, k, v, causal, scale, out),
        "persistent_one_section": lambda: H._launch(q, k, v, causal, scale, out, programs=sms, section=b * h),
        "persistent_half_l2": lambda: H._launch(q, k, v, causal, scale, out, programs=sms, section=half),
        "sdpa_default": sdpa(None),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }, out

def bench_graph(fn):
    """GPU time per call without the CPU's launch cost: fn captured in a CUDA graph and replayed."""
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except Exception as e:
        print("graph capture failed:", type(e).__name__, str(e)[:200], flush=True)
        return triton.testing.do_bench(fn, warmup=25, rep=100)

def ref(q, k, v, causal):
    h = q.shape[1]; g = h // k.shape[1]
    qd, kd, vd = q[:, :2].double(), k.repeat_interleave(g, 1)[:, :2].double(), v.repeat_interleave(g, 1)[:, :2].double()
    return F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=1 / math.sqrt(128))

def main(out_path):
    global B4
    B4 = _kernel_before()
    torch.manual_seed(0)
    shapes = [("prefill", 1, 32, 8, n, True, "bnhd") for n in (1024, 2048, 4096, 8192, 16384)]
    shapes += [("fa2", 16384 // n, 16, 16, n, c, "bhnd") for c in (True, False) for n in (1024, 2048, 4096, 8192, 16384)]
    results = []
    t0 = time.time()
    for name, b, h, hkv, n, causal, layout in shapes:
        q, k, v = make(b, h, hkv, n, layout)
        fns, out = variants(q, k, v, causal)
        r = ref(q, k, v, causal) if n <= 8192 else None
        times = {key: [] for key in fns}
        errs = {}
        for key, f in fns.items():
            try:
                out.fill_(float("nan"))
                o = f()
                if o is None: o = out
                torch.cuda.synchronize()
                if r is not None:
                    errs[key] = ((o[:, :2].double() - r).norm() / r.norm()).item()
            except Exception as e:
                errs[key] = f"error: {type(e).__name__}: {str(e)[:200]}"
        keys = [k_ for k_ in fns if not isinstance(errs.get(k_), str)]
        for rnd in range(3):
            order = keys[rnd % len(keys):] + keys[:rnd % len(keys)]
            for key in order:
                times[key].append(bench_graph(fns[key]))
        row = dict(shape=name, batch=b, heads=h, kv_heads=hkv, n=n, causal=causal, layout=layout, errs=errs,
                   ms={key: sorted(v_)[1] for key, v_ in times.items() if v_}, ms_rounds=times)
        base = row["ms"].get("sdpa_cudnn") or row["ms"].get("sdpa_default")
        print(name, b, h, hkv, n, causal, {key: round(base / v_, 3) for key, v_ in row["ms"].items()},
              {key: (round(e, 5) if isinstance(e, float) else e) for key, e in errs.items()}, flush=True)
        results.append(row)
        del q, k, v, out, fns
        torch.cuda.empty_cache()
    from tutorial_kernels import bench

    prov = bench.provenance("probe-hopper-work-items", [])
    prov.pop("peak_extra_memory")  # not measured here
    prov["command"] = "python3 tools/probe_hopper_work_items.py " + out_path
    prov["timing"] = "triton.testing.do_bench_cudagraph(rep=100, median), 3 rotated rounds, median of rounds"
    json.dump(dict(provenance=prov, results=results), open(out_path, "w"), indent=1)
    print("done in", round(time.time() - t0), "s")


if __name__ == "__main__":
    main(sys.argv[1])
