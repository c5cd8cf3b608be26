"""Chapter 5's kernel inside Hugging Face transformers: tiny random models, ours against eager and SDPA.

Every model here is built from a config with random weights (no download) and is small enough for
Triton's interpreter; on a GPU the same tests run natively. The prefill benchmark's own models are
checked for their published sizes on the meta device, which allocates nothing.
"""

import os
import statistics

import pytest
import torch

from tutorial_kernels.reference import reference_attention
from tutorial_kernels.runtime import default_device
from tutorial_kernels.testing import ON_GPU, assert_close, fresh_seed, grad_tolerance

try:
    import transformers  # noqa: F401
except ImportError as error:  # transformers comes with the `test` extra
    if os.environ.get("TUTORIAL_REQUIRE_ALL") == "1":
        raise
    pytest.skip(f"transformers is not installed ({error}); pip install -e '.[test]'", allow_module_level=True)

from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig, MistralConfig, PhiConfig  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from tutorial_kernels.integrations.hf_attention import (  # noqa: E402
    DEFAULT_NAME,
    register,
    tutorial_flash_attention,
    tutorial_flash_mask,
)

NAME = register()
DEVICE = default_device()
# bfloat16 on a GPU only, not generated on the CPU: the interpreter computes it wrongly (testing.BF16_NEEDS_GPU)
DTYPES = [torch.float32] + ([torch.bfloat16] if ON_GPU else [])


def tiny_llama(**overrides) -> LlamaConfig:
    """Llama's architecture at toy size: 2 layers, 4 query heads sharing 2 key/value heads of 16 dims."""
    return LlamaConfig(**{**dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256), **overrides})


def build(config, seed: int, dtype=torch.float32):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager")
    return model.to(DEVICE).eval()


def token_ids(vocab: int, batch: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def logits_with(model, impl: str, **inputs) -> torch.Tensor:
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits.float()


def test_the_default_name_avoids_the_word_flash():
    # transformers 5 treats any implementation name containing "flash" as the flash-attn package
    assert DEFAULT_NAME == NAME == "tutorial_fa2" and "flash" not in NAME


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_llama_with_grouped_query_attention_matches_eager_and_sdpa(dtype):
    seed = fresh_seed()
    model = build(tiny_llama(), seed, dtype)
    ids = token_ids(97, 2, 37, seed)
    ours = logits_with(model, NAME, input_ids=ids, attention_mask=torch.ones_like(ids))
    for impl in ("eager", "sdpa"):
        assert_close(ours, logits_with(model, impl, input_ids=ids), dtype, seed=seed, what=f"logits vs {impl}")


def test_phi_head_dim_20_with_partial_rotary_matches_eager():
    # head_dim 80 / 4 = 20: not a power of two, like Phi-2's 80 (the kernel pads its tiles to 32)
    seed = fresh_seed()
    config = PhiConfig(vocab_size=101, hidden_size=80, intermediate_size=160, num_hidden_layers=2,
                       num_attention_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                               "partial_rotary_factor": 0.4})
    model = build(config, seed)
    assert model.model.layers[0].self_attn.head_dim == 20
    ids = token_ids(101, 2, 29, seed)
    assert_close(logits_with(model, NAME, input_ids=ids), logits_with(model, "eager", input_ids=ids),
                 torch.float32, seed=seed, what="logits vs eager")


def test_generation_with_a_kv_cache_matches_eager_and_builds_no_mask():
    """Prefill (n_q = n_k) then one-token steps (n_q = 1, n_k growing): bottom-right alignment lets
    each new token see every cached key, and no mask tensor is ever made."""
    seed = fresh_seed()
    calls = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        calls.append((query.shape[2], key.shape[2], attention_mask is None))
        return tutorial_flash_attention(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("tutorial_fa2_spy", spy)
    AttentionMaskInterface.register("tutorial_fa2_spy", tutorial_flash_mask)
    model = build(tiny_llama(), seed)
    ids = token_ids(97, 1, 21, seed)
    model.set_attn_implementation("tutorial_fa2_spy")
    with torch.no_grad():
        # min_new_tokens: a random model may pick the end-of-sequence token and stop early
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    steps = torch.stack(out.logits)[:, 0].float()  # (4, vocab): the logits that chose each new token
    # eager, without a cache, on the same 24 tokens: its logits at positions 20..23 are those four steps
    # (compared on one sequence, so a near-tie that two correct implementations break differently
    # cannot make the test fail)
    expected = logits_with(model, "eager", input_ids=out.sequences[:, :-1])[0, 20:]
    assert_close(steps, expected, torch.float32, seed=seed, what="logits of each generated token")
    per_layer = sorted(set(calls))
    assert per_layer == [(1, 22, True), (1, 23, True), (1, 24, True), (21, 21, True)], per_layer


@pytest.mark.parametrize("batch", [1, 3])
def test_generation_with_a_static_cache_matches_eager(batch):
    """generate() with cache_implementation="static": fixed-size buffers with empty slots, which every
    call (prefill and each step) reads through chapter 8's kernel up to the lengths the mask function
    counts; the logits that chose each token equal eager's, without a cache, on the same tokens."""
    seed = fresh_seed()
    model = build(tiny_llama(), seed)
    ids = token_ids(97, batch, 13, seed)
    model.set_attn_implementation(NAME)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                             cache_implementation="static")
    steps = torch.stack(out.logits, 1).float()  # (batch, 4, vocab)
    expected = logits_with(model, "eager", input_ids=out.sequences[:, :-1])[:, 12:]
    assert_close(steps, expected, torch.float32, seed=seed, what="logits of each generated token")


def test_training_gradients_match_eager():
    # with autograd on, the layers go through chapter 6's flash_attention (forward + backward kernels)
    seed = fresh_seed()
    model = build(tiny_llama(), seed).train()
    ids = token_ids(97, 2, 19, seed)
    grads = {}
    for impl in ("eager", NAME):
        model.set_attn_implementation(impl)
        model.zero_grad()
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        grads[impl] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    err = ((grads[NAME] - grads["eager"]).norm() / grads["eager"].norm()).item()
    assert err <= grad_tolerance(torch.float32), f"gradients: relative error {err:.2e}; seed={seed}"


def test_a_padded_batch_runs_unpadded_and_matches_eager():
    """Left and right padding: the real tokens go through chapter 9's packed kernel. Logits at every real
    position against eager's, gradients of a padded training batch against eager's, and batched greedy
    generate() with left padding gives eager's tokens, token for token."""
    seed = fresh_seed()
    model = build(tiny_llama(), seed)
    ids = token_ids(97, 3, 12, seed)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, 9:] = 0  # right padding
    real = mask.bool()
    ours, eager = (logits_with(model, impl, input_ids=ids, attention_mask=mask) for impl in (NAME, "eager"))
    assert_close(ours[real], eager[real], torch.float32, seed=seed, what="logits at real tokens vs eager")

    grads = {}
    for impl in (NAME, "eager"):
        model.set_attn_implementation(impl)
        model.zero_grad()
        # a label counts where it and the position predicting it are real (a padded query's output is 0 here
        # and something else in eager; both are meaningless)
        labels = ids.masked_fill(~real, -100)
        labels[:, 1:] = labels[:, 1:].masked_fill(~real[:, :-1], -100)
        model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss.backward()
        grads[impl] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    err = ((grads[NAME] - grads["eager"]).norm() / grads["eager"].norm()).item()
    assert err <= grad_tolerance(torch.float32), f"gradients: relative error {err:.2e}; seed={seed}"

    left = torch.ones_like(ids)
    left[0, :4], left[2, :1] = 0, 0
    tokens = {}
    for impl in (NAME, "eager"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            tokens[impl] = model.generate(ids, attention_mask=left, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert torch.equal(tokens[NAME], tokens["eager"]), f"seed={seed}"


def test_padding_through_a_static_cache_is_refused_with_a_clear_error():
    model = build(tiny_llama(), 0)
    model.set_attn_implementation(NAME)
    ids = token_ids(97, 2, 12, 0)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with pytest.raises(ValueError, match=r"take padding with the default \(dynamic\) cache.*marks 3 of"):
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, cache_implementation="static")


def test_dropout_is_refused_with_a_clear_error():
    model = build(tiny_llama(attention_dropout=0.1), 0).train()
    model.set_attn_implementation(NAME)
    with pytest.raises(ValueError, match=r"dropout: .* no attention dropout, got dropout=0.1; call model.eval\(\)"):
        model(input_ids=token_ids(97, 1, 8, 0), use_cache=False)
    model.eval()  # at inference the layers pass dropout=0.0
    model(input_ids=token_ids(97, 1, 8, 0), use_cache=False)


def test_a_sliding_window_model_matches_eager_where_the_window_bites():
    """Mistral's sliding window of 12 over 12 tokens (hides nothing) and over 29 (hides most keys of the
    late queries): chapter 9's windowed kernels, logits against eager; and greedy generate() with the
    default cache, tokens identical to eager's."""
    seed = fresh_seed()
    config = MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=12)
    model = build(config, seed)
    for n in (12, 29):
        ids = token_ids(97, 2, n, seed + n)
        assert_close(logits_with(model, NAME, input_ids=ids), logits_with(model, "eager", input_ids=ids),
                     torch.float32, seed=seed, what=f"logits vs eager, {n} tokens")
    ids = token_ids(97, 1, 15, seed)
    tokens = {}
    for impl in (NAME, "eager"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            tokens[impl] = model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert torch.equal(tokens[NAME], tokens["eager"]), f"seed={seed}"


def test_gemma2s_softcap_and_alternating_windows_match_eager():
    """Gemma 2's shape: logit soft-capping in every layer, sliding-window layers alternating with global
    ones, a window that bites; weights drawn large enough (initializer_range) that the scores reach the
    cap; logits against eager."""
    from transformers import Gemma2Config

    seed = fresh_seed()
    config = Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                          attn_logit_softcapping=2.0, query_pre_attn_scalar=16, initializer_range=0.5)
    model = build(config, seed)
    ids = token_ids(97, 2, 21, seed)
    assert_close(logits_with(model, NAME, input_ids=ids), logits_with(model, "eager", input_ids=ids),
                 torch.float32, seed=seed, what="logits vs eager")


class _Layer(torch.nn.Module):
    is_causal = True


def _qkv(n_q: int, n_k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, n_q, 16, generator=g).to(DEVICE)
    k, v = (torch.randn(1, 2, n_k, 16, generator=g).to(DEVICE) for _ in range(2))
    return q, k, v


def test_the_mask_function_carries_a_sliding_window_to_layers_that_do_not_pass_it():
    """Some models build a sliding-window mask but call the attention function without `sliding_window`
    (PhiMoE, Qwen2-MoE): the mask function hands over the window's width (a 0-d tensor, or the width at
    every real token of a padded batch), so the window is applied all the same; chunked attention's
    local size is not taken for a window."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    from tutorial_kernels.reference import reference_variant_attention

    config = MistralConfig(sliding_window=6)
    marker = tutorial_flash_mask(1, 20, 20, mask_function=sliding_window_causal_mask_function(6), local_size=6,
                                 config=config)
    assert marker.dim() == 0 and int(marker) == 6
    q, k, v = _qkv(20, 20, 3)
    out, _ = tutorial_flash_attention(_Layer(), q, k, v, marker)  # no sliding_window keyword
    want, _ = reference_variant_attention(q, k, v, causal=True, window_size=(5, 5))
    assert torch.allclose(out.transpose(1, 2).double(), want, atol=1e-5)
    padded = torch.ones(1, 20, dtype=torch.long, device=DEVICE)
    padded[0, :2] = 0
    widths = tutorial_flash_mask(1, 20, 20, mask_function=sliding_window_causal_mask_function(6), local_size=6,
                                 config=config, attention_mask=padded)
    assert widths.shape == (1, 20) and widths.tolist()[0] == [0, 0] + [6] * 18
    out, _ = tutorial_flash_attention(_Layer(), q, k, v, widths)
    want, _ = reference_variant_attention(q[:, :, 2:], k[:, :, 2:], v[:, :, 2:], causal=True, window_size=(5, 5))
    assert torch.allclose(out.transpose(1, 2)[:, :, 2:].double(), want, atol=1e-5)
    chunked = LlamaConfig(sliding_window=None)
    chunked.attention_chunk_size = 6
    with pytest.raises(ValueError, match="take padding with the default"):
        tutorial_flash_mask(1, 20, 20, mask_function=sliding_window_causal_mask_function(6), local_size=6,
                            config=chunked, attention_mask=padded)


def test_a_mask_that_hides_nothing_more_than_causal_is_accepted():
    q, k, v = _qkv(5, 9, 1)
    plain, _ = tutorial_flash_attention(_Layer(), q, k, v, None)
    causal = torch.arange(9)[None, :] <= torch.arange(5)[:, None] + 4  # bottom-right aligned
    as_bool = causal[None, None].to(DEVICE)
    as_float = torch.zeros(1, 1, 5, 9).masked_fill(~causal, torch.finfo(torch.float32).min).to(DEVICE)
    for mask in (as_bool, as_float):
        out, weights = tutorial_flash_attention(_Layer(), q, k, v, mask)
        assert weights is None and out.shape == (1, 5, 4, 16) and out.is_contiguous()
        assert torch.equal(out, plain)


# n_q × H / H_kv above DECODE_ROWS: the prefill path (a decoding step's is tested below)
@pytest.mark.parametrize("batch,heads,kv_heads,n_q", [(1, 4, 2, 40), (2, 4, 2, 33), (2, 1, 1, 65)],
                         ids=lambda x: str(x))
def test_the_output_is_contiguous_in_transformers_layout_whatever_the_querys(monkeypatch, batch, heads, kv_heads, n_q):
    # (B, n_q, H, d) contiguous, the layout o_proj reads, from a query in the projections' layout (a
    # transposed view: its buffer is made like the query) and from a contiguous (B, H, n_q, d) one.
    g = torch.Generator().manual_seed(3)
    as_projected = torch.randn(batch, n_q, heads, 16, generator=g).to(DEVICE).transpose(1, 2)
    q = as_projected.contiguous()
    k, v = (torch.randn(batch, kv_heads, 9, 16, generator=g).to(DEVICE) for _ in range(2))
    made_like = []
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, *a, **kw: made_like.append(t) or empty_like(t, *a, **kw))
    outputs = []
    for query in (q, as_projected):
        out, _ = tutorial_flash_attention(_Layer(), query, k, v, None)
        assert out.shape == (batch, n_q, heads, 16) and out.is_contiguous()
        outputs.append(out)
    assert any(t is as_projected for t in made_like), "the buffer is made like a query in the projections' layout"
    assert torch.equal(outputs[0], outputs[1])
    group = heads // kv_heads
    ref = reference_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), True)
    assert_close(outputs[0].transpose(1, 2), ref, torch.float32, seed=3)


def test_a_mask_that_hides_more_is_refused():
    q, k, v = _qkv(5, 9, 2)
    mask = torch.ones(1, 1, 5, 9, dtype=torch.bool, device=DEVICE).tril(4)
    mask[..., 0] = False  # a padded first key
    with pytest.raises(ValueError, match=r"cannot apply this mask, which differs from that in 5 of 45"):
        tutorial_flash_attention(_Layer(), q, k, v, mask)
    bias = torch.full((1, 1, 5, 9), 0.5, device=DEVICE)
    with pytest.raises(ValueError, match=r"values other than 0 and -inf \(an additive bias"):
        tutorial_flash_attention(_Layer(), q, k, v, bias)
    with pytest.raises(TypeError, match=r"expected a boolean mask .* got dtype torch.int64"):
        tutorial_flash_attention(_Layer(), q, k, v, torch.ones(1, 1, 5, 9, dtype=torch.long, device=DEVICE))


def test_mask_function_returns_none_exactly_when_the_kernel_needs_no_mask():
    ones = torch.ones(2, 6, dtype=torch.bool)
    # prefill without cache, and a decoding step after 5 cached tokens: nothing to build
    assert tutorial_flash_mask(batch_size=2, q_length=6, kv_length=6, attention_mask=ones) is None
    assert tutorial_flash_mask(batch_size=2, q_length=1, kv_length=6, q_offset=5, attention_mask=ones) is None


@pytest.mark.parametrize("q_offset", [0, 4, "tensor"])
def test_a_static_cache_gets_its_lengths_and_attends_to_its_filled_slots_only(q_offset):
    """A static cache of 10 slots, q_offset tokens already cached and 2 or 6 new: the mask function
    returns each sequence's count of filled slots (from a 0-d tensor q_offset as a static cache's
    layers give it, without reading it on the host), and the attention function reads just those,
    causal from the bottom-right of the filled part. The empty slots hold garbage that must not leak."""
    n_q = 6 if q_offset == 0 else 2
    offset = torch.tensor(4, device=DEVICE) if q_offset == "tensor" else q_offset
    filled = (4 if q_offset == "tensor" else q_offset) + n_q
    lengths = tutorial_flash_mask(batch_size=1, q_length=n_q, kv_length=10, q_offset=offset,
                                  attention_mask=torch.ones(1, filled, dtype=torch.bool), device=DEVICE)
    assert lengths.dtype == torch.int32 and lengths.tolist() == [filled]
    q, k, v = _qkv(n_q, 10, 3)
    k[:, :, filled:], v[:, :, filled:] = 1e4, float("nan")  # the empty slots
    out, weights = tutorial_flash_attention(_Layer(), q, k, v, lengths)
    assert weights is None and out.shape == (q.shape[0], n_q, q.shape[1], q.shape[3]) and out.is_contiguous()
    group = q.shape[1] // k.shape[1]
    want = reference_attention(q, k[:, :, :filled].repeat_interleave(group, 1),
                               v[:, :, :filled].repeat_interleave(group, 1), True)
    assert_close(out.transpose(1, 2), want, torch.float32, seed=0)


def test_a_static_cache_gets_a_mask_where_the_model_asks_for_one_or_a_window_cuts():
    """No lengths where they could not say everything: a model that asks for a mask to change (Falcon adds
    ALiBi to it: allow_is_causal_skip=False), a config with ALiBi, and a sliding window at the attention call."""
    from types import SimpleNamespace

    ones = torch.ones(1, 6, dtype=torch.bool)
    asked = tutorial_flash_mask(batch_size=1, q_length=6, kv_length=10, attention_mask=ones, allow_is_causal_skip=False)
    assert asked is not None and asked.dim() == 4
    alibi = tutorial_flash_mask(batch_size=1, q_length=6, kv_length=10, attention_mask=ones,
                                config=SimpleNamespace(alibi=True))
    assert alibi is not None and alibi.dim() == 4
    # transformers' own allow_is_causal_skip=False: a compileable (static) cache's one-token step
    step = tutorial_flash_mask(batch_size=1, q_length=1, kv_length=10, q_offset=torch.tensor(5),
                               attention_mask=ones, allow_is_causal_skip=False, device=DEVICE)
    assert step.dim() == 1 and step.tolist() == [6]
    q, k, v = _qkv(1, 10, 4)
    with pytest.raises(ValueError, match=r"sliding_window: .* static cache"):
        tutorial_flash_attention(_Layer(), q, k, v, step, sliding_window=16)


def test_a_decoding_step_runs_chapter_8s_kernel(monkeypatch):
    """n_q × H / H_kv ≤ DECODE_ROWS at inference: flash_attention_with_kvcache over all n_k keys."""
    from tutorial_kernels.integrations import hf_attention

    calls = []
    decode = hf_attention.flash_attention_with_kvcache
    monkeypatch.setattr(hf_attention, "flash_attention_with_kvcache", lambda *a, **kw: calls.append(kw) or decode(*a, **kw))
    q, k, v = _qkv(2, 13, 3)
    out, _ = tutorial_flash_attention(_Layer(), q, k, v, None)
    assert len(calls) == 1 and calls[0]["cache_seqlens"] == 13 and out.is_contiguous()
    group = q.shape[1] // k.shape[1]
    want = reference_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), True)
    assert_close(out.transpose(1, 2), want, torch.float32, seed=0)


def test_register_is_idempotent_and_refuses_names_transformers_reads_otherwise():
    assert register() == register() == NAME
    assert AttentionInterface._global_mapping[NAME] is tutorial_flash_attention
    assert AttentionMaskInterface._global_mapping[NAME] is tutorial_flash_mask
    with pytest.raises(ValueError, match=r"must not contain 'flash'"):
        register("my_flash")
    with pytest.raises(ValueError, match=r"'sdpa' is already an attention implementation"):
        register("sdpa")
    with pytest.raises(TypeError, match=r"name must be a non-empty str, got int 3"):
        register(3)


def test_from_pretrained_accepts_the_registered_name(tmp_path):
    # what a reader with real weights does: save a model, load it back with our attention
    build(tiny_llama(), 0).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=NAME, dtype=torch.float32)
    assert model.config._attn_implementation == NAME
    ids = token_ids(97, 1, 9, 0)
    with torch.no_grad():
        model.to(DEVICE)(input_ids=ids)


# Parameter counts of the published checkpoints (as the Hugging Face hub reports them).
PUBLISHED = {"mistral-7b": (7_241_732_096, 128, 4), "llama-3-8b": (8_030_261_248, 128, 4), "phi-2": (2_779_683_840, 80, 1)}


@pytest.mark.parametrize("key", list(PUBLISHED))
def test_prefill_models_have_their_published_shapes(key):
    from tutorial_kernels.integrations.prefill import MODELS

    with torch.device("meta"):  # shapes only, no memory
        model = AutoModelForCausalLM.from_config(MODELS[key].build_config(), dtype=torch.bfloat16)
    attention = model.model.layers[0].self_attn
    params, head_dim, group = PUBLISHED[key]
    assert (sum(p.numel() for p in model.parameters()), attention.head_dim, attention.num_key_value_groups) == \
        (params, head_dim, group)


@pytest.mark.parametrize("impls", [["eager", "sdpa", "ours"], ["sdpa", "ours"], ["ours"]], ids=len)
def test_prefill_turns_let_each_implementation_follow_each_other_equally_often(impls):
    from collections import Counter

    from tutorial_kernels.integrations.prefill import turn_order

    forwards = [impl for turn in range(6) for impl in turn_order(impls, turn)]
    assert Counter(forwards) == {impl: 6 for impl in impls}
    pairs = Counter(zip(forwards, forwards[1:] + forwards[:1]))  # (before, after), cyclically
    wanted = {(a, b): 6 // max(1, len(impls) - 1) for a in impls for b in impls if a != b or len(impls) == 1}
    assert pairs == wanted


def test_prefill_timing_takes_turns_and_records_every_forward_in_order(monkeypatch):
    # The turn loop with stand-ins for the model, the GPU clock and the allocator: each "forward" takes
    # a fixed time per implementation, so the number of forwards follows from `seconds`.
    from tutorial_kernels.integrations import prefill

    class StandIn:
        impl = None

        def set_attn_implementation(self, impl):
            self.impl = impl

    model, ran = StandIn(), []
    cost_ms = {"eager": 500.0, "sdpa": 40.0, "ours": 39.0}

    def fake_forward(m, inputs):
        ran.append(m.impl)
        return cost_ms[m.impl] + len(ran) / 1000  # distinct values, in the order they ran

    monkeypatch.setattr(prefill, "time_forward", fake_forward)
    monkeypatch.setattr(prefill, "warm_up", lambda m, inputs, forwards: None)
    monkeypatch.setattr(prefill, "_free", lambda: None)
    monkeypatch.setattr(prefill.torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(prefill.torch.cuda, "max_memory_allocated", lambda: 2**30)
    rows = prefill.time_implementations(model, {}, ["eager", "sdpa", "ours"], warmup=1, seconds=1.0)

    assert rows["eager"]["reps"] == prefill.MIN_REPS  # 2 fit in a second: the floor
    assert rows["sdpa"]["reps"] == 25 and rows["ours"]["reps"] == 26  # ceil(1000 / 40), ceil(1000 / 39)
    for impl, row in rows.items():
        assert row["status"] == "ok" and len(row["ms_all"]) == row["reps"]
        assert row["ms_all"] == sorted(row["ms_all"])  # in the order they ran
        assert row["ms"] == statistics.median(row["ms_all"]) and row["ms_min"] == row["ms_all"][0]
    # the k-th forward of sdpa and of ours ran in the same turn, next to each other
    for k in range(25):
        sdpa_at = round((rows["sdpa"]["ms_all"][k] - 40.0) * 1000) - 1
        ours_at = round((rows["ours"]["ms_all"][k] - 39.0) * 1000) - 1
        assert ran[sdpa_at] == "sdpa" and ran[ours_at] == "ours" and abs(sdpa_at - ours_at) <= 2


def turns_with_pair_values(values: list[float]) -> tuple[list[float], list[float]]:
    """(ours, base) forward times whose pairs of turns have the given ratios: ours over base is v in
    turn 2i and v again in turn 2i + 1, so the pair's geometric mean is v."""
    base = [10.0] * (2 * len(values))
    return [10.0 * v for v in values for _ in range(2)], base


def test_paired_ratio_interval_is_the_sign_tests():
    from tutorial_kernels.integrations.prefill import paired_ratio

    values = [1.03, 0.98, 1.05, 1.01, 1.04, 1.005, 1.02, 1.06, 1.07]
    c = paired_ratio(*turns_with_pair_values(values))
    # m = 9 pairs: P(B ≤ 1) = 10/512 ≤ 0.025 < P(B ≤ 2) = 46/512, so the interval is v_(2) … v_(8)
    assert (c["turns"], c["pairs"]) == (18, 9) and c["ratio"] == pytest.approx(1.03)
    assert (c["low"], c["high"]) == (pytest.approx(1.005), pytest.approx(1.06)) and c["verdict"] == "slower"
    # one more pair with ours 20 % faster moves the interval's low end below 1: m = 10, v_(2) … v_(9)
    c = paired_ratio(*turns_with_pair_values([0.8, *values]))
    assert (c["low"], c["high"]) == (pytest.approx(0.98), pytest.approx(1.06)) and c["verdict"] == "undecided"
    six = paired_ratio([9.0] * 12, [10.0] * 12)  # m = 6: min … max, coverage 1 − 2/64 = 96.9 %
    assert six["verdict"] == "faster" and six["pairs"] == 6
    few = paired_ratio([9.0] * 11, [10.0] * 11)  # 5 pairs (the odd last turn is left out): no interval
    assert few["verdict"] == "too few turns" and few["low"] is None and few["ratio"] == pytest.approx(0.9)
    # turns match by position; the longer list's extra forwards are left out
    assert paired_ratio([9.0] * 13 + [50.0], [10.0] * 13)["turns"] == 13
    with pytest.raises(ValueError, match="confidence must lie strictly between 0 and 1, got 1.0"):
        paired_ratio([9.0] * 12, [10.0] * 12, confidence=1.0)


def test_paired_ratio_cancels_what_runs_before_a_forward():
    from tutorial_kernels.integrations.prefill import paired_ratio

    # whichever of the two runs first in a turn (right after eager) is 3.5 % faster; the order flips
    # every turn; ours is 0.5 % faster throughout. Turn by turn the ratios straddle 1, half and half;
    # by pairs of turns every value is 0.995
    ours, base = [], []
    for k in range(40):
        ours_first = k % 2 == 1
        ours.append(60.0 * 0.995 * (0.965 if ours_first else 1.0))
        base.append(60.0 * (1.0 if ours_first else 0.965))
    assert sum(o > b for o, b in zip(ours, base)) == 20
    c = paired_ratio(ours, base)
    assert c["verdict"] == "faster" and c["low"] == pytest.approx(0.995) and c["high"] == pytest.approx(0.995)


def test_paired_ratio_finds_a_small_lead_under_a_larger_drift():
    from tutorial_kernels.integrations.prefill import paired_ratio

    # the GPU slows down by 6 % over the run and sdpa's forwards are ± 0.4 % noisy, so the two sets of
    # times overlap almost entirely; turn by turn, ours is 0.5 % faster every time
    drift = [60.0 + 0.1 * k for k in range(40)]
    base = [t * (1 + 0.004 * (-1) ** k) for k, t in enumerate(drift)]
    ours = [t * 0.995 for t in drift]
    assert min(base) < max(ours) * 0.95
    c = paired_ratio(ours, base)
    assert c["verdict"] == "faster" and c["high"] < 0.996 and c["ratio"] == pytest.approx(0.995, abs=1e-4)


@pytest.mark.cpu("the message shown without a GPU")
def test_prefill_benchmark_refuses_without_a_gpu(capsys):
    from tutorial_kernels.integrations.prefill import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--out", "/dev/null"])
    assert exit_info.value.code == 2  # argparse's usage error
    assert "prefill latency is measured on a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu("the Gluon kernel")
@pytest.mark.skipif(not (ON_GPU and torch.cuda.get_device_capability()[0] == 9),
                    reason="the Hopper kernel (Gluon) runs on compute capability 9.x GPUs only")
def test_llama_with_head_dim_128_runs_the_hopper_kernel_on_hopper(monkeypatch):
    import tutorial_kernels.attention as adapter  # the front door, through which the adapter calls
    from tutorial_kernels.dispatch import RULES  # causal, K and V this small: persistent

    MIN_KEYS_PERSISTENT = RULES["forward_min_keys_persistent"]  # noqa: N806 (the rule's value, named as on the page)

    calls = []  # Hopper launches: the first layer's through flash_attn_hopper, the others' remembered
    hopper, (remembered_key, relaunch) = adapter.flash_attn_hopper, adapter._RELAUNCHES["hopper"]
    monkeypatch.setattr(adapter, "flash_attn_hopper", lambda *a, **kw: calls.append(1) or hopper(*a, **kw))
    monkeypatch.setitem(adapter._RELAUNCHES, "hopper",
                        (remembered_key, lambda *a: relaunch(*a) and (calls.append(1) or True)))
    monkeypatch.setattr(adapter, "_DECISIONS", {})  # decisions made earlier keep the relaunch they were made with
    seed = fresh_seed()
    config = tiny_llama(hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                        max_position_embeddings=4096)
    model = build(config, seed, torch.bfloat16)
    ids = token_ids(97, 1, MIN_KEYS_PERSISTENT + 37, seed)
    ours = logits_with(model, NAME, input_ids=ids)
    assert len(calls) == config.num_hidden_layers, "every layer goes through the Hopper kernel"
    assert_close(ours, logits_with(model, "sdpa", input_ids=ids), torch.bfloat16, seed=seed, what="logits vs sdpa")
    short = token_ids(97, 1, MIN_KEYS_PERSISTENT - 1, seed)
    assert_close(logits_with(model, NAME, input_ids=short), logits_with(model, "sdpa", input_ids=short),
                 torch.bfloat16, seed=seed, what="short prompt logits vs sdpa")
    assert len(calls) == config.num_hidden_layers, "below forward_min_keys_persistent the Triton kernel runs, not the Hopper one"


def test_the_call_cost_tool_needs_a_gpu(monkeypatch):
    from tutorial_kernels.integrations import call_cost
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        call_cost.main([])


def test_the_generate_study_finds_the_first_differing_token_and_the_references_margin():
    from tutorial_kernels.integrations.generate import compare

    tokens = torch.tensor([[5, 6, 7], [1, 2, 3]])
    logits = torch.zeros(2, 3, 10)
    logits[1, 1, 4], logits[1, 1, 2] = 3.0, 2.5  # the reference's step 1 of sequence 1: margin 0.5
    ours = {"tokens": torch.tensor([[5, 6, 7], [1, 4, 9]]), "logits": logits}
    got = compare(ours, {"tokens": tokens, "logits": logits})
    assert got == {"identical": False, "first_difference": [None, 1], "reference_margin": [None, 0.5]}
    assert compare({"tokens": tokens}, {"tokens": tokens, "logits": logits})["identical"]


def test_the_generate_study_needs_a_gpu(monkeypatch):
    from tutorial_kernels.integrations import generate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        generate.main([])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_the_generate_study_times_and_checks_a_small_model(cache):
    """The study's measurement on a tiny model (here on the CPU): a stamp per token, decode tokens/s,
    and the teacher-forced error of ours within the float32 tolerance of sdpa's logits."""
    from tutorial_kernels.integrations.generate import measure

    model = build(tiny_llama(), fresh_seed())
    rows, kept = {}, {}
    for impl in ("sdpa", NAME):
        rows[impl], kept[impl] = measure(model, impl, batch=2, prompt=9, new=5, cache=cache)
    ours = rows[NAME]
    assert ours["decode_tokens_per_s"] > 0 and ours["prefill_s"] > 0
    assert ours["teacher_forced_error"] < 1e-4 and rows["sdpa"]["teacher_forced_error"] < 1e-4, rows
    assert kept[NAME]["tokens"].shape == (2, 5) and kept[NAME]["logits"].shape == (2, 5, 97)
