"""Chapter 7: FA3's schedule on Hopper, in Gluon (`tutorial_kernels.ch07_hopper`).

Gluon kernels run on a GPU only (not in Triton's interpreter), and this one only on compute
capability 9.x: its kernel tests are not collected without a GPU and skip, with that reason, on
another GPU; the launch-plan arithmetic, the CPU refusal and the chapter's pictures (which restate
the kernel's scheduling in plain Python, checked here against the kernel's own code) run everywhere. `flash_attn_hopper`'s
output on its shapes (N = 1, ragged tiles, n_q ≠ n_k both ways, grouped-/multi-query attention, both
layouts, a poisoned `out=`, float16 and bfloat16) and its argument checks are in `test_conformance.py`."""

import importlib.util
import types

import pytest
import torch

from tutorial_kernels.ch07_hopper import (HEAD_DIMS, flash_attn_hopper,
                                          hopper_kernel_unavailable, pairs_per_section, runs_persistent)
from tutorial_kernels.reference import reference_attention
from tutorial_kernels.testing import ON_GPU, assert_close, poisoned, random_qkv
from tutorial_kernels.validation import UnsupportedShape

ON_HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9


def needs_hopper(test):
    """Not collected without a GPU (Triton's CPU interpreter does not run Gluon); skipped, with the
    reason, on a GPU of another architecture."""
    test = pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a GPU of compute capability 9.x "
                              "(H100/H200)")(test)
    return pytest.mark.gpu("the Gluon kernel")(test)


@needs_hopper
@pytest.mark.parametrize("programs,section", [(1, None), (2, 3), (5, 1), (7, 4)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 300, 300, 128), (1, 3, 3, 300, 130, 128), (1, 2, 1, 1000, 1000, 128),
                                   (2, 2, 1, 100, 357, 128), (2, 4, 2, 300, 300, 64), (1, 2, 1, 1000, 1000, 64),
                                   (2, 4, 2, 300, 300, 256), (1, 2, 1, 1000, 1000, 256)],
                         ids=lambda s: "b{}h{}kv{}-nq{}-nk{}-d{}".format(*s))
def test_programs_that_run_several_work_items_carry_the_ring_and_q_across_them(shape, causal, programs, section):
    # The launch is persistent: with fewer programs than work items, each program runs several, and
    # its barriers' phases and the K/V ring run on from one item to the next, through items with
    # different numbers of key tiles and (causal, n_q > n_k) items whose rows see no key at all;
    # sections of 1, 3 or 4 (batch, head) pairs leave a smaller last section in some shapes. Each
    # head dimension has its own key tile and ring (TILES).
    from tutorial_kernels.ch07_hopper import _launch

    batch, heads, kv_heads, n_q, n_k, head_dim = shape
    x = random_qkv(batch, heads, n_q, n_k, head_dim, torch.bfloat16, "cuda", layout="bnhd")
    k, v = x.k[:, :kv_heads], x.v[:, :kv_heads]
    out = poisoned(tuple(x.q.shape), torch.bfloat16, "cuda")
    _launch(x.q, k, v, causal, head_dim ** -0.5, out, programs=programs, section=section)
    group = heads // kv_heads
    ref = reference_attention(x.q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal)
    assert_close(out, ref, torch.bfloat16, seed=x.seed)


@needs_hopper
def test_writes_a_transposed_out_buffer_and_a_custom_scale():
    x = random_qkv(1, 4, 200, 200, 128, torch.bfloat16, "cuda", layout="bnhd")
    out = poisoned((1, 200, 4, 128), torch.bfloat16, "cuda").transpose(1, 2)
    flash_attn_hopper(x.q, x.k, x.v, True, 0.05, out=out)
    assert_close(out, reference_attention(x.q, x.k, x.v, True, 0.05), torch.bfloat16, seed=x.seed)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_views_with_an_offset_and_keys_past_a_tile_read_nothing_of_their_neighbours(causal):
    # q, k, v are views into larger tensors (a storage offset, rows of 256 of which 128 are used); the
    # head after v's last head, and the batch before, are all infinities. The last key tile (100 of 128
    # rows) must not read them: 0 · inf would be NaN.
    x = random_qkv(2, 3, 100, 100, 256, torch.bfloat16, "cuda")
    q, k = x.q[1:, :2, :, :128], x.k[1:, :2, :, 64:192]
    v_all = x.v.clone()
    v_all[:, 2] = float("inf")
    v_all[0] = float("inf")
    v = v_all[1:, :2, :, :128]
    assert not q.is_contiguous() and q.storage_offset() > 0
    out = poisoned(tuple(q.shape), torch.bfloat16, "cuda")
    flash_attn_hopper(q, k, v, causal, out=out)
    assert_close(out, reference_attention(q, k, v, causal), torch.bfloat16, seed=x.seed)


@needs_hopper
def test_unsupported_inputs_say_why():
    x = random_qkv(1, 2, 64, 64, 80, torch.float16, "cuda")
    assert "head_dim 64, 128 or 256, got 80" in hopper_kernel_unavailable(x.q, x.k, x.v)
    with pytest.raises(UnsupportedShape, match="head_dim 64, 128 or 256, got 80"):
        flash_attn_hopper(x.q, x.k, x.v)
    assert set(HEAD_DIMS) == {64, 128, 256}
    x = random_qkv(1, 2, 64, 64, 128, torch.float32, "cuda")
    with pytest.raises(TypeError, match="torch.float16 and torch.bfloat16, got torch.float32"):
        flash_attn_hopper(x.q, x.k, x.v)
    x = random_qkv(1, 2, 128, 128, 128, torch.float16, "cuda")
    columns_apart = x.q.transpose(2, 3)  # (B, H, 128, 128) whose head dimension has stride 128
    with pytest.raises(UnsupportedShape, match="needs q's head dimension contiguous"):
        flash_attn_hopper(columns_apart, x.k, x.v)
    out = poisoned((1, 2, 128, 128), torch.float16, "cuda").transpose(2, 3)
    with pytest.raises(ValueError, match="writes rows of head_dim contiguous elements"):
        flash_attn_hopper(x.q, x.k, x.v, out=out)


def test_cpu_tensors_are_refused_with_the_reason():
    q = torch.randn(1, 2, 8, 128, dtype=torch.float16)
    assert "compute capability 9.x" in hopper_kernel_unavailable(q, q, q)
    with pytest.raises(UnsupportedShape, match=r"compute capability 9.x \(Hopper\), got cpu"):
        flash_attn_hopper(q, q, q)


def test_persistent_launches_go_in_sections_of_heads_that_share_an_eighth_of_the_l2():
    # The FA2 paper's shapes at d = 128 (16 heads, 16k tokens in all) on a 50 MiB L2: K and V are
    # 2 × N × 128 × 2 bytes per head, 128 MiB in all, beyond the L2.
    l2 = 50 * 2**20
    for n, batch, expected in ((1024, 16, 12), (2048, 8, 6), (4096, 4, 3), (8192, 2, 1)):
        kv_bytes, kv_heads = batch * 16 * 2 * n * 128 * 2, batch * 16
        for causal in (True, False):
            assert runs_persistent(kv_bytes, kv_heads, causal, l2)
            assert pairs_per_section(kv_bytes, kv_heads, causal, l2, group_size=1) == expected
    kv_16k = 16 * 2 * 16384 * 128 * 2  # 8 MiB per head, beyond 6.25, and 128 MiB in all: one program per item
    assert not runs_persistent(kv_16k, 16, True, l2) and not runs_persistent(kv_16k, 16, False, l2)
    # causal with K and V within the L2: all heads in one section, however large one head is (4 × 8 MiB);
    # not causal, one head beyond an eighth of the L2 means one program per item
    assert runs_persistent(4 * 2 * 16384 * 128 * 2, 4, True, l2)
    assert pairs_per_section(4 * 2 * 16384 * 128 * 2, 4, True, l2, group_size=1) == 4
    assert not runs_persistent(4 * 2 * 16384 * 128 * 2, 4, False, l2)
    # grouped-query attention, 32 query heads on 8 key/value heads: sections hold whole groups
    prefill_kv = 8 * 2 * 4096 * 128 * 2  # 16 MiB, 2 MiB per key/value head
    assert pairs_per_section(prefill_kv, 8, True, l2, group_size=4) == 32  # causal: one section
    assert pairs_per_section(prefill_kv, 8, False, l2, group_size=4) == 12  # 3 key/value heads' queries
    assert not runs_persistent(8 * 2 * 16384 * 128 * 2, 8, True, l2)  # 64 MiB, 8 MiB per key/value head


def test_the_front_door_prefers_the_kernel_where_it_was_measured_faster(monkeypatch):
    # The rules table (dispatch.RULES, perf/rules_sm90.json): from forward_min_keys_persistent queries and
    # keys when the launch is persistent (see `runs_persistent`), from forward_min_keys otherwise; never
    # below. Shapes only: meta tensors, an H100's L2.
    from tutorial_kernels import ch07_hopper
    from tutorial_kernels.dispatch import RULES, hopper_forward_preferred

    least_persistent, least = RULES["forward_min_keys_persistent"], RULES["forward_min_keys"]
    assert (least_persistent, least, RULES["forward_head_dims"]) == (1024, 2048, [128, 256])  # as measured
    monkeypatch.setattr(ch07_hopper, "_sm_count_and_l2_bytes", lambda index: (132, 50 * 2**20))

    def qk(batch, heads, kv_heads, n):
        return (torch.empty(batch, heads, n, 128, dtype=torch.bfloat16, device="meta"),
                torch.empty(batch, kv_heads, n, 128, dtype=torch.bfloat16, device="meta"))

    prefill = qk(1, 32, 8, 1500)  # K and V: 5.9 MiB, all within the L2
    assert hopper_forward_preferred(*prefill, causal=True)
    many_heads = qk(16, 16, 16, 1500)  # K and V: 188 MiB, 0.73 MiB per head: persistent, in sections
    assert hopper_forward_preferred(*many_heads, causal=True)
    assert hopper_forward_preferred(*many_heads, causal=False)
    # with a 4 MiB L2 a head's 0.73 MiB is beyond an eighth of it: one program per item, from forward_min_keys only
    monkeypatch.setattr(ch07_hopper, "_sm_count_and_l2_bytes", lambda index: (132, 4 * 2**20))
    assert not hopper_forward_preferred(*many_heads, causal=True)
    monkeypatch.setattr(ch07_hopper, "_sm_count_and_l2_bytes", lambda index: (132, 50 * 2**20))
    assert not hopper_forward_preferred(*qk(0, 32, 8, 1500), causal=True)  # no sequence: no division
    assert hopper_forward_preferred(*qk(16, 16, 16, least), causal=True)
    assert not hopper_forward_preferred(*qk(1, 32, 8, least_persistent - 1), causal=True)
    assert hopper_forward_preferred(*qk(1, 32, 8, least_persistent), causal=True)
    # by head dimension: 256 as 128; 64, where the two kernels were level, never
    for head_dim, preferred in ((64, False), (256, True)):
        q, k = (torch.empty(4, 8, 4096, head_dim, dtype=torch.bfloat16, device="meta") for _ in range(2))
        assert hopper_forward_preferred(q, k, causal=False) is preferred

NEEDS_PLOTLY = pytest.mark.skipif(importlib.util.find_spec("plotly") is None,
                                reason="the figures need plotly (pip install -e '.[site]')")


# --- the chapter's pictures (tutorial_kernels/figures/ch07.py) --------------------------------------

class _IntegerGluon:
    """Just enough of `gl` to run the kernel's scheduling helpers on Python integers."""

    def __init__(self, program: int = 0, programs: int = 1):
        self.program, self.programs = program, programs

    constexpr = object

    @staticmethod
    def cdiv(a, b):
        return -(-a // b)

    minimum, maximum = staticmethod(min), staticmethod(max)

    def program_id(self, axis):
        return self.program

    def num_programs(self, axis):
        return self.programs


def _on_integers(jit_function, gl):
    """The Python body of a @gluon.jit function, with `gl` replaced: the kernel's own arithmetic."""
    fn = jit_function.fn
    return types.FunctionType(fn.__code__, {**fn.__globals__, "gl": gl}, fn.__name__, fn.__defaults__)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q,n_k,batch,heads,group,section", [
    (1024, 1024, 1, 3, 1, 3), (2048, 2048, 1, 32, 4, 32), (300, 300, 2, 4, 2, 3), (1000, 130, 1, 3, 3, 1),
    (100, 357, 2, 2, 1, 4), (1, 1, 1, 1, 1, 1), (777, 777, 3, 5, 5, 2)])
@NEEDS_PLOTLY
def test_the_pictures_number_work_items_as_the_kernel_does(n_q, n_k, batch, heads, group, section, causal):
    from tutorial_kernels.ch07_hopper import _work_item, band_offsets
    from tutorial_kernels.figures.ch07 import work_items

    kernel = _on_integers(_work_item, _IntegerGluon())
    n_bh = batch * heads
    ours = work_items(n_q, n_k, n_bh, section, heads, group, causal)
    _, diag, edge = band_offsets(causal, (-1, -1), n_q, n_k)
    theirs = [kernel(w, n_bh, section, heads, group, n_q, n_k, diag, edge, causal, False, 128, 128)
              for w in range(len(ours))]
    assert all(item[4] == item[5] == 0 for item in theirs)  # no window: every item's tiles start at 0, unmasked
    assert ours == [item[:4] + item[6:] for item in theirs]
    assert sorted((b, h, row) for b, h, _, row, _, _ in ours) == sorted(
        (b, h, row) for b in range(batch) for h in range(heads) for row in range(0, n_q, 128))  # each tile once
    if causal and section == n_bh:
        lengths = [item[5] for item in ours]
        assert lengths == sorted(lengths, reverse=True)  # longest first


@pytest.mark.parametrize("window_size, causal", [((300, -1), True), ((0, 0), False), ((200, 77), False),
                                                 ((129, -1), False), ((-1, 40), False), ((63, 0), False),
                                                 ((-1, -1), True), ((-1, -1), False)])
@pytest.mark.parametrize("n_q, n_k", [(1100, 1100), (777, 1300), (1300, 777), (1, 1), (130, 5)])
def test_a_windows_work_items_visit_every_key_it_sees_and_mask_every_tile_it_crosses(n_q, n_k, window_size, causal):
    """`_work_item`'s own arithmetic on integers, with and without WINDOW (a call without a left edge is
    compiled without it: then both forms must give the same tiles): every key a row of the
    item sees lies in the tiles [lo, n_tiles) it visits, at most one tile on either side is wasted, and
    a tile left unmasked ([left_full, n_full)) is seen whole by every row of the item."""
    from tutorial_kernels.ch07_hopper import _work_item, band_offsets
    from tutorial_kernels.reference import variant_mask

    kernel = _on_integers(_work_item, _IntegerGluon())
    bounded, diag, edge = band_offsets(causal, window_size, n_q, n_k)
    seen = variant_mask(n_q, n_k, window_size, causal)
    block = 128
    n_items = -(-n_q // block)
    for w in range(n_items):
        _, _, _, row, lo, left_full, n_full, n_tiles = kernel(w, 1, 1, 1, 1, n_q, n_k, diag, edge, bounded, True,
                                                              block, block)
        if window_size[0] < 0:  # the consumers' WINDOW=False must agree with the loader's general form
            assert (lo, left_full) == (0, 0)
            assert kernel(w, 1, 1, 1, 1, n_q, n_k, diag, edge, bounded, False, block, block)[6:] == (n_full, n_tiles)
        rows = seen[row:row + block]
        cols = rows.any(dim=0).nonzero().flatten().tolist()
        if cols:
            assert lo * block <= cols[0] and cols[-1] < n_tiles * block, (w, lo, n_tiles, cols[0], cols[-1])
            assert lo == cols[0] // block and n_tiles == cols[-1] // block + 1, (w, lo, n_tiles)
        for t in range(max(left_full, lo), n_full):
            tile = seen[row:row + block, t * block:(t + 1) * block]
            assert tile.shape[1] == block and tile[:min(block, n_q - row)].all(), (w, t)


class _IntegerGluonGrid(_IntegerGluon):
    """`gl` with a program id per grid axis and `gl.where`, for the backward's key tile."""

    def __init__(self, *ids: int):
        super().__init__()
        self.ids = ids

    def program_id(self, axis):
        return self.ids[axis]

    @staticmethod
    def where(condition, a, b):
        return a if condition else b


@pytest.mark.parametrize("window_size, causal", [((300, -1), True), ((0, 0), False), ((200, 77), False),
                                                 ((129, -1), False), ((-1, 40), False), ((63, 0), False),
                                                 ((-1, -1), True), ((-1, -1), False), ((62, -1), False)])
@pytest.mark.parametrize("n_q, n_k", [(1100, 1100), (777, 1300), (1300, 777), (1, 1), (130, 5), (1000, 1062),
                                      (1000, 1001)])  # diag ≡ −2 and 1 (mod 64): a tile boundary either side
def test_the_backwards_key_tiles_visit_every_query_that_sees_them_and_mask_every_tile_they_cross(n_q, n_k, window_size,
                                                                                                 causal):
    """The backward's `_key_tile` on integers: the query tiles [m_lo, m_hi) a key tile visits hold every row
    that sees one of its keys, with none wasted on either side, and a query tile it leaves unmasked
    ([m_full, m_mid)) sees the whole key tile with every row."""
    from tutorial_kernels.ch07_hopper import band_offsets
    from tutorial_kernels.ch07_hopper_backward import _key_tile
    from tutorial_kernels.reference import variant_mask

    bounded, diag, edge = band_offsets(causal, window_size, n_q, n_k)
    seen = variant_mask(n_q, n_k, window_size, causal)
    block_m, block_n = 64, 128
    for tile in range(-(-n_k // block_n)):
        kernel = _on_integers(_key_tile, _IntegerGluonGrid(tile, 0))
        _, _, first_key, m_lo, m_full, m_mid, m_hi, _ = kernel(1, 1, n_q, n_k, diag, edge, bounded, block_m, block_n)
        assert first_key == tile * block_n and m_lo <= m_full <= m_mid <= m_hi
        rows = seen[:, first_key:first_key + block_n].any(dim=1).nonzero().flatten().tolist()
        if rows:
            assert (m_lo, m_hi) == (rows[0] // block_m, rows[-1] // block_m + 1), (tile, m_lo, m_hi, rows[0], rows[-1])
        else:
            assert m_lo == m_hi, (tile, m_lo, m_hi)
        for m in range(m_full, m_mid):
            block = seen[m * block_m:(m + 1) * block_m, first_key:first_key + block_n]
            assert block.shape[1] == block_n and block.all(), (tile, m)


@pytest.mark.parametrize("programs", [1, 2, 5, 132])
@NEEDS_PLOTLY
def test_the_pictures_deal_items_as_the_kernel_does(programs):
    from tutorial_kernels.ch07_hopper import _dealt_item
    from tutorial_kernels.figures.ch07 import deal_items, dealt_item

    for program in range(programs):
        kernel = _on_integers(_dealt_item, _IntegerGluon(program, programs))
        assert [dealt_item(d, program, programs) for d in range(7)] == [kernel(d) for d in range(7)]
    n_items = 3 * programs + 1
    dealt = deal_items(n_items, programs)
    assert sorted(w for mine in dealt for w in mine) == list(range(n_items))  # every item once
    assert dealt[0][:2] == [0, 2 * programs - 1]


@NEEDS_PLOTLY
def test_dealing_forwards_and_backwards_evens_out_the_prefill_shape():
    # The page's arithmetic: 32 heads of 2048 tokens, causal, 512 items on 132 programs.
    from tutorial_kernels.figures.ch07 import busiest_program_tiles, work_items

    lengths = [item[5] for item in work_items(2048, 2048, 32, 32, 32, 4, causal=True)]
    assert len(lengths) == 512 and sum(lengths) == 32 * sum(range(1, 17))
    assert busiest_program_tiles(lengths, 132, backwards=True) == 34
    assert busiest_program_tiles(lengths, 132, backwards=False) == 40


@NEEDS_PLOTLY
def test_the_pipeline_picture_keeps_the_kernels_barriers():
    from tutorial_kernels.figures.ch07 import MMA_UNITS, STAGES, pipeline_schedule

    n_tiles = 7
    run = pipeline_schedule(n_tiles)
    done = {(wg, kind, t): end for wg, kind, t, _, end in run["mma"]}
    loaded = {t: end for t, _, _, end in run["loads"]}
    for t, stage, start, _ in run["loads"]:
        assert stage == t % STAGES
        if t >= STAGES:  # the empty barrier: both warpgroups released the stage's previous tile
            assert start >= max(run["release"][(wg, t - STAGES)] for wg in (0, 1))
    for wg, kind, t, start, _ in run["mma"]:
        assert start >= loaded[t]  # the full barrier
    spans = sorted((start, end) for *_, start, end in run["mma"])
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # one product at a time on the tensor cores
    for wg, t, start, end in run["softmax"]:
        assert start >= done[(wg, "S", t)]
        if t > 0:  # FA3's order: P̃_{t-1} V_{t-1} was issued before the softmax of tile t began
            assert [s for w, k, u, s, _ in run["mma"] if (w, k, u) == (wg, "PV", t - 1)][0] < end
    for (wg, t), released in run["release"].items():
        assert released >= done[(wg, "PV", t)]
    alone = pipeline_schedule(n_tiles, warpgroups=1, overlapped=True, loads=False)
    waited = pipeline_schedule(n_tiles, warpgroups=1, overlapped=False, loads=False)
    assert alone["end"] < waited["end"]
    assert sum(e - s for *_, s, e in alone["mma"]) == 2 * n_tiles * MMA_UNITS


@NEEDS_PLOTLY
def test_every_chapter_7_figure_builds_and_every_picture_has_alt_text():
    from tutorial_kernels.figures import FIGURES, build
    from tutorial_kernels.figures.style import figure_meta

    names = [name for name, factory in FIGURES.items() if factory.__module__ == "tutorial_kernels.figures.ch07"]
    concepts = [name for name in names if name.startswith("concept-")]
    assert {"concept-warp-specialised-pipeline", "concept-mbarrier-ring", "concept-intra-warpgroup-overlap",
            "concept-persistent-dealing", "concept-output-stores", "concept-hopper-program"} <= set(concepts)
    for name in names:
        fig = build(name)
        assert fig.data, name
        if name in concepts:
            assert len(figure_meta(fig).get("alt", "")) > 80, name


@NEEDS_PLOTLY
def test_the_output_picture_writes_each_sector_in_two_instructions_or_in_one():
    from tutorial_kernels.figures.ch07 import store_pattern

    for staged, per_sector in ((False, 2), (True, 1)):
        lanes, instructions = store_pattern(staged, rows=16, cols=128)
        for r in range(16):
            for sector in range(0, 128, 16):  # 32 bytes of 16-bit values
                assert len(set(instructions[r][sector:sector + 16])) == per_sector
        # each store instruction of the warp writes each (row, column) once: 32 lanes × 2 or 8 columns
        cells = [(lanes[r][c], instructions[r][c]) for r in range(16) for c in range(128)]
        per_lane = 8 if staged else 2
        assert all(cells.count(cell) == per_lane for cell in set(cells))


@pytest.mark.parametrize("window_size, causal", [((511, -1), True), ((4095, -1), True), ((200, 77), False),
                                                 ((63, 0), False), ((-1, 40), False)])
@pytest.mark.parametrize("n_q, n_k", [(2048, 2048), (1100, 1100), (777, 1300), (1300, 777)])
@NEEDS_PLOTLY
def test_chapter_9s_picture_of_a_work_item_has_the_kernels_ranges(n_q, n_k, window_size, causal):
    from tutorial_kernels.ch07_hopper import _work_item, band_offsets
    from tutorial_kernels.figures.ch09 import item_ranges

    kernel = _on_integers(_work_item, _IntegerGluon())
    bounded, diag, edge = band_offsets(causal, window_size, n_q, n_k)
    for w in range(-(-n_q // 128)):
        item = kernel(w, 1, 1, 1, 1, n_q, n_k, diag, edge, bounded, True, 128, 128)
        assert item_ranges(item[3], n_q, n_k, window_size, causal) == item[4:], (w, item)
