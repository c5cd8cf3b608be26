"""Probe: attention at the shape the prefill models run it — batch 1, 32 query heads sharing 8
key/value heads, head_dim 128, causal, bfloat16, q/k/v as (B, N, H, d) memory viewed (B, H, N, d)
as transformers hands them over — for chapter 5's Hopper kernel (as launched, and forced persistent
or one program per work item), chapter 5's tuned Triton kernel, torch SDPA as transformers calls
it (`enable_gqa=True`, torch's own backend choice) and SDPA pinned to cuDNN.

    python3 tools/probe_hopper_prefill_shape.py data/ch05_hopper_prefill_shape.json   # H100/H200, ~3 min

Times are GPU time only: each call captured in a CUDA graph and replayed
(`triton.testing.do_bench_cudagraph`), three rounds in rotated order, median. `do_bench` alone
would not do here: it clears the L2 cache between calls, so a kernel shorter than the CPU's cost of
launching the next call (ours is a Python launcher, tens of µs) is timed together with that cost.
What a model pays on the CPU per call is measured apart (tools/launch_overhead.py), and both
together in the prefill study. Every output is checked against a float64 reference on the first
head, into a NaN-poisoned buffer, before anything is timed.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3-8B and Mistral-7B


def implementations(q, k, v, out, scale):
    """label → call; each writes or returns (B, H, N, d)."""
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tutorial_kernels import ch05_hopper
    from tutorial_kernels.ch05_flash_v2 import flash_attn_v2_tuned

    n_items = triton.cdiv(q.shape[2], 2 * ch05_hopper.ROWS_PER_WARPGROUP) * q.shape[0] * q.shape[1]
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count

    def sdpa(**pin):
        def call():
            with sdpa_kernel([pin["backend"]]) if pin else torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        return call

    return {
        "torch SDPA: cuDNN": sdpa(backend=SDPBackend.CUDNN_ATTENTION),
        "torch SDPA, as transformers calls it": sdpa(),
        "FlashAttention-2 tuned, Triton (ch. 5)": lambda: flash_attn_v2_tuned(q, k, v, True, scale, out=out),
        "Hopper kernel (ch. 5), as launched": lambda: ch05_hopper._launch(q, k, v, True, scale, out),
        "Hopper kernel, forced persistent": lambda: ch05_hopper._launch(q, k, v, True, scale, out, programs=sms,
                                                                        section=q.shape[0] * q.shape[1]),
        "Hopper kernel, forced one program per item": lambda: ch05_hopper._launch(q, k, v, True, scale, out,
                                                                                  programs=n_items, section=1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    import torch
    import triton.testing

    from tutorial_kernels import bench
    from tutorial_kernels.reference import reference_attention, relative_error
    from tutorial_kernels.testing import fresh_seed, tolerance

    rows = []
    for n in LENGTHS:
        seed = fresh_seed()
        gen = torch.Generator(device="cuda").manual_seed(seed)

        def draw(heads):
            return torch.randn(1, n, heads, HEAD_DIM, generator=gen, device="cuda").to(torch.bfloat16).transpose(1, 2)

        q, k, v = draw(HEADS), draw(KV_HEADS), draw(KV_HEADS)
        out = torch.empty(1, n, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        scale = HEAD_DIM ** -0.5
        calls = implementations(q, k, v, out, scale)
        ref = reference_attention(q[:, :1], k[:, :1], v[:, :1], True, scale)  # head 0 sees key/value head 0
        errors = {}
        for label, call in calls.items():
            out.fill_(float("nan"))
            result = call()
            result = out if result is None else result
            errors[label] = relative_error(result[:, :1], ref)
            if not errors[label] <= tolerance(torch.bfloat16):
                raise SystemExit(f"{label} at N = {n}: relative error {errors[label]:.3g} (seed {seed})")
        times = {label: [] for label in calls}
        for label in bench.take_turns(list(calls)):
            times[label].append(triton.testing.do_bench_cudagraph(calls[label], rep=100, return_mode="median"))
        cudnn = statistics.median(times["torch SDPA: cuDNN"])
        for label, rounds in times.items():
            ms = statistics.median(rounds)
            flops = 4 * HEADS * n * n * HEAD_DIM / 2  # causal: half of the two N × N × d products
            rows.append(dict(provider=label, batch=1, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, n=n,
                             causal=True, dtype="bfloat16", layout="(B, N, H, d) viewed as (B, H, N, d)", seed=seed,
                             status="ok", rel_err_head0=errors[label], ms=ms, ms_rounds=rounds,
                             tflops=flops / (ms * 1e-3) / 1e12, speed_vs_cudnn=cudnn / ms))
            print(f"N={n:6} {label:44} {ms * 1e3:9.1f} µs  {cudnn / ms:5.3f}× cuDNN", flush=True)
        del q, k, v, out, calls, ref
        torch.cuda.empty_cache()
    info = bench.provenance("probe-hopper-prefill-shape", [])
    info.pop("peak_extra_memory")  # not measured here
    info["command"] = "python3 tools/probe_hopper_prefill_shape.py " + " ".join(sys.argv[1:])
    info["timing"] = ("GPU time: triton.testing.do_bench_cudagraph (rep 100 ms, median) per call, 3 rounds in rotated "
                      "order, ms = median of rounds; speed_vs_cudnn = cuDNN's ms / this ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"description": __doc__.split("\n")[0], "provenance": info, "results": rows},
                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
