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

Per (batch, cache, implementation): one generate of `--new` tokens untimed, which compiles what it
compiles (transformers compiles the decoding forward itself for a static cache, on a GPU; the shapes
of the timed run are the same, so nothing compiles again) and autotunes, and whose tokens and logits
are kept for the checks; then the same generate timed by a streamer that stamps the clock as each
token reaches the host: prefill = the first token's time (generate()'s own setup included; with a static
cache ours runs the prompt through chapter 8's kernel too, since the buffers are longer than the prompt),
decode tokens/s = batch · (new − 1) over the time from the first token to the last.

Checks, per (batch, cache): the greedy tokens against sdpa's, and where a sequence's tokens first
differ, sdpa's margin between its two best logits at that step (a near-tie, or an exact one, that two
correct bfloat16 implementations may break differently); and each implementation's logits at every
step against sdpa's without a cache on that implementation's own tokens (teacher forcing): the largest
relative L2 error of a step's logits (`teacher_forced_error`), ours within twice sdpa's own or
TEACHER_FORCED_TOLERANCE, whichever is larger (one sample of sdpa's error may be near zero).
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
TEACHER_FORCED_TOLERANCE = 5e-2  # as the prefill study's check: bf16 logits through 32 layers


class _Clock:
    """A generate() streamer that stamps the clock each time tokens reach the host (the prompt first,
    then each new token: generate copies them to the host as it makes them)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generate(model, ids: torch.Tensor, new: int, cache: str, *, logits: bool = False, streamer=None):
    """generate()'s output for `new` greedy tokens after `ids`."""
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  pad_token_id=0, return_dict_in_generate=True, output_logits=logits, streamer=streamer)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.inference_mode():
        return model.generate(ids, **kwargs)


def teacher_forced_error(model, sequences: torch.Tensor, step_logits: torch.Tensor, prompt: int) -> float:
    """The largest relative L2 error, over sequences and steps, of `step_logits` (B, new, vocab), the
    logits that chose each new token, against sdpa's logits without a cache on the same tokens."""
    new = step_logits.shape[1]
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        forced = model(sequences[:, :prompt + new - 1], use_cache=False, logits_to_keep=new).logits.float()
    err = (step_logits.to(forced.device) - forced).norm(dim=-1) / forced.norm(dim=-1)
    return float(err.max())


def measure(model, impl: str, batch: int, prompt: int, new: int, cache: str) -> tuple[dict, dict]:
    """One row of timings and checks, and the tokens and logits kept for the comparison with sdpa."""
    model.set_attn_implementation(impl)
    gen = torch.Generator(device=model.device).manual_seed(batch * 1000 + prompt)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=gen, device=model.device)
    checked = _generate(model, ids, new, cache, logits=True)  # untimed: compiles and autotunes; checked
    _synchronize(model.device)
    clock = _Clock()
    start = time.perf_counter()
    _generate(model, ids, new, cache, streamer=clock)
    _synchronize(model.device)
    stamps = clock.stamps  # the prompt's, then one per new token
    logits = torch.stack(checked.logits, 1).float()
    row = {"implementation": impl, "batch": batch, "prompt": prompt, "new_tokens": new, "cache": cache,
           "prefill_s": stamps[1] - start, "decode_s": stamps[-1] - stamps[1],
           "decode_tokens_per_s": batch * (new - 1) / (stamps[-1] - stamps[1]),
           "teacher_forced_error": teacher_forced_error(model, checked.sequences, logits, prompt)}
    return row, {"tokens": checked.sequences[:, prompt:].cpu(), "logits": logits.cpu()}


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
    sdpa_tokens: dict = {}
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
                rows = {r["implementation"]: r for r in result["rows"][-2:]}
                c = compare(kept["tutorial_fa2"], kept["sdpa"]) | {"batch": batch, "cache": cache}
                bound = max(TEACHER_FORCED_TOLERANCE, 2 * rows["sdpa"]["teacher_forced_error"])
                c["teacher_forced_bound"] = bound
                c["logits_within_bound"] = rows["tutorial_fa2"]["teacher_forced_error"] <= bound
                result["comparisons"].append(c)
                print(json.dumps(c), flush=True)
                sdpa_tokens.setdefault(batch, {})[cache] = kept["sdpa"]
            if len(sdpa_tokens.get(batch, {})) == 2:  # sdpa against itself: its dynamic and static caches
                c = compare(sdpa_tokens[batch]["static"], sdpa_tokens[batch]["dynamic"])
                result["comparisons"].append(c | {"batch": batch, "cache": "sdpa static vs sdpa dynamic"})
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
