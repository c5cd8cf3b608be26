"""LLM prefill latency with each attention implementation: `python -m tutorial_kernels.integrations.prefill [--out PATH]`.

The ROCm blog's end-to-end study, redone with this tutorial's kernel as one of the contestants:
Mistral-7B, Llama-3-8B and Phi-2 in Hugging Face `transformers`, one forward pass over a prompt of
N tokens (batch 1), with attention computed by

* `eager`: transformers' plain PyTorch attention (Q Kᵀ, softmax, P V; the scores in HBM);
* `sdpa`: `torch.nn.functional.scaled_dot_product_attention` (FlashAttention-2 or cuDNN inside);
* `tutorial_fa2`: chapter 5's Triton kernel, registered by `tutorial_kernels.integrations.hf_attention`.

Every model is built from its published configuration with random bfloat16 weights: nothing can be
downloaded on the benchmark machine, and the time of a forward pass depends on the shapes of the
tensors, not on the values of the weights (no data-dependent control flow, no sparsity). Each model
is built once; the implementations are switched with `model.set_attn_implementation`.

What is timed: `model(input_ids, attention_mask=ones, use_cache=False, logits_to_keep=1)` under
`torch.inference_mode()`, bracketed by CUDA events, median of several repetitions after warm-up
(the tuned kernel autotunes on its first call at each length, inside the warm-up). The
implementations take turns forward by forward at each length, so that none is always the one
timed first on a GPU rested by the others' warm-up, and a burst of noise on the host or the GPU
falls on all of them alike. That is the
prefill step of `generate`: it too computes the logits of the last position only, since only they
pick the next token; the full (N × vocab) projection would add a matmul that has nothing to do
with attention (a quarter of a gigabyte of logits per 1,000 tokens for Llama-3's vocabulary).

Ours is compared with `sdpa` turn by turn (`paired_ratio`): the ratio of the two forwards of each
turn, two turns with the two in opposite orders taken together, its median with a 95 % confidence
interval and a verdict, faster, undecided or slower; the summary printed at the end and the site's
table show it.

Before timing a model, the last-position logits of `tutorial_fa2` and `eager` are compared with
`sdpa`'s at one length, and the relative errors recorded: a fast wrong kernel must not be reported.
Running out of memory is a result (status "oom"); the longer lengths of that implementation are
then skipped (status "skipped"). Rows are written as they are measured.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tutorial_kernels.paths import data_dir
from tutorial_kernels.provenance import provenance

IMPLEMENTATIONS = {
    "eager": "eager PyTorch (transformers)",
    "sdpa": "torch SDPA",
    "tutorial_fa2": "ours: flash_attention (ch. 5/7 kernels)",
}
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
CHECK_TOLERANCE = 5e-2  # ‖ours − sdpa‖ / ‖sdpa‖ of the last-position logits, bfloat16 through 32 layers
# (or twice eager's distance from sdpa, if that is larger: see check_model)


@dataclass(frozen=True)
class ModelSpec:
    """A model's architecture from its published config.json (transformers' field names)."""

    label: str
    source: str  # the Hugging Face repository whose config.json the numbers come from
    config_class: str
    config: dict
    notes: list[str] = field(default_factory=list)

    def build_config(self):
        import transformers

        return getattr(transformers, self.config_class)(**self.config)


# The blog's three models, in its order. Values from each repository's config.json.
MODELS: dict[str, ModelSpec] = {
    "mistral-7b": ModelSpec(
        "Mistral-7B", "mistralai/Mistral-7B-v0.1", "MistralConfig",
        dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8,  # grouped-query attention: 4 query heads per KV head
             head_dim=128, hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=32768,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
             # v0.1's config has sliding_window = 4096; Mistral-7B-v0.2 and later set it to null. Without
             # it every implementation computes the same full causal attention at all lengths (up to
             # 4096 tokens the window hides nothing anyway); with it, eager and sdpa would build a
             # windowed mask beyond 4096 and our kernel, which has no window, would rightly refuse.
             sliding_window=None),
        notes=["sliding_window set to None (v0.1 has 4096, v0.2+ none); identical below 4097 tokens"],
    ),
    "llama-3-8b": ModelSpec(
        "Llama-3-8B", "meta-llama/Meta-Llama-3-8B", "LlamaConfig",
        dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8,  # grouped-query attention: 4 query heads per KV head
             head_dim=128, hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=8192,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
             attention_bias=False, mlp_bias=False),
        notes=["trained context 8192 tokens: at 16384 the latency is that of the shapes, the outputs meaningless"],
    ),
    "phi-2": ModelSpec(
        "Phi-2", "microsoft/phi-2", "PhiConfig",
        dict(vocab_size=51200, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=32,  # multi-head attention; head_dim = 2560 / 32 = 80
             hidden_act="gelu_new", layer_norm_eps=1e-5, max_position_embeddings=2048,
             # rotary embeddings on the first 40% of each head's 80 dimensions (32 of them)
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4},
             qk_layernorm=False, tie_word_embeddings=False, resid_pdrop=0.1, embd_pdrop=0.0,
             attention_dropout=0.0),
        notes=["head_dim 80 (not a power of two); trained context 2048 tokens: "
               "beyond it only the shapes are meaningful"],
    ),
}


def build_model(spec: ModelSpec, seed: int = 0) -> torch.nn.Module:
    """The model with random bfloat16 weights, created directly on the GPU (no download, no CPU copy)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(spec.build_config(), dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()  # eval: Phi-2's residual dropout (0.1) off, as at inference


def _inputs(model, n: int, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=gen, device="cuda")
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1  # as generate's prefill: only the last position's logits
    return kwargs


def warm_up(model, inputs: dict, forwards: int) -> None:
    """Untimed forwards: compilation, autotuning, the caching allocator growing to this length."""
    with torch.inference_mode():
        for _ in range(forwards):
            model(**inputs)
    torch.cuda.synchronize()


MIN_REPS, MAX_REPS = 12, 60  # timed forwards per implementation and length (12: six pairs of turns, the
# fewest for which `paired_ratio` has a 95 % interval)


def turn_order(impls: list[str], turn: int) -> list[str]:
    """a b c on even turns, a c b on odd ones: in a b c a c b … each of (up to) three implementations
    follows each other one equally often, so a forward that leaves the GPU hot or its caches full
    (eager's, at long prompts) comes before every contestant alike. Exactly so over whole pairs of
    turns in which all are timed; once one has all its forwards (eager, whose forwards are longest,
    gets fewer), the others go on taking turns without it."""
    return list(impls) if turn % 2 == 0 else [*impls[:1], *impls[:0:-1]]


def time_forward(model, inputs: dict) -> float:
    """One forward over `inputs`, in ms, CUDA events around it. The model must be warmed up at this length."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.inference_mode():
        start.record()
        model(**inputs)
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_implementations(model, inputs: dict, impls: list[str], *, warmup: int, seconds: float) -> dict[str, dict]:
    """Each implementation warmed up, then timed one forward at a time, the implementations taking
    turns (in an order where each follows each other one equally often) until each has run about
    `seconds` of forwards
    (MIN_REPS to MAX_REPS of them). Forward by forward, a burst of noise on the host (a short
    prompt's forward waits on the CPU) or on the GPU lands on every implementation alike, and
    nothing is freed between timed forwards (only after each warm-up, so an implementation's first
    timed forward may allocate; the median is not moved by one forward). Returns
    impl → row fields: status "ok" with ms (median over all forwards), ms_min, reps, peak_gib and
    ms_all (every forward in the order they ran: the k-th of each implementation ran in turn k, so
    two implementations can be compared turn by turn); or "oom" / "error"."""
    rows: dict[str, dict] = {}
    times: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    reps: dict[str, int] = {}
    for impl in impls:
        model.set_attn_implementation(impl)
        rows[impl] = _guarded(lambda: warm_up(model, inputs, warmup))
        if rows[impl]["status"] == "ok":
            times[impl] = []
        _free()

    def still_timing(impl: str) -> bool:
        return rows[impl]["status"] == "ok" and len(times[impl]) < reps.get(impl, MIN_REPS)

    order, turn = list(times), 0
    while any(still_timing(impl) for impl in order):
        for impl in turn_order(order, turn):
            if not still_timing(impl):
                continue
            model.set_attn_implementation(impl)
            torch.cuda.reset_peak_memory_stats()
            got: list[float] = []
            rows[impl] = _guarded(lambda: got.append(time_forward(model, inputs)))
            times[impl] += got
            if got and impl not in reps:  # the first forward sets how many fit in `seconds`
                reps[impl] = max(MIN_REPS, min(MAX_REPS, math.ceil(seconds * 1e3 / got[0])))
            peaks[impl] = max(peaks.get(impl, 0.0), torch.cuda.max_memory_allocated() / 2**30)
        turn += 1
    _free()
    for impl in times:
        if rows[impl]["status"] == "ok":
            rows[impl].update(ms=statistics.median(times[impl]), ms_min=min(times[impl]), reps=len(times[impl]),
                              peak_gib=peaks[impl], ms_all=[round(t, 4) for t in times[impl]])
    return rows


# --8<-- [start:paired]
CONFIDENCE = 0.95  # of the interval around the paired ratio


def paired_ratio(ours_ms: list[float], base_ms: list[float], confidence: float = CONFIDENCE) -> dict:
    """Ours against a baseline, turn by turn: the median over pairs of turns of the two implementations'
    time ratio, with a distribution-free confidence interval for it, and a verdict.

    The k-th forwards of the two ran in turn k, one right after the other (`time_implementations`),
    so what drifts over a run (clocks, temperature, the host) is in both and cancels in their ratio
    r_k = ours_k / base_k. Their order within the turn does not cancel: while eager is timed too,
    which of the two runs right after it moves r_k by several percent (seen on the H100,
    docs/how-the-numbers-were-obtained.md, LLM prefill), and `turn_order` puts the two in one order on
    even turns and in the other on odd ones. So turns 2i and 2i + 1 are taken
    together, as the geometric mean of r_2i and r_2i+1, in which that effect cancels too (an odd last
    turn is left out). The interval is the sign test's: with m such values sorted, v_(j) … v_(m+1−j),
    j the largest for which P(Binomial(m, ½) < j) ≤ (1 − confidence) / 2 (e.g. Conover, *Practical
    Nonparametric Statistics*, §3.2), so it assumes nothing about the shape of the noise. Verdict:
    "faster" if the whole interval lies below 1, "slower" if above, "undecided" if it holds 1 (the run
    cannot tell the two apart), "too few turns" if m is too small for any interval (under 6 pairs at
    95 %)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    turns = min(len(ours_ms), len(base_ms))
    ratios = [o / b for o, b in zip(ours_ms[:turns], base_ms[:turns])]
    values = sorted(math.sqrt(ratios[2 * i] * ratios[2 * i + 1]) for i in range(turns // 2))
    m = len(values)
    tail = (1 - confidence) / 2
    j, below = 0, 0.0  # below = P(B ≤ j − 1) for B ~ Binomial(m, ½), the chance the interval misses low
    for k in range(m // 2):
        below += math.comb(m, k) / 2**m  # P(B ≤ k)
        if below > tail:
            break
        j = k + 1
    result = {"ratio": statistics.median(values) if values else math.nan, "turns": turns, "pairs": m,
              "confidence": confidence}
    if j == 0:  # even the widest interval, min to max, covers the median less often than asked
        return {**result, "low": None, "high": None, "verdict": "too few turns"}
    low, high = values[j - 1], values[m - j]
    verdict = "faster" if high < 1.0 else "slower" if low > 1.0 else "undecided"
    return {**result, "low": low, "high": high, "verdict": verdict}
# --8<-- [end:paired]


def compare_with_sdpa(result: dict) -> dict[tuple[str, int], dict]:
    """(model, n) → `paired_ratio` of tutorial_fa2 against sdpa, for every length at which both ran.
    Rows without per-forward times (files written before they were kept) get the ratio of the two
    medians, with no interval and verdict None."""
    rows = {(r["model"], r["impl"], r["n"]): r for r in result["results"]}
    compared = {}
    for key in result["models"]:
        for n in sorted({r["n"] for r in result["results"] if r["model"] == key}):
            ours, sdpa = rows.get((key, "tutorial_fa2", n)), rows.get((key, "sdpa", n))
            if not (ours and sdpa and ours["status"] == sdpa["status"] == "ok"):
                continue
            if "ms_all" in ours and "ms_all" in sdpa:
                compared[(key, n)] = paired_ratio(ours["ms_all"], sdpa["ms_all"])
            else:
                compared[(key, n)] = {"ratio": ours["ms"] / sdpa["ms"], "low": None, "high": None, "verdict": None}
    return compared


def format_paired(c: dict) -> str:
    """'0.9931 [0.9902, 0.9987] faster': four decimals, so that an interval's end just below 1 does
    not print as 1.000 next to "faster"."""
    interval = f"[{c['low']:.4f}, {c['high']:.4f}]" if c["low"] is not None else "[no interval]"
    return f"{c['ratio']:.4f} {interval} {c['verdict']}"


def _guarded(step) -> dict:
    """Run step(); out of memory and other failures become a status, not an exception."""
    oom = False
    try:
        step()
        return {"status": "ok"}
    except torch.OutOfMemoryError:
        oom = True  # reported below, once the exception (and the tensors its frames hold) is gone
    except Exception as err:  # recorded, not fatal: the other points still get measured
        traceback.print_exc()
        return {"status": "error", "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
    _free()
    return {"status": "oom"} if oom else {"status": "error"}


def last_logits(model, inputs: dict) -> torch.Tensor:
    with torch.inference_mode():
        return model(**inputs).logits[0, -1].float()


def check_model(model, key: str, n: int, impls: list[str]) -> dict:
    """Last-position logits of each implementation against sdpa's, at one length."""
    inputs = _inputs(model, n, seed=n)
    model.set_attn_implementation("sdpa")
    ref = last_logits(model, inputs)
    errors = {}
    for impl in impls:
        if impl == "sdpa":
            continue
        model.set_attn_implementation(impl)
        out = last_logits(model, inputs)
        errors[impl] = ((out - ref).norm() / ref.norm()).item()
    # eager's distance from sdpa is how far two correct bfloat16 implementations drift apart through
    # the model; ours may drift as far (twice as far, to leave room), and never beyond the fixed bound
    # unless eager itself is that far off
    eager = errors.get("eager", math.nan)
    bound = max(CHECK_TOLERANCE, 2 * eager) if math.isfinite(eager) else CHECK_TOLERANCE
    ours = errors.get("tutorial_fa2", 0.0)
    return {"model": key, "n": n, "reference": "sdpa", "rel_err_last_logits": errors,
            "tolerance": bound, "passed": math.isfinite(ours) and ours <= bound}


def _free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _warm_gpu() -> None:
    """A second of matmuls so the first model is not timed on an idle, down-clocked GPU."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()
    del a


def run(models: list[str], lengths: list[int], impls: list[str], out_path: Path, argv: list[str],
        check_length: int, seconds: float) -> dict:
    import transformers

    from tutorial_kernels.integrations.hf_attention import register

    register()  # "tutorial_fa2" becomes an attention implementation transformers accepts
    prov = provenance(" ".join(["python -m tutorial_kernels.integrations.prefill", *argv])) | {"suite": "prefill"}
    prov.update(
        transformers=transformers.__version__,
        timing=f"CUDA events around each forward; per length, every implementation warmed up (2 forwards, 1 "
        "beyond 4096 tokens), then timed one forward at a time, the implementations taking turns (a b c, a c b, "
        f"...: each follows each other equally often) until each has about {seconds:g} s of forwards "
        f"({MIN_REPS} to {MAX_REPS}); nothing freed between timed forwards; ms is the median of all its forwards, "
        "ms_all lists them in order (the k-th of each implementation ran in turn k)",
        peak_memory="torch.cuda.max_memory_allocated during the timed forwards, weights included",
    )
    result = {
        "description": "Prefill latency of one forward pass (batch 1, N prompt tokens, bfloat16, random weights) "
        "of Hugging Face models with each attention implementation",
        "notes": [
            "Weights are random (built from each model's published config): latency depends on shapes, not values.",
            "Timed call: model(input_ids, attention_mask=all ones, use_cache=False, logits_to_keep=1) under "
            "torch.inference_mode(); logits of the last position only, as in generate's prefill.",
            "tutorial_fa2 is tutorial_kernels.integrations.hf_attention registered with transformers.AttentionInterface: on a "
            "Hopper GPU at head_dim 128 or 256 where dispatch.hopper_forward_preferred says it is the faster (here from "
            "1024 tokens), chapter 7's Hopper kernel (Gluon); "
            "otherwise chapter 5's flash_attn_v2_tuned, which autotunes at each new length during the warm-up, "
            "outside the timing.",
            "status 'oom': out of GPU memory; 'skipped': not run because a shorter length already ran out of memory.",
        ],
        "provenance": prov,
        "models": {},
        "implementations": {k: IMPLEMENTATIONS[k] for k in impls},
        "checks": [],
        "results": [],
        "complete": False,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every row: a run cut short keeps what it measured
        out_path.write_text(json.dumps(result, indent=1) + "\n")

    _warm_gpu()
    for key in models:
        spec = MODELS[key]
        t0 = time.perf_counter()
        model = build_model(spec)
        params = sum(p.numel() for p in model.parameters())
        result["models"][key] = {
            "label": spec.label, "source_config": spec.source, "config_class": spec.config_class,
            "config": spec.config, "params_billion": params / 1e9,
            "weights_gib": torch.cuda.memory_allocated() / 2**30, "build_s": time.perf_counter() - t0,
            "notes": spec.notes,
        }
        print(f"{spec.label}: {params / 1e9:.2f} B parameters, built in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
        if check_length:
            try:
                check = check_model(model, key, check_length, impls)
            except Exception as err:  # out of memory, or an implementation refusing: recorded as a failure
                traceback.print_exc()
                check = {"model": key, "n": check_length, "passed": False,
                         "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
            _free()
            result["checks"].append(check)
            save()
            verdict = "ok" if check["passed"] else "FAILED"
            print(f"  check at N={check_length}: {check.get('rel_err_last_logits')} -> {verdict}",
                  file=sys.stderr, flush=True)
        ran_out: dict[str, int] = {}
        for n in lengths:
            inputs = _inputs(model, n, seed=n)
            running = [impl for impl in impls if impl not in ran_out]
            timed = time_implementations(model, inputs, running, warmup=2 if n <= 4096 else 1, seconds=seconds)
            for impl in impls:
                row = {"model": key, "impl": impl, "provider": IMPLEMENTATIONS[impl], "n": n}
                if impl in ran_out:
                    row.update(status="skipped", reason=f"out of memory at N={ran_out[impl]}")
                else:
                    row.update(timed[impl])
                    if row["status"] == "oom":
                        ran_out[impl] = n
                result["results"].append(row)
                shown = f"{row['ms']:9.1f} ms" if row["status"] == "ok" else row["status"]
                print(f"  {impl:13} N={n:6}: {shown}", file=sys.stderr, flush=True)
            save()
            del inputs
        del model
        _free()
    result["complete"] = True
    save()
    return result


def summary(result: dict) -> str:
    """One line per (model, N): each implementation's time and its speedup over eager."""
    impls = list(result["implementations"])
    width = 24
    head = f"{'model':12} {'N':>6} " + " ".join(f"{impl:>{width}}" for impl in impls)
    lines = [head, "-" * len(head)]
    rows = {(r["model"], r["n"], r["impl"]): r for r in result["results"]}
    for key in result["models"]:
        for n in sorted({r["n"] for r in result["results"] if r["model"] == key}):
            eager = rows.get((key, n, "eager"))
            cells = []
            for impl in impls:
                r = rows.get((key, n, impl))
                if r is None or r["status"] != "ok":
                    cells.append(f"{'—' if r is None else r['status']:>{width}}")
                    continue
                cell = f"{r['ms']:.1f} ms"
                if impl != "eager" and eager and eager["status"] == "ok":
                    cell += f" ({eager['ms'] / r['ms']:.2f}×)"
                cells.append(f"{cell:>{width}}")
            lines.append(f"{result['models'][key]['label']:12} {n:>6} " + " ".join(cells))
    lines.append("(ms: median prefill latency; ×: speedup over eager)")
    compared = {cell: c for cell, c in compare_with_sdpa(result).items() if c["verdict"] is not None}
    if compared:
        lines.append("tutorial_fa2 / sdpa, by pairs of turns (median ratio [95% interval], verdict):")
        for (key, n), c in compared.items():
            lines.append(f"  {result['models'][key]['label']:12} {n:>6}: {format_paired(c)}")
    for check in result["checks"]:
        lines.append(f"check {check['model']} N={check['n']}: last-position logits vs sdpa "
                     f"{check.get('rel_err_last_logits')} (tolerance {check.get('tolerance')}): "
                     f"{'passed' if check['passed'] else 'FAILED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.integrations.prefill", description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="models to build")
    parser.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS), help="prompt lengths in tokens")
    parser.add_argument("--impls", nargs="+", choices=list(IMPLEMENTATIONS), default=list(IMPLEMENTATIONS),
                        help="attention implementations")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: data/prefill.json)")
    parser.add_argument("--check-length", type=int, default=2048,
                        help="prompt length of the logits check against sdpa (0: no check)")
    parser.add_argument("--seconds", type=float, default=4.0, help="about how long to time each point")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("prefill latency is measured on a CUDA GPU (random 7-8B-parameter models in bfloat16); "
                     "none is visible here")
    if any(n < 1 for n in args.lengths):
        parser.error(f"--lengths must be positive, got {args.lengths}")
    if args.check_length and "sdpa" not in args.impls:
        parser.error("the logits check compares with sdpa: include sdpa in --impls, or pass --check-length 0")
    out = args.out or data_dir() / "prefill.json"
    result = run(args.models, args.lengths, args.impls, out, argv, args.check_length, args.seconds)
    print(summary(result))
    print(f"wrote {out}")
    if not all(check["passed"] for check in result["checks"]):
        sys.exit("a logits check failed: see 'checks' in the output file")


if __name__ == "__main__":
    main()
