"""Lab 3: write a tiled matrix product's K loop, the online softmax's one sweep, then its whole kernel (chapter 3).

The lab gives two kernels, each calling one `@triton.jit` helper the learner writes, and then asks for a
whole kernel (`ch03.softmax_kernel`: chapter 3's `_online_softmax_kernel`, from its signature):

    ch03.k_loop          walk the K axis in BLOCK_K tiles: masked loads (the ragged end of K), tl.dot
                         into a float32 accumulator, slide both windows
    ch03.online_softmax  one sweep over a row in BLOCK tiles: the running max m and the running sum ℓ,
                         ℓ ← ℓ·e^{m_old − m_new} + Σ e^{x − m_new}, from m = −∞ and ℓ = 0

Each step has a skeleton (`*_skeleton`: placeholders that fail the grader) and its solution (the
chapter's own lines: `_matmul_pointer_kernel`'s K loop, `_online_softmax_kernel`'s first loop).
These are not attention cases, so this module holds its own cases, float64 answers and comparison;
the typical mistakes are recognised by replaying the kernel with that one slip in PyTorch.
`tutorial_kernels.labs.check("ch03.<step>", fn)` grades a learner's helper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from tutorial_kernels import ch03_tiling_online_softmax
from tutorial_kernels.labs.steps import Failure, Mistake, Step, check_slack, divmod_index, recognised, with_slack
from tutorial_kernels.precision import dot_precision
from tutorial_kernels.reference import relative_error
from tutorial_kernels.runtime import default_device
from tutorial_kernels.tolerances import tolerance

NOTEBOOK = "03_tiling_online_softmax_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
BLOCK_M = 16  # small tiles: 17 and 70 are ragged, 100 is six tiles and a ragged one
BLOCK_N = 16
BLOCK_K = 16
BLOCK = 16  # the softmax's tile along a row
DTYPES = (torch.float32, torch.float16)  # bfloat16 needs a GPU (the interpreter computes it wrongly)
SEED = 2203


# --- what both steps share: a case, an attempt, the comparison -----------------------------------------

@dataclass(frozen=True)
class Case:
    """One graded call: a matrix product (M, N, K) or softmax rows (rows, n_cols), in `dtype`."""

    sizes: tuple[tuple[str, int], ...]
    dtype: torch.dtype

    def __getitem__(self, name: str) -> int:
        return dict(self.sizes)[name]

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.sizes) + f", dtype={str(self.dtype).removeprefix('torch.')}"


@dataclass
class Trial:
    """The learner's output on one case, with the inputs a detector replays the kernel on."""

    case: Case
    inputs: dict[str, torch.Tensor]
    got: torch.Tensor
    expected: torch.Tensor

    def matches(self, wrong: torch.Tensor) -> bool:
        """Whether the output is this wrong answer: NaN in the same places, the rest within 3× tolerance."""
        got, wrong = self.got.double().cpu(), wrong.double().cpu()
        nan = torch.isnan(got)
        if not torch.equal(nan, torch.isnan(wrong)) or not torch.isfinite(got[~nan]).all():
            return False
        if nan.all():
            return True
        return relative_error(got[~nan], wrong[~nan]) <= 3 * tolerance(self.case.dtype)


def compare(case: Case, got: torch.Tensor, expected: torch.Tensor, axes: tuple[str, str]) -> str | None:
    """None when `got` (2-D) is within the dtype's bound of `expected`; else where and by how much it is wrong."""
    err = relative_error(got, expected)
    bound = tolerance(case.dtype)
    if err <= bound:
        return None
    got64, exp64 = got.double().cpu(), expected.double().cpu()
    diff = (got64 - exp64).abs()
    bad = ~torch.isfinite(got64) | (diff > 10 * bound * max(1.0, exp64.abs().max().item()))
    index = bad.nonzero()[0].tolist() if bad.any() else list(divmod_index(int(diff.argmax()), diff.shape))
    lines = [f"relative error {err:.2e} > {bound:.0e} allowed for this dtype",
             f"first wrong element: {axes[0]} {index[0]}, {axes[1]} {index[1]}: "
             f"expected {exp64[tuple(index)].item():+.5f}, got {got64[tuple(index)].item():+.5f}"]
    nan_rows = int((~torch.isfinite(got64)).any(dim=-1).sum())
    if nan_rows:
        lines.append(f"{nan_rows} output rows hold NaN or ±inf")
    return "\n".join(lines)


def grade(cases: list[Case], draw: Callable[[Case, int], dict], run: Callable[[dict], torch.Tensor],
          answer: Callable[[dict], torch.Tensor], axes: tuple[str, str], mistakes: tuple[Mistake, ...],
          generic_hint: str) -> tuple[int, int, Failure | None]:
    """Run every case in order (fresh random inputs each); (passed, cases, the first failure or None)."""
    for i, case in enumerate(cases):
        inputs = draw(case, SEED + i)
        expected = answer(inputs)
        try:
            got = run(inputs)
        except Exception as exc:  # the learner's code did not compile or run: say what Triton said
            message = str(exc).strip().splitlines()
            return i, len(cases), Failure(str(case), f"the kernel raised {type(exc).__name__}: "
                                          + (message[-1] if message else ""), [generic_hint])
        detail = compare(case, got, expected, axes)
        if detail is not None:
            trial = Trial(case, inputs, got, expected)
            hints = recognised(mistakes, trial)
            return i, len(cases), Failure(str(case), detail, hints or [generic_hint])
    return len(cases), len(cases), None



# --- step 1: the K loop of a tiled matrix product ------------------------------------------------------

@triton.jit
def _lab_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                       K_LOOP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One program: the BLOCK_M × BLOCK_N tile (pid_m, pid_n) of C = A B (row-major launch order)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BLOCK_M, BLOCK_K) addresses
    b_tile = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # (BLOCK_K, BLOCK_N) addresses
    acc = K_LOOP(a_tile, b_tile, offs_m, offs_n, offs_k, M, N, K, stride_ak, stride_bk,
                 BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def lab_matmul(a: torch.Tensor, b: torch.Tensor, loop=None) -> torch.Tensor:
    """C = A B for a (M, K) and b (K, N) through the lab's kernel with the given K loop (the solution
    where None). a and b may be views into larger buffers: what lies past K is then real memory, so a
    loop that reads past the ragged end of K gets a wrong answer, not a fault."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.full((M, N), float("nan"), dtype=a.dtype, device=a.device)  # poisoned: a tile never written stays NaN
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _lab_matmul_kernel[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), c.stride(0),
                             K_LOOP=loop or k_loop, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                             DOT_PRECISION=dot_precision(a.dtype))
    return c


@triton.jit
def k_loop_skeleton(a_tile, b_tile, offs_m, offs_n, offs_k, M, N, K, stride_ak, stride_bk,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Return acc = A[offs_m, :] · B[:, offs_n], a (BLOCK_M, BLOCK_N) float32 tile. a_tile, b_tile: the
    addresses of the first (BLOCK_M, BLOCK_K) tile of A and (BLOCK_K, BLOCK_N) tile of B; K need not be
    a multiple of BLOCK_K, and past K lies other data, not zeros. Pass DOT_PRECISION to tl.dot as
    input_precision ("tf32x3" keeps float32 products at float32 accuracy on a GPU)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # TODO: for k0 in range(0, K, BLOCK_K):
    # TODO:     a = tl.load(a_tile, mask=..., other=0.0)   rows < M, and columns k0 + offs_k < K
    # TODO:     b = tl.load(b_tile, mask=..., other=0.0)   rows k0 + offs_k < K, and columns < N
    # TODO:     acc = ...                                  acc + a b: tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    # TODO:     a_tile += ...                              slide both windows BLOCK_K along K (strides!)
    # TODO:     b_tile += ...
    return acc


@triton.jit
def k_loop(a_tile, b_tile, offs_m, offs_n, offs_k, M, N, K, stride_ak, stride_bk,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """The solution: `_matmul_pointer_kernel`'s K loop (with `input_precision`, as the attention kernels)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # rows past M, columns past N and the ragged end of K load as 0 and add nothing
        a = tl.load(a_tile, mask=(offs_m[:, None] < M) & (k0 + offs_k[None, :] < K), other=0.0)
        b = tl.load(b_tile, mask=(k0 + offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)  # C_tile += A_tile B_tile, float32 accumulator
        a_tile += BLOCK_K * stride_ak  # slide the A window right along K
        b_tile += BLOCK_K * stride_bk  # slide the B window down along K
    return acc


MATMUL_SHAPES = ((1, 1, 1), (17, 17, 17), (70, 33, 70), (17, 70, 100))  # (M, N, K): none a multiple of 16


def matmul_cases() -> list[Case]:
    return [Case((("M", m), ("N", n), ("K", k)), dtype) for dtype in DTYPES for m, n, k in MATMUL_SHAPES]


def draw_matmul(case: Case, seed: int) -> dict[str, torch.Tensor]:
    """Fresh random A (M, K) and B (K, N), each a view into a buffer one tile larger on every side,
    filled with random numbers too: a loop that reads past M, N or K reads them, never unowned memory."""
    M, N, K = case["M"], case["N"], case["K"]
    g = torch.Generator().manual_seed(seed)
    a_buf = torch.randn(M + BLOCK_M, K + BLOCK_K, generator=g).to(case.dtype).to(default_device())
    b_buf = torch.randn(K + BLOCK_K, N + BLOCK_N, generator=g).to(case.dtype).to(default_device())
    return dict(a=a_buf[:M, :K], b=b_buf[:K, :N], a_buf=a_buf, b_buf=b_buf)


def _k_tiles(K: int) -> list[tuple[int, int]]:
    """(k0, width) of every tile of the K loop; the last one is ragged."""
    return [(k0, min(BLOCK_K, K - k0)) for k0 in range(0, K, BLOCK_K)]


def _matmul_unchanged(t: Trial) -> bool:
    return bool(torch.isfinite(t.got).all()) and bool(t.got.abs().max() == 0) and bool(t.expected.abs().max() > 0)


def _matmul_ragged_k(t: Trial) -> bool:
    """The loop read whole tiles past K: C = A_buf[:, :K'] B_buf[:K', :], K' = K rounded up to a tile."""
    M, N, K = t.case["M"], t.case["N"], t.case["K"]
    whole = triton.cdiv(K, BLOCK_K) * BLOCK_K
    return whole > K and t.matches(t.inputs["a_buf"][:M, :whole].double() @ t.inputs["b_buf"][:whole, :N].double())


def _matmul_overwritten(t: Trial) -> bool:
    """acc = tl.dot(a, b): only the last tile's product survives."""
    k0, width = _k_tiles(t.case["K"])[-1]
    a, b = t.inputs["a"].double(), t.inputs["b"].double()
    return k0 > 0 and t.matches(a[:, k0:k0 + width] @ b[k0:k0 + width, :])


def _matmul_not_advanced(t: Trial) -> bool:
    """The windows never moved: every step multiplied the first tile again (masked to the step's width)."""
    tiles = _k_tiles(t.case["K"])
    a, b = t.inputs["a"].double(), t.inputs["b"].double()
    return len(tiles) > 1 and t.matches(sum(a[:, :width] @ b[:width, :] for _, width in tiles))


def _matmul_one_past_k(t: Trial) -> bool:
    """The K mask is k0 + offs_k <= K: one column of A and one row of B past K are added in."""
    M, N, K = t.case["M"], t.case["N"], t.case["K"]
    return K % BLOCK_K != 0 and t.matches(t.inputs["a_buf"][:M, :K + 1].double() @ t.inputs["b_buf"][:K + 1, :N].double())


K_LOOP_MISTAKES = (
    Mistake("unchanged", "Every element came out as 0: acc is still the zeros it started as. Write the loop over "
            "k0 that adds each tile's product into acc.", _matmul_unchanged),
    Mistake("ragged_k", "The output is what you get when whole tiles are read past the end of K: the last tile is "
            "ragged (K is not a multiple of BLOCK_K) and what lies past K is other data. Mask the K axis of both "
            "loads with the window's position, k0 + offs_k < K (not offs_k < K: the window has moved by k0), "
            "and give other=0.0 so the missing terms add nothing.", _matmul_ragged_k),
    Mistake("overwritten", "The output is the last K tile's product alone: acc = tl.dot(a, b) throws away what the "
            "earlier tiles summed. Accumulate: acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION) (or acc += "
            "tl.dot(a, b)).", _matmul_overwritten),
    Mistake("not_advanced", "The output is the first K tile's product counted once per tile: the windows never "
            "moved. After each tile slide them along K: a_tile += BLOCK_K * stride_ak, b_tile += BLOCK_K * "
            "stride_bk.", _matmul_not_advanced),
    Mistake("one_past_k", "The output includes one term past the end of K: the mask lets k0 + offs_k = K through "
            "(<= instead of <). Index K is already past the end (A has columns 0 … K − 1): mask with "
            "k0 + offs_k < K.", _matmul_one_past_k),
)


def _grade_k_loop(fn) -> tuple[int, int, Failure | None]:
    return grade(matmul_cases(), draw_matmul, lambda x: lab_matmul(x["a"], x["b"], loop=fn),
                 lambda x: x["a"].double() @ x["b"].double(), ("row", "column"), K_LOOP_MISTAKES,
                 "Write the loop from the picture: for each k0, load the A tile and the B tile (masked at M, N "
                 "and k0 + offs_k < K, other=0.0), add tl.dot(a, b) into acc, and slide both windows BLOCK_K "
                 "along K.")


# --- step 2: the online softmax's one sweep ------------------------------------------------------------

@triton.jit
def _lab_softmax_kernel(x_ptr, y_ptr, n_cols, STATS: tl.constexpr, BLOCK: tl.constexpr):
    """One row of softmax: the learner's STATS sweeps it for (m, ℓ), then one sweep writes
    y = e^{x − m} / ℓ. Unlike the chapter's kernel, an ℓ that is NaN is not hidden: its row stays NaN."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    y_row = y_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    m, l = STATS(x_row, n_cols, BLOCK)
    shift = tl.where(m == float("-inf"), 0.0, m)
    inv_l = tl.where(l == 0.0, 0.0, 1.0 / l)  # an all −∞ row (ℓ = 0) becomes zeros
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(y_row + start + cols, (tl.exp(x - shift) * inv_l).to(y_ptr.dtype.element_ty), mask=mask)


def lab_softmax(x: torch.Tensor, stats=None) -> torch.Tensor:
    """Softmax over the rows of a contiguous 2-D x through the lab's kernel with the given sweep (the
    solution where None)."""
    x = x.contiguous()
    y = torch.full_like(x, float("nan"))  # poisoned: a row the kernel never writes stays NaN
    _lab_softmax_kernel[(x.shape[0],)](x, y, x.shape[1], STATS=stats or row_statistics, BLOCK=BLOCK)
    return y


@triton.jit
def row_statistics_skeleton(x_row, n_cols, BLOCK: tl.constexpr):
    """Sweep the row x_row[0 : n_cols] once, in tiles of BLOCK entries, and return (m, ℓ): its maximum m
    and ℓ = Σ_j e^{x_j − m}, two float32 scalars (0-d tensors). n_cols need not be a multiple of BLOCK;
    entries may be −∞ (hidden), a whole row too: then m = −∞ and ℓ = 0. Load the tile with
    tl.load(...).to(tl.float32)."""
    cols = tl.arange(0, BLOCK)
    m = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)  # placeholder: replace it with m_0 (the TODO below)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)  # placeholder: replace it with ℓ_0
    # TODO: m = ...     m_0, a 0-d float32 tensor: tl.max(tl.full([BLOCK], ..., tl.float32), axis=0)
    # TODO: l = ...     ℓ_0, likewise: tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    # TODO: for start in range(0, n_cols, BLOCK):
    # TODO:     x = ...        the tile x_row[start + cols]; entries past n_cols must add nothing to ℓ
    # TODO:     m_new = ...    m_t = max(m_{t−1}, max_j x_j)
    # TODO:     shift = ...    m_new, but 0 where m_new is −∞ (a row that has seen only −∞ so far)
    # TODO:     l = ...        ℓ_t = ℓ_{t−1}·e^{m_{t−1} − m_t} + Σ_j e^{x_j − m_t}
    # TODO:     m = m_new
    return m, l


@triton.jit
def row_statistics(x_row, n_cols, BLOCK: tl.constexpr):
    """The solution: `_online_softmax_kernel`'s first loop."""
    cols = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)  # m_0 = −∞ (a scalar tensor)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)  # l_0 = 0
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))  # m_t = max(m_{t−1}, max_j x_j)
        # While every entry seen so far is −∞, m_new is −∞ too; shift by 0 instead so e^{−∞ − (−∞)}
        # (NaN) is never formed and the −∞ entries contribute e^{−∞} = 0.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)  # l_t = l_{t−1}·e^{m_{t−1}−m_t} + Σ e^{x_j−m_t}
        m = m_new
    return m, l


SOFTMAX_LENGTHS = (1, 17, 70)  # one entry, one tile and a ragged one, four tiles and a ragged one
ROWS = 5
FAR_BELOW = -200.0  # e^{−200} underflows to 0 in float32 (the smallest positive float32 is about e^{−103})


def softmax_cases() -> list[Case]:
    return [Case((("rows", ROWS), ("n_cols", n), ("BLOCK", BLOCK)), dtype) for dtype in DTYPES for n in SOFTMAX_LENGTHS]


def draw_rows(case: Case, seed: int) -> dict[str, torch.Tensor]:
    """Fresh random rows, each made to catch one mistake:
    row 0  a rising ramp with noise: the maximum grows on every tile, so every rescale matters;
    row 1  ordinary scores;
    row 2  every entry near −200: the true maximum is far below 0;
    row 3  −∞ for the first 20 entries (hidden scores), ordinary scores after: a tile that is all −∞;
    row 4  ordinary scores with a large one at the end: α drops far below 1 on the last tile."""
    n = case["n_cols"]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, n, generator=g, dtype=torch.float64) * 2
    x[0] = torch.linspace(-4.0, 4.0, n, dtype=torch.float64) + 0.3 * x[0]
    x[2] = FAR_BELOW + 1.5 * x[2]
    x[3, :20] = -math.inf
    x[4, -1] += 8.0
    return dict(x=x.to(case.dtype).to(default_device()))


def softmax64(x: torch.Tensor) -> torch.Tensor:
    """Row softmax in float64; a row that is −∞ throughout is zeros."""
    x = x.double()
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - torch.where(torch.isfinite(m), m, 0.0))
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)


def replay_softmax(x: torch.Tensor, *, m0: float = -math.inf, rescale: str = "right", pad: float = -math.inf,
                   guard: bool = True) -> torch.Tensor:
    """What the lab's kernel writes, replayed in float32 PyTorch, with one typical mistake switched on:
    m0 = 0.0 (m starts at 0), rescale = "none" or "inverted" (ℓ·e^{m_new − m_old}), pad = 0.0 (the
    ragged tile's missing entries load as 0), guard = False (e^{x − m_new} with m_new = −∞)."""
    x = x.float().cpu()
    rows, n = x.shape
    padded = torch.full((rows, triton.cdiv(n, BLOCK) * BLOCK), pad)
    padded[:, :n] = x
    m = torch.full((rows,), m0)
    l = torch.zeros(rows)
    for start in range(0, n, BLOCK):
        tile = padded[:, start:start + BLOCK]
        m_new = torch.maximum(m, tile.amax(dim=1))
        shift = torch.where(m_new == -math.inf, 0.0, m_new) if guard else m_new
        alpha = {"right": torch.exp(m - shift), "none": torch.ones(rows), "inverted": torch.exp(shift - m)}[rescale]
        l = l * alpha + torch.exp(tile - shift[:, None]).sum(dim=1)
        m = m_new
    shift = torch.where(m == -math.inf, 0.0, m)
    inv_l = torch.where(l == 0.0, 0.0, 1.0 / l)
    return torch.exp(x - shift[:, None]) * inv_l[:, None]


def _softmax_mistake(**slip):
    def detect(t: Trial) -> bool:
        right = replay_softmax(t.inputs["x"])
        wrong = replay_softmax(t.inputs["x"], **slip)
        return not torch.allclose(right, wrong, equal_nan=True) and t.matches(wrong)
    return detect


def _softmax_unchanged(t: Trial) -> bool:
    return bool(torch.isfinite(t.got).all()) and bool(t.got.abs().max() == 0)


ONLINE_SOFTMAX_MISTAKES = (
    Mistake("unchanged", "Every row came out as zeros: ℓ is still 0. Write the sweep: for each tile, the new "
            "running max, then ℓ rescaled and this tile's exponentials added. If you wrote it, check that no "
            "line after your loop sets m and ℓ back (the skeleton's placeholders belong before the sweep, "
            "replaced by m_0 and ℓ_0).", _softmax_unchanged),
    Mistake("no_rescale", "The output is what you get when ℓ is not rescaled: when the running max grows from "
            "m_old to m_new, the terms already in ℓ were measured from m_old. Multiply ℓ by α = e^{m_old − m_new} "
            "before adding the tile: l = l * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0).",
            _softmax_mistake(rescale="none")),
    Mistake("inverted", "The rescale factor is upside down: ℓ·e^{m_new − m_old} grows ℓ where it must shrink "
            "(and with m_old = −∞ it is e^{+∞}·0 = NaN). The factor is α = e^{m_old − m_new} ≤ 1: tl.exp(m - shift).",
            _softmax_mistake(rescale="inverted")),
    Mistake("m0_zero", "A row whose entries are all far below 0 (row 2: about −200) came out wrong: m started at 0, "
            "so it stays 0, and e^{x − 0} underflows to 0 in float32, leaving ℓ = 0. Start from m_0 = −∞: "
            "m = tl.max(tl.full([BLOCK], float(\"-inf\"), tl.float32), axis=0). The maximum must be the row's own.",
            _softmax_mistake(m0=0.0)),
    Mistake("ragged", "The entries past n_cols count as zeros: the last tile is ragged (n_cols is not a multiple "
            "of BLOCK) and each missing entry added e^{0 − m} to ℓ. Load with mask=start + cols < n_cols and "
            "other=float(\"-inf\"), so it adds e^{−∞} = 0 and cannot raise the maximum.",
            _softmax_mistake(pad=0.0)),
    Mistake("nan", "A row whose first tile is all −∞ (row 3) became NaN: there m_new = −∞ and x − m_new = "
            "−∞ − (−∞) = NaN. Subtract shift = tl.where(m_new == float(\"-inf\"), 0.0, m_new) instead of m_new.",
            _softmax_mistake(guard=False)),
)


def _grade_online_softmax(fn) -> tuple[int, int, Failure | None]:
    return grade(softmax_cases(), draw_rows, lambda x: lab_softmax(x["x"], stats=fn), lambda x: softmax64(x["x"]),
                 ("row", "column"), ONLINE_SOFTMAX_MISTAKES,
                 "Write the sweep from the equations: m_0 = −∞, ℓ_0 = 0; per tile (masked at n_cols, other −∞), "
                 "m_new = max(m, max x), shift, ℓ = ℓ·e^{m − shift} + Σ e^{x − shift}, m = m_new.")


# --- step 3: the whole online-softmax kernel -----------------------------------------------------------

@triton.jit
def online_softmax_kernel_skeleton(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    """Softmax of one row of a contiguous (rows, n_cols) tensor x into y (same shape and dtype): program i
    of the grid (rows,) owns row i. Two sweeps in tiles of BLOCK entries: the first gathers the row's
    maximum m and ℓ = Σ_j e^{x_j − m} (step 2), the second writes y_j = e^{x_j − m} / ℓ. n_cols need not
    be a multiple of BLOCK; a row that is −∞ throughout becomes zeros."""
    # TODO: which row this program owns, and where it starts in x and in y (rows may be long: 64-bit)
    # TODO: the first sweep: m and ℓ
    # TODO: the second sweep: each tile's e^{x − m} / ℓ, stored in y's dtype
    pass


online_softmax_kernel = ch03_tiling_online_softmax._online_softmax_kernel  # the solution: the chapter's kernel


def _softmax_by_kernel(kernel, x: torch.Tensor) -> torch.Tensor:
    """`kernel` (the signature of `online_softmax_kernel`) on the rows of a contiguous 2-D x; y starts as NaN."""
    x = x.contiguous()
    # y followed by a tile's worth of slack: a store past its end (a missing mask) is reported, not a crash
    buffer, flat = with_slack(x.numel(), BLOCK, float("nan"), x.dtype, x.device)
    y = flat.view(x.shape)
    kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=BLOCK)
    check_slack(buffer, x.numel(), float("nan"), "y", "mask the stores at n_cols")
    return y


def _not_normalised(t: Trial) -> bool:
    """y_j = e^{x_j − m}, never divided by ℓ."""
    x = t.inputs["x"].double()
    m = x.amax(dim=-1, keepdim=True)
    return t.matches(torch.exp(x - torch.where(torch.isfinite(m), m, 0.0)))


def _hidden_tile_rows_lost(t: Trial) -> bool:
    """The rows whose first tile is all −∞ came out NaN or zero (e^{−∞ − (−∞)} in the first sweep), the others right."""
    x = t.inputs["x"]
    lost = torch.isnan(replay_softmax(x, guard=False)).any(dim=-1)
    got = t.got.double().cpu()
    bad = torch.isnan(got).any(dim=-1) | (got == 0).all(dim=-1)
    right = softmax64(x).cpu()
    return bool(lost.any()) and torch.equal(bad, lost) and relative_error(got[~lost], right[~lost]) <= 3 * tolerance(
        t.case.dtype)


_STATS_MISTAKES = {m.name: m for m in ONLINE_SOFTMAX_MISTAKES}
SOFTMAX_KERNEL_MISTAKES = (
    Mistake("unwritten", "Every element of y is still the NaN the lab filled it with: the kernel stored nothing. "
            "The second sweep ends each tile with tl.store, masked at n_cols.", lambda t: bool(torch.isnan(t.got).all())),
    Mistake("zeros", "Every row came out as zeros: ℓ ended 0 or NaN (and 1/ℓ was guarded to 0). Does ℓ accumulate "
            "each tile's Σ e^{x − m_new}? Is the rescale factor e^{m_old − m_new}, not upside down (with m_old = −∞, "
            "e^{m_new − m_old} = ∞ and ∞ · 0 = NaN from the first tile)?",
            lambda t: bool(torch.isfinite(t.got).all()) and bool(t.got.abs().max() == 0)),
    *(_STATS_MISTAKES[name] for name in ("no_rescale", "m0_zero", "ragged")),
    Mistake("nan", _STATS_MISTAKES["nan"].hint.replace("became NaN", "was lost (NaN, or zeros)"), _hidden_tile_rows_lost),
    Mistake("not_normalised", "The output is e^{x − m}, never divided by ℓ: every row must sum to 1. Divide by ℓ in "
            "the second sweep (a row of −∞ has ℓ = 0: write zeros there).", _not_normalised),
)


def _grade_softmax_kernel(fn) -> tuple[int, int, Failure | None]:
    return grade(softmax_cases(), draw_rows, lambda x: _softmax_by_kernel(fn, x["x"]), lambda x: softmax64(x["x"]),
                 ("row", "column"), SOFTMAX_KERNEL_MISTAKES,
                 "Two sweeps over the row, in tiles masked at n_cols: the first is step 2's (m and ℓ), the second "
                 "writes e^{x − m} / ℓ; the row's start is row · n_cols, with the row id in 64 bits.")


STEPS = {
    "k_loop": Step("ch03.k_loop", "walk the K axis of a tiled matrix product", _grade_k_loop,
                   k_loop_skeleton, k_loop, K_LOOP_MISTAKES),
    "online_softmax": Step("ch03.online_softmax", "the running max and sum of a row, in one sweep",
                           _grade_online_softmax, row_statistics_skeleton, row_statistics, ONLINE_SOFTMAX_MISTAKES),
    "softmax_kernel": Step("ch03.softmax_kernel", "the whole online-softmax kernel", _grade_softmax_kernel,
                           online_softmax_kernel_skeleton, online_softmax_kernel, SOFTMAX_KERNEL_MISTAKES),
}

__all__ = ["STEPS", "lab_matmul", "lab_softmax", "k_loop_skeleton", "k_loop", "row_statistics",
           "row_statistics_skeleton", "replay_softmax", "softmax64", "online_softmax_kernel",
           "online_softmax_kernel_skeleton"]
