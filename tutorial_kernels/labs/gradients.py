"""Grading gradients (the labs of chapters 6 and 7): a case's inputs with what the forward saved, the float64
answers, and how a wrong gradient is described to the learner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tutorial_kernels.labs.steps import AttentionCase, Failure, Mistake, draw, recognised
from tutorial_kernels.reference import reference_attention, reference_log_sum_exp, reference_scores, relative_error

SEED = 2206  # the inputs of case i are drawn from SEED + i: every report can be replayed


@dataclass
class GradAttempt:
    """The learner's output on one case, with what a detector needs: the inputs, what the forward
    saved (O in the input dtype, lse and Δ in float32) and the float64 answer."""

    case: AttentionCase
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    o: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor
    got: torch.Tensor
    expected: torch.Tensor
    bound: float  # the dtype's tolerance for this quantity

    def matches(self, wrong: torch.Tensor) -> bool:
        """Whether the output is, within the dtype's tolerance, this wrong answer."""
        return bool(torch.isfinite(self.got).all()) and relative_error(self.got, wrong) <= 3 * self.bound


def draw_backward(case: AttentionCase, seed: int) -> dict[str, torch.Tensor]:
    """Fresh random q, k, v and dO, and what the forward would have saved: O (rounded to the dtype), the
    log-sum-exp (float32, −∞ for a query that sees no key) and Δ = rowsum(dO ∘ O) (float32)."""
    q, k, v = draw(case, seed)
    gen = torch.Generator(device=q.device).manual_seed(seed + 10_000)
    do = torch.randn(q.shape, generator=gen, device=q.device).to(case.dtype)
    o = reference_attention(q, k, v, case.causal).to(case.dtype)
    lse = reference_log_sum_exp(reference_scores(q, k, case.causal)).float()
    delta = (do.float() * o.float()).sum(dim=-1)
    return dict(q=q, k=k, v=v, do=do, o=o, lse=lse, delta=delta)


def dq_autograd64(q, k, v, do, causal: bool) -> torch.Tensor:
    """dQ of the float64 reference attention for the upstream gradient dO: the answer."""
    q64 = q.detach().double().requires_grad_()
    reference_attention(q64, k.double(), v.double(), causal).backward(do.double())
    return q64.grad


def describe(got: torch.Tensor, expected: torch.Tensor, bound: float, what: str,
             axes: tuple[str, ...] = ("head", "query row", "column")) -> str | None:
    """None when `got` is within `bound` (‖got − expected‖ / ‖expected‖) of `expected`; else where and by
    how much it is wrong. `got` is (1, *axes)."""
    err = relative_error(got, expected)
    if err <= bound:
        return None
    got64, exp64 = got.double().cpu()[0], expected.double().cpu()[0]
    diff = (got64 - exp64).abs()
    bad = ~torch.isfinite(got64) | (diff > 10 * bound * max(1.0, exp64.abs().max().item()))
    index = tuple(bad.nonzero()[0].tolist()) if bad.any() else tuple(torch.unravel_index(diff.argmax(), diff.shape))
    where = ", ".join(f"{axis} {int(i)}" for axis, i in zip(axes, index))
    lines = [f"relative error of {what} {err:.2e} > {bound:.0e} allowed for this dtype",
             f"first wrong element: {where}: expected {exp64[index].item():+.5f}, got {got64[index].item():+.5f}"]
    broken = int((~torch.isfinite(got64)).sum())
    if broken:
        lines.append(f"{broken} elements hold NaN or ±inf")
    return "\n".join(lines)


def grade_backward(run: Callable[[AttentionCase, dict], torch.Tensor],
                   answer: Callable[[AttentionCase, dict], torch.Tensor], bound: Callable[[torch.dtype], float],
                   cases: list[AttentionCase], mistakes: tuple[Mistake, ...], generic_hint: str, what: str,
                   axes: tuple[str, ...]) -> tuple[int, int, Failure | None]:
    """Run `run(case, inputs)` on every case in order against `answer(case, inputs)`; (cases passed,
    cases, the first failure or None), the failure with the hints of the mistakes it looks like."""
    for i, case in enumerate(cases):
        x = draw_backward(case, SEED + i)
        expected = answer(case, x)
        try:
            got = run(case, x)
        except Exception as exc:  # the learner's code did not compile or run: say what Triton said
            message = str(exc).strip().splitlines()
            return i, len(cases), Failure(str(case), f"the kernel raised {type(exc).__name__}: "
                                          + (message[-1] if message else ""), [generic_hint])
        detail = describe(got, expected, bound(case.dtype), what, axes)
        if detail is None:
            continue
        attempt = GradAttempt(case, **x, got=got, expected=expected, bound=bound(case.dtype))
        hints = recognised(mistakes, attempt)
        return i, len(cases), Failure(str(case), detail, hints or [generic_hint])
    return len(cases), len(cases), None
