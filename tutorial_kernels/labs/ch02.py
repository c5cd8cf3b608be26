"""Lab 2: write naive attention's row softmax, its causal mask, and the guards for a row that sees no key
(chapter 2).

The learner writes chapter 2's kernels, or the lines of them that carry an idea, one step each:

    ch02.softmax      `_softmax_kernel`'s three passes: the row max, the sum of exponentials, P
    ch02.causal_mask  `_scores_kernel`'s causal mask, aligned bottom-right: key c visible to query r when
                      c ≤ r + (n_k − n_q)
    ch02.empty_rows   `_softmax_kernel`'s two guards: a row that is all −∞ becomes zeros, not NaN

Each step has a skeleton (`*_skeleton`: the chapter's kernel with the step's lines replaced by placeholders
that run and fail the grader) and its solution, which is the chapter's kernel itself. The softmax steps are
graded on rows of S (`SoftmaxCase`) against a float64 softmax, the mask step on whole attention outputs
(the learner's scores kernel, then the chapter's softmax and P·V kernels) against the float64 reference.
`tutorial_kernels.labs.check("ch02.<step>", fn)` grades a learner's kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tutorial_kernels.ch02_naive_attention import _scores_kernel, _softmax_kernel, probs_times_values, row_softmax
from tutorial_kernels.labs.steps import (
    Attempt, Failure, Mistake, SlackWritten, Step, attention64, attention_cases, check_slack, grade_attention, sm_scale,
    recognised, visibility, with_slack)
from tutorial_kernels.precision import dot_precision, tiles_for
from tutorial_kernels.reference import relative_error
from tutorial_kernels.runtime import default_device
from tutorial_kernels.tiling import head_dim_block
from tutorial_kernels.tolerances import tolerance

NOTEBOOK = "02_naive_attention_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
SOFTMAX_BLOCK = 16  # the chapter uses up to 1024; 16 makes rows of 17 and 70 span several chunks, the last ragged
BLOCK_M = 16  # small score tiles: the causal diagonal crosses tiles, and 17 and 70 leave ragged ones
BLOCK_N = 16
SEED = 2205  # the cases are drawn from fixed random states, so a report can be reproduced


# --- the softmax steps' cases: rows of S -------------------------------------------------------------

@dataclass(frozen=True)
class SoftmaxCase:
    """One graded launch: S of n_rows × n_cols in `dtype`, one program per row.

    kind "normal": scores of spread 3; "large": rows around +150, rows around −150 and rows of spread 40,
    where exp overflows or underflows unless the row max is subtracted (float32 overflows past 88.7);
    "causal": the scores of a causal attention with n_q = n_rows, n_k = n_cols, −∞ where a key is hidden
    (bottom-right), so with n_rows > n_cols the first n_rows − n_cols rows are all −∞."""

    n_rows: int
    n_cols: int
    dtype: torch.dtype
    kind: str = "normal"

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        if self.kind == "causal":
            hidden = max(self.n_rows - self.n_cols, 0)
            return (f"S of causal attention, n_q={self.n_rows}, n_k={self.n_cols} ({hidden} rows see no key, "
                    f"all −∞), dtype={dtype}")
        what = " (rows near +150 and −150, and rows of spread 40)" if self.kind == "large" else ""
        columns = f"{self.n_cols} column" + ("s" if self.n_cols != 1 else "")
        return f"S of {self.n_rows} rows × {columns}{what}, BLOCK={SOFTMAX_BLOCK}, dtype={dtype}"


def softmax_cases(kinds: tuple[str, ...]) -> list[SoftmaxCase]:
    """Float32 before float16, short rows before long ones: the first failure is the simplest."""
    shapes = {"normal": ((5, 1), (5, 17), (5, 70)), "large": ((6, 17), (6, 70)),
              "causal": ((1, 1), (17, 17), (17, 70), (70, 17))}
    return [SoftmaxCase(r, c, dtype, kind) for dtype in (torch.float32, torch.float16) for kind in kinds
            for r, c in shapes[kind]]


def draw_scores(case: SoftmaxCase, seed: int) -> torch.Tensor:
    """Fresh random scores for `case` (never zeros: a zero row hides a wrong normaliser)."""
    device = default_device()
    gen = torch.Generator(device=device).manual_seed(seed)
    s = torch.randn(case.n_rows, case.n_cols, generator=gen, device=device, dtype=torch.float64)
    if case.kind == "large":
        rows = torch.arange(case.n_rows, device=device)[:, None] % 3
        s = torch.where(rows == 0, 3 * s + 150, torch.where(rows == 1, 3 * s - 150, 40 * s))
    else:
        s = 3 * s
    if case.kind == "causal":
        s = s.masked_fill(~visibility(case.n_rows, case.n_cols, device, case.n_cols - case.n_rows), -math.inf)
    return s.to(case.dtype)


def softmax64(s: torch.Tensor) -> torch.Tensor:
    """Row softmax in float64; a row that is all −∞ is zeros (the chapter's convention)."""
    s = s.double()
    row_max = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(row_max), row_max, 0.0))
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)


SLACK = SOFTMAX_BLOCK  # elements after S and after P: what the ragged last chunk of the last row reaches


def run_softmax(kernel, s: torch.Tensor) -> torch.Tensor:
    """P from the learner's softmax kernel, one program per row of the contiguous 2-D `s`. S and P are
    followed by one chunk of slack: S's holds 0 (a load without its mask reads that past the last row), P's
    NaN, and a store that writes it is refused with a SlackWritten naming P."""
    n = s.numel()
    _, s_in = with_slack(n, SLACK, 0.0, s.dtype, s.device)
    s_in.copy_(s.reshape(-1))
    p_all, p = with_slack(n, SLACK, float("nan"), s.dtype, s.device)  # poisoned: unwritten stays NaN
    kernel[(s.shape[0],)](s_in.view(s.shape), p.view(s.shape), s.shape[1], BLOCK=SOFTMAX_BLOCK)
    check_slack(p_all, n, float("nan"), "P", f"{s.shape[0]} rows of n_cols = {s.shape[1]}, the last ragged")
    return p.view(s.shape)


@dataclass
class SoftmaxAttempt:
    """The learner's P on one case, with what a detector needs."""

    case: SoftmaxCase
    s: torch.Tensor
    got: torch.Tensor | None
    expected: torch.Tensor
    error: Exception | None = None

    def matches(self, wrong: torch.Tensor) -> bool:
        """Whether the output is, within the dtype's tolerance, this wrong answer (NaN where it has NaN)."""
        got, wrong = self.got.double(), wrong.double().to(self.got.device)
        same_nan = torch.equal(torch.isnan(got), torch.isnan(wrong))
        ok = ~torch.isnan(wrong)
        return same_nan and bool(torch.isfinite(got[ok]).all()) and (
            not ok.any() or relative_error(got[ok], wrong[ok]) <= 3 * tolerance(self.case.dtype))


def compare_rows(case: SoftmaxCase, got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when P is within the dtype's bound; else where and by how much it is wrong."""
    err = relative_error(got, expected)
    bound = tolerance(case.dtype)
    if err <= bound:
        return None
    got64, exp64 = got.double().cpu(), expected.double().cpu()
    diff = (got64 - exp64).abs()
    bad = ~torch.isfinite(got64) | (diff > 10 * bound * max(1.0, exp64.abs().max().item()))
    row, col = bad.nonzero()[0].tolist() if bad.any() else divmod(int(diff.argmax()), diff.shape[1])
    lines = [f"relative error {err:.2e} > {bound:.0e} allowed for this dtype",
             f"first wrong element: row {row}, column {col}: expected P = {exp64[row, col].item():+.5f}, "
             f"got {got64[row, col].item():+.5f}"]
    nan_rows = int((~torch.isfinite(got64)).any(dim=-1).sum())
    if nan_rows:
        lines.append(f"{nan_rows} rows of P hold NaN or ±inf")
    return "\n".join(lines)


def grade_softmax(kernel, cases: list[SoftmaxCase], mistakes: tuple[Mistake, ...], generic_hint: str,
                  seed: int = SEED) -> tuple[int, int, Failure | None]:
    """Run the learner's kernel on every case in order; (cases passed, cases, the first failure or None)."""
    for i, case in enumerate(cases):
        s = draw_scores(case, seed + i)
        expected = softmax64(s)
        try:
            got = run_softmax(kernel, s)
        except Exception as exc:  # the learner's code did not compile or run: say what Triton said
            message = str(exc).strip().splitlines()
            attempt = SoftmaxAttempt(case, s, None, expected, exc)
            hints = recognised(mistakes, attempt)
            return i, len(cases), Failure(str(case), f"the kernel raised {type(exc).__name__}: "
                                          + (message[-1] if message else ""), hints or [generic_hint])
        detail = compare_rows(case, got, expected)
        if detail is not None:
            attempt = SoftmaxAttempt(case, s, got, expected)
            hints = recognised(mistakes, attempt)
            return i, len(cases), Failure(str(case), detail, hints or [generic_hint])
    return len(cases), len(cases), None



# --- step 1: the row softmax -------------------------------------------------------------------------

@triton.jit
def softmax_kernel_skeleton(s_ptr, p_ptr, n_cols, BLOCK: tl.constexpr):
    """Row `program_id(0)` of S (contiguous rows of n_cols entries) → that row of P = softmax(S):
    P_ij = exp(S_ij − m_i) / ℓ_i, m_i = max_j S_ij, ℓ_i = Σ_j exp(S_ij − m_i). The row may be longer
    than BLOCK: each pass walks it in chunks of BLOCK columns, the last one ragged. Work in float32;
    P is stored in p's dtype. Every row here has at least one finite score."""
    row = tl.program_id(0).to(tl.int64)
    s_row_ptr = s_ptr + row * n_cols
    p_row_ptr = p_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)

    # Pass 1: m_i = max_j S_ij, kept as BLOCK running maxima and reduced once at the end.
    running_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        # TODO: x = tl.load(...)       columns start + cols of the row; those ≥ n_cols must not count
        # TODO: running_max = ...      the elementwise max with x.to(tl.float32)
        pass
    row_max = tl.max(running_max, axis=0)

    # Pass 2: l_i = Σ_j exp(S_ij − m_i).
    running_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        # TODO: x = tl.load(...)       the same chunk again
        # TODO: running_sum += ...
        pass
    row_sum = tl.sum(running_sum, axis=0)
    inv_sum = 1.0 / row_sum  # unguarded: step ch02.empty_rows handles a row that sees no key

    # Pass 3: P_ij = exp(S_ij − m_i) / l_i.
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        # TODO: x = tl.load(...)
        # TODO: p = ...                exp(S_ij − m_i) / ℓ_i, with inv_sum = 1 / ℓ_i
        p = tl.zeros([BLOCK], dtype=tl.float32)  # TODO: a placeholder, replace it
        tl.store(p_row_ptr + start + cols, p.to(p_ptr.dtype.element_ty), mask=mask)


softmax_kernel = _softmax_kernel  # the solution: the chapter's own kernel (its guards are step 3)


def _unchanged(a: SoftmaxAttempt) -> bool:
    return bool(torch.isfinite(a.got).all()) and bool(a.got.abs().max() == 0)


def _zero_padding(a: SoftmaxAttempt) -> bool:
    """P = softmax of the row padded with zeros to whole chunks: the padding counted in ℓ_i."""
    pad = -a.case.n_cols % SOFTMAX_BLOCK
    padded = torch.nn.functional.pad(a.s.double(), (0, pad))
    return pad > 0 and a.matches(softmax64(padded)[:, :a.case.n_cols])


def _no_max(a: SoftmaxAttempt) -> bool:
    """P = exp(S) / Σ exp(S) in float32: overflow (∞/∞) and underflow (0/0) give NaN rows."""
    e = torch.exp(a.s.float())
    return bool(torch.isnan(a.got).any()) and a.matches(e / e.sum(dim=-1, keepdim=True))


def _max_padding(a: SoftmaxAttempt) -> bool:
    """Pass 1 loaded the columns past n_cols as 0: m_i = max(m_i, 0), harmless except for rows far below 0,
    where exp(S_ij − 0) underflows for the whole row and P = 0/0 = NaN; every other row is right."""
    far_below = a.s.double().amax(dim=-1) < -87  # exp(x − 0) underflows float32 for every x of the row
    nan = torch.isnan(a.got).any(dim=-1)
    rest = ~far_below
    return (a.case.n_cols % SOFTMAX_BLOCK != 0 and bool(far_below.any()) and torch.equal(nan.cpu(), far_below.cpu())
            and (not rest.any() or relative_error(a.got[rest], a.expected[rest]) <= 3 * tolerance(a.case.dtype)))


def _unmasked_loads(a: SoftmaxAttempt) -> bool:
    """Every load without its mask: the ragged last chunk of a row reads the next row (the 0s of S's slack
    after the last row), and P is the softmax over those extra scores too."""
    n_rows, n_cols = a.s.shape
    reach = -(-n_cols // SOFTMAX_BLOCK) * SOFTMAX_BLOCK
    if reach == n_cols:
        return False
    flat = torch.cat([a.s.double().reshape(-1), torch.zeros(SLACK, dtype=torch.float64, device=a.s.device)])
    rows = torch.stack([flat[r * n_cols:r * n_cols + reach] for r in range(n_rows)])
    return a.matches(softmax64(rows)[:, :n_cols])


def _store_past_end(a: SoftmaxAttempt) -> bool:
    return isinstance(a.error, SlackWritten)


STORE_MASK_HINT = ("A store wrote past the end of P: the last, ragged chunk of a row has lanes past n_cols, and an "
                   "unmasked store writes them into the next row (past P's end for the last row: on a GPU, other "
                   "data or a fault). Store with mask=start + cols < n_cols, as the skeleton's store line does.")


def _unnormalised(a: SoftmaxAttempt) -> bool:
    s = a.s.double()
    return a.matches(torch.exp(s - s.amax(dim=-1, keepdim=True)))


SOFTMAX_MISTAKES = (
    Mistake("unchanged", "Every entry of P is 0: the placeholder `p = tl.zeros(...)` is still there, or the "
            "passes do not yet load the row. Fill in the three passes.", _unchanged),
    Mistake("padding", "The columns past n_cols in the last, ragged chunk count as scores of 0: they add "
            "exp(0 − m_i) to ℓ_i, so every P_ij is too small. Load them as −∞, neutral for the max and for the "
            "sum (e^−∞ = 0): tl.load(..., mask=start + cols < n_cols, other=float(\"-inf\")).", _zero_padding),
    Mistake("max_padding", "Rows whose scores are all far below 0 (around −150) are NaN: pass 1 loaded the columns "
            "past n_cols as 0, so m_i = 0, not the row's max, and exp(S_ij − 0) underflows to 0 for the whole row "
            "(ℓ_i = 0, and 0 · ∞ = NaN). The padding must be neutral for the max too: other=float(\"-inf\") in "
            "pass 1 as well.", _max_padding),
    Mistake("unmasked_load", "The last, ragged chunk of each row read past the row's end, into the next row's "
            "scores (past S for the last row): mask every load, tl.load(s_row_ptr + start + cols, "
            "mask=start + cols < n_cols, other=float(\"-inf\")).", _unmasked_loads),
    Mistake("store_mask", STORE_MASK_HINT, _store_past_end),
    Mistake("no_max", "Rows of large scores are NaN: exp(S_ij) overflows float32 past 88.7 (∞/∞) and "
            "underflows to 0 below about −103 (0/0). Subtract the row max before exponentiating, in pass 2 "
            "and pass 3: tl.exp(x.to(tl.float32) - row_max). The factor e^−m_i cancels, so P is unchanged.",
            _no_max),
    Mistake("unnormalised", "P is exp(S_ij − m_i) without the division: each row must sum to 1. Multiply by "
            "inv_sum = 1 / ℓ_i in pass 3.", _unnormalised),
)


def _grade_softmax(fn) -> tuple[int, int, Failure | None]:
    return grade_softmax(fn, softmax_cases(("normal", "large")), SOFTMAX_MISTAKES,
                         "Write each pass from its equation: pass 1 m_i = max_j S_ij, pass 2 ℓ_i = Σ_j "
                         "exp(S_ij − m_i), pass 3 P_ij = exp(S_ij − m_i) / ℓ_i; load columns past n_cols as −∞.")


# --- step 2: the causal mask -------------------------------------------------------------------------

@triton.jit
def scores_kernel_skeleton(
    q_ptr, k_ptr, s_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    n_heads, n_q, n_k, head_dim, sm_scale,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One BLOCK_M × BLOCK_N tile of S = scale · Q Kᵀ for one (batch, head): query rows offs_m, key
    columns offs_n. With CAUSAL, a score whose key the query may not see is −∞: key c is visible to
    query r when c ≤ r + (n_k − n_q) (bottom-right alignment)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2).to(tl.int64)
    batch = pid_bh // n_heads
    head = pid_bh % n_heads

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this tile
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # key columns of this tile
    offs_d = tl.arange(0, BLOCK_D)

    q_tile_ptr = q_ptr + batch * stride_qb + head * stride_qh
    q = tl.load(
        q_tile_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_D)
    k_tile_ptr = k_ptr + batch * stride_kb + head * stride_kh
    k_t = tl.load(
        k_tile_ptr + offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kn,
        mask=(offs_d[:, None] < head_dim) & (offs_n[None, :] < n_k),
        other=0.0,
    )  # (BLOCK_D, BLOCK_N): K already transposed

    s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * sm_scale
    if CAUSAL:
        # TODO: visible = ...              (BLOCK_M, BLOCK_N) booleans from offs_n[None, :] and offs_m[:, None]
        # TODO: s = tl.where(visible, s, ...)
        pass

    s_head_ptr = s_ptr + pid_bh * n_q * n_k
    tl.store(
        s_head_ptr + offs_m[:, None].to(tl.int64) * n_k + offs_n[None, :],
        s.to(s_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < n_q) & (offs_n[None, :] < n_k),
    )


scores_kernel = _scores_kernel  # the solution: the chapter's own kernel


def lab_scores(q: torch.Tensor, k: torch.Tensor, causal: bool, kernel=None) -> torch.Tensor:
    """S = Q Kᵀ/√d, (B, H, n_q, n_k) in q's dtype, through `kernel` (the chapter's where None) launched as
    `attention_scores` launches it, with 16 × 16 tiles."""
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    s = torch.full((batch, heads, n_q, n_k), float("nan"), dtype=q.dtype, device=q.device)  # poisoned
    tiles = tiles_for(q.dtype, head_dim, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)  # larger for full float32 on a GPU
    grid = (triton.cdiv(n_q, tiles["BLOCK_M"]), triton.cdiv(n_k, tiles["BLOCK_N"]), batch * heads)
    (kernel or scores_kernel)[grid](
        q, k, s, *q.stride(), *k.stride(), heads, n_q, n_k, head_dim, head_dim ** -0.5,
        CAUSAL=causal, BLOCK_D=head_dim_block(head_dim), DOT_PRECISION=dot_precision(q.dtype), **tiles)
    return s


def lab_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scores=None) -> torch.Tensor:
    """Chapter 2's three stages with the learner's scores kernel: S, then the chapter's softmax and P·V."""
    return probs_times_values(row_softmax(lab_scores(q, k, causal, scores)), v)


def _mask_matches(offset_of, strict: bool = False):
    """A detector: causal output equals attention with key c visible to query r when c ≤ r + offset."""
    def detect(a: Attempt) -> bool:
        n_q, n_k = a.case.n_q, a.case.n_k
        wrong = visibility(n_q, n_k, a.q.device, offset_of(n_q, n_k), strict=strict)
        right = visibility(n_q, n_k, a.q.device, n_k - n_q)
        return a.case.causal and not torch.equal(wrong, right) and a.matches(
            attention64(a.q, a.k, a.v, sm_scale(a.case), wrong))
    return detect


def _tile_local(a: Attempt) -> bool:
    """The mask compared positions inside the tile (tl.arange(0, BLOCK_N) against tl.arange(0, BLOCK_M)), not
    in the whole matrix: key c visible to query r when c mod BLOCK_N ≤ r mod BLOCK_M + (n_k − n_q)."""
    n_q, n_k = a.case.n_q, a.case.n_k
    tiles = tiles_for(a.q.dtype, a.case.head_dim, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    rows = torch.arange(n_q, device=a.q.device)[:, None] % tiles["BLOCK_M"]
    cols = torch.arange(n_k, device=a.q.device)[None, :] % tiles["BLOCK_N"]
    wrong = cols <= rows + (n_k - n_q)
    return (a.case.causal and not torch.equal(wrong, visibility(n_q, n_k, a.q.device, n_k - n_q))
            and a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case), wrong)))


def _no_mask(a: Attempt) -> bool:
    return a.case.causal and a.matches(attention64(a.q, a.k, a.v, sm_scale(a.case)))


def _no_key_rows_nonzero(a: Attempt) -> bool:
    """Rows that see no key (causal, n_q > n_k) came back nonzero, the others right: a finite fill."""
    hidden = a.case.n_q - a.case.n_k
    if not a.case.causal or hidden <= 0:
        return False
    got, expected = a.got[..., hidden:, :], a.expected[..., hidden:, :]
    return bool(a.got[..., :hidden, :].abs().max() > 1e-3) and relative_error(got, expected) <= 3 * tolerance(
        a.case.dtype)


MASK_MISTAKES = (
    Mistake("unmasked", "The output is attention with no mask at all: with CAUSAL, set the hidden scores to −∞, "
            "s = tl.where(visible, s, float(\"-inf\")).", _no_mask),
    Mistake("alignment", "The causal mask is aligned top-left (c ≤ r), which is right only when n_q = n_k. "
            "Bottom-right alignment shifts the diagonal by n_k − n_q: key c is visible to query r when "
            "c ≤ r + (n_k − n_q), so the last query sees every key.", _mask_matches(lambda n_q, n_k: 0)),
    Mistake("sign", "The diagonal is shifted the wrong way: the offset is n_k − n_q (the queries are the last "
            "n_q positions of a sequence of n_k), not n_q − n_k.", _mask_matches(lambda n_q, n_k: n_q - n_k)),
    Mistake("off_by_one", "Each query must see its own diagonal key: c ≤ r + (n_k − n_q), not <. "
            "(With one query and one key, the query sees that key.)",
            _mask_matches(lambda n_q, n_k: n_k - n_q, strict=True)),
    Mistake("tile_local", "The mask compares positions inside the tile (0 … BLOCK − 1), so every tile gets the "
            "same triangle. Compare the positions in the whole matrix, offs_n[None, :] and offs_m[:, None], which "
            "already include pid · BLOCK.", _tile_local),
    Mistake("finite", "The rows that see no key must come out as zeros, but yours average V. Hide scores with "
            "float(\"-inf\"), not a finite constant such as -1e9 or -1e4: a row whose every score is that "
            "constant is a row of equal scores, and its softmax is uniform.", _no_key_rows_nonzero),
)


def _grade_mask(fn) -> tuple[int, int, Failure | None]:
    cases = attention_cases()
    passed, failure = grade_attention(lambda c, q, k, v: lab_attention(q, k, v, c.causal, scores=fn), cases,
                                      list(MASK_MISTAKES), "Check `visible`: with CAUSAL, query offs_m[r] sees key "
                                      "offs_n[c] when offs_n[c] ≤ offs_m[r] + (n_k − n_q); hidden scores are −∞.")
    return passed, len(cases), failure


# --- step 3: a row that sees no key ------------------------------------------------------------------

@triton.jit
def guarded_softmax_kernel_skeleton(s_ptr, p_ptr, n_cols, BLOCK: tl.constexpr):
    """The kernel of step 1, now also for a row that is all −∞ (a query that sees no key, causal with
    n_q > n_k): that row of P must be zeros, not NaN. Every other row as before."""
    row = tl.program_id(0).to(tl.int64)
    s_row_ptr = s_ptr + row * n_cols
    p_row_ptr = p_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)

    # Pass 1: m_i = max_j S_ij, kept as BLOCK running maxima and reduced once at the end.
    running_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_row_ptr + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_max = tl.maximum(running_max, x.to(tl.float32))
    row_max = tl.max(running_max, axis=0)
    # TODO: row_max = ...      for a row that is all −∞, a finite shift: −∞ − (−∞) is NaN

    # Pass 2: l_i = Σ_j exp(S_ij − m_i).
    running_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(s_row_ptr + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        running_sum += tl.exp(x.to(tl.float32) - row_max)
    row_sum = tl.sum(running_sum, axis=0)
    # TODO: inv_sum = ...      1 / ℓ_i, but 0 where ℓ_i = 0, so that the row becomes zeros
    inv_sum = 1.0 / row_sum  # TODO: guard it

    # Pass 3: P_ij = exp(S_ij − m_i) / l_i.
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(s_row_ptr + start + cols, mask=mask, other=float("-inf"))
        p = tl.exp(x.to(tl.float32) - row_max) * inv_sum
        tl.store(p_row_ptr + start + cols, p.to(p_ptr.dtype.element_ty), mask=mask)


guarded_softmax_kernel = _softmax_kernel  # the solution: the chapter's own kernel, guards included


def _nan_rows(a: SoftmaxAttempt) -> bool:
    """The rows that are all −∞ are NaN; every other row is right."""
    empty = torch.isneginf(a.s).all(dim=-1)
    nan = torch.isnan(a.got).any(dim=-1)
    rest = ~empty
    return bool(empty.any()) and torch.equal(nan, empty) and (not rest.any() or relative_error(
        a.got[rest], a.expected[rest]) <= 3 * tolerance(a.case.dtype))


def _clamped_max(a: SoftmaxAttempt) -> bool:
    """The max was clamped at 0 (tl.maximum(row_max, 0.0)): rows far below 0 underflow to zeros."""
    s = a.s.double()
    far_below = (s.amax(dim=-1) < -87)[:, None]  # exp(x − 0) underflows float32 for every x of the row
    return bool(far_below.any()) and a.matches(torch.where(far_below, 0.0, a.expected.double()))


EMPTY_ROW_MISTAKES = (
    Mistake("nan", "The rows that see no key are NaN. Such a row is all −∞, so m_i = −∞ and exp(−∞ − (−∞)) = "
            "exp(NaN); then ℓ_i = 0 and 1/ℓ_i = ∞. Two guards: shift by 0 when m_i = −∞, "
            "row_max = tl.where(row_max == float(\"-inf\"), 0.0, row_max), and scale by 0 instead of dividing by "
            "ℓ_i = 0, inv_sum = tl.where(row_sum > 0.0, 1.0 / tl.maximum(row_sum, 1e-30), 0.0).", _nan_rows),
    Mistake("clamp", "Rows whose scores are all far below 0 came out zeros: the max was replaced by a bound "
            "(tl.maximum(row_max, 0.0)?), so exp(S_ij − 0) underflows. Replace m_i only where it is −∞: "
            "tl.where(row_max == float(\"-inf\"), 0.0, row_max).", _clamped_max),
    Mistake("store_mask", STORE_MASK_HINT, _store_past_end),
)


def _grade_empty_rows(fn) -> tuple[int, int, Failure | None]:
    return grade_softmax(fn, softmax_cases(("causal", "large")), EMPTY_ROW_MISTAKES,
                         "A row that is all −∞ must become zeros and every other row must stay the softmax: "
                         "guard m_i where it is −∞, and 1/ℓ_i where ℓ_i = 0.")


STEPS = {
    "softmax": Step("ch02.softmax", "the row softmax: max, sum of exponentials, divide", _grade_softmax,
                    softmax_kernel_skeleton, softmax_kernel, SOFTMAX_MISTAKES),
    "causal_mask": Step("ch02.causal_mask", "hide the keys a query may not see (bottom-right)", _grade_mask,
                        scores_kernel_skeleton, scores_kernel, MASK_MISTAKES),
    "empty_rows": Step("ch02.empty_rows", "a row that sees no key becomes zeros, not NaN", _grade_empty_rows,
                       guarded_softmax_kernel_skeleton, guarded_softmax_kernel, EMPTY_ROW_MISTAKES),
}

__all__ = ["NOTEBOOK", "STEPS", "SoftmaxCase", "guarded_softmax_kernel", "guarded_softmax_kernel_skeleton",
           "lab_attention", "lab_scores", "run_softmax", "scores_kernel", "scores_kernel_skeleton",
           "softmax64", "softmax_kernel", "softmax_kernel_skeleton"]
