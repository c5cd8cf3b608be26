"""What every lab step shares: the cases it is graded on, the float64 answers (right and typically
wrong) it is compared with, and how a failure is described to the learner.

A step runs the learner's function on a list of small odd cases, in order from the simplest; the
first case that fails becomes a `Failure` (which case, the first wrong element, expected vs got),
and every `Mistake` of the step whose detector recognises the wrong output adds its hint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from tutorial_kernels.inputs import random_qkv
from tutorial_kernels.reference import reference_attention, relative_error
from tutorial_kernels.tolerances import tolerance

DTYPES = (torch.float32, torch.float16)  # bfloat16 needs a GPU (the interpreter computes it wrongly)
LENGTHS = ((1, 1), (17, 17), (70, 70), (17, 70), (70, 17))  # (n_q, n_k): one key, ragged tiles, both ways unequal


@dataclass(frozen=True)
class AttentionCase:
    """One graded call: q (1, 2, n_q, head_dim), k and v (1, 2, n_k, head_dim)."""

    n_q: int
    n_k: int
    causal: bool
    dtype: torch.dtype
    head_dim: int = 24  # not a power of two: the kernel pads it to 32 columns

    def __str__(self) -> str:
        return (f"n_q={self.n_q}, n_k={self.n_k}, head_dim={self.head_dim}, causal={self.causal}, "
                f"dtype={str(self.dtype).removeprefix('torch.')}")


def attention_cases(causal: tuple[bool, ...] = (False, True)) -> list[AttentionCase]:
    """Every length pair, non-causal before causal, float32 before float16: the first failure is the simplest."""
    return [AttentionCase(n_q, n_k, c, dtype) for dtype in DTYPES for c in causal for n_q, n_k in LENGTHS]


@dataclass
class Attempt:
    """The learner's output on one case, with what a detector needs to recognise a mistake."""

    case: AttentionCase
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    got: torch.Tensor
    expected: torch.Tensor
    passed_before: list[AttentionCase] = field(default_factory=list)

    def matches(self, wrong: torch.Tensor) -> bool:
        """Whether the output is, within the dtype's tolerance, this wrong answer."""
        return bool(torch.isfinite(self.got).all()) and relative_error(self.got, wrong) <= 3 * tolerance(self.case.dtype)


@dataclass(frozen=True)
class Mistake:
    """A typical mistake of one step: its name (used by the tests), the hint, and a detector."""

    name: str
    hint: str
    detect: Callable[[Attempt], bool]


@dataclass
class Failure:
    """The first case that failed: what to tell the learner."""

    case: str
    detail: str
    hints: list[str]


def draw(case: AttentionCase, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = random_qkv(1, 2, case.n_q, case.n_k, case.head_dim, case.dtype, seed=seed)  # default device
    return x.q, x.k, x.v


def sm_scale(case: AttentionCase) -> float:
    return 1.0 / math.sqrt(case.head_dim)


def attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                visible: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scale · Q Kᵀ) V in float64 with an explicit (n_q, n_k) visibility mask: the wrong answers
    a mistake produces are this with another mask or scale. A row that sees no key is zeros."""
    s = (q.double() @ k.double().transpose(-2, -1)) * scale  # (B, H, n_q, n_k)
    if visible is not None:
        s = s.masked_fill(~visible, -math.inf)
    row_max = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(row_max), row_max, 0.0))
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0) @ v.double()


def visibility(n_q: int, n_k: int, device, offset: int, strict: bool = False) -> torch.Tensor:
    """(n_q, n_k) mask: key c visible to query r when c ≤ r + offset (c < r + offset when strict)."""
    rows = torch.arange(n_q, device=device)[:, None]
    cols = torch.arange(n_k, device=device)[None, :]
    return cols < rows + offset if strict else cols <= rows + offset


def tiled64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, visible: torch.Tensor | None,
            block_n: int, *, rescale_acc: bool = True, rescale_l: bool = True) -> torch.Tensor:
    """The online-softmax loop over key tiles in float64, with the rescales optionally forgotten:
    what a kernel with that mistake computes."""
    s_all = (q.double() @ k.double().transpose(-2, -1)) * scale
    if visible is not None:
        s_all = s_all.masked_fill(~visible, -math.inf)
    shape = s_all.shape[:-1]
    m = torch.full(shape, -math.inf, dtype=torch.float64, device=q.device)
    l = torch.zeros(shape, dtype=torch.float64, device=q.device)
    acc = torch.zeros(*shape, v.shape[-1], dtype=torch.float64, device=q.device)
    for start in range(0, k.shape[-2], block_n):
        s = s_all[..., start:start + block_n]
        m_new = torch.maximum(m, s.amax(dim=-1))
        shift = torch.where(torch.isfinite(m_new), m_new, 0.0)
        p = torch.exp(s - shift[..., None])
        alpha = torch.exp(m - shift)
        l = (l * alpha if rescale_l else l) + p.sum(dim=-1)
        acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v.double()[..., start:start + block_n, :]
        m = m_new
    return torch.where(l[..., None] > 0, acc / torch.where(l > 0, l, 1.0)[..., None], 0.0)


class SlackWritten(ValueError):
    """A store wrote past the end of one of the lab's buffers, into the slack the lab leaves after it.
    Without the slack, Triton's interpreter writes over memory the process does not own and kills it
    (and the learner's notebook kernel with it)."""


def with_slack(size: int, slack: int, fill: float, dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(a flat buffer of size + slack elements, all `fill`, and a view of its first `size`): the kernel gets
    the view; `check_slack` then says whether a store reached past it."""
    buffer = torch.full((size + slack,), fill, dtype=dtype, device=device)
    return buffer, buffer[:size]


def check_slack(buffer: torch.Tensor, size: int, fill: float, name: str, what: str) -> None:
    """Raise SlackWritten naming `name` (`what` it holds) if an element after its first `size` is no longer
    `fill` (NaN compares as NaN)."""
    slack = buffer[size:]
    written = ~(torch.isnan(slack) if fill != fill else slack == fill)
    if bool(written.any()):
        first = int(written.nonzero()[0])
        raise SlackWritten(f"a store wrote past the end of {name} ({what}): {int(written.sum())} slots after it "
                           f"were written, the first at {name}[{size + first}]")


def compare(case: AttentionCase, got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when `got` is within the dtype's bound of `expected`; else where and by how much it is wrong."""
    err = relative_error(got, expected)
    bound = tolerance(case.dtype)
    if err <= bound:
        return None
    got64, exp64 = got.double().cpu(), expected.double().cpu()
    diff = (got64 - exp64).abs()
    bad = ~torch.isfinite(got64) | (diff > 10 * bound * max(1.0, exp64.abs().max().item()))
    index = bad.nonzero()[0].tolist() if bad.any() else list(divmod_index(int(diff.argmax()), diff.shape))
    _, head, row, col = index
    nan_rows = int((~torch.isfinite(got64)).any(dim=-1).sum())
    lines = [f"relative error {err:.2e} > {bound:.0e} allowed for this dtype",
             f"first wrong element: head {head}, query row {row}, column {col}: "
             f"expected {exp64[tuple(index)].item():+.5f}, got {got64[tuple(index)].item():+.5f}"]
    if nan_rows:
        lines.append(f"{nan_rows} output rows hold NaN or ±inf")
    return "\n".join(lines)


def divmod_index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """A flat index into `shape` as one index per axis."""
    index = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))


def grade_attention(run: Callable[[AttentionCase, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                    cases: list[AttentionCase], mistakes: list[Mistake], generic_hint: str,
                    seed: int = 2205) -> tuple[int, Failure | None]:
    """Run `run(case, q, k, v) -> o` on every case in order; (cases passed, the first failure or None)."""
    passed: list[AttentionCase] = []
    for i, case in enumerate(cases):
        q, k, v = draw(case, seed + i)
        expected = reference_attention(q, k, v, case.causal)
        try:
            got = run(case, q, k, v)
        except Exception as exc:  # the learner's code did not compile or run: say what Triton said
            message = str(exc).strip().splitlines()
            return len(passed), Failure(str(case), f"the kernel raised {type(exc).__name__}: "
                                        + (message[-1] if message else ""), [generic_hint])
        detail = compare(case, got, expected)
        if detail is None:
            passed.append(case)
            continue
        attempt = Attempt(case, q, k, v, got, expected, passed)
        hints = recognised(mistakes, attempt)
        return len(passed), Failure(str(case), detail, hints or [generic_hint])
    return len(passed), None


def recognised(mistakes, attempt) -> list[str]:
    """The hints of the `mistakes` whose detector recognises `attempt` (any lab's attempt object); a
    detector that cannot judge this output (it raises) recognises nothing."""
    hints = []
    for mistake in mistakes:
        try:
            if mistake.detect(attempt):
                hints.append(mistake.hint)
        except Exception:  # noqa: BLE001
            pass
    return hints


@dataclass(frozen=True)
class Step:
    """One puzzle of a lab: `grade(fn)` → (cases passed, cases in all, the first failure or None);
    `skeleton` is what the learner starts from, `solution` the tested answer."""

    name: str
    what: str
    grade: Callable[[Callable], tuple[int, int, Failure | None]]
    skeleton: Callable
    solution: Callable
    mistakes: tuple[Mistake, ...]
