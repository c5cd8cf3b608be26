"""Lab 9: the three changes chapter 9 makes to chapter 5's kernel, written by the learner as `@triton.jit`
helpers that the lab's kernel (`_lab_variants_kernel`, chapter 9's forward with its helpers passed in) calls:

    ch09.key_range   the key tiles a query tile's band needs: a window skips tiles, it does not mask them
    ch09.scores      a tile's scores with softcap, ALiBi and the window's mask, and the softcap's derivative
    ch09.sequence    where a packed batch's sequence starts and how long it is, from cu_seqlens

Each step has a skeleton (placeholders that fail the grader) and its solution (chapter 9's own helper).
The kernel counts the key tiles each program visits, so a band that is right but skips nothing fails too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tutorial_kernels.ch09_variants import _key_range, _sequence, _variant_scores, key_range as host_key_range
from tutorial_kernels.labs.steps import Failure, Mistake, SlackWritten, Step, recognised
from tutorial_kernels.precision import dot_precision
from tutorial_kernels.reference import expand_kv_heads
from tutorial_kernels.runtime import default_device
from tutorial_kernels.tiling import head_dim_block

NOTEBOOK = "09_variants_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
BLOCK_M = 16
BLOCK_N = 16


# --- the kernel the lab provides ----------------------------------------------------------------------

@triton.jit
def _lab_variants_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, tiles_ptr, cu_q_ptr, cu_k_ptr, slopes_ptr,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    n_heads, n_q_dense, n_k_dense, head_dim, sm_scale, softcap, left, right, n_tiles,
    SEQUENCE: tl.constexpr, KEY_RANGE: tl.constexpr, SCORES: tl.constexpr,  # the learner's three helpers
    VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Chapter 9's forward (one head per key/value head, head_dim contiguous); also writes how many key
    tiles each program visited to tiles[(sequence, head), query tile]."""
    pid_bh = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1)
    batch, head = pid_bh // n_heads, pid_bh % n_heads
    q_start, n_q = SEQUENCE(cu_q_ptr, batch, n_q_dense, VARLEN)
    k_start, n_k = SEQUENCE(cu_k_ptr, batch, n_k_dense, VARLEN)
    if pid_m * BLOCK_M >= n_q:
        tl.store(tiles_ptr + pid_bh * n_tiles + pid_m, 0)
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh + (q_start + rows)[:, None] * stride_qm
                + offs_d[None, :], mask=(rows[:, None] < n_q) & d_ok[None, :], other=0.0)
    k_head = k_ptr + batch * stride_kb + head * stride_kh + k_start * stride_kn
    v_head = v_ptr + batch * stride_vb + head * stride_vh + k_start * stride_vn
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes_ptr + head)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    visited = 0
    lo, hi = KEY_RANGE(pid_m * BLOCK_M, n_q, n_k, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_t = tl.load(k_head + cols[None, :] * stride_kn + offs_d[:, None], mask=(cols[None, :] < n_k) & d_ok[:, None],
                      other=0.0)
        s, _ = SCORES(tl.dot(q, k_t, input_precision=DOT_PRECISION), rows, cols, n_q, n_k, sm_scale, softcap, slope,
                      left, right, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - shift[:, None])
        alpha = tl.math.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_head + cols[:, None] * stride_vn + offs_d[None, :], mask=(cols[:, None] < n_k) & d_ok[None, :],
                    other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
        visited += 1
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(o_ptr + batch * stride_ob + head * stride_oh + (q_start + rows)[:, None] * stride_om + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=(rows[:, None] < n_q) & d_ok[None, :])
    tl.store(tiles_ptr + pid_bh * n_tiles + pid_m, visited)


@triton.jit
def _probe_scores_kernel(x_ptr, s_ptr, slope_ptr, softcap, SCORES: tl.constexpr, BLOCK: tl.constexpr):
    """The learner's scores on a BLOCK × BLOCK tile of raw products (sm_scale 1, no bias, no mask, softcap on):
    the capped scores in log₂ units and the factor dS_capped/dS, for comparison with c·tanh(x/c), 1 − tanh²."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs[:, None] * BLOCK + offs[None, :])
    s, slope = SCORES(x, offs, offs, BLOCK, BLOCK, 1.0, softcap, 0.0, 0, 0, True, False, False, False)
    tl.store(s_ptr + offs[:, None] * BLOCK + offs[None, :], s)
    tl.store(slope_ptr + offs[:, None] * BLOCK + offs[None, :], slope + x * 0.0)


def lab_variants(q, k, v, *, cu_q=None, cu_k=None, window=(-1, -1), softcap=0.0, slopes=None, sequence=_sequence,
                 key_range=_key_range, scores=_variant_scores) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, key tiles visited per program) of the lab's kernel with these helpers. Dense q (B, H, n_q, d) or
    packed (tokens, H, d) with cu_seqlens; k, v with q's heads; window (left, right), −1: unbounded. Raises
    SlackWritten if a packed sequence's rows were written past the end of the batch."""
    varlen = cu_q is not None
    if varlen:
        # a wrong start or length reads and writes past the packed tensors: give them slack rows (zeros to
        # read, NaN to write into), as Triton's interpreter would otherwise touch memory the process may not own
        total = q.shape[0]
        slack = 2 * total + 2 * BLOCK_M
        q, k, v = (torch.cat([t, t.new_zeros((slack,) + t.shape[1:])]) for t in (q, k, v))
        out, tiles = _launch(q, k, v, cu_q, cu_k, window, softcap, slopes, sequence, key_range, scores)
        written = ~torch.isnan(out[total:]).all(dim=(1, 2))
        if bool(written.any()):
            raise SlackWritten(f"a store wrote past the end of the packed output: {int(written.sum())} rows after "
                               f"its {total} tokens were written, the first at token {total + int(written.nonzero()[0])}")
        return out[:total], tiles
    return _launch(q, k, v, cu_q, cu_k, window, softcap, slopes, sequence, key_range, scores)


def _launch(q, k, v, cu_q, cu_k, window, softcap, slopes, sequence, key_range, scores):
    varlen = cu_q is not None
    if varlen:
        batch, heads = cu_q.numel() - 1, q.shape[1]
        n_q = int((cu_q[1:] - cu_q[:-1]).max()) if batch else 0
        n_k = int((cu_k[1:] - cu_k[:-1]).max()) if batch else 0
        strides = [(0, t.stride(1), t.stride(0)) for t in (q, k, v)]
    else:
        batch, heads, n_q, _ = q.shape
        n_k = k.shape[2]
        strides = [t.stride()[:3] for t in (q, k, v)]
    out = torch.full_like(q, float("nan"))
    o_strides = (0, out.stride(1), out.stride(0)) if varlen else out.stride()[:3]
    n_tiles = max(triton.cdiv(n_q, BLOCK_M), 1)
    tiles = torch.full((batch * heads, n_tiles), -1, dtype=torch.int32, device=q.device)
    dummy = torch.zeros(2, dtype=torch.int32, device=q.device)
    left, right = window
    _lab_variants_kernel[(batch * heads, n_tiles)](
        q, k, v, out, tiles, cu_q if varlen else dummy, cu_k if varlen else dummy,
        slopes if slopes is not None else dummy.float(), *strides[0], *strides[1], *strides[2], *o_strides,
        heads, n_q, n_k, q.shape[-1], 1.0 / math.sqrt(q.shape[-1]), float(softcap), max(left, 0), max(right, 0),
        n_tiles, SEQUENCE=sequence, KEY_RANGE=key_range, SCORES=scores, VARLEN=varlen, SOFTCAP=softcap > 0,
        ALIBI=slopes is not None, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        BLOCK_D=head_dim_block(q.shape[-1]), DOT_PRECISION=dot_precision(q.dtype))
    return out, tiles


# --- float64 answers, right and typically wrong ----------------------------------------------------------

def variants64(q, k, v, window=(-1, -1), softcap=0.0, slopes=None, *, bias_capped=False, sign=-1.0,
               mask=True) -> torch.Tensor:
    """O in float64 for one dense (B, H, n_q, d) problem, scores cap → bias → mask (flash-attn's order), or
    with one slip: the bias inside the cap, the bias's sign flipped, no window mask (every key of the key
    tiles the lab kernel's band visits is then seen)."""
    n_q, n_k = q.shape[2], k.shape[2]
    if n_q == 0 or n_k == 0:
        return torch.zeros(*q.shape, dtype=torch.float64, device=q.device)
    x = (q.double() @ expand_kv_heads(k, q.shape[1]).double().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    distance = (torch.arange(n_k)[None, :] - (torch.arange(n_q)[:, None] + n_k - n_q)).to(x.device)
    bias = 0.0 if slopes is None else sign * slopes.double().reshape(1, -1, 1, 1) * distance.abs()
    if bias_capped:
        x = x + bias
    if softcap > 0:
        x = softcap * torch.tanh(x / softcap)
    if not bias_capped:
        x = x + bias
    seen = torch.ones(n_q, n_k, dtype=torch.bool, device=x.device)
    left, right = window
    if mask and left >= 0:
        seen &= distance >= -left
    if mask and right >= 0:
        seen &= distance <= right
    if not mask:  # the window's mask forgotten: a query sees every key of the tiles its band visits
        for start_m in range(0, n_q, BLOCK_M):
            lo, hi = host_key_range(start_m, n_q, n_k, left if left >= 0 else None, right if right >= 0 else None,
                                    BLOCK_M, BLOCK_N)
            end = min(n_k, lo + triton.cdiv(max(hi - lo, 0), BLOCK_N) * BLOCK_N)
            seen[start_m:start_m + BLOCK_M] = False
            seen[start_m:start_m + BLOCK_M, lo:end] = True
    x = x.masked_fill(~seen, -math.inf)
    top = x.amax(-1, keepdim=True)
    e = torch.exp(x - torch.where(torch.isfinite(top), top, 0.0))
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0) @ expand_kv_heads(v, q.shape[1]).double()


def _draw(shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(default_device()).to(dtype)


def _error(got, expected) -> tuple[float, tuple]:
    diff = (got.double() - expected.double()).abs().nan_to_num(nan=math.inf)
    index = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.numel() else ()
    return (diff.max().item() if diff.numel() else 0.0), index


def _close(got, expected, dtype) -> bool:
    bound = 2e-5 if dtype == torch.float32 else 4e-3
    if got.numel() == 0:
        return True
    return bool(torch.isfinite(got).all()) and _error(got, expected)[0] <= bound * max(1.0, expected.abs().max().item())


@dataclass(frozen=True)
class Case:
    n_q: int
    n_k: int
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dtype: torch.dtype = torch.float32

    def __str__(self) -> str:
        parts = [f"n_q={self.n_q}, n_k={self.n_k}, window={self.window}"]
        parts += [f"softcap={self.softcap}"] if self.softcap else []
        parts += ["ALiBi"] if self.alibi else []
        return ", ".join(parts) + f", {str(self.dtype).removeprefix('torch.')}"


@dataclass
class VariantAttempt:
    case: Case
    inputs: tuple
    got: torch.Tensor
    expected: torch.Tensor
    tiles: torch.Tensor | None = None
    needed: torch.Tensor | None = None

    def is_(self, **slip) -> bool:
        q, k, v, slopes = self.inputs
        wrong = variants64(q, k, v, self.case.window, self.case.softcap, slopes, **slip)
        return _close(self.got, wrong, self.case.dtype)


def _needed_tiles(case: Case, heads: int) -> torch.Tensor:
    """The tiles chapter 9's band visits per (head, query tile): the lab's bar for skipping."""
    left, right = case.window
    counts = []
    for start_m in range(0, case.n_q, BLOCK_M):
        lo, hi = host_key_range(start_m, case.n_q, case.n_k, left if left >= 0 else None,
                                right if right >= 0 else None, BLOCK_M, BLOCK_N)
        counts.append(max(0, triton.cdiv(hi - lo, BLOCK_N)))
    return torch.tensor(counts, dtype=torch.int32).repeat(heads, 1)


def _grade_dense(cases, mistakes, generic, **helpers) -> tuple[int, int, Failure | None]:
    heads = 2
    for i, case in enumerate(cases):
        q, k, v = (_draw((1, heads, n, 24), 90 + 3 * i + j, case.dtype) for j, n in enumerate((case.n_q, case.n_k,
                                                                                               case.n_k)))
        slopes = torch.tensor([0.5, 0.25], device=q.device) if case.alibi else None
        try:
            got, tiles = lab_variants(q, k, v, window=case.window, softcap=case.softcap, slopes=slopes, **helpers)
        except Exception as exc:  # noqa: BLE001  (the learner's helper: say what Triton said)
            lines = str(exc).strip().splitlines()
            return i, len(cases), Failure(str(case), f"the kernel raised {type(exc).__name__}: "
                                          + (lines[-1] if lines else ""), [generic])
        expected = variants64(q, k, v, case.window, case.softcap, slopes)
        needed = _needed_tiles(case, heads)
        attempt = VariantAttempt(case, (q, k, v, slopes), got, expected, tiles.cpu(), needed)
        if not _close(got, expected, case.dtype):
            err, at = _error(got, expected)
            detail = (f"largest error {err:.2e} at head {at[1]}, query row {at[2]}, column {at[3]}: expected "
                      f"{expected[at].item():+.5f}, got {got[at].item():+.5f}")
            return i, len(cases), Failure(str(case), detail, recognised(mistakes, attempt) or [generic])
        extra = tiles.cpu() > needed
        if bool(extra.any()):
            h, m = (int(x) for x in extra.nonzero()[0])
            detail = (f"the output is right, but query tile {m} (rows {m * BLOCK_M}–{m * BLOCK_M + BLOCK_M - 1}) of "
                      f"head {h} visited {int(tiles[h, m])} key tiles where {int(needed[h, m])} hold every key it "
                      "may see: masked, not skipped")
            return i, len(cases), Failure(str(case), detail, recognised(mistakes, attempt) or [generic])
    return len(cases), len(cases), None


# --- step 1: the band's key tiles ------------------------------------------------------------------------------

@triton.jit
def key_range_skeleton(start_m, n_q, n_k, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[lo, hi): the keys the query tile [start_m, start_m + BLOCK_M) may see, lo rounded down to a key tile's
    start. Query i sees key j when −left ≤ j − (i + n_k − n_q) ≤ right (HAS_LEFT / HAS_RIGHT False: that
    side unbounded). The kernel loops `for start_n in range(lo, hi, BLOCK_N)`: every tile it visits costs."""
    lo = 0
    hi = n_k
    # TODO: if HAS_LEFT: lo = ...   the first row's first key, start_m + (n_k − n_q) − left, at least 0,
    #                               rounded down to a multiple of BLOCK_N
    # TODO: if HAS_RIGHT: hi = ...  one past the last row's last key, start_m + BLOCK_M + (n_k − n_q) + right,
    #                               at most n_k
    return lo, hi


key_range = _key_range  # the solution: chapter 9's `_key_range`

KEY_RANGE_CASES = [Case(40, 40, (7, 0)), Case(40, 40, (5, 3)), Case(33, 57, (9, -1)), Case(57, 33, (-1, 2)),
                   Case(64, 64, (17, 1)), Case(40, 40, (0, 0)), Case(48, 48, (100, 100)),
                   Case(40, 40, (7, 0), dtype=torch.float16)]

KEY_RANGE_MISTAKES = (
    Mistake("no_skip", "Right output, but every key tile is visited: the mask hides the keys outside the band, "
            "but the loop still loads and multiplies their tiles. Narrow [lo, hi) to the band: that is where a "
            "window saves its work.", lambda a: a.tiles is not None and bool((a.tiles >= a.needed).all())
            and bool((a.tiles > a.needed).any()) and _close(a.got, a.expected, a.case.dtype)),
    Mistake("offset", "Keys are missing where n_q ≠ n_k: the band is measured from the bottom-right diagonal, "
            "so both bounds carry the offset n_k − n_q (start_m + (n_k − n_q) − left, …).",
            lambda a: a.case.n_q != a.case.n_k and not _close(a.got, a.expected, a.case.dtype)),
    Mistake("last_row", "Some keys at the right edge are missing: the tile's last row is start_m + BLOCK_M − 1, "
            "and hi is one past its last key, start_m + BLOCK_M + (n_k − n_q) + right.",
            lambda a: a.case.n_q == a.case.n_k and a.case.window[1] >= 0 and not _close(a.got, a.expected,
                                                                                         a.case.dtype)),
)


def _grade_key_range(fn) -> tuple[int, int, Failure | None]:
    return _grade_dense(KEY_RANGE_CASES, KEY_RANGE_MISTAKES, "Write both bounds from the docstring: the tile's first "
                        "row's first key (rounded down to a tile) and one past its last row's last key.",
                        key_range=fn)


# --- step 2: the scores ----------------------------------------------------------------------------------------

@triton.jit
def tanh(x):
    """tanh x = 1 − 2 / (e^{2x} + 1), exactly ±1 at the extremes (chapter 9's `_tanh`), for the scores step."""
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def scores_skeleton(qk, rows, cols, n_q, n_k, sm_scale, softcap, slope, left, right,
                    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """A tile's scores in log₂ units (× log₂e, for the kernel's exp2), −∞ where the mask hides a key, and the
    softcap's derivative dS/dx (1 where there is no cap). qk: Q_i K_jᵀ for query rows `rows` and key columns
    `cols`. In order: x = sm_scale · qk; with SOFTCAP, S = softcap · tanh(x / softcap) (`tanh`) and the
    derivative 1 − tanh²; with ALIBI, S −= slope · |j − (i + n_k − n_q)|; hide keys past n_k, rows past n_q,
    and outside −left ≤ j − (i + n_k − n_q) ≤ right."""
    x = qk * sm_scale
    slope_of_cap = 1.0
    # TODO: if SOFTCAP: t = tanh(x / softcap); x = ...; slope_of_cap = ...
    # TODO: distance = ...            j − (i + n_k − n_q), a (rows, cols) tile: cols[None, :], rows[:, None]
    # TODO: if ALIBI: x = ...         minus slope · |distance| (as float32)
    # TODO: seen = ...                in range (rows < n_q, cols < n_k), and inside the window where bounded
    return x * 1.4426950408889634, slope_of_cap  # TODO: −∞ where not seen (tl.where)


scores = _variant_scores  # the solution: chapter 9's `_variant_scores`

SCORE_CASES = [Case(40, 40), Case(40, 40, softcap=2.0), Case(33, 57, alibi=True), Case(40, 40, (7, 0)),
               Case(57, 33, (5, 3), softcap=1.5, alibi=True), Case(40, 40, (9, 0), softcap=2.5, alibi=True,
                                                                    dtype=torch.float16)]


def _slip(**kw):
    return lambda a: a.is_(**kw)


SCORE_MISTAKES = (
    Mistake("bias_capped", "The ALiBi bias went inside the cap: flash-attn's order is cap first, then the bias, "
            "S = c·tanh(x/c) − slope·|D|; capping the sum bends the bias too.", _slip(bias_capped=True)),
    Mistake("bias_sign", "The bias has the wrong sign: ALiBi subtracts slope·|D|, so far keys score lower.",
            _slip(sign=1.0)),
    Mistake("no_mask", "Keys outside the window were seen: give them −∞ where the distance is out of "
            "[−left, right] (only on the sides HAS_LEFT / HAS_RIGHT bound).", _slip(mask=False)),
)


def _grade_slope(fn) -> str | None:
    """None if the learner's derivative is 1 − tanh²(x/c) on a tile of raw products, else what is wrong."""
    block, c = 16, 2.0
    x = torch.linspace(-8.0, 8.0, block * block, device=default_device(), dtype=torch.float32).reshape(block, block)
    s, slope = torch.empty_like(x), torch.empty_like(x)
    _probe_scores_kernel[(1,)](x, s, slope, c, SCORES=fn, BLOCK=block)
    t = torch.tanh(x.double() / c)
    err = (slope.double() - (1 - t * t)).abs().max().item()
    if not err <= 1e-4:
        at = int((slope.double() - (1 - t * t)).abs().argmax())
        return (f"the softcap's derivative at x = {x.flatten()[at].item():+.3f} (c = {c}): expected 1 − tanh²(x/c) = "
                f"{(1 - t * t).flatten()[at].item():.5f}, got {slope.flatten()[at].item():.5f}")
    return None


def _grade_scores(fn) -> tuple[int, int, Failure | None]:
    generic = ("Write it in the docstring's order: scale, cap (and its derivative), bias, mask; return the scores "
               "× log₂e with −∞ where hidden.")
    passed, total, failure = _grade_dense(SCORE_CASES, SCORE_MISTAKES, generic, scores=fn)
    if failure is not None:
        return passed, total + 1, failure
    try:
        wrong = _grade_slope(fn)
    except Exception as exc:  # noqa: BLE001
        wrong = f"the probe raised {type(exc).__name__}: {str(exc).strip().splitlines()[-1:]}"
    if wrong is not None:
        return total, total + 1, Failure("the derivative dS/dx under softcap 2.0", wrong, [
            "The backward multiplies dS by dS/dx: for S = c·tanh(x/c) it is 1 − tanh²(x/c), 1 − t² with the t you "
            "already have."])
    return total + 1, total + 1, None


# --- step 3: a packed batch's sequence -----------------------------------------------------------------------

@triton.jit
def sequence_skeleton(cu_ptr, batch, n_dense, VARLEN: tl.constexpr):
    """(first token, length) of sequence `batch`: with VARLEN, from cu_seqlens (int32, B + 1 entries, where
    sequence b is tokens [cu[b], cu[b + 1])), the start as int64 (a packed batch may pass 2³¹ elements);
    without, (0, n_dense)."""
    start = batch * 0  # an int64 zero
    length = n_dense
    # TODO: if VARLEN: start = ...    tl.load(cu_ptr + batch), as int64
    # TODO:            length = ...   the next entry minus this one, as int32
    return start, length


sequence = _sequence  # the solution: chapter 9's `_sequence`

PACKED = [(17, 5, 0, 33, 1), (40, 1, 16)]  # sequence lengths of each graded batch: short, empty, one token


def _grade_sequence(fn) -> tuple[int, int, Failure | None]:
    heads, d = 2, 24
    for i, lengths in enumerate(PACKED):
        total = sum(lengths)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=default_device())
        q, k, v = (_draw((total, heads, d), 70 + 3 * i + j) for j in range(3))
        case = f"a packed batch of lengths {list(lengths)}, causal window (6, 0)"
        try:
            got, _ = lab_variants(q, k, v, cu_q=cu, cu_k=cu, window=(6, 0), sequence=fn)
        except Exception as exc:  # noqa: BLE001
            lines = str(exc).strip().splitlines()
            return i, len(PACKED), Failure(case, f"the kernel raised {type(exc).__name__}: " + (lines[-1] if lines
                                                                                                 else ""), [
                "Sequence b is tokens [cu[b], cu[b + 1]): its length is the difference of the two entries, not the "
                "second entry, and a sequence that runs past the batch's end writes where no token is."])
        for b, n in enumerate(lengths):
            a = int(cu[b])
            one = [t[a:a + n].transpose(0, 1)[None] for t in (q, k, v)]  # (1, H, n, d)
            expected = variants64(*one, (6, 0))[0].transpose(0, 1)
            if not _close(got[a:a + n], expected, torch.float32):
                hints = ["Sequence b starts at token cu[b] and has cu[b + 1] − cu[b] tokens; load both entries."]
                if b > 0 and bool(torch.isnan(got[a:a + n]).any()):
                    hints.append("Its rows were never written: the program took another sequence's place (did the "
                                 "start come from cu[b]?) or thought it empty (length).")
                return i, len(PACKED), Failure(case, f"sequence {b} (tokens {a}–{a + n - 1}, {n} long) is wrong: "
                                               f"largest error {_error(got[a:a + n], expected)[0]:.2e}", hints)
    return len(PACKED), len(PACKED), None


STEPS = {
    "key_range": Step("ch09.key_range", "the key tiles a window's band needs", _grade_key_range, key_range_skeleton,
                      key_range, KEY_RANGE_MISTAKES),
    "scores": Step("ch09.scores", "a tile's scores: softcap (and its derivative), ALiBi, the window's mask",
                   _grade_scores, scores_skeleton, scores, SCORE_MISTAKES),
    "sequence": Step("ch09.sequence", "where a packed sequence starts and how long it is", _grade_sequence,
                     sequence_skeleton, sequence, ()),
}

__all__ = ["STEPS", "lab_variants", "variants64", "tanh", "key_range", "key_range_skeleton", "scores", "scores_skeleton",
           "sequence", "sequence_skeleton"]
