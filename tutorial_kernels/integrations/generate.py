"""Text generation with each attention implementation: `python -m tutorial_kernels.integrations.generate [--out PATH]`.

Hugging Face `generate()` on a Llama-3-8B-shaped model (random bfloat16 weights from its published
configuration, as the prefill study builds it): a prompt of `--prompt` random tokens per sequence,
then `--new` tokens chosen greedily, with attention computed by

* `sdpa`: torch's `scaled_dot_product_attention`;
* `tutorial_fa2`: this package's (`integrations.hf_attention`): the prompt through the front door,
  each one-token step through chapter 8's decode kernel, and with a static cache every call through
  chapter 8's kernel reading each sequence's filled slots;

for each batch size and for transformers' two caches: `dynamic` (the default: keys and values
concatenated each step) and `static` (`cache_implementation="static"`: buffers of prompt + new tokens
allocated once, filled in place).

Per (batch, cache, implementation): one untimed generate of 8 tokens (compiling, autotuning), one of
1 token (the prefill, timed), one of `--new` tokens (timed); decode tokens/s = batch · (new − 1) over
the difference of the two times (wall clock, the GPU synchronised before and after). Then the same
generate again with the logits kept, untimed: the greedy tokens are compared with sdpa's, and where a
sequence's tokens first differ, sdpa's margin between its two best logits at that step is recorded
(a near-tie that two correct bfloat16 implementations may break differently, or not).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from tutorial_kernels.paths import data_dir
from tutorial_kernels.provenance import provenance

IMPLEMENTATIONS = ("sdpa", "tutorial_fa2")
CACHES = ("dynamic", "static")
WARMUP_TOKENS = 8


def _generate(model, ids: torch.Tensor, new: int, cache: str, logits: bool = False):
    """(generate's output, seconds): `new` greedy tokens after `ids`."""
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  pad_token_id=0, return_dict_in_generate=True, output_logits=logits)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def measure(model, impl: str, batch: int, prompt: int, new: int, cache: str) -> tuple[dict, dict]:
    """One row of timings, and the tokens and logits for the comparison."""
    model.set_attn_implementation(impl)
    gen = torch.Generator(device="cuda").manual_seed(batch * 1000 + prompt)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=gen, device="cuda")
    _generate(model, ids, WARMUP_TOKENS, cache)
    _, prefill_s = _generate(model, ids, 1, cache)
    _, total_s = _generate(model, ids, new, cache)
    checked, _ = _generate(model, ids, new, cache, logits=True)
    row = {"implementation": impl, "batch": batch, "prompt": prompt, "new_tokens": new, "cache": cache,
           "prefill_s": prefill_s, "total_s": total_s,
           "decode_tokens_per_s": batch * (new - 1) / (total_s - prefill_s)}
    return row, {"tokens": checked.sequences[:, prompt:].cpu(), "logits": torch.stack(checked.logits, 1).float().cpu()}


def compare(ours: dict, reference: dict) -> dict:
    """Per sequence: the first step whose greedy token differs from the reference's (None: none), and
    the reference's margin between its two best logits at that step."""
    first, margins = [], []
    for b in range(reference["tokens"].shape[0]):
        differ = (ours["tokens"][b] != reference["tokens"][b]).nonzero()
        if differ.numel() == 0:
            first.append(None)
            margins.append(None)
            continue
        step = int(differ[0])
        top2 = reference["logits"][b, step].topk(2).values
        first.append(step)
        margins.append(float(top2[0] - top2[1]))
    return {"identical": all(f is None for f in first), "first_difference": first, "reference_margin": margins}


def run(batches: list[int], prompt: int, new: int, out_path: Path, argv: list[str]) -> dict:
    from tutorial_kernels.integrations.hf_attention import register
    from tutorial_kernels.integrations.prefill import MODELS, build_model

    register()
    spec = MODELS["llama-3-8b"]
    result = {
        "description": "generate() of a Llama-3-8B-shaped model (random bf16 weights): decode tokens/s and greedy "
                       "tokens, ours against sdpa, dynamic and static caches",
        "provenance": provenance(" ".join(["python -m tutorial_kernels.integrations.generate", *argv])),
        "model": {"label": spec.label, "config_source": spec.source, "config": spec.config},
        "method": __doc__.split("\n\n", 1)[1].strip(),
        "rows": [], "comparisons": [],
    }
    model = build_model(spec)
    for batch in batches:
        for cache in CACHES:
            kept = {}
            for impl in IMPLEMENTATIONS:
                try:
                    row, kept[impl] = measure(model, impl, batch, prompt, new, cache)
                    row["status"] = "ok"
                except Exception as err:  # recorded: the other cells still run
                    traceback.print_exc()
                    row = {"implementation": impl, "batch": batch, "cache": cache, "status": "error",
                           "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"}
                result["rows"].append(row)
                print(json.dumps({k: v for k, v in row.items()}), flush=True)
                gc.collect()
                torch.cuda.empty_cache()
            if len(kept) == 2:
                c = compare(kept["tutorial_fa2"], kept["sdpa"]) | {"batch": batch, "cache": cache}
                result["comparisons"].append(c)
                print(json.dumps(c), flush=True)
            out_path.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.integrations.generate",
                                     description="generate() tokens/s and greedy tokens, ours against sdpa")
    parser.add_argument("--out", type=Path, default=None, help="JSON to write (default data/generate.json)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=256)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("generation is timed on a CUDA GPU; none is visible here")
    run(args.batches, args.prompt, args.new, args.out or data_dir() / "generate.json", argv)


if __name__ == "__main__":
    main()
