"""Chapter 9's figures (docs/chapters/09-variants.md): attention as models use it.

- `concept-window-tiles`: the tiles of S a sliding window leaves to compute, drawn from the kernel's own
  bounds (`ch09_variants.key_range`): visited with every pair seen, visited with some pairs hidden, or
  never visited; a menu picks the window.
- `concept-work-item-ranges`: one work item of chapter 7's forward under a window, its key tiles in their
  three ranges (`item_ranges`, the host form of `ch07_hopper._work_item`'s bounds), every pair seen or not.

And measurements, from data/ch09_variants.json (the `ch09-variants` suite):

- `ch09-speed`: each variant's TFLOP/s against what it should match (the front door's plain attention,
  a dense batch, FlexAttention with the same mask), with the bar it was set and whether it meets it.
"""

from __future__ import annotations

import plotly.graph_objects as go

from tutorial_kernels.ch07_hopper import band_offsets
from tutorial_kernels.ch09_variants import band, key_range
from tutorial_kernels.figures.concepts import (
    GRID, MASKED, NOTE, SKIPPED, UNMASKED, discrete_scale, hover, legend_entry, narrow_diagram, tile_edges, tile_span,
    tile_ticks)
from tutorial_kernels.figures.ratios import FAIL_FILL, PASS_FILL
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data
from tutorial_kernels.figures.style import SIZES, add_notes, concept_layout, measured_table

# (label, window_size, causal)
WINDOWS = [("causal", (-1, -1), True), ("causal, window 192", (191, -1), True),
           ("causal, window 64", (63, -1), True), ("±96, not causal", (96, 96), False), ("full", (-1, -1), False)]
WINDOW_STATES = ["all seen", "some hidden", "skipped"]


def window_tiles(n: int, window_size: tuple[int, int], causal: bool, block_m: int, block_n: int) -> list[list[str]]:
    """Per (query tile, key tile): "skipped" outside the kernel's visited range, else "all seen" when every
    (query, key) pair of the tile is inside the band, "some hidden" when the mask hides some."""
    left, right = band(window_size, causal)
    rows = []
    for start_m in range(0, n, block_m):
        lo, hi = key_range(start_m, n, n, left, right, block_m, block_n)
        row = []
        for start_n in range(0, n, block_n):
            if start_n + block_n <= lo or start_n >= hi:
                row.append("skipped")
                continue
            seen = [(left is None or j - i >= -left) and (right is None or j - i <= right)
                    for i in range(start_m, min(start_m + block_m, n)) for j in range(start_n, min(start_n + block_n, n))]
            row.append("all seen" if all(seen) else "some hidden")
        rows.append(row)
    return rows


@figure("concept-window-tiles")
def window_tile_map(n: int = 512, block_m: int = 64, block_n: int = 64) -> go.Figure:
    """The tiles of S for one sequence of n tokens under each window of WINDOWS (a menu), from the
    kernel's bounds; the title line counts the tiles computed."""
    fig = go.Figure()
    buttons = []
    tiles = (-(-n // block_m)) * (-(-n // block_n))
    for k, (label, window_size, causal) in enumerate(WINDOWS):
        states = window_tiles(n, window_size, causal, block_m, block_n)
        computed = sum(s != "skipped" for row in states for s in row)
        about = [[hover(f"Q tile {a} (queries {tile_span(sm, block_m, n)}) × K/V tile {b} "
                        f"(keys {tile_span(sn, block_n, n)}): "
                        + {"all seen": "computed; every query sees every key of it",
                           "some hidden": "computed; the mask hides the pairs outside the band",
                           "skipped": "never visited: no query of the tile sees a key of it"}[s])
                  for b, (sn, s) in enumerate(zip(range(0, n, block_n), row))]
                 for a, (sm, row) in enumerate(zip(range(0, n, block_m), states))]
        fig.add_trace(go.Heatmap(
            z=[[WINDOW_STATES.index(s) for s in row] for row in states], x=tile_edges(n, block_n),
            y=tile_edges(n, block_m),
            zmin=0, zmax=2, colorscale=discrete_scale([UNMASKED, MASKED, SKIPPED]), showscale=False, xgap=2, ygap=2,
            customdata=about, hovertemplate="%{customdata}<extra></extra>", visible=k == 0, name=label))
        visible = [False] * len(WINDOWS) + [True] * 3
        visible[k] = True
        buttons.append(dict(method="update", label=f"{label} ({computed}/{tiles} tiles)",
                            args=[{"visible": visible}]))
    for name, colour in zip(["computed, every pair seen", "computed, some pairs hidden", "never visited"],
                            [UNMASKED, MASKED, SKIPPED]):
        fig.add_trace(legend_entry(name, colour))
    fig.update_layout(plot_bgcolor=GRID, updatemenus=[dict(
        type="dropdown", direction="down", buttons=buttons, active=0, showactive=True, x=0, xanchor="left", y=1,
        yanchor="bottom", pad=dict(b=10), font=dict(size=NOTE))])
    add_notes(fig, f"One sequence of {n} tokens, {block_m} × {block_n} tiles; the menu picks the window. Drawn from "
                   "<code>ch09_variants.key_range</code>, the host form of the kernel's bounds: a program walks only "
                   "the key tiles of its band, so the work grows with the window, not with the sequence.")
    narrow_diagram(fig, ticks=True, **{"margin.l": 56})
    concept_layout(fig, "A sliding window: which tiles of S are computed", (
        f"A map of the {block_m} × {block_n} tiles of the score matrix of one {n}-token sequence, queries down and "
        "keys across, for a causal mask with and without a sliding window, a two-sided window and full attention. "
        "Tiles inside the band are computed, those the band's edge crosses are computed with some pairs masked, "
        "and tiles outside it are never visited; the menu says how many tiles each choice computes."),
        height=580, above=40)
    fig.update_xaxes(showticklabels=True, range=[0, n], tickvals=tile_ticks(n, block_n, 2),
                     title=dict(text="key j", font=dict(size=SIZES["axis_title"])))
    fig.update_yaxes(showticklabels=True, range=[n, 0], tickvals=tile_ticks(n, block_m),
                     title=dict(text="query i", font=dict(size=SIZES["axis_title"])))
    return fig


def item_ranges(first_row: int, n_q: int, n_k: int, window_size: tuple[int, int], causal: bool, block_m: int = 128,
                block_n: int = 128) -> tuple[int, int, int, int]:
    """(lo, left_full, n_full, n_tiles) of chapter 7's work item whose rows start at `first_row`, as its
    `_work_item` computes them with WINDOW (a test checks the two agree): key tiles [lo, n_tiles) visited,
    [left_full, n_full) unmasked."""
    bounded, diag, edge = band_offsets(causal, window_size, n_q, n_k)
    if bounded:
        n_full = max(min(first_row + diag + 1, n_k), 0) // block_n
        n_tiles = -(-max(min(first_row + block_m + diag, n_k), 0) // block_n)
    else:
        n_full, n_tiles = n_k // block_n, -(-n_k // block_n)
    lo = min(max(first_row + edge, 0) // block_n, n_tiles)
    left_full = min(max(-(-max(first_row + block_m - 1 + edge, 0) // block_n), lo), n_tiles)
    return lo, left_full, n_full, n_tiles


RANGE_STATES = ["not visited", "masked tile: pair hidden", "masked tile: pair seen", "unmasked tile"]


@figure("concept-work-item-ranges")
def work_item_ranges(n: int = 2048, first_row: int = 1024, window: int = 512, cell: int = 8) -> go.Figure:
    """One 128-row work item of chapter 7's forward, causal with a window of `window` keys, over every key of
    an n-token sequence: its tiles in the three ranges, each pair seen or hidden; `cell` × `cell` pairs per square."""
    block = 128
    lo, left_full, n_full, n_tiles = item_ranges(first_row, n, n, (window - 1, -1), True, block, block)
    rows, keys = range(first_row, first_row + block, cell), range(0, n, cell)

    def state(i: int, j: int) -> int:
        tile = j // block
        if not lo <= tile < n_tiles:
            return 0
        if left_full <= tile < n_full:
            return 3
        seen = first_row <= i and j <= i and j >= i - (window - 1)  # the square's first pair stands for it
        return 2 if seen else 1

    z = [[state(i, j) for j in keys] for i in rows]
    about = [[hover(f"queries {i}–{i + cell - 1}, keys {j}–{j + cell - 1} (key tile {j // block}): "
                    + RANGE_STATES[state(i, j)]) for j in keys] for i in rows]
    fig = go.Figure(go.Heatmap(
        z=z, x0=cell / 2, dx=cell, y0=first_row + cell / 2, dy=cell, zmin=0, zmax=3,
        colorscale=discrete_scale([SKIPPED, "#fdd0a2", MASKED, UNMASKED]), showscale=False, xgap=0, ygap=0,
        customdata=about, hovertemplate="%{customdata}<extra></extra>", name="pairs"))
    for t in range(n // block + 1):  # tile boundaries
        fig.add_shape(type="line", x0=t * block, x1=t * block, y0=first_row, y1=first_row + block,
                      line=dict(color=GRID if not lo <= t <= n_tiles else "#5a6372", width=1))
    labels = [(lo, f"lo = {lo}"), (left_full, f"left_full = {left_full}"), (n_full, f"n_full = {n_full}"),
              (n_tiles, f"n_tiles = {n_tiles}")]
    for k, (t, text) in enumerate(labels):
        fig.add_annotation(x=t * block, y=first_row - 4 - 14 * (k % 2), text=text, showarrow=False, yanchor="bottom",
                           font=dict(size=NOTE))
    for name, colour in zip(RANGE_STATES, [SKIPPED, "#fdd0a2", MASKED, UNMASKED]):
        fig.add_trace(legend_entry(name, colour))
    add_notes(fig, f"Rows {first_row}–{first_row + block - 1} of a causal {n}-token sequence with a window of {window} "
                   f"keys, 128-key tiles. Tiles [lo, left_full) cross the window's left edge and [n_full, n_tiles) "
                   f"the diagonal: both masked; [left_full, n_full) every row sees whole: no mask. Computed by "
                   f"<code>item_ranges</code>, the host form of <code>_work_item</code>'s bounds.")
    narrow_diagram(fig, ticks=True, **{"margin.l": 56})
    concept_layout(fig, "One work item under a window: the key tiles it visits, in three ranges", (
        f"The {block} query rows of one work item of chapter 7's forward against all {n} keys, causal with a "
        f"{window}-key window. Key tiles {lo} to {n_tiles - 1} are visited: tile {lo} crosses the window's left edge "
        f"and is masked, tiles {left_full} to {n_full - 1} are seen whole by every row and run unmasked, and tile "
        f"{n_full} holds the diagonal and is masked; the other tiles are never loaded."), height=380, above=40)
    fig.update_xaxes(showticklabels=True, range=[0, n], tickvals=list(range(0, n + 1, 2 * block)),
                     title=dict(text="key j", font=dict(size=SIZES["axis_title"])))
    fig.update_yaxes(showticklabels=True, range=[first_row + block, first_row - 36],
                     tickvals=[first_row, first_row + block // 2, first_row + block],
                     title=dict(text="query i", font=dict(size=SIZES["axis_title"])))
    return fig


def _cell(rows: list[dict], key: str, **match) -> dict | None:
    """The measured row of provider `key` whose fields equal `match` (None when there is none)."""
    found = [r for r in rows if r["provider_key"] == key and r["status"] == "ok"
             and all(r.get(k) == v for k, v in match.items())]
    return found[0] if found else None


def speed_comparisons(data: dict) -> list[tuple]:
    """(what, ours, against, theirs, bar) for every comparison the speed table shows: ours and theirs
    are rows of `data`, bar the least ratio ours ÷ theirs (TFLOP/s) the variant was set."""
    rows = data["results"]
    out = []
    for mode, word in (("fwd", "forward"), ("bwd", "backward")):
        long = dict(n=32768, batch=1, causal=True, softcap=0.0, alibi=False, mode=mode)
        window = _cell(rows, "ch09-front-door", window=4096, **long)
        out += [(f"window 4096, N = 32k, {word}", window, "plain causal, the front door",
                 _cell(rows, "ch09-front-door", window=-1, **long), 0.9),
                (f"window 4096, N = 32k, {word}", window, "FlexAttention, the same window",
                 _cell(rows, "ch09-flex", window=4096, **long), 1.2)]
        packed = _cell(rows, "ch09-front-door-varlen", mode=mode)
        out += [(f"packed, 64k tokens, {word}", packed, "dense 16 × 4096, the front door",
                 _cell(rows, "ch09-front-door", n=4096, batch=16, causal=True, mode=mode), 0.95),
                (f"packed, 64k tokens, {word}", packed, "FlexAttention, a document mask",
                 _cell(rows, "ch09-flex-document", mode=mode), 1.2)]
    for mode, word in (("fwd", "forward"), ("bwd", "backward")):
        for n in (4096, 16384):
            dense = dict(n=n, causal=False, window=-1, mode=mode)
            plain = _cell(rows, "ch09-front-door", softcap=0.0, alibi=False, **dense)
            for label, variant in (("softcap 50", dict(softcap=50.0, alibi=False)),
                                   ("ALiBi", dict(softcap=0.0, alibi=True))):
                out.append((f"{label}, N = {n // 1024}k, {word}", _cell(rows, "ch09-front-door", **variant, **dense),
                            "plain, the front door", plain, 1 / 1.1))
    return [c for c in out if c[1] is not None and c[3] is not None]


@figure("ch09-speed")
def speed_table(data: dict | None = None):
    """Chapter 9's speed table: each variant against its baseline, the ratio and the bar."""
    data = data or load_data("ch09_variants")
    header = ["variant", "TFLOP/s", "against", "its TFLOP/s", "ratio", "bar"]
    columns: list[list] = [[] for _ in header]
    fills: list[list] = [[] for _ in header]
    for what, ours, against, theirs, bar in speed_comparisons(data):
        ratio = ours["tflops"] / theirs["tflops"]
        for column, value in zip(columns, [what, f"{ours['tflops']:.0f}", against, f"{theirs['tflops']:.0f}",
                                           f"{ratio:.2f}×", f"≥ {bar:.2f}×"]):
            column.append(value)
        for i, fill in enumerate(fills):
            fill.append((PASS_FILL if ratio >= bar else FAIL_FILL) if i == 4 else None)
    wide = []
    for r in data["results"]:
        if r["provider_key"] == "ch09-front-door-wide" and r["status"] == "ok":
            base = _cell(data["results"], "ch09-front-door", **{k: r[k] for k in
                                                                ("n", "batch", "causal", "window", "softcap", "alibi",
                                                                 "mode")})
            if base is not None:
                wide.append(r["tflops"] / base["tflops"])
    notes = ["TFLOP/s counts the (query, key) pairs each mask keeps: a window of 4096 keys keeps about a quarter "
             "of causal attention's pairs at 32k, and a packed batch only each sequence's own. bfloat16, "
             "head_dim 128, 16 heads; the packed batch's lengths are drawn from [128, 8192] with a fixed random state. "
             "The softcap and ALiBi rows compare equal work, so their bar, 0.91×, is at most 10 % more time.",
             "Green: the ratio meets its bar; red: it does not. The plain front door and the window run chapter 7's "
             "Hopper kernels (the window with its bounds, as this chapter shows); softcap, ALiBi and the packed batch "
             "run this chapter's Triton kernels, in one readable configuration."]
    if wide:
        notes.append(f"The same forward in 128 × 64 tiles (8 warps, 3 stages) instead of 64 × 64: "
                     f"{min(wide):.2f}× to {max(wide):.2f}× the TFLOP/s of the default, so larger tiles "
                     "alone do not close the gap.")
    return measured_table(header, columns, data, "Chapter 9's variants: TFLOP/s against their bars",
                          fills=fills, align=["left", "right", "left", "right", "right", "right"], notes=notes)
