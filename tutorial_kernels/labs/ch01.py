"""Lab 1: write a block sum, then the passes that reduce a whole vector to one number (chapter 1).

The learner writes chapter 1's sum of a vector in three steps:

    ch01.block_sum  the kernel: program pid sums its tile of BLOCK elements in float32 into partial[pid]
    ch01.two_pass   the host loop: launch the block sum on x, then on its partial sums, until one is left
    ch01.atomic     the one-launch alternative: each program adds its tile's sum into the total atomically

Each step has a skeleton (`*_skeleton`: runs, and fails the grader) and its solution, the chapter's own
code (`partial_sums_kernel`, `triton_sum`'s loop, `_atomic_sum_kernel`). These are not attention cases,
so this module has its own case type and grader: vectors of n = 1, 17, 1000, 4097 elements (never a
multiple of BLOCK = 32, so the last tile is ragged), float32 and float16, each sum compared with the
float64 sum through the chapter's `reduction_error` (|got − Σx| / Σ|x|).
`tutorial_kernels.labs.check("ch01.<step>", fn)` grades a learner's function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from tutorial_kernels.ch01_gpu_hierarchy import (_atomic_sum_kernel, partial_sums_kernel, reduction_error,
                                                 reduction_passes)
from tutorial_kernels.labs.steps import DTYPES, Failure, Mistake, SlackWritten, Step, check_slack, recognised, with_slack
from tutorial_kernels.runtime import default_device

NOTEBOOK = "01_gpu_hierarchy_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
BLOCK = 32  # small tiles: 4097 elements take three passes (129 → 5 → 1), and no length is a multiple of 32
LENGTHS = (1, 17, 1000, 4097)  # one element, one ragged tile, two passes, three passes
BOUND = 1e-5  # |got − Σx| / Σ|x|: the chapter's tests' bound for a float32 sum (appendix A derives it)
PAD = 100.0  # what lies just past the end of x: a load that forgets its mask reads this, not a fault
MAX_LAUNCHES = 16  # two_pass: more launches than this is a loop that does not stop


@dataclass(frozen=True)
class SumCase:
    """One graded call: a vector of n fresh random values of dtype."""

    n: int
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"n={self.n}, dtype={str(self.dtype).removeprefix('torch.')}, BLOCK={BLOCK}"


def sum_cases() -> list[SumCase]:
    """Every length, float32 before float16: the first failure is the simplest."""
    return [SumCase(n, dtype) for dtype in DTYPES for n in LENGTHS]


def draw(case: SumCase, seed: int) -> torch.Tensor:
    """x: n values of mean 1 (partial sums grow, so float16 rounding shows; mean-zero sums stay small),
    the first n of a buffer whose BLOCK further elements hold PAD, so an unmasked load reads PAD."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.randn(case.n, generator=g) + 1.0).to(case.dtype)
    buffer = torch.full((case.n + BLOCK,), PAD, dtype=case.dtype)
    buffer[:case.n] = values
    return buffer.to(default_device())[:case.n]


def tiles(n: int) -> list[slice]:
    """The element ranges of the ⌈n / BLOCK⌉ programs."""
    return [slice(start, min(start + BLOCK, n)) for start in range(0, n, BLOCK)]


@dataclass
class SumAttempt:
    """The learner's output on one case (`got`, or the `error` it raised), with what detectors need."""

    case: SumCase
    x: torch.Tensor
    got: torch.Tensor | None
    error: Exception | None = None

    def sums(self, per_tile: bool, wrong: Callable[[torch.Tensor, slice], float] | None = None) -> torch.Tensor:
        """float64 sums (one per tile, or the total) of `wrong(x64, tile)`, the sum a mistake computes for
        a tile (the right sum when None)."""
        x64 = self.x.double().cpu()
        per = torch.tensor([wrong(x64, t) if wrong else x64[t].sum().item() for t in tiles(self.case.n)],
                           dtype=torch.float64)
        return per if per_tile else per.sum()

    def scale(self, per_tile: bool) -> torch.Tensor:
        x64 = self.x.double().cpu().abs()
        per = torch.tensor([x64[t].sum().item() for t in tiles(self.case.n)], dtype=torch.float64)
        return per if per_tile else per.sum()

    def matches(self, wrong: torch.Tensor, per_tile: bool) -> bool:
        """Whether the output is this wrong answer (to 1e-3 of Σ|x|, so a float16 accumulator's rounding on
        top still matches) and that answer is not the right one."""
        if self.got is None or self.got.numel() != wrong.numel():
            return False
        got, scale = self.got.double().cpu().reshape(wrong.shape), self.scale(per_tile)
        right = self.sums(per_tile)
        return bool(((got - wrong).abs() <= 1e-3 * scale).all()) and bool(((wrong - right).abs() > 1e-3 * scale).any())


def _first_wrong(case: SumCase, x: torch.Tensor, got: torch.Tensor, per_tile: bool) -> str | None:
    """None when every sum is within BOUND (the chapter's `reduction_error`); else the first wrong one."""
    pieces = tiles(case.n) if per_tile else [slice(0, case.n)]
    if got.numel() != len(pieces):
        return (f"expected {len(pieces)} value{'s' * (len(pieces) > 1)}, got a tensor of shape {tuple(got.shape)}")
    flat = got.reshape(-1)
    for i, t in enumerate(pieces):
        err = reduction_error(flat[i], x[t])
        if err <= BOUND:  # NaN fails this test too
            continue
        what = (f"partial[{i}], the sum of x[{t.start}:{t.stop}]" if per_tile else f"the sum of x[0:{case.n}]")
        lines = [f"{what}: expected {x[t].double().sum().item():+.5f}, got {flat[i].item():+.5f}",
                 f"error |got − Σx| / Σ|x| = {err:.2e} > {BOUND:.0e} allowed"]
        bad = int((~torch.isfinite(flat)).sum())
        if bad:
            lines.append(f"{bad} of {flat.numel()} value{'s are' if flat.numel() > 1 else ' is'} NaN or ±inf"
                         + (" (the output starts as NaN: a slot never written stays NaN)"
                            if per_tile and bool(torch.isnan(flat).any()) else ""))
        return "\n".join(lines)
    return None



def grade_sums(run: Callable[[SumCase, torch.Tensor], torch.Tensor], mistakes: tuple[Mistake, ...],
               generic_hint: str, per_tile: bool, seed: int = 101) -> tuple[int, int, Failure | None]:
    """Run `run(case, x) -> sums` on every case in order; (cases passed, cases, the first failure or None).
    `per_tile`: `run` returns the ⌈n / BLOCK⌉ partial sums, else the total."""
    cases = sum_cases()
    for i, case in enumerate(cases):
        x = draw(case, seed + i)
        try:
            got = run(case, x)
        except Exception as exc:  # the learner's code did not compile or run: say what it said
            attempt = SumAttempt(case, x, None, exc)
            message = str(exc).strip().splitlines()
            hints = recognised(mistakes, attempt)
            return i, len(cases), Failure(str(case), f"{type(exc).__name__}: " + (message[-1] if message else ""),
                                          hints or [generic_hint])
        if not isinstance(got, torch.Tensor):
            return i, len(cases), Failure(str(case), f"expected a torch.Tensor, got {type(got).__name__}",
                                          [generic_hint])
        detail = _first_wrong(case, x, got, per_tile)
        if detail is None:
            continue
        attempt = SumAttempt(case, x, got)
        hints = recognised(mistakes, attempt)
        return i, len(cases), Failure(str(case), detail, hints or [generic_hint])
    return len(cases), len(cases), None


# --- the wrong sums typical mistakes compute, tile by tile ----------------------------------------

def _overlapping(x64: torch.Tensor, t: slice) -> float:
    """offs = pid + arange (the ×BLOCK forgotten): program p sums x[p : p + BLOCK], masked at n."""
    p = t.start // BLOCK
    return x64[p:p + BLOCK].sum().item()


def _unmasked(x64: torch.Tensor, t: slice) -> float:
    """No mask: the ragged tile reads PAD past the end."""
    return x64[t].sum().item() + (BLOCK - (t.stop - t.start)) * PAD


def _one_past(x64: torch.Tensor, t: slice) -> float:
    """mask=offs <= n: the last tile also reads x[n], the first PAD past the end."""
    return x64[t].sum().item() + (PAD if t.stop == len(x64) else 0.0)


def _tile_slack(n: int) -> int:
    """Slack after an output buffer that covers every index a program can form from its tile,
    ⌈n / BLOCK⌉·BLOCK + BLOCK slots, so that a store at ptr + offs stays in the buffer."""
    return triton.cdiv(n, BLOCK) * BLOCK + BLOCK


def _nonfinite(a: SumAttempt) -> bool:
    return a.got is not None and not bool(torch.isfinite(a.got).all())


def _ragged_tile_wrong(a: SumAttempt) -> bool:
    """Every full tile is right and the ragged last one is wrong (by more than rounding): the masked
    lanes added something, and it is not the unmasked PAD."""
    if a.got is None or a.got.numel() != len(tiles(a.case.n)) or a.matches(a.sums(True, _unmasked), True):
        return False
    err = [reduction_error(g, a.x[t]) for g, t in zip(a.got.reshape(-1), tiles(a.case.n))]
    unwritten = bool(torch.isnan(a.got).all())  # that is the mistake "unchanged"
    return not unwritten and all(e <= BOUND for e in err[:-1]) and not err[-1] <= 3e-2  # NaN: not ≤


def _float16_rounding(a: SumAttempt, per_tile: bool) -> bool:
    """float16 input, every sum off by float16 rounding (more than BOUND, under 3e-2 of Σ|x|)."""
    if a.got is None or a.case.dtype != torch.float16 or not bool(torch.isfinite(a.got).all()):
        return False
    pieces = tiles(a.case.n) if per_tile else [slice(0, a.case.n)]
    if a.got.numel() != len(pieces):
        return False
    err = [reduction_error(g, a.x[t]) for g, t in zip(a.got.reshape(-1), pieces)]
    return max(err) > BOUND and max(err) < 3e-2


FLOAT16_HINT = ("The float16 sums are off by float16 rounding: tl.sum adds in the dtype it is given, and float16 "
                "keeps 11 significant bits. Convert the tile first: tl.sum(x.to(tl.float32), axis=0).")
NO_MASK_HINT = ("Lanes past n were loaded: the last tile is ragged (n is not a multiple of BLOCK) and read what lies "
                f"after x (here the lab put {PAD:g} there; on a GPU it is whatever is in memory, or a fault). "
                "Load with mask=offs < n.")
OTHER_HINT = ("The full tiles are right and the ragged last one is wrong: lanes the mask turns off take the value "
              "`other`, and tl.sum adds them with the rest. Use other=0.0, the identity of +; float(\"-inf\") is the "
              "identity of max (a softmax's row maximum), not of a sum.")
ONE_PAST_HINT = ("The last tile read one element too many, x[n] (here the lab put 100 there): the indices of x run "
                 "from 0 to n − 1, so index n is already past the end. Mask with offs < n, not offs <= n.")
OFFSET_HINT = ("Program p's tile starts at p·BLOCK: offs = pid * BLOCK + tl.arange(0, BLOCK). With pid + tl.arange "
               "the tiles overlap (program 1 sums x[1:33]) and most of x is never read.")


# --- step 1: the block sum ---------------------------------------------------------------------------

@triton.jit
def partial_sums_kernel_skeleton(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    """Program pid sums its tile x[pid·BLOCK : (pid+1)·BLOCK] (fewer elements in the last tile: n need
    not be a multiple of BLOCK) in float32, and writes that one float to partial[pid]."""
    pid = tl.program_id(0).to(tl.int64)  # 64-bit: pid · BLOCK passes 2³¹ for inputs over 8 GiB
    # TODO: offs = ...              the (BLOCK,) element indices of this program's tile
    # TODO: x = tl.load(...)        masked at n; the lanes the mask turns off must add nothing
    # TODO: tl.store(...)           the tile's sum, added in float32, at partial_ptr + pid


partial_sums = partial_sums_kernel  # the solution: the chapter's `partial_sums_kernel`


def block_sums(kernel, x: torch.Tensor) -> torch.Tensor:
    """One launch of `kernel` on x: ⌈n / BLOCK⌉ programs, into float32 partial sums that start as NaN
    (poisoned: a slot the kernel never writes stays NaN)."""
    programs = triton.cdiv(x.numel(), BLOCK)
    buffer, partial = with_slack(programs, _tile_slack(x.numel()), float("nan"), device=x.device)
    kernel[(programs,)](x, partial, x.numel(), BLOCK=BLOCK)
    check_slack(buffer, programs, float("nan"), "partial", f"its {programs} slot{'s' * (programs != 1)}, one per program")
    return partial


BLOCK_SUM_MISTAKES = (
    Mistake("unchanged", "No partial sum was written (they are all still NaN): each program stores its tile's sum "
            "with tl.store(partial_ptr + pid, ...).",
            lambda a: a.got is not None and bool(torch.isnan(a.got).all())),
    Mistake("one_slot", "Only partial[0] was written: every program stored at the same address. Program pid "
            "writes partial[pid]: tl.store(partial_ptr + pid, ...).",
            lambda a: a.got is not None and a.got.numel() > 1 and bool(torch.isnan(a.got[1:]).all())
            and bool(torch.isfinite(a.got[0]))),
    Mistake("past_end", "A store wrote past the end of partial: program pid writes ONE float, the tile's sum, at "
            "partial_ptr + pid. A store at partial_ptr + offs (the tile's element indices) writes BLOCK places per "
            "program, most of them past the ⌈n / BLOCK⌉ slots (on a GPU: over other data, or a fault).",
            lambda a: isinstance(a.error, SlackWritten)),
    Mistake("offset", OFFSET_HINT, lambda a: a.matches(a.sums(True, _overlapping), True)),
    Mistake("no_mask", NO_MASK_HINT, lambda a: a.matches(a.sums(True, _unmasked), True)),
    Mistake("one_past", ONE_PAST_HINT, lambda a: a.matches(a.sums(True, _one_past), True)),
    Mistake("other", OTHER_HINT, lambda a: _ragged_tile_wrong(a) and not a.matches(a.sums(True, _one_past), True)),
    Mistake("float16", FLOAT16_HINT, lambda a: _float16_rounding(a, True)),
)


def _grade_block_sum(fn) -> tuple[int, int, Failure | None]:
    return grade_sums(lambda case, x: block_sums(fn, x), BLOCK_SUM_MISTAKES,
                      "Check the three lines: offs = pid * BLOCK + tl.arange(0, BLOCK); a load masked with "
                      "offs < n and other=0.0; tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0)).",
                      per_tile=True)


# --- step 2: the passes ------------------------------------------------------------------------------

def two_pass_sum_skeleton(x, partial_sums_kernel, BLOCK):
    """Σ x as a float32 0-dim tensor, for a contiguous 1-D float16 or float32 x of n ≥ 1 elements.
    partial_sums_kernel[(programs,)](values, partial, n, BLOCK=BLOCK) turns n values into ⌈n / BLOCK⌉
    float32 partial sums, one per program; launch it on x, then on those partial sums, until one is left."""
    n = x.numel()
    values = x
    # TODO: partial = ...      float32, one slot per program: ⌈n / BLOCK⌉ of them (triton.cdiv), on x.device
    # TODO: partial_sums_kernel[(partial.numel(),)](...)
    # TODO: go on with the partial sums as the values, until one value is left; return it as a 0-dim tensor
    return torch.zeros((), dtype=torch.float32, device=x.device)


def two_pass_sum(x, partial_sums_kernel, BLOCK):
    """The solution: `triton_sum`'s loop, with its block size a parameter."""
    n = x.numel()
    values = x
    while True:  # at least one pass, so a float16 input of one element still comes back as float32
        partial = torch.empty(triton.cdiv(n, BLOCK), dtype=torch.float32, device=x.device)
        partial_sums_kernel[(partial.numel(),)](
            values, partial, n, BLOCK=BLOCK
        )
        values, n = partial, partial.numel()
        if n == 1:
            return partial.reshape(())


class LaunchError(RuntimeError):
    """A launch the lab refused to run (it would read or write out of bounds, or never end): `mistake`
    names the typical mistake it comes from."""

    def __init__(self, mistake: str, message: str):
        super().__init__(message)
        self.mistake = mistake


class CheckedKernel:
    """`partial_sums_kernel` as the learner launches it, `kernel[grid](values, partial, n, BLOCK=…)`,
    checking each launch before it runs: a wrong grid or n must give a report, not a stray read."""

    def __init__(self, x: torch.Tensor):
        self.x = x
        self.launches = 0

    def __getitem__(self, grid):
        def launch(values, partial, n, *args, **kwargs):
            self.launches += 1
            block = kwargs.get("BLOCK", args[0] if args else None)
            programs = grid(dict(BLOCK=block)) if callable(grid) else grid
            programs = programs[0] if isinstance(programs, (tuple, list)) else programs
            where = f"launch {self.launches}"
            if self.launches > MAX_LAUNCHES:
                raise LaunchError("endless", f"{where}: more than {MAX_LAUNCHES} launches, and still going")
            if self.launches > 1 and values.data_ptr() == self.x.data_ptr():
                raise LaunchError("same_input", f"{where} reads x again, not the partial sums of launch "
                                  f"{self.launches - 1}")
            if not isinstance(partial, torch.Tensor) or partial.dtype != torch.float32:
                raise LaunchError("partial_dtype", f"{where}: the partial sums are "
                                  f"{getattr(partial, 'dtype', type(partial).__name__)}, not torch.float32")
            if n > values.numel():
                raise LaunchError("stale_n", f"{where}: n = {n}, but its input holds {values.numel()} values")
            if programs * block < n or partial.numel() < programs:
                raise LaunchError("grid", f"{where}: {programs} programs of BLOCK = {block} into "
                                  f"{partial.numel()} partial sums, for n = {n} values (⌈n / BLOCK⌉ = "
                                  f"{triton.cdiv(n, block)})")
            partial_sums_kernel[(programs,)](values, partial, n, *args, **kwargs)
        return launch


def _passes_left(a: SumAttempt, launches: int) -> bool:
    """The output is what `launches` passes leave: ⌈n / BLOCK^launches⌉ > 1 values, or the first of them."""
    size = BLOCK ** launches
    if a.got is None or a.case.n <= size:
        return False
    if a.got.numel() == triton.cdiv(a.case.n, size):
        return True
    first = a.x[:size].double().sum()
    return a.got.numel() == 1 and bool((a.got.double().cpu() - first.cpu()).abs() <= 1e-3 * a.scale(False))


def _fixed_passes(a: SumAttempt) -> bool:
    return any(_passes_left(a, k) for k in range(2, 4))


def _launch_error(name: str):
    return lambda a: isinstance(a.error, LaunchError) and a.error.mistake == name


TWO_PASS_MISTAKES = (
    Mistake("unchanged", "The sum came back as 0: the skeleton's placeholder. Launch the kernel, and return "
            "the last partial sum.", lambda a: a.got is not None and a.got.numel() == 1 and float(a.got) == 0.0),
    Mistake("one_pass", "One launch leaves ⌈n / BLOCK⌉ partial sums (32 for n = 1000), and you returned them, or "
            "the first. Launch the kernel again with the partial sums as its input, until one value is left.",
            lambda a: _passes_left(a, 1)),
    Mistake("fixed_passes", "A fixed number of launches is not enough for every n: with BLOCK = 32, n = 4097 "
            "needs three (4097 → 129 → 5 → 1; see `reduction_passes`). Loop until one value is left.",
            _fixed_passes),
    Mistake("stale_n", "A later launch was given the first launch's n: after a pass, the values to reduce are the "
            "partial sums, and there are partial.numel() of them (values, n = partial, partial.numel()).",
            _launch_error("stale_n")),
    Mistake("same_input", "Every launch must read what the previous one wrote: after a pass, the values to reduce "
            "are the partial sums (values = partial), not x.", _launch_error("same_input")),
    Mistake("grid", "One program per tile: ⌈n / BLOCK⌉ programs, triton.cdiv(n, BLOCK), and as many partial sums. "
            "n // BLOCK rounds down and drops the ragged last tile (for n < BLOCK, every tile).",
            _launch_error("grid")),
    Mistake("partial_dtype", "Keep the partial sums in float32 (dtype=torch.float32), whatever x's dtype: the next "
            "pass adds them, and float16 would round each one to 11 significant bits.",
            _launch_error("partial_dtype")),
    Mistake("endless", "The loop does not stop: each launch leaves ⌈n / BLOCK⌉ values; stop when that is 1 (and "
            "make the next launch's n the partial sums' count).", _launch_error("endless")),
    Mistake("too_few", "Part of the sum was added outside the kernel (torch's .sum() or a Python loop): the step is "
            "to add the partial sums by launching the kernel again on them, until one value is left.",
            _launch_error("too_few")),
    Mistake("shape", "Return the sum as a float32 0-dim tensor: partial.reshape(()). Launch at least once, even "
            "when n = 1: a float16 x of one element must come back as float32, not as x itself.",
            _launch_error("shape")),
)


def _run_two_pass(fn, x: torch.Tensor):
    """fn's sum, refused when it is not a float32 0-dim tensor or was finished outside the kernel."""
    kernel = CheckedKernel(x)
    got = fn(x, kernel, BLOCK)
    if isinstance(got, torch.Tensor) and (got.dtype != torch.float32 or got.dim() != 0):
        raise LaunchError("shape", f"expected a float32 0-dim tensor, got {str(got.dtype).removeprefix('torch.')} "
                          f"of shape {tuple(got.shape)}")
    needed = len(reduction_passes(x.numel(), BLOCK))
    if isinstance(got, torch.Tensor) and got.numel() == 1 and kernel.launches < needed \
            and reduction_error(got.reshape(()), x) <= BOUND:
        raise LaunchError("too_few", f"the sum is right, but it took {kernel.launches} launch"
                          f"{'es' * (kernel.launches != 1)} where n = {x.numel()} needs {needed}")
    return got


def _grade_two_pass(fn) -> tuple[int, int, Failure | None]:
    return grade_sums(lambda case, x: _run_two_pass(fn, x), TWO_PASS_MISTAKES,
                      "Write the loop: partial = torch.empty(⌈n / BLOCK⌉, float32); launch ⌈n / BLOCK⌉ programs on "
                      "(values, partial, n); values, n = partial, partial.numel(); stop when n == 1.",
                      per_tile=False)


# --- step 3: one launch, with atomics ----------------------------------------------------------------

@triton.jit
def atomic_sum_kernel_skeleton(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    """Program pid sums its tile x[pid·BLOCK : (pid+1)·BLOCK] (fewer in the last tile) in float32 and adds
    that sum into total[0], which starts at 0, with an atomic read-modify-write."""
    pid = tl.program_id(0).to(tl.int64)
    # TODO: offs = ..., x = tl.load(...)      the tile, as in step 1
    # TODO: tl.atomic_add(total_ptr, ..., sem="relaxed")


atomic_sum = _atomic_sum_kernel  # the solution: the chapter's `_atomic_sum_kernel`


def atomic_total(kernel, x: torch.Tensor) -> torch.Tensor:
    """One launch of `kernel`: ⌈n / BLOCK⌉ programs adding into a float32 total zeroed first."""
    buffer, total = with_slack(1, _tile_slack(x.numel()), 0.0, device=x.device)
    kernel[(triton.cdiv(x.numel(), BLOCK),)](x, total, x.numel(), BLOCK=BLOCK)
    check_slack(buffer, 1, 0.0, "total", "one float")
    return total.reshape(())


def _one_tile(a: SumAttempt) -> bool:
    """The total is one tile's sum: the programs overwrote it, and the last to write won."""
    per = a.sums(True)
    got = a.got.double().cpu()
    return len(per) > 1 and bool(((per - got).abs() <= 1e-3 * a.scale(False)).any())


ATOMIC_MISTAKES = (
    Mistake("unchanged", "The total is still 0: no program added anything. Each adds its tile's sum with "
            "tl.atomic_add(total_ptr, ...).", lambda a: a.got is not None and float(a.got) == 0.0),
    Mistake("store", "The total is one tile's sum: tl.store writes, so each program replaced the total with its own "
            "sum and the last one won. tl.atomic_add reads, adds and writes as one step, so no addition is lost.",
            _one_tile),
    Mistake("past_end", "An atomic wrote past the end of total, which is ONE float: every program adds its tile's "
            "sum, a scalar, at total_ptr itself — not at total_ptr + pid (one slot per program, as partial had in "
            "step 1) nor at total_ptr + offs.", lambda a: isinstance(a.error, SlackWritten)),
    Mistake("offset", OFFSET_HINT, lambda a: a.matches(a.sums(False, _overlapping), False)),
    Mistake("no_mask", NO_MASK_HINT, lambda a: a.matches(a.sums(False, _unmasked), False)),
    Mistake("one_past", ONE_PAST_HINT, lambda a: a.matches(a.sums(False, _one_past), False)),
    Mistake("other", "The total is NaN or ±inf: lanes the mask turns off take the value `other`, and they are "
            "added with the rest. Use other=0.0, the identity of +.", _nonfinite),
    Mistake("float16", FLOAT16_HINT, lambda a: _float16_rounding(a, False)),
)


def _grade_atomic(fn) -> tuple[int, int, Failure | None]:
    return grade_sums(lambda case, x: atomic_total(fn, x), ATOMIC_MISTAKES,
                      "Step 1's tile, then tl.atomic_add(total_ptr, tl.sum(x.to(tl.float32), axis=0), "
                      "sem=\"relaxed\").", per_tile=False)


STEPS = {
    "block_sum": Step("ch01.block_sum", "one program sums one tile into one float", _grade_block_sum,
                      partial_sums_kernel_skeleton, partial_sums, BLOCK_SUM_MISTAKES),
    "two_pass": Step("ch01.two_pass", "launch again on the partial sums until one is left", _grade_two_pass,
                     two_pass_sum_skeleton, two_pass_sum, TWO_PASS_MISTAKES),
    "atomic": Step("ch01.atomic", "one launch: every program adds into the total atomically", _grade_atomic,
                   atomic_sum_kernel_skeleton, atomic_sum, ATOMIC_MISTAKES),
}

__all__ = ["STEPS", "BLOCK", "partial_sums", "partial_sums_kernel_skeleton", "two_pass_sum", "two_pass_sum_skeleton",
           "atomic_sum", "atomic_sum_kernel_skeleton", "block_sums", "atomic_total", "CheckedKernel"]
