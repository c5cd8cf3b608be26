"""Lab 8: write Flash-Decoding's split pass, its merge, and a paged cache's addresses (chapter 8).

The lab gives chapter 8's two kernels, `_lab_partial_kernel` (grouped-query packing, the loads of Q and of
each sequence's length, the stores of O_s and lse₂,s) and `_lab_combine_kernel`; the learner writes the
three `@triton.jit` helpers they call, one step each:

    ch08.split_pass  one program's keys [s·c, min((s + 1)·c, n_k)), c in whole key tiles: the online softmax
                     in log₂ units, then O_s = acc / ℓ and lse₂,s = m + log₂ ℓ (0 and −∞ for a row with no key)
    ch08.combine     lse = log Σ_s e^{lse_s}, O = Σ_s e^{lse_s − lse} O_s, guarded for a row no split saw
    ch08.paged_rows  key j of sequence b: row j mod PAGE of block block_table[b, j // PAGE]

Each step has a skeleton (`*_skeleton`) and its solution (the chapter's own lines). A case is one decode step
of sequences of different lengths, O and lse graded against the float64 `reference_kvcache_attention`; a
contiguous cache runs as a paged one with one block per sequence. `check("ch08.<step>", fn)` grades a helper.
"""

from __future__ import annotations

import functools
import math
import types
from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from tutorial_kernels.labs.steps import Failure, Mistake, Step, recognised
from tutorial_kernels.precision import dot_precision
from tutorial_kernels.reference import expand_kv_heads, reference_kvcache_attention, relative_error
from tutorial_kernels.runtime import default_device
from tutorial_kernels.tiling import LOG2_E, from_log2_units, head_dim_block
from tutorial_kernels.tolerances import tolerance

NOTEBOOK = "08_inference_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
BLOCK_M = 16  # packed rows (query × head of a group) per tile: tl.dot's smallest
BLOCK_N = 16  # keys per tile: 70 keys are five tiles, the last one ragged
TABLE_SLACK = 256  # entries after the block table, all −1: a read past it stays in memory the lab owns
SHARP = 60.0  # q × SHARP: scores in the hundreds, so 2^{lse₂} overflows float32 (2^128)
SEED = 2208  # the inputs of case i are drawn from SEED + i: every report can be replayed
KV_HEADS, HEAD_DIM = 2, 24  # a head dimension that is not a power of two: the kernels pad it to 32 columns


# --- the kernels the lab provides ----------------------------------------------------------------------

@triton.jit
def _kv_tile(kv, start_n, offs_n, key_ok):
    """The (BLOCK_N, BLOCK_D) key and value tiles of keys offs_n = start_n + arange of this program's
    sequence and KV head, zeros where not key_ok. `kv_tile` binds ROWS (where a key lives: step 3) and PAGE."""
    k_ptr, v_ptr, table_ptr, batch, stride_tb, stride_tn, stride_kb, stride_kn, stride_vb, stride_vn, \
        offs_d, d_ok, capacity = kv
    ok = key_ok & (offs_n >= 0) & (offs_n < capacity)  # a wrong key range reads zeros, never past the cache
    first = tl.minimum(tl.maximum(start_n, 0), capacity - 1)  # a tile outside the cache reads no table entry past it
    k_rows, v_rows = ROWS(table_ptr, batch, stride_tb, stride_tn, first, offs_n, ok,  # noqa: F821 (bound by kv_tile)
                          stride_kb, stride_kn, stride_vb, stride_vn, PAGE, TILE)  # noqa: F821
    kv_mask = ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    return k, v


@functools.cache
def kv_tile(rows, page: int):
    """`_kv_tile` with ROWS = rows and PAGE = page bound: a loader the learner's split pass calls as
    KV_TILE(kv, start_n, offs_n, key_ok) without passing either on."""
    fn = _kv_tile.fn
    scope = {**fn.__globals__, "ROWS": rows, "PAGE": tl.constexpr(page), "TILE": tl.constexpr(BLOCK_N)}
    return triton.jit(types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__))


@triton.jit
def _lab_partial_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seqlens_ptr, part_ptr, part_lse_ptr,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_tb, stride_tn, stride_pb, stride_ph, stride_pm, stride_ps, stride_lb, stride_lh, stride_lm, stride_ls,
    n_kv_heads, group_size, n_q, head_dim, n_splits, capacity, qk_scale,
    PARTIAL: tl.constexpr, KV_TILE: tl.constexpr,  # the learner's split pass; the loader (with step 3's rows)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program: one tile of packed rows of one (batch, KV head) against split `split` of its keys."""
    pid_bk = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    batch = pid_bk // n_kv_heads
    kv_head = pid_bk % n_kv_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_q * group_size
    query = rows // group_size  # grouped-query packing: the group's heads share every key tile
    head = kv_head * group_size + rows % group_size
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(q_ptr + batch * stride_qb + head[:, None] * stride_qh + query[:, None] * stride_qm
                + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    n_k = tl.load(seqlens_ptr + batch)  # this sequence's keys
    kv = (k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh, table_ptr, batch, stride_tb, stride_tn,
          stride_kb, stride_kn, stride_vb, stride_vn, offs_d, d_ok, capacity)  # what KV_TILE needs
    o, lse2 = PARTIAL(q, row_ok, n_k, split, n_splits, qk_scale, kv, KV_TILE,
                      BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION)
    l_rows = batch * stride_lb + head * stride_lh + query * stride_lm + split * stride_ls
    o_rows = batch * stride_pb + head * stride_ph + query * stride_pm + split * stride_ps
    tl.store(part_lse_ptr + l_rows, lse2, mask=row_ok)
    tl.store(part_ptr + o_rows[:, None] + offs_d[None, :], o, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _lab_combine_kernel(
    part_ptr, part_lse_ptr, o_ptr, lse_ptr, stride_pr, stride_ps, stride_lr, stride_ls,
    stride_ob, stride_oh, stride_om, n_heads, n_q, head_dim, n_splits,
    COMBINE: tl.constexpr,  # the learner's merge
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (batch, head, query): every split of the row at once."""
    row = tl.program_id(0).to(tl.int64)
    batch = row // (n_heads * n_q)
    head = (row // n_q) % n_heads
    query = row % n_q
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < n_splits
    lse_s = tl.load(part_lse_ptr + row * stride_lr + offs_s * stride_ls, mask=s_ok, other=float("-inf"))
    o_s = tl.load(part_ptr + row * stride_pr + offs_s[:, None] * stride_ps + offs_d[None, :],
                  mask=s_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    o, lse2 = COMBINE(lse_s, o_s)
    tl.store(o_ptr + batch * stride_ob + head * stride_oh + query * stride_om + offs_d,
             o.to(o_ptr.dtype.element_ty), mask=offs_d < head_dim)
    tl.store(lse_ptr + row, from_log2_units(lse2))  # natural units: lse = lse₂ · ln 2


def lab_decode(x: dict, n_splits: int, partial=None, combine=None, rows=None) -> dict[str, torch.Tensor]:
    """One decode step of `draw`'s inputs x through the lab's kernels with the given helpers (the solutions
    where None): O (B, H, n_q, d) in q's dtype, lse (B, H, n_q), and the partials part, part_lse (float32).
    Every output starts as NaN: an element no kernel writes stays NaN."""
    q, k, v, table = x["q"], x["k_pool"], x["v_pool"], x["table"]
    batch, heads, n_q, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    part, part_lse, lse = (torch.full(shape, float("nan"), device=q.device) for shape in (
        (batch, heads, n_q, n_splits, head_dim), (batch, heads, n_q, n_splits), (batch, heads, n_q)))
    o, block_d = torch.full_like(q, float("nan")), head_dim_block(head_dim)
    _lab_partial_kernel[(batch * kv_heads, triton.cdiv(n_q * group, BLOCK_M), n_splits)](
        q, k, v, table, x["lengths"], part, part_lse, q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), *table.stride(),
        *part.stride()[:4], *part_lse.stride(), kv_heads, group, n_q, head_dim, n_splits, x["capacity"],
        head_dim ** -0.5 * LOG2_E, PARTIAL=partial or split_pass, KV_TILE=kv_tile(rows or paged_rows, x["page"]),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=block_d, DOT_PRECISION=dot_precision(q.dtype))
    _lab_combine_kernel[(batch * heads * n_q,)](
        part, part_lse, o, lse, part.stride(2), part.stride(3), part_lse.stride(2), part_lse.stride(3),
        o.stride(0), o.stride(1), o.stride(2), heads, n_q, head_dim, n_splits, COMBINE=combine or combine_splits,
        BLOCK_S=max(2, triton.next_power_of_2(n_splits)), BLOCK_D=block_d)
    return dict(o=o, lse=lse, part=part, part_lse=part_lse)


# --- the cases, their inputs and the float64 answers ----------------------------------------------------

def keys_per_split(n_k: int, splits: int) -> int:
    """c: ⌈n_k / splits⌉ keys rounded up to whole key tiles (the chapter's rule)."""
    return triton.cdiv(triton.cdiv(n_k, splits), BLOCK_N) * BLOCK_N


@dataclass(frozen=True)
class DecodeCase:
    """One decode step (one query per sequence) of sequences of `lengths` keys, H = group × KV_HEADS query
    heads, `splits` splits; a contiguous cache (page None) or a paged one of `page`-row blocks."""

    lengths: tuple[int, ...]
    group: int
    splits: int
    dtype: torch.dtype
    page: int | None = None
    poison: bool = False  # table entries of blocks a sequence does not own are −1 (else: every entry a block)
    sharp: bool = False  # q × SHARP

    @property
    def capacity(self) -> int:
        """Rows per sequence: past the longest, and past every split's end unclipped (a wrong range reads them)."""
        rows = max([self.splits * keys_per_split(n, self.splits) for n in self.lengths] + [max(self.lengths) + 1])
        return triton.cdiv(rows, self.page or BLOCK_N) * (self.page or BLOCK_N)

    def __str__(self) -> str:
        cache = f"a paged cache of {self.page}-row blocks" if self.page else "a contiguous cache"
        return (f"lengths={self.lengths}, heads={self.group * KV_HEADS} on kv_heads={KV_HEADS} (group {self.group}), "
                f"splits={self.splits}, {cache}{f', q × {SHARP:g} (sharp scores)' if self.sharp else ''}, "
                f"head_dim={HEAD_DIM}, dtype={str(self.dtype).removeprefix('torch.')}")


DTYPES = (torch.float32, torch.float16)  # bfloat16 needs a GPU (the interpreter computes it wrongly)
BATCH = (0, 1, 17, 70)  # an empty cache, one key, a ragged tile, five tiles


def decode_cases() -> list[DecodeCase]:
    """Steps 1 and 2, simplest first: one split, then several (the last clipped, some empty), GQA, lengths
    0 and 1, a paged cache whose blocks are two tiles, sharp scores; float32, then float16."""
    shapes = [dict(lengths=(17,), group=1, splits=1), dict(lengths=(70,), group=1, splits=1),
              dict(lengths=(70,), group=1, splits=3), dict(lengths=BATCH, group=3, splits=3),
              dict(lengths=BATCH, group=3, splits=5), dict(lengths=(5, 70, 33), group=2, splits=3, page=32),
              dict(lengths=(40, 70), group=2, splits=3, sharp=True)]
    return [DecodeCase(dtype=dtype, **shape) for dtype in DTYPES for shape in shapes]


def paged_cases() -> list[DecodeCase]:
    """Step 3: blocks smaller than a key tile, larger but not a multiple of it, and a multiple of it."""
    return [DecodeCase(BATCH, 2, 3, dtype, page=page, poison=True) for dtype in DTYPES for page in (4, 24, 64)]


def draw(case: DecodeCase, seed: int) -> dict:
    """q, the pools of K and V (random everywhere, past every sequence's end too), the block table (a
    random order of the pool's blocks, two spare; K as (blocks, H_kv, PAGE, d), V in flash-attn's
    (blocks, PAGE, H_kv, d) seen through a transpose), and the lengths."""
    gen, device = torch.Generator(device="cpu").manual_seed(seed), default_device()
    batch, capacity = len(case.lengths), case.capacity

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(case.dtype).to(device)

    q = randn(batch, case.group * KV_HEADS, 1, HEAD_DIM, scale=SHARP if case.sharp else 1.0)
    page, width = case.page or capacity, capacity // (case.page or capacity)  # width: blocks per sequence
    if case.page is None:
        k_pool, v_pool = randn(batch, KV_HEADS, capacity, HEAD_DIM), randn(batch, KV_HEADS, capacity, HEAD_DIM)
        blocks = torch.arange(batch)[:, None]
    else:
        n_blocks = batch * width + 2
        k_pool, v_pool = randn(n_blocks, KV_HEADS, page, HEAD_DIM), randn(n_blocks, page, KV_HEADS, HEAD_DIM)
        v_pool = v_pool.transpose(1, 2)  # flash-attn's layout, seen as (blocks, H_kv, PAGE, d)
        blocks = torch.randperm(n_blocks, generator=gen)[:batch * width].view(batch, width)
    if case.poison:
        for b, n in enumerate(case.lengths):
            blocks[b, triton.cdiv(n, page):] = -1
    flat = torch.full((batch * width + TABLE_SLACK,), -1, dtype=torch.int32, device=device)
    flat[:batch * width] = blocks.flatten().to(torch.int32)
    return dict(q=q, k_pool=k_pool, v_pool=v_pool, table=flat[:batch * width].view(batch, width), table_flat=flat,
                page=page, capacity=capacity, lengths=torch.tensor(case.lengths, dtype=torch.int32, device=device))


# --- what a typical mistake computes (in float64), and the grading --------------------------------------

def split64(case: DecodeCase, x: dict, *, clip=True, whole_tiles=True, tail_masked=True, rescale_acc=True,
            rescale_l=True, base=2.0, normalise=True, lse="log2") -> tuple[torch.Tensor, torch.Tensor]:
    """(O_s (B, H, n_q, S, d), lse₂,s (B, H, n_q, S)) that a split pass with these slips writes, in float64:
    the chapter's loop tile by tile, the lab's loads (one table entry per tile when PAGE % BLOCK_N = 0)."""
    q, k_pool, v_pool, table = x["q"].double(), x["k_pool"].double(), x["v_pool"].double(), x["table_flat"].long()
    batch, heads, n_q, d = q.shape
    splits, scale, page, width = case.splits, LOG2_E / math.sqrt(d), x["page"], x["table"].shape[1]
    part = torch.zeros(batch, heads, n_q, splits, d, dtype=torch.float64, device=q.device)
    lse2 = torch.full((batch, heads, n_q, splits), -math.inf, dtype=torch.float64, device=q.device)
    for b, n in enumerate(case.lengths):
        c = keys_per_split(n, splits) if whole_tiles else triton.cdiv(n, splits)
        for s in range(splits):
            start = s * c
            end = min(start + c, n) if clip else start + c
            m = torch.full((heads, n_q), -math.inf, dtype=torch.float64, device=q.device)
            l, acc = torch.zeros_like(m), torch.zeros(heads, n_q, d, dtype=torch.float64, device=q.device)
            for start_n in range(start, end, BLOCK_N):
                keys = torch.arange(start_n, start_n + BLOCK_N, device=q.device)
                in_split = keys < end
                ok = in_split & (keys < x["capacity"])  # what the loader reads; zeros elsewhere
                entry = torch.full_like(keys, start_n // page) if page % BLOCK_N == 0 else keys // page
                block, row = table[b * width + torch.where(ok, entry, 0)], torch.where(ok, keys % page, 0)
                k, v = (torch.where(ok[:, None, None], pool[torch.where(ok, block, 0), :, row], 0.0).transpose(0, 1)
                        for pool in (k_pool, v_pool))  # (H_kv, BLOCK_N, d)
                k, v = expand_kv_heads(k[None], heads)[0], expand_kv_heads(v[None], heads)[0]
                sc = (q[b] @ k.transpose(-1, -2)) * scale  # (H, n_q, BLOCK_N), log₂ units
                if tail_masked:
                    sc = sc.masked_fill(~in_split, -math.inf)
                m_new = torch.maximum(m, sc.amax(dim=-1))
                shift = torch.where(torch.isfinite(m_new), m_new, 0.0)
                p = torch.pow(base, sc - shift[..., None])
                alpha = torch.pow(base, m - shift)
                l = (l * alpha if rescale_l else l) + p.sum(dim=-1)
                acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v
                m = m_new
            seen = l > 0
            safe = torch.where(seen, l, 1.0)
            part[b, :, :, s] = torch.where(seen[..., None], acc / safe[..., None] if normalise else acc, 0.0)
            value = {"ln": m + torch.log(safe), "no_max": torch.log2(safe)}.get(lse, m + torch.log2(safe))
            lse2[b, :, :, s] = torch.where(seen, value, 0.0 if lse == "zero" else -math.inf)
    return part, lse2


def combine64(part: torch.Tensor, lse2: torch.Tensor, *, base=2.0, log=torch.log2, add_top=True,
              normalise=True) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse in natural units) that a merge with these slips computes from the partials, in float64."""
    part, lse2 = part.double(), lse2.double()
    top = lse2.amax(dim=-1, keepdim=True)
    shift = torch.where(torch.isfinite(top), top, 0.0)
    w = torch.pow(base, lse2 - shift)
    total = w.sum(dim=-1, keepdim=True)
    safe = torch.where(total > 0, total, 1.0)
    o = (part * (w / safe if normalise else w)[..., None]).sum(dim=-2)
    out = torch.where(total > 0, (shift if add_top else 0.0) + log(safe), -math.inf)[..., 0]
    return o, out * math.log(2)


@dataclass
class DecodeAttempt:
    """The learner's output on one case: the inputs, what the kernels wrote, and the float64 answer."""

    case: DecodeCase
    x: dict
    got: dict
    expected: tuple[torch.Tensor, torch.Tensor]

    def matches(self, o: torch.Tensor, lse: torch.Tensor | None = None) -> bool:
        """Whether the output is, within 3× the dtype's tolerance, this wrong (O, lse)."""
        bound = 3 * tolerance(self.case.dtype)
        got_o = self.got["o"].double().cpu()
        if not bool(torch.isfinite(got_o).all()) or not relative_error(got_o, o.cpu()) <= bound:
            return False
        return lse is None or lse_error(self.got["lse"], lse) <= bound

    def nan_rows(self) -> torch.Tensor:
        """(B, H, n_q) rows of O that hold NaN or ±inf."""
        return ~torch.isfinite(self.got["o"].double().cpu()).all(dim=-1)

    def all_zero(self) -> bool:
        o = self.got["o"].double()
        return bool(torch.isfinite(o).all()) and bool(o.abs().max() == 0) and bool(self.expected[0].abs().max() > 0)

    def splits_seen(self) -> torch.Tensor:
        """(B, H, n_q, 1) how many splits saw a key of the row (at least 1)."""
        return torch.isfinite(self.got["part_lse"].double()).sum(dim=-1, keepdim=True).clamp(min=1)

    def no_key_rows(self) -> torch.Tensor:
        """(B, H, n_q) rows that see no key (lse = −∞)."""
        return torch.isneginf(self.expected[1].cpu())


def lse_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative error over the rows with a finite lse; inf if the rows at −∞ (no key) differ."""
    got, want = got.double().cpu(), want.double().cpu()
    finite = torch.isfinite(want)
    if not torch.equal(torch.isneginf(got), torch.isneginf(want)) or not bool(finite.any()):
        return 0.0 if torch.equal(got, want) else math.inf
    return relative_error(got[finite], want[finite])


def describe(case: DecodeCase, got: dict, expected: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    """None when O and lse are within the dtype's bound of the reference; else which, where, and by how much."""
    bound = tolerance(case.dtype)
    o, lse = got["o"].double().cpu(), got["lse"].double().cpu()
    o_ref, lse_ref = (t.cpu() for t in expected)
    err = relative_error(o, o_ref)
    if not err <= bound:
        diff = (o - o_ref).abs()
        bad = ~torch.isfinite(o) | (diff > 10 * bound * max(1.0, o_ref.abs().max().item()))
        index = tuple(bad.nonzero()[0].tolist()) if bad.any() else tuple(torch.unravel_index(diff.argmax(), diff.shape))
        b, h, i, col = (int(j) for j in index)
        lines = [f"relative error of O {err:.2e} > {bound:.0e} allowed for this dtype",
                 f"first wrong element: sequence {b} (n_k = {case.lengths[b]}), head {h}, query {i}, column {col}: "
                 f"expected {o_ref[index].item():+.5f}, got {o[index].item():+.5f}"]
        broken = int((~torch.isfinite(o)).any(dim=-1).sum())
        return "\n".join(lines + ([f"{broken} output rows hold NaN or ±inf"] if broken else []))
    if lse_error(lse, lse_ref) <= bound:
        return None
    diff = torch.where(lse == lse_ref, 0.0, (lse - lse_ref).abs().nan_to_num(math.inf)) / lse_ref.abs().clamp(min=1.0)
    b, h, i = (int(j) for j in torch.unravel_index(diff.argmax(), diff.shape))  # the worst row
    return (f"O is right, but the log-sum-exp is not: sequence {b} (n_k = {case.lengths[b]}), head {h}, query {i}: "
            f"expected lse = {lse_ref[b, h, i].item():+.5f}, got {lse[b, h, i].item():+.5f}")


def raised(exc: Exception) -> str:  # what Triton said when the learner's code did not compile or run
    return f"the kernel raised {type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[-1]


def grade_decode(run: Callable[[DecodeCase, dict], dict], cases: list[DecodeCase], mistakes: tuple[Mistake, ...],
                 generic_hint: str, first: int = 0, total: int | None = None) -> tuple[int, int, Failure | None]:
    """Run every case in order on fresh inputs; (cases passed, cases, the first failure with its hints),
    counting `first` cases graded before these (step 3's probes) and `total` in all."""
    total = len(cases) if total is None else total
    for i, case in enumerate(cases):
        x = draw(case, SEED + i)
        expected = reference_kvcache_attention(x["q"], x["k_pool"], x["v_pool"], x["lengths"],  # (O, lse), float64
                                               x["table"] if case.page else None, causal=False)
        try:
            got = run(case, x)
        except Exception as exc:  # the learner's code did not compile or run: say what Triton said
            return first + i, total, Failure(str(case), raised(exc), [generic_hint])
        detail = describe(case, got, expected)
        if detail is not None:
            hints = recognised(mistakes, DecodeAttempt(case, x, got, expected))
            return first + i, total, Failure(str(case), detail, hints or [generic_hint])
    return first + len(cases), total, None



# --- step 1: the split pass ------------------------------------------------------------------------------

@triton.jit
def split_pass_skeleton(q, row_ok, n_k, split, n_splits, qk_scale, kv, KV_TILE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    """Split `split` of `n_splits` of a sequence of n_k keys (n_k may be 0): keys [s·c, min((s + 1)·c, n_k)),
    c = ⌈n_k / n_splits⌉ rounded up to whole BLOCK_N tiles. q: (BLOCK_M, BLOCK_D) packed query rows (row_ok
    False in padding rows); qk_scale = τ·log₂e. KV_TILE(kv, start_n, offs_n, key_ok) returns the (BLOCK_N,
    BLOCK_D) key and value tiles of keys offs_n = start_n + tl.arange(0, BLOCK_N), zeros where not key_ok.
    Return (o, lse2): O_s = acc / ℓ, (BLOCK_M, BLOCK_D) float32, and lse₂ = m + log₂ ℓ, (BLOCK_M,) in log₂
    units; for a row that saw no key, 0 and −∞."""
    # TODO: keys_per_split = ...   ⌈n_k / n_splits⌉, then up to whole tiles: tl.cdiv twice, × BLOCK_N
    # TODO: start = ...            this split's first key
    # TODO: end = ...              one past its last key, clipped to n_k (tl.minimum)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log₂ units
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running Σ 2^{s − m}
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # TODO: for start_n in range(start, end, BLOCK_N):
    # TODO:     offs_n = ...; key_ok = ...       the tile's keys; those before end
    # TODO:     k, v = KV_TILE(kv, start_n, offs_n, key_ok)
    # TODO:     s = ...        τ log₂e · Q Kᵀ: tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    # TODO:     s = ...        −∞ where the key is not in the split (and in padding rows): tl.where
    # TODO:     m_new, shift, p, alpha, then l_i, acc (rescaled by alpha), m_i: chapter 5's update
    # TODO:                    (acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION))
    # TODO: o = ...      acc / ℓ, dividing by tl.where(l_i > 0, l_i, 1.0): 0, not 0/0, for a row that saw no key
    # TODO: lse2 = ...   m + log₂ ℓ where ℓ > 0, else −∞
    o = acc
    lse2 = m_i
    return o, lse2


@triton.jit
def split_pass(q, row_ok, n_k, split, n_splits, qk_scale, kv, KV_TILE: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The solution: `_decode_partial_kernel`'s key range, loop and epilogue."""
    keys_per_split = tl.cdiv(tl.cdiv(n_k, n_splits), BLOCK_N) * BLOCK_N  # its own length, split in whole tiles
    start = split * keys_per_split
    end = tl.minimum(start + keys_per_split, n_k)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log₂ units
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running Σ 2^{s − m}
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < end
        k, v = KV_TILE(kv, start_n, offs_n, key_ok)  # the lab's loads (the chapter's PAGED branch: step 3)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # τ log₂e · Q Kᵀ
        visible = key_ok[None, :] & row_ok[:, None]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: 2^{−∞ − 0} = 0
        p = tl.math.exp2(s - shift[:, None])  # P̃ = 2^{S − m_new}
        alpha = tl.math.exp2(m_i - shift)  # α = 2^{m_old − m_new}
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    seen = l_i > 0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]  # O_s = acc / ℓ: 0 for a row that saw no key
    lse2 = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    return o, lse2


def _split_mistake(**slips):  # what the split pass with these slips gives, merged by the chapter's combine
    return lambda a: a.matches(*combine64(*split64(a.case, a.x, **slips)))


SPLIT_MISTAKES = (
    Mistake("unchanged", "Every row came out as zeros: every split returned lse₂ = −∞, which the merge reads as 'saw "
            "no key'. Are the placeholders `o = acc`, `lse2 = m_i` still there, or `m_i = m_new` missing?",
            DecodeAttempt.all_zero),
    Mistake("no_clip", "A split's end is not clipped to n_k: the last split's [s·c, (s + 1)·c) runs past the sequence "
            "into rows the cache holds for tokens not generated yet (here random): end = tl.minimum(start + "
            "keys_per_split, n_k).", _split_mistake(clip=False)),
    Mistake("ragged", "Keys past the split's end still count: KV_TILE loads them as zeros, which score 0, not −∞. "
            "Hide them: s = tl.where(visible, s, float(\"-inf\")) with key_ok in visible.",
            _split_mistake(tail_masked=False)),
    Mistake("whole_tiles", "keys_per_split must be whole BLOCK_N tiles, ⌈⌈n_k / n_splits⌉ / BLOCK_N⌉ · BLOCK_N. The "
            "ranges cover every key without it, but then a split starts inside a tile; a paged cache reads one table "
            "entry per tile when PAGE is a multiple of BLOCK_N, and here a tile straddled two blocks.",
            _split_mistake(whole_tiles=False)),
    Mistake("no_rescale_acc", "acc is not rescaled: when the running max grows, what acc summed was weighted by "
            "2^(s − m_old); multiply it by alpha = 2^(m_old − m_new) first: acc = acc * alpha[:, None] + ….",
            _split_mistake(rescale_acc=False)),
    Mistake("no_rescale_l", "l_i is not rescaled: l_i = l_i * alpha + tl.sum(p, 1), the same alpha as acc.",
            _split_mistake(rescale_l=False)),
    Mistake("exp", "The scores are already in log₂ units (qk_scale = τ·log₂e): use tl.math.exp2, not tl.exp, for p "
            "and alpha.", lambda a: any(_split_mistake(base=math.e, lse=r)(a) for r in ("log2", "ln"))),
    Mistake("not_normalised", "The merge expects O_s = acc / ℓ, each split's own softmax average (its weight "
            "2^{lse_s − lse} scales it to the row): divide by ℓ.", _split_mistake(normalise=False)),
    Mistake("lse_ln", "lse₂ mixes units: m is in log₂ units, so add log₂ ℓ (tl.math.log2), not tl.log ℓ.",
            _split_mistake(lse="ln")),
    Mistake("lse_no_max", "lse₂ = log₂ ℓ forgets m: ℓ sums 2^(s − m), so log₂ Σ 2^s = m + log₂ ℓ.",
            _split_mistake(lse="no_max")),
    Mistake("lse_zero", "A row that saw no key needs lse₂ = −∞, a weight 2^(−∞) = 0 in the merge; 0 gives its O_s = 0 "
            "the weight 2^(0 − lse): lse2 = tl.where(l_i > 0, …, float(\"-inf\")).", _split_mistake(lse="zero")),
    Mistake("nan", "Some rows are NaN: for a row that saw no key in a split (an empty split, a sequence of length 0) "
            "acc / ℓ is 0 / 0, and the merge's weight 0 does not save it (0 · NaN = NaN). Divide by "
            "tl.where(l_i > 0, l_i, 1.0): acc is 0 there, so O_s = 0.",  # in a case with an empty split
            lambda a: bool(a.nan_rows().any()) and any(keys_per_split(n, a.case.splits) * (a.case.splits - 1) >= n
                                                      for n in a.case.lengths)),
)


def _grade_split(fn) -> tuple[int, int, Failure | None]:
    return grade_decode(lambda c, x: lab_decode(x, c.splits, partial=fn), decode_cases(), SPLIT_MISTAKES,
                        "Write it from the chapter: the range (keys_per_split, start, end), then chapter 5's loop "
                        "with −∞ where not key_ok, then O_s = acc / ℓ and lse₂ = m + log₂ ℓ, 0 and −∞ where ℓ = 0.")


# --- step 2: the merge -----------------------------------------------------------------------------------

@triton.jit
def combine_splits_skeleton(lse_s, o_s):
    """One (batch, head, query) row's splits. lse_s: (BLOCK_S,) each split's lse₂ (log₂ units; −∞ for a split
    that saw no key of the row, and for padding splits past n_splits); o_s: (BLOCK_S, BLOCK_D) their O_s,
    float32 (0 for those). Return (o, lse2): O = Σ_s 2^{lse₂,s − lse₂} O_s, (BLOCK_D,), and
    lse₂ = log₂ Σ_s 2^{lse₂,s}, every power measured from the largest lse₂,s; 0 and −∞ when no split saw a key."""
    # TODO: top = ...     the largest lse_s (tl.max along axis 0)
    # TODO: shift = ...   top, but 0 where top is −∞: no split saw a key
    # TODO: w = ...       2^(lse_s − shift)
    # TODO: total = ...   Σ_s w
    # TODO: o = ...       Σ_s (w / total) O_s: o_s * (...)[:, None], summed along axis 0; divide only where total > 0
    # TODO: lse2 = ...    shift + log₂ total where total > 0, else −∞
    o = tl.sum(o_s, 0) * 0.0
    lse2 = tl.max(lse_s, 0)
    return o, lse2


@triton.jit
def combine_splits(lse_s, o_s):
    """The solution: `_decode_combine_kernel`'s merge."""
    top = tl.max(lse_s, 0)
    shift = tl.where(top == float("-inf"), 0.0, top)  # no split saw a key: every weight is 0
    w = tl.math.exp2(lse_s - shift)  # 2^{lse_s − max}
    total = tl.sum(w, 0)
    o = tl.sum(o_s * (w / tl.where(total > 0, total, 1.0))[:, None], 0)  # Σ_s 2^{lse_s − lse} O_s
    lse2 = tl.where(total > 0, shift + tl.math.log2(tl.where(total > 0, total, 1.0)), float("-inf"))
    return o, lse2


def _merge_mistake(**slips):  # what a merge with these slips gives from the chapter's partials
    return lambda a: a.matches(*combine64(a.got["part"], a.got["part_lse"], **slips))


MERGE_MISTAKES = (
    Mistake("unchanged", "O came out as zeros: the skeleton's placeholder. O is the splits' outputs, each weighted "
            "by its share of the row's softmax mass, 2^{lse₂,s − lse₂}.", DecodeAttempt.all_zero),
    Mistake("exp", "Your weights are e^{lse₂,s − top}: the lse₂ are in log₂ units, so the weights are powers of 2: "
            "w = tl.math.exp2(lse_s - shift).",
            lambda a: any(_merge_mistake(base=math.e, log=f)(a) for f in (torch.log2, torch.log))),
    Mistake("log", "O is right but lse is not: lse₂ = top + log₂ total, in log₂ units like every lse_s (tl.log is "
            "the natural log); the kernel converts lse₂ to natural units itself.", _merge_mistake(log=torch.log)),
    Mistake("no_top", "O is right but lse₂ = log₂ total forgets the shift: total = Σ 2^{lse₂,s − top}, so "
            "log₂ Σ 2^{lse₂,s} = top + log₂ total.", _merge_mistake(add_top=False)),
    Mistake("not_normalised", "O = Σ_s w_s O_s is not divided by Σ_s w_s: the weights 2^{lse₂,s − top} are measured "
            "from the largest split, and only w / total sums to 1.", _merge_mistake(normalise=False)),
    Mistake("unweighted", "Your O adds (or averages) the splits' outputs without weights: a split of 2 keys would "
            "count as much as one of 32. Weigh each O_s by 2^{lse₂,s − lse₂}, its share of the row's Σ_j e^{x_j}.",
            lambda a: not a.matches(a.expected[0]) and any(a.matches(a.got["part"].double().sum(dim=-2) / count)
                                                           for count in (1, a.splits_seen()))),
    Mistake("no_guard", "NaN in the rows no split saw (a sequence of length 0): every lse_s is −∞, so lse_s − top = "
            "−∞ − (−∞) = NaN, and total = 0. Shift by 0 where top is −∞, divide only where total > 0, and give "
            "lse₂ = −∞ there.", lambda a: bool(a.nan_rows().any()) and bool((a.nan_rows() <= a.no_key_rows()).all())),
    Mistake("no_max", "With sharp scores lse₂ is in the hundreds and 2^{lse₂,s} overflows float32 (past 2^127): "
            "measure the powers from the largest, w = 2^{lse₂,s − top}, and add it back: lse₂ = top + log₂ Σ w.",
            lambda a: a.case.sharp and bool(a.nan_rows().any()) and not bool((a.nan_rows() & a.no_key_rows()).any())),
)


def _grade_merge(fn) -> tuple[int, int, Failure | None]:
    return grade_decode(lambda c, x: lab_decode(x, c.splits, combine=fn), decode_cases(), MERGE_MISTAKES,
                        "Write the merge from the equations: top, shift, w = 2^(lse_s − shift), total, then "
                        "O = Σ_s (w / total) O_s and lse₂ = shift + log₂ total, guarded where total = 0.")


# --- step 3: the paged cache's addresses -----------------------------------------------------------------

@triton.jit
def paged_rows_skeleton(table_ptr, batch, stride_tb, stride_tn, start_n, offs_n, key_ok,
                        stride_kb, stride_kn, stride_vb, stride_vn, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Where keys offs_n (= start_n + tl.arange(0, BLOCK_N)) of sequence `batch` live in a pool of blocks of
    PAGE rows: key j is row j mod PAGE of block block_table[batch, j // PAGE], the table's entry at
    table_ptr + batch·stride_tb + (j // PAGE)·stride_tn. Return (k_rows, v_rows), (BLOCK_N,) int64:
    block·stride_kb + (j mod PAGE)·stride_kn and block·stride_vb + (j mod PAGE)·stride_vn. A key past the
    sequence's end (key_ok False) must not read the table: its entry may not exist."""
    rows_n = offs_n.to(tl.int64)  # × a token stride, which may be large
    # TODO: block = ...    block_table[batch, j // PAGE] for each key: tl.load(…, mask=key_ok, other=0), .to(tl.int64)
    # TODO: k_rows = ...   block · stride_kb + (j mod PAGE) · stride_kn
    # TODO: v_rows = ...   the same with V's strides
    k_rows = rows_n * 0
    v_rows = rows_n * 0
    return k_rows, v_rows


@triton.jit
def paged_rows(table_ptr, batch, stride_tb, stride_tn, start_n, offs_n, key_ok,
               stride_kb, stride_kn, stride_vb, stride_vn, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The solution: `_decode_partial_kernel`'s PAGED branch."""
    rows_n = offs_n.to(tl.int64)  # × a token stride, which may be large (a (tokens, B, H_kv, d) cache)
    if PAGE % BLOCK_N == 0:  # the tile lies in one block: one entry of the table
        block = tl.load(table_ptr + batch * stride_tb + (start_n // PAGE) * stride_tn).to(tl.int64)
    else:
        block = tl.load(table_ptr + batch * stride_tb + (offs_n // PAGE) * stride_tn, mask=key_ok, other=0)
        block = block.to(tl.int64)
    k_rows = block * stride_kb + (rows_n % PAGE) * stride_kn
    v_rows = block * stride_vb + (rows_n % PAGE) * stride_vn
    return k_rows, v_rows


@triton.jit
def _probe_rows_kernel(table_ptr, seqlens_ptr, k_out, v_out, stride_tb, stride_tn, stride_kb, stride_kn,
                       stride_vb, stride_vn, keys, ROWS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (b, t): ROWS for key tile t of sequence b, every lane stored to k_out[b, t·BLOCK_N + lane]."""
    batch = tl.program_id(0).to(tl.int64)
    start_n = tl.program_id(1) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    key_ok = offs_n < tl.load(seqlens_ptr + batch)
    k_rows, v_rows = ROWS(table_ptr, batch, stride_tb, stride_tn, start_n, offs_n, key_ok,
                          stride_kb, stride_kn, stride_vb, stride_vn, PAGE, BLOCK_N)
    tl.store(k_out + batch * keys + offs_n, k_rows)
    tl.store(v_out + batch * keys + offs_n, v_rows)


def rows_of(x: dict, b: int, j: int, *, swap=False, table=True, own_row=True, with_row=True, v_strides=True,
            one_entry=False) -> tuple[int, int]:
    """(k_rows, v_rows) of key j of sequence b: the chapter's rule, or one typical slip of it."""
    kb, kn, vb, vn = x["k_pool"].stride(0), x["k_pool"].stride(2), x["v_pool"].stride(0), x["v_pool"].stride(2)
    index = j % x["page"] if swap else (j // BLOCK_N * BLOCK_N if one_entry else j) // x["page"]
    row = (j // x["page"] if swap else j % x["page"]) if with_row else 0
    block = int(x["table_flat"][(b * x["table"].shape[1] if own_row else 0) + index]) if table else index
    return block * kb + row * kn, block * (vb if v_strides else kb) + row * (vn if v_strides else kn)


ROWS_MISTAKES = {  # name: (the slip as rows_of's arguments, hint)
    "unchanged": (None, "Every address is still 0 (the skeleton's placeholders): every key would read row 0 of "
                  "block 0."),
    "swap": (dict(swap=True), "j // PAGE and j mod PAGE are swapped: the table's column is j // PAGE (which of "
             "the sequence's blocks holds key j), and the row inside that block is j mod PAGE."),
    "no_table": (dict(table=False), "The block is block_table[batch, j // PAGE], not j // PAGE itself: j // PAGE "
                 "is only its position in the sequence's list of blocks, and the blocks lie anywhere in the pool. "
                 "Load it: tl.load(table_ptr + batch * stride_tb + (offs_n // PAGE) * stride_tn, …)."),
    "batch_row": (dict(own_row=False), "Every sequence read sequence 0's row of the table: add batch * stride_tb."),
    "no_row": (dict(with_row=False), "The row inside the block is missing: add (j mod PAGE) · stride_kn (V: vn)."),
    "v_strides": (dict(v_strides=False), "v_rows uses K's strides: the pools may be laid out differently (here V "
                  "is flash-attn's (blocks, PAGE, H_kv, d), seen through a transpose): use stride_vb and stride_vn."),
    "one_entry": (dict(one_entry=True), "One table entry per tile is right only when a tile lies in one block "
                  "(PAGE a multiple of BLOCK_N); here a tile spans blocks: each key needs its entry, offs_n // PAGE."),
    "unmasked": (None, "The addresses of the keys that exist are right, but a key past the sequence's end (key_ok "
                 "False) read the table: its entry is past the blocks the sequence owns (here −1, or past the "
                 "table's end). Load with mask=key_ok, other=0."),
}


def _grade_rows(fn) -> tuple[int, int, Failure | None]:
    """Probe `fn`'s addresses on every case's table (a wrong one named by the slips that explain them all), then
    run the attention through them."""
    cases, probes, total = paged_cases(), [], 2 * len(paged_cases())
    for i, case in enumerate(cases):
        x, lanes = draw(case, SEED + i), triton.cdiv(max(case.lengths), BLOCK_N) * BLOCK_N  # every tile, every lane
        out = torch.full((2, len(case.lengths), lanes), -1, dtype=torch.int64, device=x["q"].device)
        try:
            _probe_rows_kernel[(len(case.lengths), lanes // BLOCK_N)](
                x["table"], x["lengths"], out[0], out[1], *x["table"].stride(), x["k_pool"].stride(0),
                x["k_pool"].stride(2), x["v_pool"].stride(0), x["v_pool"].stride(2), lanes, ROWS=fn, PAGE=x["page"],
                BLOCK_N=BLOCK_N)
        except Exception as exc:
            return 0, total, Failure(str(case), raised(exc), [ROWS_MISTAKES["unchanged"][1]])
        probes += [(case, x, b, j, (int(out[0, b, j]), int(out[1, b, j]))) for b, n in enumerate(case.lengths)
                   for j in range(triton.cdiv(n, BLOCK_N) * BLOCK_N)]
    keys = [probe for probe in probes if probe[3] < probe[0].lengths[probe[2]]]  # keys that exist
    wrong = next((probe for probe in keys if probe[4] != rows_of(probe[1], probe[2], probe[3])), None)
    if wrong is not None:
        case, x, b, j, got = wrong
        names = [name for name, (slip, _) in ROWS_MISTAKES.items()
                 if slip is not None and all(g == rows_of(xx, bb, jj, **slip) for _, xx, bb, jj, g in keys)]
        page, block = x["page"], int(x["table"][b, j // x["page"]])
        detail = (f"sequence {b} (n_k = {case.lengths[b]}), key j = {j}: block_table[{b}, {j} // {page}] = {block}, "
                  f"row {j} mod {page} = {j % page}, so (k_rows, v_rows) = {rows_of(x, b, j)}; got {got} (strides: "
                  f"K {x['k_pool'].stride(0)} per block, {x['k_pool'].stride(2)} per row; V {x['v_pool'].stride(0)} "
                  f"and {x['v_pool'].stride(2)})")
        names = ["unchanged"] if all(g == (0, 0) for *_, g in keys) else names
        return 0, total, Failure(str(case), detail, [ROWS_MISTAKES[n][1] for n in names] or [
            "Work one key out on paper: its block is the table's entry (batch, j // PAGE), its row j mod PAGE, "
            "and the offset block · stride_kb + row · stride_kn (V: stride_vb, stride_vn)."])
    for case, x, b, j, got in probes:  # a key past the end, in a tile the kernel visits: inside the pools
        ends = (x["k_pool"].stride(0) * x["k_pool"].shape[0], x["v_pool"].stride(0) * x["v_pool"].shape[0])
        if not all(0 <= g < end for g, end in zip(got, ends)):
            return 0, total, Failure(str(case), f"sequence {b} (n_k = {case.lengths[b]}), key j = {j}, past the end "
                                     f"in a tile the kernel visits: (k_rows, v_rows) = {got}, outside the pools",
                                     [ROWS_MISTAKES["unmasked"][1]])
    return grade_decode(lambda c, x: lab_decode(x, c.splits, rows=fn), cases, (),
                        "The addresses are right but the attention is not: run the earlier steps' checks.",
                        first=len(cases), total=total)


STEPS = {
    "split_pass": Step("ch08.split_pass", "one program's pass over its split's keys: O_s and lse₂,s",
                       _grade_split, split_pass_skeleton, split_pass, SPLIT_MISTAKES),
    "combine": Step("ch08.combine", "merge a row's splits by their log-sum-exps", _grade_merge,
                    combine_splits_skeleton, combine_splits, MERGE_MISTAKES),
    "paged_rows": Step("ch08.paged_rows", "where a key lives in a paged cache", _grade_rows,
                       paged_rows_skeleton, paged_rows,
                       tuple(Mistake(n, h, lambda a: False) for n, (_, h) in ROWS_MISTAKES.items())),
}

__all__ = ["STEPS", "lab_decode", "kv_tile", "split_pass", "split_pass_skeleton", "combine_splits",
           "combine_splits_skeleton", "paged_rows", "paged_rows_skeleton", "decode_cases",
           "paged_cases", "draw", "split64", "combine64"]
