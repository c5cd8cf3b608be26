"""Lab 6's capstone (`ch06.autograd`): the learner wraps chapter 5's forward and chapter 6's backward in a
`torch.autograd.Function` and trains chapter 6's small GPT with it, on the CPU.

The grader checks the Function as PyTorch will use it: O and the three gradients against float64 autograd on
small odd cases (causal and not, n_q ≠ n_k, grouped-query heads, a scale other than 1/√d); that what it keeps
for the backward is O(N·d) numbers (never the n_q × n_k matrix P), read through
`torch.autograd.graph.saved_tensors_hooks`; and that a tiny GPT trained with it for a few steps follows the same
model trained with torch's attention.
"""

from __future__ import annotations

import torch

from tutorial_kernels.ch06_backward import FlashAttentionFunction
from tutorial_kernels.labs.steps import AttentionCase, Failure, Mistake, recognised
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.runtime import default_device, interpreter_active
from tutorial_kernels.tolerances import grad_tolerance, tolerance


class LabAttention_skeleton(torch.autograd.Function):
    """softmax(sm_scale · Q Kᵀ) V, differentiable. forward(ctx, q, k, v, causal, sm_scale, tuned) returns O;
    backward(ctx, dO) returns one gradient per forward argument (None for those that are not tensors).
    The kernels: flash_attn_v2_with_lse(q, k, v, causal, sm_scale, tuned=tuned) → (O, lse) (chapter 5) and
    flash_attn_backward(q, k, v, o, lse, do, causal, sm_scale, tuned=tuned) → (dQ, dK, dV) (chapter 6). Keep
    for the backward only O(N·d) numbers: never the n_q × n_k matrix P."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, tuned):
        # TODO: the forward kernel with its log-sum-exp; keep what the backward will need
        return torch.zeros_like(q)

    @staticmethod
    def backward(ctx, do):
        # TODO: the backward kernels, from what the forward kept
        return None, None, None, None, None, None


LabAttention = FlashAttentionFunction  # the solution: chapter 6's own Function

SCALE = 0.3  # not 1/√d: a Function that drops sm_scale somewhere is caught
CASES = [  # (case, query heads, key/value heads)
    (AttentionCase(17, 17, False, torch.float32), 2, 2), (AttentionCase(17, 17, True, torch.float32), 2, 2),
    (AttentionCase(17, 40, True, torch.float32), 2, 2), (AttentionCase(40, 17, True, torch.float32), 4, 2),
    (AttentionCase(33, 33, True, torch.float16), 2, 1),
]
TEXT = "attention is all you need, and memory is all attention needs. " * 40


def _draw(case: AttentionCase, heads: int, kv_heads: int, seed: int) -> list[torch.Tensor]:
    """Fresh q, k, v and dO of a case, in its dtype on the default device."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, case.n_q, case.head_dim, generator=g)
    k, v = (torch.randn(1, kv_heads, case.n_k, case.head_dim, generator=g) for _ in "kv")
    do = torch.randn(1, heads, case.n_q, case.head_dim, generator=g)
    return [t.to(default_device(), case.dtype) for t in (q, k, v, do)]


def _answer64(q, k, v, do, causal: bool, scale: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """O and (dQ, dK, dV) of the float64 reference attention."""
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = reference_attention(*leaves64, causal, scale)
    want.backward(do.double())
    return want.detach(), [t.grad for t in leaves64]


def _run(fn, case: AttentionCase, heads: int, kv_heads: int, seed: int, scale: float = SCALE):
    """O and (dQ, dK, dV) of fn.apply on fresh inputs, the float64 answers, and the largest saved tensor."""
    q, k, v, do = _draw(case, heads, kv_heads, seed)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = fn.apply(*leaves, case.causal, scale, False)
    out.backward(do)
    want, want_grads = _answer64(q, k, v, do, case.causal, scale)
    return out, [t.grad for t in leaves], want, want_grads, max(saved, default=0), (q, k)


AUTOGRAD_MISTAKES = (
    Mistake("unchanged", "O came out as zeros: forward must return the kernel's O (flash_attn_v2_with_lse returns "
            "(O, lse): keep lse for the backward, return O).", lambda t: t["what"] == "O" and t["zeros"]),
    Mistake("no_grads", "The gradients are missing (None or zeros): backward must return (dQ, dK, dV, None, None, None) "
            "from flash_attn_backward, given the tensors the forward kept (ctx.save_for_backward, ctx.saved_tensors).",
            lambda t: t["what"] != "O" and t["zeros"]),
    Mistake("causal", "The result is what the other mask gives: pass `causal` to both kernels (keep it on ctx for the "
            "backward).", lambda t: t["matches_other_mask"]),
    Mistake("scale", "Right at the default scale 1/√d, wrong at sm_scale = 0.3: pass sm_scale to both kernels (keep "
            "it on ctx for the backward).", lambda t: t["right_at_default_scale"]),
    Mistake("saves_p", "The Function kept a tensor as large as the n_q × n_k matrix P for the backward: FlashAttention "
            "keeps q, k, v, O and the log-sum-exp, O(N·d) numbers, and recomputes P tile by tile.",
            lambda t: t["what"] == "memory"),
)


def grade_autograd(fn) -> tuple[int, int, Failure | None]:
    total = len(CASES) + 2
    for i, (case, heads, kv_heads) in enumerate(CASES):
        where = f"{case}, {heads} query heads on {kv_heads} key/value heads, sm_scale={SCALE}"
        try:
            out, grads, want, want_grads, _, _ = _run(fn, case, heads, kv_heads, 1806 + i)
        except Exception as exc:  # noqa: BLE001 — the learner's Function: say what PyTorch said
            message = str(exc).strip().splitlines()
            hint = ("backward returns one value per forward argument: dQ, dK, dV, then None for causal, sm_scale "
                    "and tuned." if "incorrect number of gradients" in str(exc) else
                    "Follow the docstring: forward calls flash_attn_v2_with_lse and keeps (q, k, v, O, lse) with "
                    "ctx.save_for_backward; backward calls flash_attn_backward on them and dO.")
            return i, total, Failure(where, f"it raised {type(exc).__name__}: " + (message[-1] if message else ""), [hint])
        for what, got, expected, bound in (("O", out, want, tolerance(case.dtype)),) + tuple(
                (name, g, w, grad_tolerance(case.dtype)) for name, g, w in zip(("dQ", "dK", "dV"), grads, want_grads)):
            if got is not None and relative_error(got, expected) <= bound:
                continue
            trial = dict(what=what, zeros=got is None or bool((got == 0).all()),
                         matches_other_mask=_matches_other_mask(case, heads, kv_heads, 1806 + i, what, got, bound),
                         right_at_default_scale=_right_at_default_scale(fn, case, heads, kv_heads, 1806 + i))
            detail = "missing (None)" if got is None else f"relative error {relative_error(got, expected):.2e} > {bound:.0e}"
            return i, total, Failure(where, f"{what}: {detail}", recognised(AUTOGRAD_MISTAKES, trial) or [
                "Compare your forward and backward with the chapter's Function, line by line."])
    # memory, where P (n_q × n_k per head) is larger than Q, K, V or O (n × d): nothing kept is larger than those
    case = AttentionCase(70, 70, True, torch.float32)
    *_, largest, (q, k) = _run(fn, case, 2, 2, 1806 + len(CASES))
    if largest > max(q.numel(), k.numel()):
        return len(CASES), total, Failure(
            f"{case}, 2 heads", f"a tensor of {largest} elements was kept for the backward; Q, K, V and O have "
            f"{q.numel()} each, P would have {2 * case.n_q * case.n_k}", recognised(AUTOGRAD_MISTAKES, dict(
                what="memory", zeros=False, matches_other_mask=False, right_at_default_scale=False)))
    return _grade_training(fn, len(CASES) + 1, total)


def _right_at_default_scale(fn, case, heads, kv_heads, seed) -> bool:
    """Whether the Function passes this case at sm_scale = 1/√d: then it drops sm_scale somewhere."""
    try:
        out, grads, want, want_grads, _, _ = _run(fn, case, heads, kv_heads, seed, scale=case.head_dim ** -0.5)
    except Exception:  # noqa: BLE001
        return False
    return relative_error(out, want) <= tolerance(case.dtype) and all(
        g is not None and relative_error(g, w) <= grad_tolerance(case.dtype) for g, w in zip(grads, want_grads))


def _matches_other_mask(case, heads, kv_heads, seed, what, got, bound) -> bool:
    """Whether `got` is the reference with the other causal flag: what a dropped `causal` gives."""
    if got is None or case.n_q == case.n_k == 1:
        return False
    q, k, v, do = _draw(case, heads, kv_heads, seed)
    out, grads = _answer64(q, k, v, do, not case.causal, SCALE)
    wrong = out if what == "O" else grads[("dQ", "dK", "dV").index(what)]
    return relative_error(got, wrong) <= 3 * bound


def _grade_training(fn, passed: int, total: int) -> tuple[int, int, Failure | None]:
    """A one-layer GPT trained 12 steps with the Function and with torch's attention: the loss falls, and the
    curves agree (same seed, same data)."""
    from tutorial_kernels.integrations.gpt import CharCorpus, GPTConfig, train

    corpus = CharCorpus(TEXT)
    config = GPTConfig(vocab_size=corpus.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32)
    ours = train(lambda q, k, v: fn.apply(q, k, v, True, q.shape[-1] ** -0.5, False), 12, config=config,
                 batch_size=4, corpus=corpus, seed=3, device=default_device())
    torch_losses = train("torch", 12, config=config, batch_size=4, corpus=corpus, seed=3, device=default_device())
    where = "a one-layer GPT (2 heads of 16), 12 training steps, causal"
    if not ours[-1] < 0.8 * ours[0]:
        return passed, total, Failure(where, f"the loss did not fall: {ours[0]:.3f} → {ours[-1]:.3f}", [
            "Every case above passed, so check that the Function returns O itself (not a copy detached from autograd)."])
    bound = 1e-3 if interpreter_active() else 2e-2  # on a GPU, float32 products run in TF32
    worst = max(abs(a - b) for a, b in zip(ours, torch_losses))
    if worst >= bound:
        return passed, total, Failure(where, f"the loss curve left torch's by {worst:.2e} (allowed {bound:.0e})", [
            "Compare your Function with the chapter's: the model must train as with torch's attention."])
    return total, total, None


__all__ = ["LabAttention", "LabAttention_skeleton", "AUTOGRAD_MISTAKES", "grade_autograd"]
