"""The concept diagrams (figures/concepts.py): they build, say what they show, explain every tile on
hover, and draw the kernels' own rules — the causal maps against a brute-force mask."""

import itertools
import re

import pytest

pytest.importorskip("plotly", reason="the figures need plotly (pip install -e '.[site]')")

from tutorial_kernels.figures import build, figure_html
from tutorial_kernels.figures.concepts import (
    CAUSAL_PAIRS, HOVER_WIDTH, SCORE_STATES, STAGE_NAMES, causal_tile_stages, dataflow_bytes, dkdv_visits, dq_visits,
    score_tile_states)
from tutorial_kernels.figures.style import figure_meta, visible_length
from tutorial_kernels.instruments.hbm_model import flash_v1_hbm_bytes, flash_v2_hbm_bytes
from tutorial_kernels.tiling import key_stages

CONCEPTS = ["concept-gpu-hierarchy", "concept-score-tiles", "concept-fa1-vs-fa2-dataflow", "concept-split-k-vs-split-q",
            "concept-causal-tile-map", "concept-backward-traversals", "concept-window-tiles"]
# (n_q, n_k) square, either way round, multiples of the tiles or not, and rows that see no key
LENGTHS = [(1, 1), (1, 70), (70, 1), (64, 64), (40, 130), (130, 40), (100, 257), (200, 300), (300, 200)] + [
    (40, 40 + d) for d in range(-20, 21, 3)]
BLOCKS = [(16, 16), (32, 16), (16, 64), (64, 32)]


def _flat(values):
    if isinstance(values, (list, tuple)):
        for v in values:
            yield from _flat(v)
    else:
        yield values


def hover_texts(trace) -> list[str] | None:
    """What hovering `trace` can show, one string per point (None: a legend-only entry)."""
    xs = [x for x in _flat(list(trace.x) if trace.x is not None else []) if x is not None]
    if trace.type == "scatter" and not xs:
        assert trace.hoverinfo == "skip", f"{trace.name}: an empty trace should not hover"
        return None
    if trace.type == "scatter" and trace.hoveron == "fills":
        assert trace.hoverinfo == "text" and isinstance(trace.text, str), trace.name
        return [trace.text]
    assert trace.hoverinfo != "skip", f"{trace.name} is drawn but says nothing on hover"
    template = trace.hovertemplate or ""
    assert template.strip(), f"{trace.name} has no hovertemplate"
    if "%{customdata}" in template:
        return [template.replace("%{customdata}", str(c)) for c in _flat(trace.customdata.tolist()
                                                                           if hasattr(trace.customdata, "tolist")
                                                                           else trace.customdata)]
    return [template]


@pytest.mark.parametrize("name", CONCEPTS)
def test_every_concept_builds_with_alt_text_and_says_something_on_every_hover(name):
    fig = build(name)
    alt = figure_meta(fig).get("alt", "")
    assert len(alt.split()) >= 20 and alt.endswith("."), f"{name}: alt text should be a sentence or three: {alt!r}"
    assert f'role="img" aria-label="' in figure_html(name)
    hovered = 0
    for trace in fig.data:
        texts = hover_texts(trace)
        if texts is None:
            continue
        for text in texts:
            plain = re.sub(r"<extra>.*?</extra>", "", text)
            assert visible_length(plain.replace("<br>", "").strip()) > 10, f"{name}: {trace.name}: empty hover {text!r}"
            for line in re.split(r"<br>", plain):
                assert visible_length(line) <= HOVER_WIDTH + 12, f"{name}: hover line too long for a phone: {line!r}"
        hovered += len(texts)
    assert hovered >= 6, f"{name}: only {hovered} boxes or tiles explain themselves on hover"


@pytest.mark.parametrize("name", CONCEPTS)
def test_concepts_have_a_narrow_layout_and_readable_text(name):
    fig = build(name)
    narrow = figure_meta(fig).get("narrow", {})
    assert narrow.get("margin.l", 99) <= 56 and narrow.get("margin.r", 99) <= 12, f"{name}: phone margins not set"
    sizes = [a.font.size for a in fig.layout.annotations if a.text]
    sizes += [t.textfont.size for t in fig.data if t.type == "heatmap" and t.texttemplate]
    assert all(s is None or s >= 12 for s in sizes), f"{name}: text smaller than the template's note size: {sizes}"


def _visible(i: int, j: int, n_q: int, n_k: int) -> bool:
    return j <= i + (n_k - n_q)  # bottom-right causal alignment (chapter 2)


def brute_force_stage(start_m, start_n, n_q, n_k, block_m, block_n) -> str:
    """From the mask alone: skipped when no real query of the tile sees a real key of it; unmasked
    when every real query sees every key of the whole tile (a key past n_k needs the mask too)."""
    rows = range(start_m, min(start_m + block_m, n_q))
    keys = range(start_n, start_n + block_n)
    if not any(_visible(i, j, n_q, n_k) for i in rows for j in keys if j < n_k):
        return "skipped"
    if all(j < n_k and _visible(i, j, n_q, n_k) for i in rows for j in keys):
        return "unmasked"
    return "masked"


def test_causal_stages_are_the_mask_and_key_stages():
    for (n_q, n_k), (block_m, block_n) in itertools.product(LENGTHS, BLOCKS):
        stages = causal_tile_stages(n_q, n_k, block_m, block_n)
        assert len(stages) == -(-n_q // block_m) and all(len(r) == -(-n_k // block_n) for r in stages)
        for a, start_m in enumerate(range(0, n_q, block_m)):
            unmasked_end, masked_end = key_stages(start_m, n_q, n_k, block_m, block_n)
            for b, start_n in enumerate(range(0, n_k, block_n)):
                where = (n_q, n_k, block_m, block_n, start_m, start_n)
                assert stages[a][b] == brute_force_stage(start_m, start_n, n_q, n_k, block_m, block_n), where
                kernel = ("unmasked" if start_n < unmasked_end else "masked" if start_n < masked_end else "skipped")
                assert stages[a][b] == kernel, where


def test_the_causal_map_draws_those_stages_for_every_button():
    fig = build("concept-causal-tile-map")
    menu = fig.layout.updatemenus[0]
    pairs = [tuple(map(int, re.findall(r"\d+", b.label)[-2:])) for b in menu.buttons]
    assert pairs == CAUSAL_PAIRS
    assert any(q < k for q, k in pairs) and any(q > k for q, k in pairs) and any(q == k for q, k in pairs)
    assert any(q % 64 or k % 32 for q, k in pairs), "a pair whose lengths are not multiples of the tiles"
    maps = [t for t in fig.data if t.type == "heatmap"]
    for button, heatmap, (n_q, n_k) in zip(menu.buttons, maps, pairs):
        shown = [t for t, v in zip(fig.data, button.args[0]["visible"]) if v and t.type == "heatmap"]
        assert shown == [heatmap]
        drawn = [[STAGE_NAMES[z] for z in row] for row in heatmap.z]
        assert drawn == causal_tile_stages(n_q, n_k, 64, 32)
        assert list(heatmap.x)[-1] == n_k and list(heatmap.y)[-1] == n_q  # a ragged last tile drawn to its end
        for row, texts in zip(drawn, heatmap.customdata):
            for stage, text in zip(row, texts):
                assert {"unmasked": "stage 1", "masked": "stage 2", "skipped": "never visited"}[stage] in text


def test_backward_walks_visit_what_the_mask_leaves_in_kernel_order():
    for (n_q, n_k), (block_m, block_n) in itertools.product(LENGTHS, BLOCKS):
        for start_n in range(0, n_k, block_n):  # the dK/dV program of key tile start_n: down its column
            visits = dkdv_visits(start_n, n_q, n_k, block_m, block_n)
            seen = [brute_force_stage(m, start_n, n_q, n_k, block_m, block_n) != "skipped" for m in range(0, n_q, block_m)]
            assert [m // block_m for m, _ in visits] == [a for a, s in enumerate(seen) if s], (n_q, n_k, start_n)
            masked = [m for m, is_masked in visits if is_masked]
            assert masked == [m for m, _ in visits][:len(masked)], "the masked tiles come first"
            for m, is_masked in visits:
                rows = range(m, min(m + block_m, n_q))
                if not is_masked:
                    assert all(_visible(i, j, n_q, n_k) for i in rows for j in range(start_n, min(start_n + block_n, n_k)))
        for start_m in range(0, n_q, block_m):  # the dQ program of query tile start_m: across its row
            visits = dq_visits(start_m, n_q, n_k, block_m, block_n)
            expect = [s for s in causal_tile_stages(n_q, n_k, block_m, block_n)[start_m // block_m]]
            assert [("masked" if is_masked else "unmasked") for _, is_masked in visits] == [s for s in expect if s != "skipped"]
            assert [n // block_n for n, _ in visits] == [b for b, s in enumerate(expect) if s != "skipped"]


def test_backward_figure_numbers_each_walk_in_order():
    fig = build("concept-backward-traversals")
    dkdv, dq = [t for t in fig.data if t.type == "heatmap"]
    n, block_m, block_n = 256, 32, 64
    for b, start_n in enumerate(range(0, n, block_n)):
        column = [row[b] for row in dkdv.text]
        steps = [int(s) for s in column if s]
        assert steps == list(range(1, len(dkdv_visits(start_n, n, n, block_m, block_n)) + 1))
    for a, start_m in enumerate(range(0, n, block_m)):
        assert [int(s) for s in dq.text[a] if s] == list(range(1, len(dq_visits(start_m, n, n, block_m, block_n)) + 1))


def test_score_tiles_slider_steps_through_every_kv_tile_with_one_tile_of_s_alive():
    fig = build("concept-score-tiles")
    slider = fig.layout.sliders[0]
    tiles_q, tiles_k = -(-768 // 128), -(-1024 // 128)
    assert len(slider.steps) == tiles_k
    on_chip = SCORE_STATES.index("on chip now")
    for j, step in enumerate(slider.steps):
        z = step.args[0]["z"][0]
        assert z == score_tile_states(tiles_q, tiles_k, 2, j)
        alive = [(i, c) for i, row in enumerate(z) for c, s in enumerate(row) if s == on_chip]
        assert alive == [(2, j)], "exactly one tile of S exists at each step: program 2's tile j"
        text = step.args[0]["customdata"][0][2][j].replace("<br>", " ")
        assert "computed by program 2 at step " + str(j) in text and "√d" in text
        assert step.args[0]["z"][1] == [[on_chip if c == j else 1 for c in range(tiles_k)]]  # K_j, V_j loaded
    assert [list(r) for r in fig.data[0].z] == slider.steps[slider.active].args[0]["z"][0]  # drawn at the active step


def test_dataflow_counts_come_from_the_io_model():
    moved = dataflow_bytes(4096, 64, 2, 128)
    assert moved["flash-v1"] == sum(flash_v1_hbm_bytes(1, 1, 4096, 4096, 64, 2, 128, 128).values())
    assert moved["flash-v2"] == sum(flash_v2_hbm_bytes(1, 1, 4096, 4096, 64, 2, 128, 128).values())
    assert moved["flash-v1"] > 2 * moved["flash-v2"]
    notes = " ".join(figure_meta(build("concept-fa1-vs-fa2-dataflow"))["notes"])
    assert f"{moved['flash-v1'] / 1e6:.0f} MB" in notes and f"{moved['flash-v2'] / 1e6:.0f} MB" in notes


def test_split_k_and_split_q_give_each_warp_a_band():
    fig = build("concept-split-k-vs-split-q")
    s_k, s_q = [t for t in fig.data if t.type == "heatmap" and t.name == "S tile"]
    z_k, z_q = [list(map(list, t.z)) for t in (s_k, s_q)]
    assert all(row == [0, 1, 2, 3] for row in z_k), "split-K: warp w owns key column band w"
    assert sorted(row[0] for row in z_q) == [0, 1, 2, 3] and all(len(set(row)) == 1 for row in z_q), \
        "split-Q: warp w owns query row band w"


def test_gpu_hierarchy_draws_the_device_record():
    from tutorial_kernels.figures.rows import load_data

    fig = build("concept-gpu-hierarchy")
    device = load_data("ch01_timelines")["device"]
    copy = load_data("ch01_reduction")["ceilings"]["copy_tb_per_s"]
    text = " ".join(a.text for a in fig.layout.annotations if a.text)
    assert f"{device['sm_count']} SMs" in text and "50 MiB" in text and "228 KiB" in text and "80 GB" in text
    assert f"{copy:.2f} TB/s measured" in text and "3.35 TB/s" in text
    meta = figure_meta(fig)
    assert any("whitepaper" in n for n in meta["notes"]) and meta.get("provenance")
