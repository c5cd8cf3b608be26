"""Lab 7's grader can fail: planted typical mistakes in the ring arithmetic, the work-item numbering and
the dealing are caught with their own hint (on the CPU, through Triton's interpreter), and the
solutions are the chapter's own lines."""

from __future__ import annotations

import inspect
import re

import pytest
import triton
import triton.language as tl

from tutorial_kernels import ch07_hopper
from tutorial_kernels.labs import ch07
from tutorial_kernels.tests.planted import assert_caught_with_its_hint


# --- planted mistakes: each is the solution with one typical slip -------------------------------------

@triton.jit
def _ring_phase_every_tile(t, STAGES: tl.constexpr):
    stage = t % STAGES
    full_phase = t & 1
    empty_phase = (t + 1) & 1
    return stage, full_phase, empty_phase


@triton.jit
def _ring_empty_same_phase(t, STAGES: tl.constexpr):
    stage = t % STAGES
    full_phase = (t // STAGES) & 1
    empty_phase = (t // STAGES) & 1
    return stage, full_phase, empty_phase


@triton.jit
def _ring_phase_not_a_bit(t, STAGES: tl.constexpr):
    stage = t % STAGES
    full_phase = t // STAGES
    empty_phase = ((t // STAGES) + 1) & 1
    return stage, full_phase, empty_phase


@triton.jit
def _ring_stage_by_round(t, STAGES: tl.constexpr):
    stage = t // STAGES
    full_phase = (t // STAGES) & 1
    empty_phase = ((t // STAGES) + 1) & 1
    return stage, full_phase, empty_phase


@triton.jit
def _ring_phases_swapped(t, STAGES: tl.constexpr):
    stage = t % STAGES
    full_phase = ((t // STAGES) + 1) & 1
    empty_phase = (t // STAGES) & 1
    return stage, full_phase, empty_phase


@triton.jit
def _ring_full_previous_round(t, STAGES: tl.constexpr):
    stage = t % STAGES
    full_phase = ((t // STAGES) + 1) & 1
    empty_phase = ((t // STAGES) + 1) & 1
    return stage, full_phase, empty_phase


@triton.jit
def _ring_two_values(t, STAGES: tl.constexpr):  # a Python error inside the kernel: one value short
    stage = t % STAGES
    full_phase = (t // STAGES) & 1
    return stage, full_phase


@triton.jit
def _items_tile_past_the_end(w, n_bh, section, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    n_m = tl.cdiv(n_q, BLOCK_M)
    first_bh = (w // (section * n_m)) * section
    pairs = tl.minimum(section, n_bh - first_bh)
    within = w - first_bh * n_m
    m_rank = within // pairs
    bh = first_bh + within % pairs
    if CAUSAL:
        pid_m = n_m - m_rank
    else:
        pid_m = m_rank
    return bh, pid_m


@triton.jit
def _items_bh_within_section(w, n_bh, section, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    n_m = tl.cdiv(n_q, BLOCK_M)
    first_bh = (w // (section * n_m)) * section
    pairs = tl.minimum(section, n_bh - first_bh)
    within = w - first_bh * n_m
    m_rank = within // pairs
    bh = within % pairs
    if CAUSAL:
        pid_m = n_m - 1 - m_rank
    else:
        pid_m = m_rank
    return bh, pid_m


@triton.jit
def _items_misspelt(w, n_bh, section, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    n_m = tl.cdiv(n_q, BLOCK_M)
    first_bh = (w // (section * n_m)) * section
    pairs = tl.minimum(section, n_bh - first_bh)
    within = w - first_bh * n_m
    return first_bh + within % pair, within // pairs  # noqa: F821 (the planted slip: `pair` for `pairs`)


@triton.jit
def _items_shortest_first(w, n_bh, section, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    n_m = tl.cdiv(n_q, BLOCK_M)
    first_bh = (w // (section * n_m)) * section
    pairs = tl.minimum(section, n_bh - first_bh)
    within = w - first_bh * n_m
    m_rank = within // pairs
    bh = first_bh + within % pairs
    pid_m = m_rank
    return bh, pid_m


@triton.jit
def _items_pair_by_pair(w, n_bh, section, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    n_m = tl.cdiv(n_q, BLOCK_M)
    first_bh = (w // (section * n_m)) * section
    within = w - first_bh * n_m
    m_rank = within % n_m
    bh = first_bh + within // n_m
    if CAUSAL:
        pid_m = n_m - 1 - m_rank
    else:
        pid_m = m_rank
    return bh, pid_m


@triton.jit
def _items_full_last_section(w, n_bh, section, n_q, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    n_m = tl.cdiv(n_q, BLOCK_M)
    first_bh = (w // (section * n_m)) * section
    pairs = section
    within = w - first_bh * n_m
    m_rank = within // pairs
    bh = first_bh + within % pairs
    if CAUSAL:
        pid_m = n_m - 1 - m_rank
    else:
        pid_m = m_rank
    return bh, pid_m


@triton.jit
def _deal_backwards_first(deal):
    program, programs = tl.program_id(0), tl.num_programs(0)
    backwards = 1 - deal % 2
    return deal * programs + program + backwards * (programs - 1 - 2 * program)


@triton.jit
def _deal_mirror_off_by_one(deal):
    program, programs = tl.program_id(0), tl.num_programs(0)
    backwards = deal % 2
    return deal * programs + program + backwards * (programs - 2 * program)


@triton.jit
def _deal_no_offset(deal):
    program, programs = tl.program_id(0), tl.num_programs(0)
    backwards = deal % 2
    return program + backwards * (programs - 1 - 2 * program)


@triton.jit
def _deal_misspelt(deal):
    program, programs = tl.program_id(0), tl.num_programs(0)
    backwards = deal % 2
    return deal * programs + program + backward * (programs - 1 - 2 * program)  # noqa: F821 (the planted slip)


PLANTED = [
    ("ch07.ring", _ring_phase_every_tile, "phase_every_tile"),
    ("ch07.ring", _ring_empty_same_phase, "empty_same_phase"),
    ("ch07.ring", _ring_phase_not_a_bit, "phase_not_a_bit"),
    ("ch07.ring", _ring_stage_by_round, "stage_by_round"),
    ("ch07.ring", _ring_phases_swapped, "swapped"),
    ("ch07.ring", _ring_full_previous_round, "full_previous_round"),
    ("ch07.ring", _ring_two_values, "raised"),
    ("ch07.work_item", _items_shortest_first, "shortest_first"),
    ("ch07.work_item", _items_tile_past_the_end, "tile_past_the_end"),
    ("ch07.work_item", _items_bh_within_section, "bh_within_section"),
    ("ch07.work_item", _items_misspelt, "raised"),
    ("ch07.work_item", _items_pair_by_pair, "pair_by_pair"),
    ("ch07.work_item", _items_full_last_section, "full_last_section"),
    ("ch07.dealt_item", ch07.dealt_item_skeleton, "round_robin"),
    ("ch07.dealt_item", _deal_backwards_first, "backwards_first"),
    ("ch07.dealt_item", _deal_mirror_off_by_one, "mirror_off_by_one"),
    ("ch07.dealt_item", _deal_no_offset, "no_deal_offset"),
    ("ch07.dealt_item", _deal_misspelt, "raised"),
]


@pytest.mark.parametrize("step, fn, mistake", PLANTED, ids=[f"{s}-{m}" for s, _, m in PLANTED])
def test_a_planted_mistake_is_caught_with_its_hint(step, fn, mistake):
    assert_caught_with_its_hint(step, fn, mistake)


def test_the_ring_simulation_says_what_goes_wrong_on_the_gpu():
    """Right phases play through; a consumer phase that flips every tile reads a stage before its tile
    has arrived; the loader waiting for the consumers' own phase overwrites a tile still in use."""
    right = [ch07.chapter_ring(t, 3) for t in range(13)]
    assert ch07.simulate_ring(right, 3) is None
    every_tile = [(t % 3, t & 1, ((t // 3) + 1) & 1) for t in range(13)]
    assert "before tile 1 has arrived" in ch07.simulate_ring(every_tile, 3)
    same = [(t % 3, (t // 3) & 1, (t // 3) & 1) for t in range(13)]
    assert "overwrites stage" in ch07.simulate_ring(same, 3) or "deadlock" in ch07.simulate_ring(same, 3)


def test_the_mistake_models_default_to_the_chapters_numbering():
    for n_q, n_bh, section, causal in ch07.ITEM_CASES:
        chapter = [ch07.chapter_item(w, n_bh, section, n_q, causal)[:2] for w in range(len(ch07._items(
            n_q, n_bh, section, causal)))]
        assert ch07._items(n_q, n_bh, section, causal) == chapter
    for programs in ch07.DEAL_PROGRAMS:
        assert all(ch07._dealing(d, p, programs) == ch07.chapter_deal(d, p, programs)
                   for d in range(4) for p in range(programs))


def _code_lines(jit_function) -> list[str]:
    body = inspect.getsource(jit_function.fn).split('"""')[2].splitlines()
    return [code for line in body if (code := line.split("#")[0].strip()) and not code.startswith("return")]


def test_the_solutions_are_the_chapters_lines():
    """The lab's `work_item` and `dealt_item` are `_work_item`'s and `_dealt_item`'s lines with `tl` for `gl`
    (and BLOCK_M for block_m); the ring's three expressions are `_load_kv_tile`'s and `_overlapped_step`'s
    with t for the tile counter (`loaded`, `ring_t`) and STAGES for `stages`."""
    for solution, chapter in ((ch07.work_item, ch07_hopper._work_item), (ch07.dealt_item, ch07_hopper._dealt_item)):
        theirs = {line.split("#")[0].strip() for line in inspect.getsource(chapter.fn).splitlines()}
        for code in _code_lines(solution):
            ours = code.replace("tl.", "gl.").replace("BLOCK_M", "block_m")
            assert ours in theirs, f"{solution.__name__}: {code!r} is not in the chapter's {chapter.__name__}"
    source = inspect.getsource(ch07_hopper._load_kv_tile.fn) + inspect.getsource(ch07_hopper._overlapped_step.fn)
    for code in _code_lines(ch07.ring_slot):
        expression = code.split(" = ", 1)[1].replace("STAGES", "stages")
        assert any(re.sub(r"\bt\b", counter, expression) in source for counter in ("loaded", "ring_t")), code
