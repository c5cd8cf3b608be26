"""Lab 7: FlashAttention-3's bookkeeping on Hopper — the mbarrier ring and the persistent schedule (chapter 7).

Chapter 7's kernel is written in Gluon and runs on an H100 only, but three of its pieces are integer
arithmetic that runs anywhere. The learner writes them as `@triton.jit` helpers, which the lab runs in
tiny Triton kernels (through the interpreter on a CPU, natively on a GPU); on the GPU the same lines
live inside the Gluon kernel (`tutorial_kernels/ch07_hopper.py`), with `gl.` for `tl.`:

    ch07.ring       the stage of the ring the t-th K/V tile goes to, and the phases the consumers (full)
                    and the loader (empty) wait for
    ch07.work_item  which (batch·head, query tile) work item w is: section by section, query tile by
                    query tile, causal tiles longest first
    ch07.dealt_item which item a persistent program takes in deal number d: forwards, then backwards

Each step has a skeleton (`*_skeleton`) and its solution (the chapter's own lines). The grader compares
the learner's numbers with the chapter's own `_work_item` and `_dealt_item`, run on Python integers (as
the chapter's tests run them), and with the ring arithmetic of `_load_kv_tile` and `_overlapped_step`;
it then plays the consequences out — a simulated mbarrier ring, the items each program runs — so that
a failure says what would go wrong on the GPU.
`tutorial_kernels.labs.check("ch07.<step>", fn)` grades a learner's helper.
"""

from __future__ import annotations

import types

import torch
import triton
import triton.language as tl

from tutorial_kernels import ch07_hopper
from tutorial_kernels.labs.steps import Failure, Mistake, Step
from tutorial_kernels.runtime import default_device

NOTEBOOK = "07_flash_v3_hopper_lab.ipynb"  # in notebooks/labs/: starts from this module's skeletons
BLOCK = 16  # query rows and keys per tile: small, so that n = 70 is five tiles, the last one ragged


def _run_error(exc: Exception) -> str:
    message = str(exc).strip().splitlines()
    return f"the kernel raised {type(exc).__name__}: " + (message[-1] if message else "")


RAISED = ("Your helper raised before any number came back, so there is nothing to compare yet: read the error "
          "above. Typical: a misspelt name (NameError), a different number of returned values than the kernel "
          "unpacks (\"not enough values to unpack\": return exactly what the docstring lists), or a Python "
          "function Triton does not know inside @triton.jit (use tl.minimum, tl.where, …).")


# --- the chapter's own scheduling arithmetic, on Python integers ----------------------------------------

class _IntegerGluon:
    """Just enough of `gl` to run the chapter's scheduling helpers on Python integers."""

    constexpr = object

    def __init__(self, program: int = 0, programs: int = 1):
        self.program, self.programs = program, programs

    @staticmethod
    def cdiv(a, b):
        return -(-a // b)

    minimum, maximum = staticmethod(min), staticmethod(max)

    def program_id(self, axis):
        return self.program

    def num_programs(self, axis):
        return self.programs


def on_integers(jit_function, program: int = 0, programs: int = 1):
    """The Python body of one of the chapter's @gluon.jit helpers with `gl` replaced by integer
    arithmetic: the kernel's own lines, callable on ints."""
    fn = jit_function.fn
    return types.FunctionType(fn.__code__, {**fn.__globals__, "gl": _IntegerGluon(program, programs)},
                              fn.__name__, fn.__defaults__)


def chapter_ring(t: int, stages: int) -> tuple[int, int, int]:
    """(stage, full phase, empty phase) of the program's t-th K/V tile, as the chapter computes them:
    `_load_kv_tile` (stage = loaded % stages, empty phase ((loaded // stages) + 1) & 1) and
    `_overlapped_step` (full phase (ring_t // stages) & 1)."""
    return t % stages, (t // stages) & 1, ((t // stages) + 1) & 1


def chapter_item(w: int, n_bh: int, section: int, n_q: int, causal: bool) -> tuple[int, int, int]:
    """(bh, pid_m, key tiles) of work item w, from the chapter's `_work_item` (one batch, n_bh heads)."""
    _, diag, edge = ch07_hopper.band_offsets(causal, (-1, -1), n_q, n_q)
    batch, head, _, first_row, _, _, _, n_tiles = on_integers(ch07_hopper._work_item)(
        w, n_bh, section, n_bh, 1, n_q, n_q, diag, edge, causal, False, BLOCK, BLOCK)
    return batch * n_bh + head, first_row // BLOCK, n_tiles


def chapter_deal(deal: int, program: int, programs: int) -> int:
    """The item program `program` of `programs` takes in deal `deal`: the chapter's `_dealt_item`."""
    return on_integers(ch07_hopper._dealt_item, program, programs)(deal)


# --- step 1: the ring ----------------------------------------------------------------------------------

@triton.jit
def ring_slot_skeleton(t, STAGES: tl.constexpr):
    """The program's t-th K/V tile (t = 0, 1, 2, … counted across all its work items) in a ring of
    STAGES shared-memory stages. Return (stage, full_phase, empty_phase):
    stage:       the stage the tile is loaded into;
    full_phase:  the phase the consumers wait for on full[stage] before they read the tile;
    empty_phase: the phase the loader waits for on empty[stage] before it overwrites the stage."""
    # TODO: stage = ...         consecutive tiles go to consecutive stages, round after round
    # TODO: full_phase = ...    one bit, which flips each time the ring comes round to this stage
    # TODO: empty_phase = ...   the loader waits for the release of the tile STAGES numbers earlier
    stage = 0
    full_phase = 0
    empty_phase = 0
    return stage, full_phase, empty_phase


@triton.jit
def ring_slot(t, STAGES: tl.constexpr):
    """The solution: the ring arithmetic of `_load_kv_tile` (the loader) and `_overlapped_step` (the consumers)."""
    stage = t % STAGES  # _load_kv_tile: stage = loaded % stages
    full_phase = (t // STAGES) & 1  # _overlapped_step: mbarrier.wait(full_bars.index(stage), (ring_t // stages) & 1)
    empty_phase = ((t // STAGES) + 1) & 1  # _load_kv_tile: mbarrier.wait(empty_bars.index(stage), ((loaded // stages) + 1) & 1, …)
    return stage, full_phase, empty_phase


RING_STAGES = (3, 2, 4, 1)  # the chapter's 3 first; 1 stage: every tile is a new round
RING_ROUNDS = 4  # tiles 0 … 4·STAGES: four rounds of the ring and the first tile of a fifth


@triton.jit
def _probe_ring_kernel(out_ptr, RING: tl.constexpr, STAGES: tl.constexpr):
    """Program t writes RING(t, STAGES) to out[3t], out[3t + 1], out[3t + 2]."""
    t = tl.program_id(0)
    stage, full_phase, empty_phase = RING(t, STAGES)
    tl.store(out_ptr + 3 * t, stage)
    tl.store(out_ptr + 3 * t + 1, full_phase)
    tl.store(out_ptr + 3 * t + 2, empty_phase)


def probe_ring(fn, stages: int, n_tiles: int) -> list[tuple[int, int, int]]:
    """(stage, full_phase, empty_phase) that `fn` gives for tiles 0 … n_tiles − 1."""
    out = torch.full((3 * n_tiles,), -999, dtype=torch.int32, device=default_device())
    _probe_ring_kernel[(n_tiles,)](out, RING=fn, STAGES=stages)
    return [tuple(row) for row in out.view(n_tiles, 3).tolist()]


def simulate_ring(table: list[tuple[int, int, int]], stages: int) -> str | None:
    """Play the ring with these (stage, full_phase, empty_phase) per tile: a loader and one consumer,
    barriers modelled as PTX's: `wait(bar, P)` returns once the phase of parity P has completed, that
    is, when the number of completed phases c has c mod 2 ≠ P (so on a fresh barrier, c = 0, a wait
    for phase 1 returns at once). Played twice, the loader running ahead whenever it may, then the
    consumers; returns what goes wrong first in each (a stale read, an overwrite, a deadlock), or None."""
    found = [what for eager in ("load", "use") if (what := _play_ring(table, stages, eager))]
    return "\n  or, the consumers running first: ".join(dict.fromkeys(found)) if found else None


def _play_ring(table: list[tuple[int, int, int]], stages: int, eager: str) -> str | None:
    n = len(table)
    full, empty = [0] * stages, [0] * stages  # completed phases per stage
    holds = [None] * stages  # the tile a stage holds; None before its first load and once released
    loaded = used = 0
    while used < n:
        may_load = loaded < n and empty[table[loaded][0]] % 2 != table[loaded][2]
        may_use = full[table[used][0]] % 2 != table[used][1]
        if may_load and (eager == "load" or not may_use):
            s = table[loaded][0]
            if holds[s] is not None:
                return (f"the loader's wait on empty[{s}] for phase {table[loaded][2]} returns at once, so tile "
                        f"{loaded} overwrites stage {s} while the consumers still need tile {holds[s]} there")
            holds[s], full[s], loaded = loaded, full[s] + 1, loaded + 1
        elif may_use:
            s = table[used][0]
            if holds[s] != used:
                got = "nothing yet" if holds[s] is None else f"tile {holds[s]}"
                return (f"the consumers' wait on full[{s}] for phase {table[used][1]} returns before tile {used} "
                        f"has arrived: they read stage {s}, which holds {got}")
            holds[s], empty[s], used = None, empty[s] + 1, used + 1
        else:
            return (f"deadlock: the consumers wait on full[{table[used][0]}] for phase {table[used][1]} (tile {used}), "
                    "the loader " + (f"on empty[{table[loaded][0]}] for phase {table[loaded][2]} (tile {loaded})"
                                     if loaded < n else "has nothing left to load")
                    + ", and neither phase ever completes")
    return None


RING_MISTAKES = {  # name: ({column: the value that mistake gives for (t, stages)}, hint)
    "stage_by_round": ({0: lambda t, s: t // s}, "The stage is t % STAGES, not t // STAGES: consecutive tiles go to "
                       "consecutive stages (0, 1, 2, 0, 1, 2, … with 3 stages); t // STAGES is the round."),
    "phase_every_tile": ({1: lambda t, s: t & 1, 2: lambda t, s: (t + 1) & 1},
                         "The phase flips once per round of the ring, not once per tile: a stage's barrier completes "
                         "once each time that stage is filled (or released), that is every STAGES tiles. "
                         "The round is t // STAGES; its parity is the phase: (t // STAGES) & 1."),
    "phase_not_a_bit": ({1: lambda t, s: t // s, 2: lambda t, s: t // s + 1},
                        "A phase is one bit, 0 or 1: the barrier's phase bit flips at each completion. Take the "
                        "round's parity, (t // STAGES) & 1, not the round itself."),
    "full_previous_round": ({1: lambda t, s: ((t // s) + 1) & 1},
                            "The consumers wait on full[stage] for this round's parity, (t // STAGES) & 1: in round 0 "
                            "phase 0, the stage's first fill. Phase 1 is the one a fresh barrier counts as already "
                            "completed, so waiting for it returns at once, before the tile has landed."),
    "empty_same_phase": ({2: lambda t, s: (t // s) & 1},
                         "The loader waits on empty[stage] for the opposite phase to the consumers' one: tile t may "
                         "overwrite the stage once tile t − STAGES, one round earlier, was released, so it waits for "
                         "the previous round's parity, ((t // STAGES) + 1) & 1. (In the first round that is phase 1, "
                         "which a fresh barrier counts as completed: the loader does not wait.)"),
}
RING_UNCHANGED = "All three numbers are still 0 (the skeleton's placeholders): every tile would go to stage 0."
RING_SWAPPED = ("full_phase and empty_phase are swapped: the consumers wait on full for this round's parity, "
                "(t // STAGES) & 1 (phase 0 in round 0: the first fill); the loader waits on empty for the previous "
                "round's, ((t // STAGES) + 1) & 1 (phase 1 in round 0, which a fresh barrier counts as completed).")


def _grade_ring(fn) -> tuple[int, int, Failure | None]:
    total = len(RING_STAGES)
    got, expected = {}, {}
    for done, stages in enumerate(RING_STAGES):
        n_tiles = RING_ROUNDS * stages + 1
        try:
            got[stages] = probe_ring(fn, stages, n_tiles)
        except Exception as exc:
            return done, total, Failure(f"STAGES={stages}", _run_error(exc), [RAISED])
        expected[stages] = [chapter_ring(t, stages) for t in range(n_tiles)]
    wrong = [s for s in RING_STAGES if got[s] != expected[s]]
    if not wrong:
        return total, total, None
    stages = wrong[0]
    t = next(i for i, (g, e) in enumerate(zip(got[stages], expected[stages])) if g != e)
    # a mistake is recognised when its column(s) give exactly the learner's numbers for every tile and STAGES
    hints = [hint for columns, hint in RING_MISTAKES.values() if any(
        all(got[s][i][col] == wrong_value(i, s) for s in RING_STAGES for i in range(len(got[s])))
        for col, wrong_value in columns.items())]
    if all(got[s][i][1:] == chapter_ring(i, s)[:0:-1] for s in RING_STAGES for i in range(len(got[s]))):
        hints = [RING_SWAPPED]
    if all(row == (0, 0, 0) for rows in got.values() for row in rows):
        hints = [RING_UNCHANGED]
    detail = [f"ring tile t={t} (round {t // stages} of the ring): expected (stage, full_phase, empty_phase) = "
              f"{expected[stages][t]}, got {got[stages][t]}",
              f"tiles 0..{len(got[stages]) - 1} as stage/full_phase/empty_phase:",
              "  expected: " + " ".join(f"{a}/{b}/{c}" for a, b, c in expected[stages]),
              "  yours:    " + " ".join(f"{a}/{b}/{c}" for a, b, c in got[stages])]
    if any(not 0 <= row[0] < stages for row in got[stages]):
        detail.append(f"on the GPU: a stage outside 0..{stages - 1} indexes past the ring's buffers and barriers")
    elif any(phase not in (0, 1) for row in got[stages] for phase in row[1:]):
        detail.append("on the GPU: mbarrier.wait takes the parity of the phase to wait for, 0 or 1")
    else:
        consequence = simulate_ring(got[stages], stages)
        if consequence:
            detail.append(f"on the GPU, {consequence}")
    return RING_STAGES.index(stages), total, Failure(
        f"STAGES={stages}, K/V tiles t = 0..{len(got[stages]) - 1}", "\n".join(detail), hints or [
            "Write the ring out on paper for STAGES = 3: tile t goes to stage t mod 3 in round ⌊t / 3⌋; the "
            "consumers wait for the round's parity on full, the loader for the previous round's on empty."])


# --- step 2: the work items -------------------------------------------------------------------------------

@triton.jit
def work_item_skeleton(w, n_bh, section, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """Work item w (0 ≤ w < n_bh · ⌈n_q / BLOCK_M⌉): one query tile of one (batch, head) pair. Return
    (bh, pid_m): the pair (0 ≤ bh < n_bh) and the query tile (rows pid_m · BLOCK_M …).
    The pairs go in sections of `section` consecutive pairs (the last section may be smaller); within a
    section, query tile by query tile, every pair of one tile before the next tile; causal, the tiles
    that see the most keys (the last ones) first."""
    n_m = tl.cdiv(n_q, BLOCK_M)  # query tiles per pair
    # TODO: first_bh = ...   the first pair of w's section (a section holds section · n_m items)
    # TODO: pairs = ...      the pairs in this section: section, or fewer in the last one
    # TODO: within = ...     w's rank within its section
    # TODO: m_rank = ...     which query tile of the section's order: ranks 0, 1, … go longest first
    # TODO: bh = ...
    # TODO: pid_m = ...      causal: the m_rank-th tile from the end; else the m_rank-th
    bh = 0
    pid_m = 0
    return bh, pid_m


@triton.jit
def work_item(w, n_bh, section, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """The solution: the first lines of `_work_item`."""
    n_m = tl.cdiv(n_q, BLOCK_M)
    first_bh = (w // (section * n_m)) * section
    pairs = tl.minimum(section, n_bh - first_bh)  # the last section may be smaller
    within = w - first_bh * n_m
    m_rank = within // pairs
    bh = first_bh + within % pairs
    if CAUSAL:
        pid_m = n_m - 1 - m_rank
    else:
        pid_m = m_rank
    return bh, pid_m


# (n_q, n_bh, section, causal): the simplest first; sections that do not divide n_bh; one query row
ITEM_CASES = ((17, 1, 1, False), (70, 3, 3, False), (70, 3, 3, True), (70, 5, 2, True), (17, 6, 4, False),
              (70, 6, 4, True), (1, 2, 2, True))


@triton.jit
def _probe_items_kernel(out_ptr, n_bh, section, n_q, WORK: tl.constexpr, CAUSAL: tl.constexpr,
                        BLOCK_M: tl.constexpr):
    """Program w writes WORK(w, …) to out[2w], out[2w + 1]."""
    w = tl.program_id(0)
    bh, pid_m = WORK(w, n_bh, section, n_q, CAUSAL, BLOCK_M)
    tl.store(out_ptr + 2 * w, bh)
    tl.store(out_ptr + 2 * w + 1, pid_m)


def probe_items(fn, n_q: int, n_bh: int, section: int, causal: bool) -> list[tuple[int, int]]:
    """(bh, pid_m) that `fn` gives for every work item w."""
    n_items = n_bh * triton.cdiv(n_q, BLOCK)
    out = torch.full((2 * n_items,), -999, dtype=torch.int32, device=default_device())
    _probe_items_kernel[(n_items,)](out, n_bh, section, n_q, WORK=fn, CAUSAL=causal, BLOCK_M=BLOCK)
    return [tuple(pair) for pair in out.view(n_items, 2).tolist()]


def _items(n_q, n_bh, section, causal, *, longest_first=True, tile_by_tile=True, clamp_last=True,
           sections=True, reverse_full=False, last_tile=1, bh_from_section=True) -> list[tuple[int, int]]:
    """The work items in order with one typical mistake switched on (all defaults: the chapter's)."""
    n_m = -(-n_q // BLOCK)
    if not sections:
        section = n_bh
    items = []
    for w in range(n_bh * n_m):
        first_bh = w // (section * n_m) * section
        pairs = min(section, n_bh - first_bh) if clamp_last else section
        within = w - first_bh * n_m
        if tile_by_tile:
            m_rank, bh = within // pairs, first_bh + within % pairs
        else:  # every tile of one pair before the next pair
            m_rank, bh = within % n_m, first_bh + within // n_m
        if not bh_from_section:  # the pair counted from the section's first pair, not from pair 0
            bh -= first_bh
        reverse = longest_first if causal else reverse_full
        items.append((bh, n_m - last_tile - m_rank if reverse else m_rank))
    return items


ITEM_MISTAKES = {  # name: (the items that mistake gives, hint)
    "shortest_first": (dict(longest_first=False), "Causal items go longest first: the last query tile of a pair sees "
                       "the most keys, so rank 0 is the last tile, pid_m = n_m − 1 − m_rank. Shortest first, the "
                       "programs would end on the longest items, and the last one to finish would hold up the launch."),
    "pair_by_pair": (dict(tile_by_tile=False), "Within a section the items go query tile by query tile, every pair "
                     "of one tile before the next tile: m_rank = within // pairs, bh = first_bh + within % pairs. "
                     "Pair by pair (within // n_m), causal items would not come longest first across the section."),
    "full_last_section": (dict(clamp_last=False), "The last section may hold fewer pairs than `section` (when "
                          "section does not divide n_bh): pairs = tl.minimum(section, n_bh − first_bh)."),
    "no_sections": (dict(sections=False), "The items go section by section: all items of the first `section` "
                    "pairs, then the next section's. first_bh = (w // (section · n_m)) · section."),
    "tile_past_the_end": (dict(last_tile=0), "Off by one: the last query tile is n_m − 1 (tiles 0 … n_m − 1), so "
                          "causal pid_m = n_m − 1 − m_rank; n_m − m_rank names a tile past the end and never "
                          "computes tile 0."),
    "bh_within_section": (dict(bh_from_section=False), "within % pairs is the pair's place inside its section; "
                          "the pair itself is first_bh + within % pairs. Without first_bh every section "
                          "recomputes the first section's pairs."),
    "reversed_full": (dict(reverse_full=True), "Only causal tiles differ in length; without CAUSAL every tile sees "
                      "every key and the items keep the natural order, pid_m = m_rank."),
}
ITEM_UNCHANGED = "Every item is still (0, 0) (the skeleton's placeholders): all programs would run one query tile."


def _case_str(n_q, n_bh, section, causal) -> str:
    n_m = triton.cdiv(n_q, BLOCK)
    return (f"n_q={n_q} ({n_m} query tile{'s' * (n_m > 1)} of BLOCK_M={BLOCK}), n_bh={n_bh} (batch·heads) in "
            f"sections of {section}, causal={causal}")


def _grade_items(fn) -> tuple[int, int, Failure | None]:
    total = len(ITEM_CASES)
    got = {}
    for done, case in enumerate(ITEM_CASES):
        try:
            got[case] = probe_items(fn, *case)
        except Exception as exc:
            return done, total, Failure(_case_str(*case), _run_error(exc), [RAISED])
    expected = {case: [chapter_item(w, case[1], case[2], case[0], case[3])[:2] for w in range(len(got[case]))]
                for case in ITEM_CASES}
    wrong = [case for case in ITEM_CASES if got[case] != expected[case]]
    if not wrong:
        return total, total, None
    case = wrong[0]
    n_q, n_bh, section, causal = case
    w = next(i for i, (g, e) in enumerate(zip(got[case], expected[case])) if g != e)
    lengths = {item[:2]: item[2] for item in (chapter_item(i, n_bh, section, n_q, causal)
                                              for i in range(len(got[case])))}
    shown = slice(max(0, w - 3), w + 5)

    def order(items):
        return " ".join(f"({bh},{m})" + (f"·{lengths[bh, m]}" if causal and (bh, m) in lengths else "")
                        for bh, m in items[shown])
    detail = [f"item w={w}: expected (bh, pid_m) = {expected[case][w]}, got {got[case][w]}",
              f"items {shown.start}..{min(shown.stop, len(got[case])) - 1} as (bh,pid_m)"
              + ("·key tiles" if causal else "") + ":",
              f"  expected: {order(expected[case])}",
              f"  yours:    {order(got[case])}"]
    counts = {item: got[case].count(item) for item in set(expected[case])}
    twice = [item for item, k in counts.items() if k > 1]
    never = [item for item, k in counts.items() if k == 0]
    outside = [item for item in got[case] if item not in counts]
    if twice or never or outside:
        detail.append(f"on the GPU: {len(never)} query tile(s) never computed (their output rows stay unwritten), "
                      f"{len(twice)} computed more than once, {len(outside)} item(s) outside the tensors"
                      + (f"; e.g. never {sorted(never)[0]}" if never else ""))
    # a mistake is recognised when it gives exactly the learner's items in every case
    hints = [hint for kw, hint in ITEM_MISTAKES.values()
             if all(_items(*c, **kw) == got[c] for c in ITEM_CASES)]
    if all(item == (0, 0) for items in got.values() for item in items):
        hints = [ITEM_UNCHANGED]
    return ITEM_CASES.index(case), total, Failure(_case_str(*case), "\n".join(detail), hints or [
        "Number the items of one case on paper: a section's items are its pairs' tiles, section · n_m of them; "
        "within it, rank r is tile r // pairs of pair r % pairs; causal, tile ranks count from the last tile."])


# --- step 3: dealing the items --------------------------------------------------------------------------------

@triton.jit
def dealt_item_skeleton(deal):
    """The work item this program takes in deal number `deal` (0, 1, 2, …): the items, numbered longest
    first, are dealt to the P programs like cards, forwards in even deals (program p takes the p-th item
    of the deal) and backwards in odd ones (program p takes the p-th item from the deal's end). An item
    number past the last item means: nothing this deal (the caller checks)."""
    program, programs = tl.program_id(0), tl.num_programs(0)
    # TODO: backwards = ...   1 in odd deals, 0 in even ones
    # TODO: return the item: deal · programs + program going forwards, deal · programs + (programs − 1 − program) backwards
    return deal * programs + program


@triton.jit
def dealt_item(deal):
    """The solution: `_dealt_item`."""
    program, programs = tl.program_id(0), tl.num_programs(0)
    backwards = deal % 2
    return deal * programs + program + backwards * (programs - 1 - 2 * program)


# the items: causal, 3 heads of 70 queries in 16-row tiles, longest first (lengths 5 5 5 4 4 4 … 1 1 1);
# programs: the simplest first, then an odd number, then more programs than items
DEAL_ITEMS = (70, 3, 3, True)  # (n_q, n_bh, section, causal) for `chapter_item`
DEAL_PROGRAMS = (2, 4, 5, 7, 16)


@triton.jit
def _probe_deals_kernel(out_ptr, deals, DEAL: tl.constexpr):
    """Program p writes DEAL(d) to out[p · deals + d] for every deal d."""
    program = tl.program_id(0)
    for d in range(deals):
        tl.store(out_ptr + program * deals + d, DEAL(d))


def probe_deals(fn, programs: int, n_items: int) -> list[list[int]]:
    """For each of `programs` programs, the item number `fn` gives it in each deal."""
    deals = triton.cdiv(n_items, programs)
    out = torch.full((programs * deals,), -999, dtype=torch.int32, device=default_device())
    _probe_deals_kernel[(programs,)](out, deals, DEAL=fn)
    return out.view(programs, deals).tolist()


def _dealing(deal, program, programs, *, backwards_in_odd=True, round_robin=False, mirror=1, offset=True):
    """The item with one typical mistake switched on (defaults: the chapter's)."""
    backwards = 0 if round_robin else (deal % 2 if backwards_in_odd else 1 - deal % 2)
    return deal * programs * offset + program + backwards * (programs - mirror - 2 * program)


DEAL_MISTAKES = {  # name: (the items that mistake gives, hint)
    "round_robin": (dict(round_robin=True), "You deal round-robin, forwards in every deal: program 0 then draws "
                    "the first, longest item of every deal and finishes last. Deal backwards in odd deals: "
                    "backwards = deal % 2, and program p takes item deal · P + (P − 1 − p)."),
    "backwards_first": (dict(backwards_in_odd=False), "The first deal goes forwards (program p takes item p) and "
                        "the second backwards: backwards = deal % 2, 0 in deal 0."),
    "mirror_off_by_one": (dict(mirror=0), "Backwards, program p takes the p-th item from the end of the deal, "
                          "deal · P + (P − 1 − p): the last item of the deal is deal · P + P − 1, not deal · P + P."),
    "no_deal_offset": (dict(offset=False), "Each deal hands out the next P items: deal d starts at item d · P. "
                       "Without the deal · P term every deal hands out items 0 … P − 1 again and the rest never run."),
}


def _grade_deals(fn) -> tuple[int, int, Failure | None]:
    n_q, n_bh, section, causal = DEAL_ITEMS
    n_items = n_bh * triton.cdiv(n_q, BLOCK)
    lengths = [chapter_item(w, n_bh, section, n_q, causal)[2] for w in range(n_items)]
    total = len(DEAL_PROGRAMS)
    for done, programs in enumerate(DEAL_PROGRAMS):
        case = (f"{programs} programs dealt {n_items} causal items ({n_bh} heads × {n_items // n_bh} query tiles, "
                f"key tiles {' '.join(map(str, lengths))}, longest first)")
        try:
            got = probe_deals(fn, programs, n_items)
        except Exception as exc:
            return done, total, Failure(case, _run_error(exc), [RAISED])
        deals = len(got[0])
        expected = [[chapter_deal(d, p, programs) for d in range(deals)] for p in range(programs)]
        if got == expected:
            continue
        p, d = next((p, d) for p in range(programs) for d in range(deals) if got[p][d] != expected[p][d])
        detail = [f"program {p}, deal {d}: expected item {expected[p][d]}, got {got[p][d]}"]
        mine = [[w for w in row if 0 <= w < n_items] for row in got]
        dealt = [w for row in mine for w in row]
        never = sorted(set(range(n_items)) - set(dealt))
        twice = sorted({w for w in dealt if dealt.count(w) > 1})
        if never or twice:
            detail.append(f"on the GPU: items never run: {never or 'none'}; run more than once: {twice or 'none'}")
        busiest = max(sum(lengths[w] for w in row) for row in mine)
        best = max(sum(lengths[w] for w in row if w < n_items) for row in expected)
        detail.append(f"key tiles per program, yours: {[sum(lengths[w] for w in row) for row in mine]} (busiest "
                      f"{busiest}); the chapter's dealing: busiest {best}")
        # a mistake is recognised when it gives exactly the learner's items for every program and deal
        hints = [hint for kw, hint in DEAL_MISTAKES.values()
                 if got == [[_dealing(d, p, programs, **kw) for d in range(deals)] for p in range(programs)]]
        return done, total, Failure(case, "\n".join(detail), hints or [
            "Deal 0 goes forwards: program p takes item p. Deal 1 backwards: program p takes item 2P − 1 − p. "
            "In general deal · P + p, or deal · P + (P − 1 − p) in odd deals."])
    return total, total, None


STEPS = {
    "ring": Step("ch07.ring", "the stage and the phases of the t-th K/V tile", _grade_ring,
                 ring_slot_skeleton, ring_slot,
                 tuple(Mistake(n, h, lambda a: False) for n, (_, h) in RING_MISTAKES.items())
                 + (Mistake("swapped", RING_SWAPPED, lambda a: False),
                    Mistake("unchanged", RING_UNCHANGED, lambda a: False),
                    Mistake("raised", RAISED, lambda a: False))),
    "work_item": Step("ch07.work_item", "which (pair, query tile) work item w is", _grade_items,
                      work_item_skeleton, work_item,
                      tuple(Mistake(n, h, lambda a: False) for n, (_, h) in ITEM_MISTAKES.items())
                      + (Mistake("unchanged", ITEM_UNCHANGED, lambda a: False),
                         Mistake("raised", RAISED, lambda a: False))),
    "dealt_item": Step("ch07.dealt_item", "which item a persistent program takes in each deal", _grade_deals,
                       dealt_item_skeleton, dealt_item,
                       tuple(Mistake(n, h, lambda a: False) for n, (_, h) in DEAL_MISTAKES.items())
                       + (Mistake("raised", RAISED, lambda a: False),)),
}

__all__ = ["STEPS", "chapter_deal", "chapter_item", "chapter_ring", "dealt_item", "dealt_item_skeleton",
           "on_integers", "probe_deals", "probe_items", "probe_ring", "ring_slot", "ring_slot_skeleton",
           "simulate_ring", "work_item", "work_item_skeleton"]
