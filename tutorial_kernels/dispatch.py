"""Which kernel runs a front-door call: the rules in one place, a way to pin or exclude kernels, and why.

    from tutorial_kernels import attention_kernels, explain
    print(explain(q, k, v, causal=True))              # which kernels would run, and why the others do not
    with attention_kernels("triton-tuned"):            # like torch.nn.attention.sdpa_kernel
        o = flash_attention(q, k, v, causal=True)      # chapter 5's and 6's kernels only

The kernels, in the order the front door prefers them where more than one can run a call:

* "hopper": chapter 7's Gluon kernels (FlashAttention-3's schedule), on a Hopper GPU, head_dim 64, 128
  or 256 (the backward 64 or 128), where they were measured faster than chapter 5's and 6's kernels:
  the rules of `perf/rules_sm90.json` (`RULES`, `hopper_forward_preferred`, `hopper_backward_preferred`;
  the site's "Which kernel runs a call" page shows the table with the measurement behind each rule);
* "triton-tuned": chapter 5's forward and chapter 6's backward, tiles from the measured table, on any
  CUDA GPU;
* "triton-interpreter": the same kernels in Triton's interpreter, on the CPU.

A window alone follows the forward's choice ("hopper": chapter 7's kernels with its bounds; otherwise
chapter 9's); softcap, ALiBi, masks, hooks, packed batches and decoding have one kernel family each and are not
pinned. Pins apply to the calls made inside the block, eagerly or traced by torch.compile there (a
compiled graph keeps the pins it was traced under); a backward keeps the pins its forward ran under.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch

from tutorial_kernels import ch07_hopper, ch07_hopper_backward

KERNELS = ("hopper", "triton-tuned", "triton-interpreter")  # in the order of preference
# The rules for Hopper (sm90), one table with the measurement behind each (the only architecture with a
# kernel of its own: elsewhere chapter 5's and 6's kernels run every call)
RULES_FILE = Path(__file__).parent / "perf" / "rules_sm90.json"
RULES = {name: rule["value"] for name, rule in json.loads(RULES_FILE.read_text())["rules"].items()}
_ALLOWED: contextvars.ContextVar[frozenset | None] = contextvars.ContextVar("attention_kernels", default=None)


class NoAllowedKernel(RuntimeError):
    """No kernel the enclosing `attention_kernels` block allows can run the call (the message says why each
    cannot)."""


def _names(given, what: str) -> tuple[str, ...]:
    """A kernel's name, or a list or tuple of them, as torch.nn.attention.sdpa_kernel takes its backends."""
    if not isinstance(given, (str, list, tuple, set, frozenset)):
        raise TypeError(f"attention_kernels: {what} must be a kernel's name or a list of names, got "
                        f"{type(given).__name__} {given!r}")
    names = (given,) if isinstance(given, str) else tuple(given)
    for name in names:
        if name not in KERNELS:
            raise ValueError(f"attention_kernels: unknown kernel {name!r} in {what}; the kernels are "
                             f"{', '.join(KERNELS)}")
    return names


@contextlib.contextmanager
def attention_kernels(*kernels: str | list[str] | tuple[str, ...],
                      exclude: str | list[str] | tuple[str, ...] = ()) -> Iterator[None]:
    """Within the block, the front door runs only `kernels` (names, or one list of them; all of KERNELS if
    none are named) less `exclude` (a name or a list); a call none of them can run raises NoAllowedKernel
    (a RuntimeError) saying why each could not. An inner block replaces the outer one's choice for its calls, as
    torch.nn.attention.sdpa_kernel does. Raises ValueError naming an unknown kernel."""
    named = tuple(name for given in kernels for name in _names(given, "kernels"))
    allowed = frozenset(named or KERNELS) - frozenset(_names(exclude, "exclude"))
    with pinned(allowed):
        yield


def allowed_kernels() -> frozenset | None:
    """The kernels the enclosing `attention_kernels` block allows, None outside any (all of them)."""
    return _ALLOWED.get()


@contextlib.contextmanager
def pinned(allowed: frozenset | None) -> Iterator[None]:
    """Run under a set of allowed kernels saved earlier (`allowed_kernels()`): a backward under its forward's."""
    token = _ALLOWED.set(allowed)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def pins_as_text(allowed: frozenset | None) -> str:
    """The pins as an operator's argument (torch.compile keeps them in the graph): "" for none, else the
    allowed kernels joined by commas ("," for a block that allows nothing)."""
    return "" if allowed is None else ",".join(sorted(allowed)) or ","


def pins_from_text(text: str) -> frozenset | None:
    """`pins_as_text`'s inverse."""
    return None if text == "" else frozenset(name for name in text.split(",") if name)


class Choice(NamedTuple):
    """A kernel picked for a call: its name and, for every kernel considered, why it does not run the call
    (None for those that could)."""
    kernel: str
    considered: tuple[tuple[str, str | None], ...]


def _nothing_to_compute(q: torch.Tensor, k: torch.Tensor) -> bool:
    """No query, or no key: PyTorch's answer needs no kernel (an empty output, or zeros without keys)."""
    return q.numel() == 0 or k.shape[2] == 0


def hopper_forward_preferred(q: torch.Tensor, k: torch.Tensor, causal: bool) -> bool:
    """Whether chapter 7's forward was measured faster than chapter 5's kernel on inputs like these (RULES:
    forward_head_dims; from forward_min_keys_persistent queries and keys where its launch is persistent,
    `ch07_hopper.runs_persistent`, from forward_min_keys otherwise). Not whether it can run them:
    `ch07_hopper.hopper_kernel_unavailable` says that."""
    if q.shape[3] not in RULES["forward_head_dims"]:
        return False
    n = min(q.shape[2], k.shape[2])
    if n >= RULES["forward_min_keys"]:
        return True
    if n < RULES["forward_min_keys_persistent"] or k.numel() == 0:
        return False
    l2_bytes = ch07_hopper.l2_bytes(q.device)
    return ch07_hopper.runs_persistent(2 * k.numel() * k.element_size(), k.shape[0] * k.shape[1], causal, l2_bytes)


def _backward_min_keys(head_dim: int, causal: bool) -> int | None:
    return RULES["backward_min_keys"].get(str(head_dim), {}).get("causal" if causal else "full")


def hopper_backward_preferred(q: torch.Tensor, k: torch.Tensor, causal: bool) -> bool:
    """Whether chapter 7's backward was measured faster than chapter 6's kernels on inputs like these (RULES:
    backward_min_keys per head dimension and mask); whether it can run them is
    `ch07_hopper_backward.hopper_backward_unavailable`."""
    least = _backward_min_keys(q.shape[3], causal)
    return least is not None and min(q.shape[2], k.shape[2]) >= least


def _hopper_not_preferred(q: torch.Tensor, k: torch.Tensor, causal: bool, backward: bool) -> str | None:
    """Why chapter 7's kernel, though it could run the call, was measured slower than chapter 5's or 6's there."""
    n = min(q.shape[2], k.shape[2])
    if backward:
        if hopper_backward_preferred(q, k, causal):
            return None
        least = _backward_min_keys(q.shape[3], causal)
        if least is None:
            return f"is built for head_dim {' or '.join(RULES['backward_min_keys'])}, got {q.shape[3]}"
        return f"was measured faster than chapter 6's kernels from {least} keys at this head_dim, got {n}"
    if hopper_forward_preferred(q, k, causal):
        return None
    if q.shape[3] not in RULES["forward_head_dims"]:
        return f"was measured no faster than chapter 5's kernel at head_dim {q.shape[3]}"
    return (f"was measured faster than chapter 5's kernel from {RULES['forward_min_keys_persistent']} keys where "
            f"the K and V fit the L2 cache, and from {RULES['forward_min_keys']} otherwise, got {n}")


def _choose(considered: list[tuple[str, str | None]], what: str) -> Choice:
    """The first kernel that can run the call and is allowed; NoAllowedKernel if none."""
    allowed = _ALLOWED.get()
    marked = [(name, why if allowed is None or name in allowed or why is not None else "excluded by attention_kernels")
              for name, why in considered]
    for name, why in marked:
        if why is None:
            return Choice(name, tuple(marked))
    reasons = "; ".join(f"{name} {why}" for name, why in marked)
    raise NoAllowedKernel(f"attention_kernels: no allowed kernel runs this {what} ({reasons})")


def _candidates(q: torch.Tensor, hopper_why) -> list[tuple[str, str | None]]:
    """Every kernel with why it cannot run the call (None if it can); `hopper_why()` asked on a GPU only."""
    if not q.is_cuda:
        on_cpu = "needs a CUDA GPU, got the CPU"
        return [("hopper", on_cpu), ("triton-tuned", on_cpu), ("triton-interpreter", None)]
    return [("hopper", hopper_why()), ("triton-tuned", None), ("triton-interpreter", "runs on the CPU only")]


def forward_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, *,
                   out: torch.Tensor | None = None) -> Choice:
    """The forward kernel for these (validated) inputs, and why each other one does not run them. "none" for
    a call with no query or no key. The Hopper kernel writes `out` with its head dimension contiguous."""
    if _nothing_to_compute(q, k):
        return Choice("none", ())
    return _choose(_candidates(q, lambda: (
        ch07_hopper.hopper_kernel_unavailable(q, k, v) or _hopper_not_preferred(q, k, causal, False)
        or (None if out is None or out.stride(3) == 1 else "writes out with its head dimension contiguous"))),
        "forward")


def backward_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool) -> Choice:
    """The backward kernel for these inputs and dO, and why each other one does not run them. Under
    `torch.use_deterministic_algorithms(True)` never "hopper": its dQ sums in no fixed order."""
    if _nothing_to_compute(q, k):
        return Choice("none", ())
    return _choose(_candidates(q, lambda: (
        "sums dQ in no fixed order, and torch.use_deterministic_algorithms(True) is set"
        if torch.are_deterministic_algorithms_enabled() else
        ch07_hopper_backward.hopper_backward_unavailable(q, k, v, do) or _hopper_not_preferred(q, k, causal, True))),
        "backward")


def kernel_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, *,
               out: torch.Tensor | None = None) -> str:
    """The forward kernel's name (`forward_choice`): "hopper", "triton-tuned", "triton-interpreter" or "none"."""
    return forward_choice(q, k, v, causal, out=out).kernel


def backward_kernel_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool) -> str:
    """The backward kernel's name (`backward_choice`)."""
    return backward_choice(q, k, v, do, causal).kernel


DESCRIPTIONS = {"hopper": "chapter 7's Gluon kernel, FlashAttention-3's schedule",
                "triton-tuned": "chapter 5's Triton kernel (backward: chapter 6's), tiles from the measured table",
                "triton-interpreter": "chapter 5's Triton kernel (backward: chapter 6's) in Triton's interpreter",
                "none": "no kernel: no query or no key (PyTorch's answer: empty, or zeros)"}


def explain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, *,
            window_size: tuple[int, int] = (-1, -1), training: bool | None = None) -> str:
    """Which kernels `flash_attention(q, k, v, causal, window_size=window_size)` would run for these tensors,
    and why each other kernel would not: a few lines of text. training: whether the backward is wanted too
    (default: as autograd would, grad mode on and any of q, k, v requiring grad). Runs nothing; raises as
    the call would for inputs it refuses."""
    from tutorial_kernels.validation import check_attention_inputs, check_window_size

    check_attention_inputs(q, k, v, causal, None, max_head_dim=256, allow_gqa=True, allow_empty=True)
    windowed = tuple(check_window_size(window_size)) != (-1, -1)
    if training is None:
        training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    lines = []
    for what in ("forward", "backward") if training else ("forward",):
        try:
            choice = forward_choice(q, k, v, causal) if what == "forward" else backward_choice(q, k, v, q, causal)
        except NoAllowedKernel as refused:  # nothing allowed runs it: the call raises the same, unless windowed
            if not (windowed and what == "backward"):
                raise
            choice = Choice("refused", (("every plain kernel", str(refused)),))
        if windowed and choice.kernel != "hopper":  # a window runs chapter 7's kernels, or else chapter 9's
            why = dict(choice.considered).get("hopper") or "; ".join(filter(None, dict(choice.considered).values()))
            lines.append(f"{what}: chapter 9's Triton kernels with the window's tile bounds (hopper: {why})")
            continue
        lines.append(f"{what}: {choice.kernel} — {DESCRIPTIONS[choice.kernel]}"
                     + (", with the window's tile bounds" if windowed else ""))
        lines += [f"  {name}: {'could run it' if why is None else why}" for name, why in choice.considered
                  if name != choice.kernel]
    return "\n".join(lines)


__all__ = ["attention_kernels", "allowed_kernels", "explain", "forward_choice", "backward_choice", "kernel_for",
           "backward_kernel_for", "hopper_forward_preferred", "hopper_backward_preferred", "NoAllowedKernel", "KERNELS",
           "RULES"]
