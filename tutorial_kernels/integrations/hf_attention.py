"""The tutorial's attention (`tutorial_kernels.flash_attention`) as an attention implementation for Hugging Face `transformers`.

In transformers 5 a model's attention layers do not call a fixed function: they look up
`config._attn_implementation` in `transformers.AttentionInterface` and call what is registered
there as

    fn(module, query, key, value, attention_mask, *, scaling, dropout, **kwargs) -> (output, weights)

with query (B, H, n_q, d), key and value (B, H_kv, n_k, d), and output (B, n_q, H, d). A second
registry, `transformers.masking_utils.AttentionMaskInterface`, says how the model builds the
`attention_mask` that reaches that function. `register()` adds both under one name, after which

    model.set_attn_implementation("tutorial_fa2")
    AutoModelForCausalLM.from_pretrained(..., attn_implementation="tutorial_fa2")

route every attention layer through this tutorial's kernel. What the kernel computes, and what it
refuses rather than computing something else:

* grouped-query attention natively: key/value heads are never repeated (the kernel maps query head
  h to key/value head h // (H / H_kv));
* any head dimension from 16 to 256, so Phi-2's 80 as well as Llama's 128;
* causal attention with the mask aligned to the bottom-right corner, which is what a model with a
  key/value cache needs (see `tutorial_flash_attention`);
* decoding steps (a few new queries against a cache) through chapter 8's decode kernel, and a static
  cache (`cache_implementation="static"`, fixed-size buffers with empty slots at the end) through the
  same kernel, which reads each sequence's first `cache_seqlens` keys: the mask function hands the
  attention function those lengths instead of a mask (`tutorial_flash_mask`);
* a sliding window that cuts keys off (Mistral, Gemma 2's local layers) and logit soft-capping
  (Gemma 2) through chapter 9's kernels, with the window_size flash-attn gets from transformers
  (W − 1, W − 1); for a sliding-window layer the mask function hands over the window's width instead of
  a mask, so the window holds even for layers that do not pass `sliding_window` themselves;
* padded batches (left or right padding, training or generate()) through chapter 9's packed kernel:
  the real tokens are gathered end to end, as transformers' own FlashAttention-2 path does;
* no dropout, no attention sinks, no padding, window or softcap through a static cache: each raises
  a ValueError that says so instead of returning a wrong answer.

Importing this module imports neither transformers (`register` does) nor touches a GPU.
"""

from __future__ import annotations

import torch

from tutorial_kernels.attention import flash_attention, flash_attention_varlen, flash_attention_with_kvcache

# Not "tutorial_flash": transformers 5 reads any implementation name containing "flash" as a request
# for the flash-attn package (`is_flash_attention_requested`) and tries to import it from the Hub.
DEFAULT_NAME = "tutorial_fa2"

_HELP = ("use attn_implementation='sdpa' (or 'eager') for inputs that need it, or run unpadded "
         "batches: one sequence, or sequences of equal length with an all-ones attention_mask")
# A call with at most this many packed rows (new queries × query heads per key/value head) is a
# decoding step: chapter 8's kernel, which splits the keys across the GPU, not chapter 5's, which
# gives each program a tile of 64 or more query rows and here would leave nearly all of them empty.
DECODE_ROWS = 64


# --8<-- [start:attention_forward]
def tutorial_flash_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, n_q, d)
    key: torch.Tensor,  # (B, H_kv, n_k, d), H_kv dividing H: not repeated
    value: torch.Tensor,  # (B, H_kv, n_k, d)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """softmax(scaling · Q Kᵀ) V through the package's kernels, in the calling convention of
    `transformers.AttentionInterface`. Returns ((B, n_q, H, d), None): attention weights are never
    formed, which is the point of the kernels. The output is contiguous.

    Causal or not comes from the `is_causal` keyword when the model passes one, else from
    `module.is_causal`, as in transformers' own SDPA path. The causal mask is aligned to the
    bottom-right corner: query i of n_q sees keys j ≤ i + (n_k − n_q). With a key/value cache that is
    exactly right: the n_q new tokens are the last n_q of n_k, and a one-token decoding step
    (n_q = 1) sees every cached key, as it must.

    `attention_mask` is None when the model needs no mask (`tutorial_flash_mask` sees to that for
    causal and unpadded inputs); for a static cache, the (B,) int32 count of each sequence's keys in
    the fixed-size buffers; for a sliding-window layer whose window bites, a 0-d tensor, its width; for a
    padded batch, the (B, n_k) mask of real tokens (boolean, or the window's width at every real token of
    a sliding-window layer), which runs unpadded through `flash_attention_varlen` (padded queries get 0). A 4-D mask that arrives anyway
    is accepted only if it hides nothing the kernel would not hide; anything else (a packed batch, an
    additive bias) raises a ValueError.

    Which kernel: at inference, a call of at most DECODE_ROWS rows (n_q × H / H_kv: a decoding step)
    and every call against a static cache go to `tutorial_kernels.flash_attention_with_kvcache`
    (chapter 8). The others go to the front door, `tutorial_kernels.flash_attention`, which picks the
    forward (chapter 7's Hopper kernel on a Hopper GPU where it is the faster, else chapter 5's
    autotuned kernel) and, with autograd recording (training), the backward (chapter 7's where
    `dispatch.hopper_backward_preferred`, else chapter 6's).
    """
    if dropout:
        raise ValueError(
            f"dropout: this tutorial's kernel has no attention dropout, got dropout={dropout}; call model.eval() "
            "for inference, or set config.attention_dropout = 0.0 to train without it"
        )
    for name in ("s_aux", "cu_seq_lens_q", "cu_seq_lens_k"):
        if kwargs.get(name) is not None:
            what = {"s_aux": "attention sinks"}.get(name, "packed (varlen) sequences")
            raise ValueError(f"{name}: this tutorial's kernel does not support {what}, "
                             f"got {name}={kwargs[name]!r}; {_HELP}")
    n_q, n_k = query.shape[2], key.shape[2]
    # chapter 9's variants, as transformers hands them to flash-attn: a sliding window of W keys that bites
    # is window_size (W − 1, W − 1) (the causal mask makes the right bound 0); Gemma 2's logit soft-capping
    window = kwargs.get("sliding_window")
    if attention_mask is not None and attention_mask.dim() == 0:  # `tutorial_flash_mask`'s sliding window
        window, attention_mask = int(attention_mask), None
    elif attention_mask is not None and attention_mask.dim() == 2 and attention_mask.dtype != torch.bool:
        window = int(attention_mask.max()) or window  # a padded sliding-window layer: the width at real tokens
        attention_mask = attention_mask > 0
    variants = {}
    if window is not None and n_k > window:
        variants["window_size"] = (window - 1, window - 1)
    if kwargs.get("softcap"):
        variants["softcap"] = float(kwargs["softcap"])
    is_causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if attention_mask is not None and attention_mask.dim() == 1:
        # a static cache: the mask function's (B,) lengths, each sequence's keys in the fixed-size buffers
        if window is not None:  # the lengths count the full layers' slots, not this window's buffer
            raise ValueError(
                f"sliding_window: this layer attends to a window of {window} keys through a static cache, which "
                f"this tutorial's kernels do not support; use the default (dynamic) cache, or "
                f"attn_implementation='sdpa' (or 'eager')")
        if training:
            raise ValueError("a static cache is for generation: gradients through it are not supported; train "
                             "without a cache (use_cache=False)")
        if variants:
            raise ValueError(f"softcap: logit soft-capping through a static cache is not supported by this tutorial's "
                             f"kernels (chapter 8's decode kernel has none); use the default (dynamic) cache, or "
                             f"attn_implementation='sdpa' (or 'eager')")
        out = flash_attention_with_kvcache(query, key, value, cache_seqlens=attention_mask, causal=causal,
                                           sm_scale=scaling)
        return out.transpose(1, 2).contiguous(), None  # (B, n_q, H, d): no copy for one new token
    if attention_mask is not None and attention_mask.dim() == 2:
        return _unpadded(query, key, value, attention_mask, causal, scaling, variants), None
    if attention_mask is not None:
        _check_mask_is_redundant(attention_mask, n_q, n_k, causal)
    if variants:  # chapter 9's kernels, forward and backward
        out = flash_attention(query, key, value, causal, scaling, **variants)
        return out.transpose(1, 2).contiguous(), None
    if not training and n_q * (query.shape[1] // key.shape[1]) <= DECODE_ROWS:
        # a decoding step against a growing (dynamic) cache: all n_k keys are the sequence's
        out = flash_attention_with_kvcache(query, key, value, cache_seqlens=n_k, causal=causal, sm_scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    if training:
        out = flash_attention(query, key, value, causal, scaling)  # differentiable: the front door's kernels
        return out.transpose(1, 2).contiguous(), None  # (B, n_q, H, d), the layout o_proj reads: one copy
    # At inference the kernel writes straight into a (B, n_q, H, d) buffer, through a (B, H, n_q, d)
    # view of it: no transposing copy afterwards. The front door picks the kernel: on a Hopper GPU at
    # head_dim 128 or 256 with enough queries and keys (a prefill, not a decoding step), chapter 7's;
    # elsewhere chapter 5's autotuned Triton kernel (its teaching configuration on the CPU).
    batch, heads, _, head_dim = query.shape
    if query.stride() == (n_q * heads * head_dim, head_dim, heads * head_dim, 1):
        # the query is a view of a (B, n_q, H, d) tensor, as the projections make it: a buffer like it is
        # the layout wanted, and empty_like takes a third less CPU time than empty with a shape and dtype
        out = torch.empty_like(query)
        flash_attention(query, key, value, causal, scaling, out=out)
        return out.transpose(1, 2), None
    out = torch.empty((batch, n_q, heads, head_dim), dtype=query.dtype, device=query.device)
    flash_attention(query, key, value, causal, scaling, out=out.transpose(1, 2))
    return out, None
# --8<-- [end:attention_forward]


def _unpadded(query, key, value, tokens: torch.Tensor, causal: bool, scaling, variants: dict) -> torch.Tensor:
    """A padded batch through chapter 9's packed kernel: `tokens` (B, n_k) marks each sequence's real
    keys (True); its queries are the last n_q positions. The real tokens are gathered end to end, run
    with per-sequence lengths (`flash_attention_varlen`, differentiable), and scattered back; a padded
    query's output is 0, as in transformers' FlashAttention-2 path. Reading the lengths waits for the GPU."""
    batch, heads, n_q, head_dim = query.shape
    q_tokens = tokens[:, tokens.shape[1] - n_q:]
    lengths_q, lengths_k = q_tokens.sum(1), tokens.sum(1)
    cu_q = torch.nn.functional.pad(lengths_q.cumsum(0), (1, 0)).to(torch.int32)
    cu_k = torch.nn.functional.pad(lengths_k.cumsum(0), (1, 0)).to(torch.int32)
    q = query.transpose(1, 2)[q_tokens]  # (total_q, H, d)
    k, v = key.transpose(1, 2)[tokens], value.transpose(1, 2)[tokens]  # (total_k, H_kv, d)
    packed = flash_attention_varlen(q, k, v, cu_q, cu_k, int(lengths_q.max()), int(lengths_k.max()), causal, scaling,
                                    **variants)
    out = packed.new_zeros(batch, n_q, heads, head_dim)
    out[q_tokens] = packed
    return out


def _check_mask_is_redundant(mask: torch.Tensor, n_q: int, n_k: int, causal: bool) -> None:
    """Raise unless `mask` lets every (query, key) pair through that the kernel attends to, and no other.

    transformers hands over boolean masks (True = attend) or additive float masks (0 = attend, a large
    negative number = hidden); a float mask with any other value is a bias the kernel cannot add.
    """
    if mask.dim() != 4 or mask.shape[-2:] != (n_q, n_k):
        raise ValueError(
            f"attention_mask: this tutorial's kernel accepts no mask, or a redundant 4-D mask of shape "
            f"(B, 1, {n_q}, {n_k}); got shape {tuple(mask.shape)}. It does not support padding; {_HELP}"
        )
    if mask.dtype == torch.bool:
        visible = mask
    elif not mask.is_floating_point():
        raise TypeError(
            f"attention_mask: expected a boolean mask (True = attend) or an additive float mask, got dtype "
            f"{mask.dtype}; {_HELP}"
        )
    else:
        visible = mask == 0
        hidden = mask <= torch.finfo(mask.dtype).min / 2
        if not bool((visible | hidden).all()):
            raise ValueError(
                "attention_mask: the float mask holds values other than 0 and -inf (an additive bias such as "
                f"ALiBi or a relative-position bias), which this tutorial's kernel cannot add; {_HELP}"
            )
    rows = torch.arange(n_q, device=mask.device)[:, None]
    cols = torch.arange(n_k, device=mask.device)[None, :]
    expected = cols <= rows + (n_k - n_q) if causal else torch.ones(n_q, n_k, dtype=torch.bool, device=mask.device)
    differ = int((visible != expected).sum())
    if differ:
        pattern = "bottom-right causal" if causal else "full (non-causal)"
        raise ValueError(
            f"attention_mask: this tutorial's kernel computes {pattern} attention over all {n_k} keys and "
            f"cannot apply this mask, which differs from that in {differ} of {visible.numel()} (query, key) "
            f"entries: padding, packed sequences or the empty slots of a sliding-window layer's static cache are not "
            f"supported; {_HELP}"
        )


# --8<-- [start:mask]
def tutorial_flash_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    **kwargs,
) -> torch.Tensor | None:
    """What the model passes to `tutorial_flash_attention` as its mask: None whenever the kernel's own
    masking (causal or none) is exactly the mask asked for, so no (n_q × n_k) tensor is ever built.

    Without this registration transformers would pass None for every input of a custom
    implementation, padded or not, and a padded batch would be computed wrongly without a word.

    For a static cache (causal, keys from position 0, empty slots past the sequence) it returns the
    (B,) int32 count of each sequence's keys, q_offset + q_length, computed on the GPU where q_offset
    is a tensor (no wait for the device, no graph break under torch.compile).

    A 2-D padding mask that hides a token is returned as the (B, kv_length) mask of real tokens (the
    attention function unpads with it); with a static cache it raises. Patterns the kernel cannot
    produce (packed sequences, a sliding window that bites, masks the model asked to be materialised)
    are built as transformers builds them for SDPA, and `tutorial_flash_attention` then refuses them,
    or runs if they turn out to hide nothing more.
    """
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function, sdpa_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    if attention_mask is not None and attention_mask.dim() == 1:
        # lengths this function returned already: generate() prepares a static cache's mask before the
        # forward (prepare_inputs_for_generation), and the model hands it back here
        return attention_mask
    static = isinstance(q_offset, torch.Tensor) or q_offset + q_length < kv_length
    # a sliding-window layer: local_size is the config's sliding_window (chunked attention's is its chunk size)
    config = kwargs.get("config")
    sliding = (local_size is not None and local_size == getattr(config, "sliding_window", None)
               and not getattr(config, "attention_chunk_size", None))
    if attention_mask is not None:
        seen = attention_mask[:, kv_offset : kv_offset + kv_length]
        whole = attention_mask.shape[-1] >= kv_offset + kv_length  # shorter: a static cache's empty slots follow
        if not bool(seen.all()):
            if static or not whole or not (mask_function is causal_mask_function or sliding):
                pads = int((~seen.bool()).sum())
                raise ValueError(
                    f"attention_mask: this tutorial's kernels take padding with the default (dynamic) cache, not "
                    f"with a static cache's buffers or a mask the model reshapes; the 2-D attention_mask marks "
                    f"{pads} of {seen.numel()} positions as padding (0); {_HELP}")
            # a padded batch: the attention function unpads it into chapter 9's packed (varlen) kernel, as
            # transformers' own FlashAttention-2 path does. It gets the (B, n_k) mask of the real tokens:
            # booleans, or for a sliding-window layer the window's width at every real token
            return seen.int() * local_size if sliding else seen.bool()
    else:
        whole = True
    # allow_is_causal_skip=False is transformers' own for a compileable cache's one-token step; otherwise
    # the model asks for a mask it will change (Falcon adds ALiBi to it), which lengths cannot carry
    asked_for_a_mask = not allow_is_causal_skip and not (q_length == 1 and isinstance(q_offset, torch.Tensor))
    biased = bool(getattr(kwargs.get("config"), "alibi", False))
    if (mask_function is causal_mask_function and isinstance(kv_offset, int) and kv_offset == 0 and static
            and not asked_for_a_mask and not biased):
        # a static cache (its layers give q_offset as a tensor, once filled): fixed-size buffers whose first
        # q_offset + q_length slots hold each sequence. Causal attention over just those is chapter 8's
        # kernel given their count, which is what the attention function receives instead of a mask
        return _static_cache_lengths(q_offset, q_length, batch_size, kwargs.get("device"))
    window_harmless = local_size is not None and kv_length < local_size  # transformers' own test, see sdpa_mask
    if isinstance(q_offset, torch.Tensor):
        q_offset = int(q_offset)
    # the kernel's causal mask is bottom-right aligned: right when the last query is the last key
    aligned = q_offset + q_length == kv_offset + kv_length
    if sliding and whole and aligned and allow_is_causal_skip and not window_harmless:
        # a window that bites: a 0-d tensor, the window's width, which the attention function applies
        # itself (chapter 9's kernel skips the tiles outside it), whether or not the layer passes it too
        return torch.tensor(local_size)
    plain_causal = allow_is_causal_skip and aligned and (mask_function is causal_mask_function or window_harmless)
    plain_full = allow_is_bidirectional_skip and (mask_function is bidirectional_mask_function or window_harmless)
    if whole and (plain_causal or plain_full):
        return None
    return sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        mask_function=mask_function, attention_mask=attention_mask, local_size=local_size,
        allow_is_causal_skip=False, allow_is_bidirectional_skip=False, **kwargs,
    )
# --8<-- [end:mask]


def _static_cache_lengths(q_offset, q_length: int, batch_size: int, device) -> torch.Tensor:
    """(B,) int32: q_offset + q_length for every sequence (q_offset an int, or a static cache's 0-d tensor)."""
    if isinstance(q_offset, torch.Tensor):
        return (q_offset.reshape(1) + q_length).to(torch.int32).repeat(batch_size)
    return torch.full((batch_size,), q_offset + q_length, dtype=torch.int32, device=device)


# --8<-- [start:register]
def register(name: str = DEFAULT_NAME) -> str:
    """Make `name` an attention implementation transformers accepts, and return it.

    Adds `tutorial_flash_attention` to `AttentionInterface` (what each layer calls) and
    `tutorial_flash_mask` to `AttentionMaskInterface` (what mask the model builds for it). Both are
    process-wide dictionaries, so calling again, from any module, changes nothing.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {type(name).__name__} {name!r}")
    if "flash" in name or "/" in name or "|" in name:
        # transformers parses these: "flash" → the flash-attn package, "org/repo" → a Hub kernel, "paged|…"
        raise ValueError(f"name must not contain 'flash', '/' or '|', which transformers reads as other "
                         f"implementations (flash-attn, Hub kernels, paged attention); got {name!r}")
    taken = AttentionInterface._global_mapping.get(name, tutorial_flash_attention)
    if name == "eager" or taken is not tutorial_flash_attention:
        raise ValueError(f"name {name!r} is already an attention implementation of transformers; choose another")
    AttentionInterface.register(name, tutorial_flash_attention)
    AttentionMaskInterface.register(name, tutorial_flash_mask)
    return name
# --8<-- [end:register]
