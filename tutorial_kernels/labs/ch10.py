"""Lab 10: the pieces of ring attention the learner writes — the zig-zag map, the merge of partial results by
their log-sum-exp, and the rule for which blocks a ring step computes — each a whole function, graded on the
CPU; the merge also inside a real ring of two processes (gloo on the CPU, NCCL with a GPU each; where neither
can form, the merge is graded alone and a warning says why), against the front door on the whole sequence.

Steps (`check("ch10.<name>", fn)`):
- `zigzag`: `zigzag_positions(seq_len, world, rank)`, the positions a rank holds;
- `merge`: `merge(o, lse, o_part, lse_part) -> (o, lse)`, chapter 3's merge on whole key sets;
- `blocks`: `ring_blocks(rank, source, causal, q_chunks, kv_chunks)`, a ring step's blocks.
"""

from __future__ import annotations

import inspect
import math
import textwrap
import warnings
from dataclasses import dataclass

import torch

from tutorial_kernels import ch10_context_parallel
from tutorial_kernels.attention import flash_attention
from tutorial_kernels.labs.steps import Failure, Mistake, Step, recognised
from tutorial_kernels.ranks import ranks_unavailable, run_ranks

NOTEBOOK = "10_context_parallel_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons


def _raised(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return f"your function raised {type(exc).__name__}: " + (lines[-1] if lines else "")


# --- step 1: the zig-zag map ----------------------------------------------------------------------------

def zigzag_positions_skeleton(seq_len: int, world: int, rank: int) -> torch.Tensor:
    """The positions rank `rank` of `world` holds of a sequence of `seq_len`, as a 1-D int64 tensor in its
    shard's order. Cut the sequence into 2·world chunks as even as can be (the first seq_len mod 2·world
    chunks one position longer); the rank holds chunk `rank`, then chunk 2·world − 1 − rank."""
    # TODO: base, extra = ...        the chunks' length and how many get one more (divmod)
    # TODO: starts = ...             where each of the 2·world chunks starts (and where the last ends)
    # TODO: first, second = ...      the rank's two chunks
    # TODO: return ...               their positions, the first chunk's then the second's (torch.arange, torch.cat)
    return torch.zeros(0, dtype=torch.int64)


def zigzag_positions(seq_len: int, world: int, rank: int) -> torch.Tensor:
    """The solution: chapter 10's `zigzag_positions`."""
    base, extra = divmod(seq_len, 2 * world)
    starts = [0]
    for c in range(2 * world):
        starts.append(starts[-1] + base + (c < extra))
    first, second = rank, 2 * world - 1 - rank
    return torch.cat([torch.arange(starts[first], starts[first + 1]), torch.arange(starts[second], starts[second + 1])])


ZIGZAG_CASES = [(16, 2), (24, 4), (37, 4), (29, 3), (7, 4), (10, 1), (0, 2)]  # (seq_len, world)


def _contiguous(n, world, rank):
    return torch.tensor_split(torch.arange(n), world)[rank]


def _chunks_of(n, world, base_only=False):
    base, extra = divmod(n, 2 * world)
    starts = [0]
    for c in range(2 * world):
        starts.append(starts[-1] + base + (0 if base_only else (c < extra)))
    return starts


def _zigzag_slip(n, world, rank, *, mirror=2 * 1 - 1, order=(0, 1), base_only=False):
    starts = _chunks_of(n, world, base_only)
    chunks = (rank, 2 * world - mirror - rank)
    chunks = [chunks[i] for i in order]
    return torch.cat([torch.arange(starts[c], starts[c + 1]) if 0 <= c < 2 * world else torch.zeros(0, dtype=torch.int64)
                      for c in chunks])


@dataclass
class ZigzagAttempt:
    n: int
    world: int
    rank: int
    got: list

    def is_(self, wrong: torch.Tensor) -> bool:
        return self.got == wrong.tolist()


ZIGZAG_MISTAKES = (
    Mistake("unchanged", "Nothing came back (the skeleton's placeholder): the rank holds two chunks' positions.",
            lambda a: a.got == [] and a.n > 0),
    Mistake("contiguous", "You gave the rank one contiguous slice, position rank·N/P on. That is the cut the chapter "
            "shows idling under a causal mask: cut 2·world chunks and give rank r chunks r and 2·world − 1 − r.",
            lambda a: a.is_(_contiguous(a.n, a.world, a.rank))),
    Mistake("mirror", "The second chunk is off by one: of 2·world chunks (0 … 2·world − 1) rank r's partner is "
            "2·world − 1 − r, so rank 0 holds the first and the last.",
            lambda a: any(a.is_(_zigzag_slip(a.n, a.world, a.rank, mirror=m)) for m in (0, 2))),
    Mistake("order", "The right positions in the wrong order: the shard lists chunk r first, then chunk "
            "2·world − 1 − r, so that its positions are in sequence order (the ring's causal square relies on it).",
            lambda a: a.is_(_zigzag_slip(a.n, a.world, a.rank, order=(1, 0)))),
    Mistake("remainder", "Positions are missing when 2·world does not divide the length: the first "
            "seq_len mod 2·world chunks are one position longer (as torch.tensor_split cuts).",
            lambda a: a.is_(_zigzag_slip(a.n, a.world, a.rank, base_only=True))),
)


def _grade_zigzag(fn) -> tuple[int, int, Failure | None]:
    total = len(ZIGZAG_CASES)
    for i, (n, world) in enumerate(ZIGZAG_CASES):
        for rank in range(world):
            case = f"seq_len={n}, world={world}, rank={rank}"
            try:
                got = fn(n, world, rank)
                got = [int(x) for x in (got.tolist() if isinstance(got, torch.Tensor) else got)]
            except Exception as exc:  # noqa: BLE001  (the learner's code: say what it raised)
                return i, total, Failure(case, _raised(exc), ["Write it from the docstring, one TODO a line."])
            expected = zigzag_positions(n, world, rank).tolist()
            if got != expected:
                hints = recognised(ZIGZAG_MISTAKES, ZigzagAttempt(n, world, rank, got))
                return i, total, Failure(case, f"expected positions {expected}, got {got}", hints or [
                    "Chunk sizes: divmod(seq_len, 2·world); rank r holds chunks r and 2·world − 1 − r, in that order."])
    return total, total, None


# --- step 2: the merge ------------------------------------------------------------------------------------

def merge_skeleton(o: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor, lse_part: torch.Tensor):
    """Fold a partial result into a running one. o, o_part: (..., n, d) float32, each the softmax-weighted sum
    of V over its own keys; lse, lse_part: (..., n) their rows' log Σ e^{s} over those keys, −∞ for a row that
    saw none. Return (o, lse) over both key sets: lse = log(e^{lse} + e^{lse_part}) without overflow, and O
    each part weighted by e^{its lse − the new lse}; a row that saw no key on either side: O = 0, lse = −∞."""
    # TODO: new = ...            the log-sum-exp of both (torch.logaddexp does it without overflow)
    # TODO: seen = ...           rows where new > −∞
    # TODO: w_old, w_part = ...  e^{lse − new}, e^{lse_part − new}, 0 where not seen (torch.where)
    # TODO: return ...           (w_old[..., None] · o + w_part[..., None] · o_part, new)
    return o, lse


def merge(o: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor, lse_part: torch.Tensor):
    """The solution: chapter 10's `merge_partials`, returning new tensors."""
    new = torch.logaddexp(lse, lse_part)
    seen = new > -math.inf
    w_old = torch.where(seen, torch.exp(lse - new), 0.0)
    w_part = torch.where(seen, torch.exp(lse_part - new), 0.0)
    return w_old[..., None] * o + w_part[..., None] * o_part, new


@dataclass
class MergeCase:
    name: str
    scale: float  # of the scores: 200 gives log-sum-exps in the hundreds, past float32's e^88
    empty_rows: bool  # some rows see no key in either part, some in one part only

    def __str__(self) -> str:
        return self.name


MERGE_CASES = [MergeCase("two halves of 20 keys, 3 rows, d = 8", 1.0, False),
               MergeCase("rows that see no key in one part or in both", 1.0, True),
               MergeCase("large scores (log-sum-exps in the hundreds)", 200.0, True)]


def _partials(case: MergeCase, seed: int):
    """(o_a, lse_a, o_b, lse_b, o, lse): float64 partial results over two key sets of random scores, and the
    whole; with empty_rows, row 0 sees no key in set A, row 1 none in either set."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, 3, 20, generator=g, dtype=torch.float64) * case.scale
    v = torch.randn(2, 20, 8, generator=g, dtype=torch.float64)
    seen = torch.ones(2, 3, 20, dtype=torch.bool)
    if case.empty_rows:
        seen[:, 0, :11] = False
        seen[:, 1, :] = False
    parts = []
    for keys in (slice(0, 11), slice(11, 20)):
        sp = s[..., keys].masked_fill(~seen[..., keys], -math.inf)
        lse = torch.logsumexp(sp, -1)
        p = torch.where(seen[..., keys], torch.exp(sp - torch.where(lse > -math.inf, lse, 0.0)[..., None]), 0.0)
        parts += [p @ v[:, keys], lse]
    whole = s.masked_fill(~seen, -math.inf)
    lse = torch.logsumexp(whole, -1)
    p = torch.where(seen, torch.exp(whole - torch.where(lse > -math.inf, lse, 0.0)[..., None]), 0.0)
    return (*parts, p @ v, lse)


@dataclass
class MergeAttempt:
    case: MergeCase
    parts: tuple
    got: tuple

    def is_(self, o, lse=None) -> bool:
        ok = bool(torch.isfinite(self.got[0]).all()) and torch.allclose(self.got[0].double(), o, atol=1e-4, rtol=1e-4)
        return ok and (lse is None or torch.allclose(self.got[1].double(), lse, atol=1e-4, rtol=1e-4))

    def nan(self) -> bool:
        return bool(torch.isnan(self.got[0]).any() or torch.isnan(self.got[1]).any())


def _nan_where_both_empty(a: MergeAttempt) -> bool:
    bad = torch.isnan(a.got[0]).any(-1) | torch.isnan(a.got[1])
    return bool(bad.any()) and bool(bad[:, 1].all()) and not bool(bad[:, 2].any())


MERGE_MISTAKES = (
    Mistake("unchanged", "O and lse came back as they went in (the skeleton's placeholder): the result covers both "
            "key sets.", lambda a: a.is_(a.parts[0].float().double(), None)),
    Mistake("unweighted", "You added (or averaged) the two outputs: each O is already normalised over its own keys, "
            "so weigh each by its share of the row's mass, e^{its lse − the new lse}.",
            lambda a: a.is_(a.parts[0] + a.parts[2]) or a.is_((a.parts[0] + a.parts[2]) / 2)),
    Mistake("max", "lse is the larger of the two, not their log-sum-exp: log(e^a + e^b) is more than max(a, b) "
            "(by log 2 when they are equal). torch.logaddexp computes it.",
            lambda a: torch.allclose(a.got[1].double(), torch.maximum(a.parts[1], a.parts[3]), atol=1e-4)
            and not a.nan()),
    Mistake("overflow", "inf or NaN with large scores: e^{lse} overflows float32 past lse ≈ 88. Compute the new lse "
            "with torch.logaddexp (or measure both from the larger), and the weights as e^{lse − new}, at most 1.",
            lambda a: a.case.scale > 1 and not _nan_where_both_empty(a)
            and not (bool(torch.isfinite(a.got[0]).all()) and bool((a.got[1] < math.inf).all()))),
    Mistake("no_guard", "NaN in the rows that saw no key on either side: there lse = lse_part = new = −∞, and "
            "e^{−∞ − (−∞)} = e^{NaN}. Give those rows weight 0 (torch.where(seen, …, 0.0)).", _nan_where_both_empty),
)


def _merge_source(fn) -> str:
    return textwrap.dedent(inspect.getsource(fn))


def _ring_with_merge(rank: int, world: int, source: str, name: str, seed: int) -> float:
    """On each rank: the chapter's ring forward with the learner's merge (its source run here), against the
    front door on the whole sequence; the largest |difference| over the ranks' outputs."""
    namespace = {"torch": torch, "math": math}
    exec(compile(source, f"<your {name}>", "exec"), namespace)  # noqa: S102  (the learner's own function)
    learner = namespace[name]

    def in_place(o, lse, o_part, lse_part):
        new_o, new_lse = learner(o.clone(), lse.clone(), o_part.float(), lse_part.clone())
        o.copy_(new_o)
        lse.copy_(new_lse)

    g = torch.Generator().manual_seed(seed)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(device) for _ in range(3))
    whole = flash_attention(q, k, v, True)
    local = [ch10_context_parallel.shard_sequence(t) for t in (q, k, v)]
    out, _ = ch10_context_parallel._ring_forward(*local, True, 0.25, None, None, merge=in_place)
    got = ch10_context_parallel.unshard_sequence(out, 40)
    return (got - whole).abs().max().item()


def _grade_merge(fn) -> tuple[int, int, Failure | None]:
    # the ring's case where two ranks can run here: on the CPU, or with a GPU each (`ranks_unavailable`)
    total = len(MERGE_CASES) + (ranks_unavailable(2) is None)
    for i, case in enumerate(MERGE_CASES):
        parts = _partials(case, 11 + i)
        try:
            got = fn(parts[0].float(), parts[1].float(), parts[2].float(), parts[3].float())
            got = (got[0], got[1])
        except Exception as exc:  # noqa: BLE001
            return i, total, Failure(str(case), _raised(exc), [
                "Return the pair (o, lse) as new tensors (the chapter's merge_partials works in place and returns "
                "nothing); write it from the docstring, one TODO a line."])
        o, lse = parts[4], parts[5]
        good = (torch.isfinite(got[0]).all() and torch.allclose(got[0].double(), o, atol=1e-4, rtol=1e-4)
                and torch.equal(torch.isinf(got[1]), torch.isinf(lse))
                and torch.allclose(got[1].double().nan_to_num(neginf=0.0), lse.nan_to_num(neginf=0.0), atol=1e-4))
        if not good:
            diff = (got[0].double() - o).abs().nan_to_num(nan=math.inf)
            at = tuple(int(x) for x in torch.unravel_index(diff.argmax(), diff.shape))
            detail = (f"row {at[:2]}: O[{at[2]}] expected {o[at].item():+.5f}, got {got[0][at].item():+.5f}; "
                      f"lse expected {lse[at[:2]].item():+.4f}, got {got[1][at[:2]].item():+.4f}")
            hints = recognised(MERGE_MISTAKES, MergeAttempt(case, parts, got))
            return i, total, Failure(str(case), detail, hints or [
                "lse = logaddexp(lse, lse_part); O = e^{lse − new} O + e^{lse_part − new} O_part, 0 where new is −∞."])
    if total == len(MERGE_CASES):
        warnings.warn(f"ch10.merge: the ring case did not run ({ranks_unavailable(2)}); your merge was graded "
                      f"alone", stacklevel=2)
        return total, total, None
    backend = "NCCL" if torch.cuda.is_available() else "gloo"
    case = f"a ring of 2 processes ({backend}): causal attention over 40 positions with your merge"
    try:
        diff = run_ranks(_ring_with_merge, 2, _merge_source(fn), fn.__name__, 5)
    except (OSError, TypeError) as exc:
        return total - 1, total, Failure(case, _raised(exc), ["Define your merge with `def` in a cell of its own: "
                                                              "the ranks run its source."])
    except RuntimeError as exc:
        return total - 1, total, Failure(case, "a rank failed: " + str(exc).strip().splitlines()[-1],
                                         ["Use only torch and math in the merge: the ranks run its source alone."])
    if not diff <= 1e-4:
        return total - 1, total, Failure(case, f"largest |difference| from the whole sequence's output {diff:.2e}",
                                         ["The merge passed alone but not in the ring: does it change its inputs?"])
    return total, total, None


# --- step 3: which blocks a ring step computes ---------------------------------------------------------------

def ring_blocks_skeleton(rank: int, source: int, causal: bool, q_chunks: tuple[int, int],
                         kv_chunks: tuple[int, int]) -> list[tuple[slice, slice, bool]]:
    """The blocks rank `rank` computes against the keys and values of rank `source`: a list of (query rows,
    key rows, causal) of its shard (two zig-zag chunks of lengths q_chunks) against source's (kv_chunks). Query
    chunk a sees key chunk b fully when a is later in the sequence, not at all when earlier, causally when the
    same. Every (query, key) pair a causal mask allows must be computed once over the ring's steps, no other."""
    n_q, n_k = sum(q_chunks), sum(kv_chunks)
    # TODO: not causal: every query against every key
    # TODO: source == rank: ...
    # TODO: source < rank: ...
    # TODO: source > rank: ...
    return []


def ring_blocks(rank: int, source: int, causal: bool, q_chunks: tuple[int, int],
                kv_chunks: tuple[int, int]) -> list[tuple[slice, slice, bool]]:
    """The solution: chapter 10's `ring_blocks`."""
    n_q, n_k = sum(q_chunks), sum(kv_chunks)
    if not causal:
        return [(slice(0, n_q), slice(0, n_k), False)]
    if source == rank:
        return [(slice(0, n_q), slice(0, n_k), True)]
    if source < rank:
        return [(slice(0, n_q), slice(0, kv_chunks[0]), False)]
    return [(slice(q_chunks[0], n_q), slice(0, n_k), False)]


BLOCK_CASES = [(1, 6, False), (1, 6, True), (2, 8, False), (2, 8, True), (4, 16, True), (3, 17, True), (4, 37, True)]


def _coverage(fn, world: int, n: int, causal: bool) -> torch.Tensor:
    """How many times each (query position, key position) pair is computed over the ring's steps, and where a
    causal block computes only its lower triangle."""
    count = torch.zeros(n, n, dtype=torch.int64)
    chunks = [b - a for a, b in ch10_context_parallel.zigzag_chunks(n, world)]
    for step in range(world):
        for rank in range(world):
            source = (rank - step) % world
            qpos = zigzag_positions(n, world, rank)
            kpos = zigzag_positions(n, world, source)
            for rows, keys, block_causal in fn(rank, source, causal, (chunks[rank], chunks[-1 - rank]),
                                               (chunks[source], chunks[-1 - source])):
                qi, kj = qpos[rows], kpos[keys]
                pairs = torch.ones(len(qi), len(kj), dtype=torch.int64)
                if block_causal:  # the kernel's causal square: query i of the block sees key j ≤ i + (n_k − n_q)
                    pairs = pairs.tril(len(kj) - len(qi))
                count[qi[:, None], kj[None, :]] += pairs
    return count


def _grade_blocks(fn) -> tuple[int, int, Failure | None]:
    total = len(BLOCK_CASES)
    for i, (world, n, causal) in enumerate(BLOCK_CASES):
        case = f"world={world}, seq_len={n}, causal={causal}"
        try:
            count = _coverage(fn, world, n, causal)
        except Exception as exc:  # noqa: BLE001
            return i, total, Failure(case, _raised(exc), ["Return a list of (slice, slice, bool) triples."])
        allowed = torch.ones(n, n, dtype=torch.bool).tril() if causal else torch.ones(n, n, dtype=torch.bool)
        wrong = ((count != 1) & allowed) | ((count != 0) & ~allowed)
        if wrong.any():
            i_, j_ = (int(x) for x in wrong.nonzero()[0])
            times, may = int(count[i_, j_]), bool(allowed[i_, j_])
            detail = (f"query position {i_} and key position {j_}: computed {times} time{'s' if times != 1 else ''} "
                      f"over the ring's steps; {'once' if may else 'never'} is right "
                      f"({'the key is not later than the query' if may else 'the key is later: the mask hides it'})")
            hints = []
            if not may:
                hints.append("A key later than its query was computed: in a step with another rank's keys, only "
                             "whole chunks that come earlier may be used (source < rank: its first chunk; source > "
                             "rank: your second chunk against both), and your own keys need causal=True.")
            elif times == 0:
                hints.append("A pair the mask allows was never computed: every query chunk must meet every earlier key "
                             "chunk at the step its rank holds it.")
            else:
                hints.append("A pair was computed twice: a step must not repeat what another step computes.")
            return i, total, Failure(case, detail, hints)
    return total, total, None


STEPS = {
    "zigzag": Step("ch10.zigzag", "the positions a rank holds under the zig-zag cut", _grade_zigzag,
                   zigzag_positions_skeleton, zigzag_positions, ZIGZAG_MISTAKES),
    "merge": Step("ch10.merge", "merge two partial results by their log-sum-exps (then inside a ring of two processes)",
                  _grade_merge, merge_skeleton, merge, MERGE_MISTAKES),
    "blocks": Step("ch10.blocks", "which blocks a causal ring step computes", _grade_blocks, ring_blocks_skeleton,
                   ring_blocks, ()),
}

__all__ = ["STEPS", "zigzag_positions", "zigzag_positions_skeleton", "merge", "merge_skeleton", "ring_blocks",
           "ring_blocks_skeleton"]
