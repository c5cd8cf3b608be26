"""Chapter 8's figures (docs/chapters/08-inference.md): decoding against a KV cache.

Pictures of ideas, drawn from the kernel module's rules (`choose_num_splits`, the launcher's tile
sizes and its rounding of the splits to whole key tiles, the block table's address rule):

- `concept-decode-grid`: one decode step of one sequence on 132 SMs, with chapter 5's grid, with
  grouped-query packing, and with packing and split-KV: which SMs work, how many rows of a
  program's query tile are real, and how many of the keys each program walks;
- `concept-paged-cache`: a block table and the pool of blocks it points into, one key's address traced.

And measurements, from data/ch08_decode.json (the `decode` suite):

- `ch08-decode-bandwidth`: KV bandwidth against cached keys, one panel per batch size, under the copy ceiling;
- `ch08-decode-table`: every cell of the suite summed up per (H_kv, d, lengths): ours against torch's
  kernels, paged against contiguous, the share of the copy ceiling, and the host's time per call.

And from data/generate.json (`python -m tutorial_kernels.integrations.generate`):

- `ch08-generate`: generate() of a Llama-3-8B-shaped model, decode tokens/s ours against sdpa, with the checks.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.ch08_decode import choose_num_splits, gpu_decode_tiles, resident_programs
from tutorial_kernels.figures.concepts import (
    EDGE, INK, NOTE, SIDE_MARGIN, Diagram, discrete_scale, fixed_axes, hover, legend_entry, narrow_diagram)
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data, ok_rows, provider_keys, provider_label
from tutorial_kernels.figures.style import (WAVE_COLOURS, add_notes, concept_layout, measured_layout, measured_table,
                                            ordered_providers, provider_colour, provider_line, reference_line, shade)

SMS = 132  # an H100 SXM
CH05_BLOCK_M = 128  # chapter 5's largest query tile
IDLE, ONE, TWO, THREE, USED = "#eef1f5", "#c6dbef", "#6baed6", "#08519c", "#fd8d3c"


def decode_splits(batch: int, kv_heads: int, n_q: int, group: int, capacity: int, sms: int = SMS,
                  head_dim: int = 128) -> tuple[int, int]:
    """(splits that hold keys, keys per split) for a sequence that fills the cache: `choose_num_splits` with
    the GPU's tile and its resident programs, then the sequence's keys cut into that many ranges of whole
    key tiles, as the kernel cuts them."""
    tiles = gpu_decode_tiles(n_q, group, head_dim)
    block_n = tiles["BLOCK_N"]
    row_tiles = math.ceil(n_q * group / tiles["BLOCK_M"])
    wanted = choose_num_splits(batch, kv_heads, row_tiles, capacity, sms, block_n,
                               resident_programs(tiles, head_dim, 2))
    per_split = math.ceil(math.ceil(capacity / wanted) / block_n) * block_n
    return max(1, math.ceil(capacity / per_split)), per_split


def _strip(fig: go.Figure, used: list[bool], abouts: list[str], y0: float, y1: float, name: str, at: dict) -> None:
    """One row of cells across the panel (x 0 … 100): USED where `used`, IDLE elsewhere."""
    n = len(used)
    fig.add_trace(go.Heatmap(
        z=[[1 if u else 0 for u in used]], x0=50 / n, dx=100 / n, y0=(y0 + y1) / 2, dy=y1 - y0,
        customdata=[[hover(a) for a in abouts]], zmin=0, zmax=1, colorscale=[[0, IDLE], [1, USED]],
        showscale=False, xgap=1 if n <= 40 else 0, ygap=0, name=name, hovertemplate="%{customdata}<extra></extra>"),
        **at)


@figure("concept-decode-grid")
def decode_grid(heads: int = 32, kv_heads: int = 8, n_k: int = 32768, sms: int = SMS, head_dim: int = 128) -> go.Figure:
    """One decode step (one sequence, one new token) on `sms` SMs: chapter 5's grid of one program per
    query head, grouped-query packing (one per KV head), and packing with split-KV."""
    group = heads // kv_heads
    splits, per_split = decode_splits(1, kv_heads, 1, group, n_k, sms, head_dim)
    tiles = gpu_decode_tiles(1, group, head_dim)
    block_m = tiles["BLOCK_M"]
    ranges = splits  # the keys strip: one cell per split's range
    schemes = [
        ("chapter 5's grid:", heads, CH05_BLOCK_M, 1, False),
        ("grouped-query packing:", kv_heads, block_m, group, False),
        ("packing + split-KV:", kv_heads * splits, block_m, group, True),
    ]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.05,
                        subplot_titles=[f"{title}<br>{programs} programs" for title, programs, *_ in schemes])
    cols = 12
    rows = math.ceil(sms / cols)
    top, bottom = 100, 46
    row_h = (top - bottom) / rows
    for col, (title, programs, tile_rows, rows_used, split) in enumerate(schemes, start=1):
        at = dict(row=1, col=col)

        def program_about(p: int) -> str:
            if not split and rows_used == 1:
                return f"query head {p} (its KV head {p // group}): 1 row of {tile_rows}, all {n_k:,} keys"
            kv, s = (p % kv_heads, p // kv_heads) if split else (p, 0)
            keys = (f"keys {s * per_split:,}–{min((s + 1) * per_split, n_k) - 1:,}" if split else f"all {n_k:,} keys")
            return (f"KV head {kv}, query heads {kv * group}–{kv * group + group - 1}: "
                    f"{rows_used} rows of {tile_rows}, {keys}")

        z, about = [], []
        for r in range(rows):
            z_row, about_row = [], []
            for c in range(cols):
                sm = r * cols + c
                if sm >= sms:
                    z_row.append(None)
                    about_row.append("")
                    continue
                mine = list(range(sm, programs, sms))  # program p on SM p mod sms: the scheduler's first guess
                z_row.append(min(len(mine), 3))
                if not mine:
                    about_row.append(hover(f"SM {sm}: idle; this launch has no program for it."))
                else:
                    what = "; ".join(program_about(p) for p in mine)
                    about_row.append(hover(f"SM {sm}: {len(mine)} program{'s' * (len(mine) > 1)}. {what}."))
            z.append(z_row)
            about.append(about_row)
        fig.add_trace(go.Heatmap(
            z=z, customdata=about, x0=100 / cols / 2, dx=100 / cols, y0=top - row_h / 2, dy=-row_h, zmin=0, zmax=3,
            colorscale=discrete_scale([IDLE, ONE, TWO, THREE]), showscale=False, xgap=2, ygap=2, name=f"SMs, {title}",
            hovertemplate="%{customdata}<extra></extra>"), **at)
        busy = min(programs, sms)
        fig.add_annotation(x=50, y=bottom - 3, text=f"{busy} of {sms} SMs busy", showarrow=False,
                           font=dict(size=NOTE, color=INK), **at)

        # one program's query tile: which of its rows are real (query × head) and which are padding
        used = [r < rows_used for r in range(tile_rows)]
        if rows_used == 1:
            abouts = ["row 0: query head 0's one query, the only real row"] + [
                f"row {r}: padding; the tile multiplies zeros here" for r in range(1, tile_rows)]
        else:
            abouts = [f"row {r}: query head {r} (row r → head r mod {group})" if r < rows_used
                      else f"row {r}: padding; the tile multiplies zeros here" for r in range(tile_rows)]
        fig.add_annotation(x=50, y=31.5, text=f"a program's tile: {rows_used} of {tile_rows} rows real",
                           showarrow=False, font=dict(size=NOTE, color=INK), **at)
        _strip(fig, used, abouts, 22, 27, f"tile rows, {title}", at)

        # the keys one program walks, in the split's ranges
        walked = [True] * ranges if not split else [s == 0 for s in range(ranges)]
        key_abouts = []
        for s in range(ranges):
            span = f"keys {s * per_split:,}–{min((s + 1) * per_split, n_k) - 1:,}"
            if not split:
                key_abouts.append(f"{span}: walked by this program, as are all {n_k:,}")
            else:
                key_abouts.append(f"{span}: this program's split" if s == 0 else f"{span}: split {s}, another program's")
        keys_text = f"all {n_k:,}" if not split else f"{per_split:,} of {n_k:,}"
        fig.add_annotation(x=50, y=12.5, text=f"keys it walks: {keys_text}", showarrow=False,
                           font=dict(size=NOTE, color=INK), **at)
        _strip(fig, walked, key_abouts, 3, 8, f"keys, {title}", at)
        fixed_axes(fig)
    fig.add_trace(legend_entry("SM with 1 program", ONE))
    fig.add_trace(legend_entry("SM with 2 programs", TWO))
    fig.add_trace(legend_entry("SM with 3 programs", THREE))
    fig.add_trace(legend_entry("real row, keys walked", USED))
    fig.add_trace(legend_entry("idle, padding, not walked", IDLE))
    add_notes(fig, f"One sequence, {heads} query heads on {kv_heads} KV heads (G = {group}), one new query, {n_k:,} "
                   f"cached keys, d = {head_dim}, {sms} SMs. Split-KV as the launcher chooses: choose_num_splits, "
                   f"rounded to whole key tiles of {tiles['BLOCK_N']}, gives {splits} splits of {per_split:,} keys. "
                   f"Program p is drawn on SM p mod {sms}; the hardware's placement is less regular, the count of busy "
                   f"SMs is the point.")
    narrow_diagram(fig, **{"+height": 60})
    return concept_layout(fig, "One decode step on 132 SMs: whose programs, how many rows, how many keys", (
        f"Three panels of {sms} SMs for one new token of one sequence with {heads} query heads on {kv_heads} key/value "
        f"heads and {n_k:,} cached keys. Chapter 5's grid runs {heads} programs, each using 1 row of a "
        f"{CH05_BLOCK_M}-row tile and walking every key. Grouped-query packing runs {kv_heads} programs of {group} "
        f"real rows, each reading its KV head once, still walking every key. Adding split-KV runs "
        f"{kv_heads * splits} programs, each walking {per_split:,} keys, so every SM works."),
        height=600, margin=SIDE_MARGIN)


# --- the paged cache ---------------------------------------------------------------------------------

PAGED_LENGTHS = (40, 9, 50)  # keys per sequence
PAGED_TABLE = ((7, 2, 10), (4,), (0, 9, 5, 8))  # each sequence's blocks in the pool, in order
PAGED_POOL = 12


@figure("concept-paged-cache")
def paged_cache(lengths: tuple[int, ...] = PAGED_LENGTHS, table: tuple[tuple[int, ...], ...] = PAGED_TABLE,
                pool: int = PAGED_POOL, block_size: int = 16, sequence: int = 2, key: int = 49) -> go.Figure:
    """A block table (one row per sequence) and the pool of blocks it points into; key `key` of
    `sequence` traced to its block and row."""
    width = max(len(t) for t in table)
    owner = {block: (b, i) for b, blocks in enumerate(table) for i, block in enumerate(blocks)}
    colours = WAVE_COLOURS[:len(table)]
    fig = go.Figure()
    dia = Diagram(fig)

    # the block table: x 9 … 42, one row per sequence (its labels left of it)
    tx0, tx1, ty1 = 9, 42, 84
    cell_w, cell_h = (tx1 - tx0) / width, 14
    fig.add_annotation(x=(tx0 + tx1) / 2, y=ty1 + 3, yanchor="bottom", text="block_table (B × blocks)",
                       showarrow=False, font=dict(size=NOTE, color=INK))
    for b, blocks in enumerate(table):
        y1 = ty1 - b * cell_h
        fig.add_annotation(x=tx0 - 0.5, y=y1 - cell_h / 2, xanchor="right", text=f"b={b}", showarrow=False,
                           font=dict(size=NOTE, color=INK))
        for i in range(width):
            x0 = tx0 + i * cell_w
            if i < len(blocks):
                first, last = i * block_size, min((i + 1) * block_size, lengths[b]) - 1
                dia.box(x0, y1 - cell_h, x0 + cell_w, y1, str(blocks[i]), (
                    f"block_table[{b}, {i}] = {blocks[i]}: sequence {b}'s keys {first}–{last} are in block "
                    f"{blocks[i]} of the pool, rows 0–{last - first}."), fill=shade(colours[b], 0.55))
            else:
                dia.box(x0, y1 - cell_h, x0 + cell_w, y1, "·", (
                    f"block_table[{b}, {i}]: unused. Sequence {b} has {lengths[b]} keys, "
                    f"{len(blocks)} block{'s' * (len(blocks) > 1)}; the kernel never reads this entry."), fill="#ffffff")

    # the pool: x 52 … 98, blocks in rows of four
    per_row = 4
    px0, px1, py1 = 52, 98, 84
    bw = (px1 - px0) / per_row
    bh = 14
    fig.add_annotation(x=(px0 + px1) / 2, y=py1 + 3, yanchor="bottom", text="the pool: k_cache[block]",
                       showarrow=False, font=dict(size=NOTE, color=INK))
    centres = {}
    for block in range(pool):
        r, c = divmod(block, per_row)
        x0, y1 = px0 + c * bw, py1 - r * bh
        centres[block] = (x0 + bw / 2, y1 - bh / 2)
        if block in owner:
            b, i = owner[block]
            filled = min(block_size, lengths[b] - i * block_size)
            first = i * block_size
            dia.box(x0 + 0.4, y1 - bh + 0.4, x0 + bw - 0.4, y1 - 0.4, str(block), (
                f"Block {block}: sequence {b}'s keys {first}–{first + filled - 1} in rows 0–{filled - 1}"
                + (f"; rows {filled}–{block_size - 1} wait for its next keys." if filled < block_size else
                   f", all {block_size} rows full.")), fill=shade(colours[b], 0.55))
            # how full: a bar along the block's bottom edge
            fig.add_shape(type="rect", x0=x0 + 0.8, x1=x0 + 0.8 + (bw - 1.6) * filled / block_size, y0=y1 - bh + 0.8,
                          y1=y1 - bh + 3, fillcolor=colours[b], line=dict(width=0), layer="above")
        else:
            dia.box(x0 + 0.4, y1 - bh + 0.4, x0 + bw - 0.4, y1 - 0.4, str(block), (
                f"Block {block}: free. The next sequence to need a block takes it, wherever it lies."), fill="#ffffff")

    # one key traced: table entry → block → row
    i, row = divmod(key, block_size)
    block = table[sequence][i]
    cx, cy = tx0 + (i + 0.5) * cell_w, ty1 - (sequence + 0.5) * cell_h
    bx, by = centres[block]
    trace_colour = "#d62728"
    for x0, y0, x1, y1 in ((cx - cell_w / 2, cy - cell_h / 2, cx + cell_w / 2, cy + cell_h / 2),
                           (bx - bw / 2 + 0.4, by - bh / 2 + 0.4, bx + bw / 2 - 0.4, by + bh / 2 - 0.4)):
        fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, line=dict(color=trace_colour, width=2.5), layer="above")
    dia.arrow(cx + cell_w / 2, cy, bx - bw / 2 + 0.4, by, colour=trace_colour)
    dia.box(2, 2, 98, 24, (f"key {key} of sequence {sequence}: block_table[{sequence}, {key} // {block_size}] = {block},"
                           f"<br>row {key} mod {block_size} = {row} of block {block}"), (
        f"The kernel's address rule: key j of sequence b is row j mod block_size of block block_table[b, j // "
        f"block_size]. Here j = {key}, b = {sequence}, block_size = {block_size}: entry {i} of the row, block {block}, "
        f"row {row}."), fill="#fdf3e1")
    for b in range(len(table)):
        fig.add_trace(legend_entry(f"sequence {b}: {lengths[b]} keys", colours[b]))
    fixed_axes(fig)
    dia.finish()
    add_notes(fig, f"Blocks of {block_size} tokens. The bar along a block's bottom shows how many of its rows hold "
                   "keys: only a sequence's last block is partly filled, so a sequence wastes less than one block. "
                   "In k_cache (num_blocks, H_kv, block_size, d) every KV head has its own rows in each block.")
    narrow_diagram(fig)
    return concept_layout(fig, "A paged KV cache: a block table and a pool of blocks", (
        f"On the left a block table with one row per sequence ({', '.join(str(n) for n in lengths)} keys), each "
        f"entry the number of a block in the pool; on the right a pool of {pool} blocks of {block_size} tokens, "
        f"coloured by the sequence that owns them, {pool - len(owner)} free, in no particular order. An arrow "
        f"traces key {key} of sequence {sequence}: entry {key // block_size} of its row names block {block}, where "
        f"the key is row {row}."), height=460, margin=SIDE_MARGIN)


DECODE_BATCHES = (1, 8, 64)


def _kib(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 else str(n)


@figure("ch08-decode-bandwidth")
def decode_bandwidth(data: dict | None = None, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
                     dtype: str = "bfloat16") -> go.Figure:
    """GB/s of KV cache read per decode step against the cached keys per sequence, one panel per batch
    size (equal lengths), every provider of the `decode` suite, under the run's copy bandwidth."""
    data = data or load_data("ch08_decode")
    cell = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, varying_lengths=False)
    fig = make_subplots(rows=1, cols=len(DECODE_BATCHES), shared_yaxes=True,
                        subplot_titles=[f"B = {b}" for b in DECODE_BATCHES], horizontal_spacing=0.03)
    for col, batch in enumerate(DECODE_BATCHES, start=1):
        for key in ordered_providers(provider_keys(data)):
            rows = sorted(ok_rows(data, provider_key=key, batch=batch, **cell), key=lambda r: r["n"])
            if not rows:
                continue
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in rows], y=[r["gb_per_s"] for r in rows], mode="lines+markers",
                name=provider_label(data, key), legendgroup=key, showlegend=col == 1, line=provider_line(key),
                marker=dict(color=provider_colour(key)),
                hovertemplate="%{fullData.name}<br>B = " + str(batch) + ", n = %{x:,}: %{y:,.0f} GB/s<extra></extra>",
            ), row=1, col=col)
    copy_gb = data["ceilings"]["copy_tb_per_s"] * 1000
    for col in range(1, len(DECODE_BATCHES) + 1):
        reference_line(fig, copy_gb, f"device copy, same run: {copy_gb:,.0f} GB/s" if col == 1 else None,
                       position="top left", row=1, col=col)
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(title="keys per sequence", type="log", tickvals=lengths, ticktext=[_kib(n) for n in lengths])
    fig.update_yaxes(title="GB/s of K and V read / GPU time", col=1, rangemode="tozero")
    add_notes(fig, f"One decode step: H = {heads} query heads, H_kv = {kv_heads}, d = {head_dim}, {dtype}, every "
                   "sequence the same length. GPU time alone (a CUDA graph's replay); the host's cost per call is "
                   "in the table below. Missing points: a cache larger than the suite's memory budget, or SDPA's "
                   "refusal.")
    return measured_layout(fig, data, "Decoding from a KV cache: bandwidth vs cached keys", height=560)


def _spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """'min – median' of `values` ('—' for none)."""
    if not values:
        return "—"
    ordered = sorted(values)
    return f"{fmt.format(ordered[0])} – {fmt.format(ordered[len(ordered) // 2])}"


@figure("ch08-decode-table")
def decode_table(data: dict | None = None):
    """The whole `decode` suite in one table: per (H_kv, d, equal or varying lengths), over the batch
    sizes, lengths and both dtypes, the least and the median of each ratio."""
    data = data or load_data("ch08_decode")
    copy_gb = data["ceilings"]["copy_tb_per_s"] * 1000
    cells: dict[tuple, dict] = {}
    for r in data["results"]:
        if r["status"] == "ok":
            key = (r["kv_heads"], r["head_dim"], r["varying_lengths"], r["dtype"], r["batch"], r["n"])
            cells.setdefault(key, {})[r["provider_key"]] = r
    groups: dict[tuple, list[dict]] = {}
    for key, cell in cells.items():
        if "kvcache" in cell:
            groups.setdefault(key[:3], []).append(cell)
    header = ["H_kv, d, lengths", "cells", "÷ torch flash", "÷ cuDNN", "paged 16 ÷ contiguous",
              "paged 256 ÷ contiguous", "÷ copy, n ≥ 8k", "host µs per call: ours, SDPA flash"]
    columns: list[list] = [[] for _ in header]
    for (kv_heads, head_dim, varying), group in sorted(groups.items()):
        ours = [c["kvcache"] for c in group]

        def ratio(other: str, group=group) -> list[float]:
            return [c["kvcache"]["gb_per_s"] / c[other]["gb_per_s"] for c in group if other in c]

        def paged(key: str, group=group) -> list[float]:
            return [c[key]["gb_per_s"] / c["kvcache"]["gb_per_s"] for c in group if key in c]

        long = [r["gb_per_s"] / copy_gb for r in ours if r["n"] >= 8192]
        host_sdpa = [c["sdpa-flash-gqa"]["host_us"] for c in group if "sdpa-flash-gqa" in c]
        row = [f"{kv_heads}, {head_dim}, {'varying' if varying else 'equal'}", len(group), _spread(ratio("sdpa-flash-gqa")),
               _spread(ratio("sdpa-cudnn-gqa")), _spread(paged("kvcache-paged16")), _spread(paged("kvcache-paged256")),
               _spread(long, "{:.0%}"),
               f"{_spread([r['host_us'] for r in ours], '{:.0f}')}; {_spread(host_sdpa, '{:.0f}')}"]
        for column, value in zip(columns, row):
            column.append(value)
    return measured_table(header, columns, data, "Decoding: every cell of the suite, least – median",
                          notes=["Each entry: the least and the median over the group's cells (B ∈ {1, 8, 64}, "
                                 "n ∈ {1k, 4k, 32k, 128k} where the caches fit, bfloat16 and float16). Ratios of "
                                 "KV bandwidth from GPU time (a CUDA graph's replay); above 1: ours faster. SDPA "
                                 "takes one length per call, so in the varying-length groups only B = 1 has torch "
                                 "ratios. The copy ceiling counts bytes read and written; a kernel that only reads "
                                 "can pass it. "
                                 "Host µs: the host's time per eager call (ours after its first call, whose "
                                 "launches later calls repeat)."])


@figure("ch08-generate")
def generate_table(data: dict | None = None):
    """Hugging Face generate() of a Llama-3-8B-shaped model, ours against sdpa, per (batch, cache):
    decode tokens/s, their ratio, and the checks (greedy tokens, teacher-forced logits)."""
    data = data or load_data("generate")
    rows = {(r["batch"], r["cache"], r["implementation"]): r for r in data["rows"] if r["status"] == "ok"}
    checks = {(c["batch"], c["cache"]): c for c in data["comparisons"]}
    header = ["batch, cache", "sdpa tokens/s", "ours tokens/s", "ours ÷ sdpa", "greedy tokens",
              "teacher-forced logits: ours, bound"]
    columns: list[list] = [[] for _ in header]
    for batch, cache in sorted({(b, c) for b, c, _ in rows}):
        sdpa, ours = rows.get((batch, cache, "sdpa")), rows.get((batch, cache, "tutorial_fa2"))
        if sdpa is None or ours is None:
            continue
        check = checks.get((batch, cache), {})
        if check.get("identical"):
            tokens = "identical"
        else:
            margins = check.get("reference_margin", [])
            tokens = f"differ at sdpa's near-ties (top-2 margin ≤ {max(margins):.2f})" if margins else "differ"
        row = [f"{batch}, {cache}", f"{sdpa['decode_tokens_per_s']:,.0f}", f"{ours['decode_tokens_per_s']:,.0f}",
               f"{ours['decode_tokens_per_s'] / sdpa['decode_tokens_per_s']:.2f}×", tokens,
               f"{ours['teacher_forced_error']:.3f}, {check.get('teacher_forced_bound', float('nan')):.3f}"
               + ("" if check.get("logits_within_bound") else " (outside)")]
        for column, value in zip(columns, row):
            column.append(value)
    model = data["model"]["label"]
    prompt, new = data["rows"][0]["prompt"], data["rows"][0]["new_tokens"]
    return measured_table(header, columns, data, f"generate() of a {model}-shaped model: decode tokens/s",
                          notes=[f"Random bfloat16 weights from the published configuration; a prompt of {prompt} "
                                 f"tokens, then {new} greedy tokens. Tokens/s: batch × (new − 1) over the time from "
                                 "the first new token to the last. 'ours': this package's attention functions "
                                 "(prefill through the front door, one-token steps through the decode kernel; "
                                 "with a static cache every call through the decode kernel). Teacher-forced: the "
                                 "largest relative error of a step's logits against sdpa without a cache, on the "
                                 "implementation's own tokens; the bound is twice sdpa's own error, at least 0.05."])


# --- how many splits: every count measured ---------------------------------------------------------

SPLIT_PANELS = ((1, 8, 32768), (8, 32, 32768), (64, 8, 32768))  # (B, H_kv, n) at d = 128, equal lengths
SPLIT_LAYOUTS = (("contiguous", "contiguous cache", "#08519c"), ("paged16", "paged, 16-token blocks", "#fd8d3c"))


def rule_splits(row: dict, layout: str, sms: int) -> int:
    """The number of splits the launcher chooses for a measured shape (`choose_num_splits` as the module
    has it now, with the GPU's tile and its resident programs)."""
    tiles = gpu_decode_tiles(1, row["heads"] // row["kv_heads"], row["head_dim"])
    return choose_num_splits(row["batch"], row["kv_heads"], 1, row["n"], sms, tiles["BLOCK_N"],
                             resident_programs(tiles, row["head_dim"], 2), busy_waves=3 if layout == "contiguous" else 4)


def split_choices(data: dict) -> list[dict]:
    """Per measured shape and layout: the fastest split count's GB/s, and the share of it that the rule's
    choice reads (the measured count nearest the rule's, on a log scale)."""
    shapes: dict = {}
    for r in data["results"]:
        if r["layout"]:
            key = (r["batch"], r["heads"], r["kv_heads"], r["n"], r["head_dim"], r["varying_lengths"], r["layout"])
            shapes.setdefault(key, {})[r["num_splits"]] = r
    out = []
    for key, by_splits in shapes.items():
        any_row = next(iter(by_splits.values()))
        wanted = rule_splits(any_row, key[-1], data["sm_count"])
        near = min(by_splits, key=lambda s: (abs(math.log(s / wanted)), s))
        best = max(by_splits.values(), key=lambda r: r["gb_per_s"])
        out.append(dict(shape=key, rule=wanted, measured_at=near, best_splits=best["num_splits"],
                        share=by_splits[near]["gb_per_s"] / best["gb_per_s"]))
    return out


@figure("ch08-splits")
def splits_measured(data: dict | None = None) -> go.Figure:
    """GB/s of one decode step against the number of splits, three shapes at d = 128, contiguous and
    16-token pages, the rule's choice marked; the notes sum up every shape."""
    data = data or load_data("ch08_splits")
    fig = make_subplots(rows=1, cols=len(SPLIT_PANELS), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"B = {b}, H_kv = {kv}, {_kib(n)} keys" for b, kv, n in SPLIT_PANELS])
    for col, (batch, kv_heads, n) in enumerate(SPLIT_PANELS, start=1):
        cell = dict(batch=batch, kv_heads=kv_heads, n=n, head_dim=128, varying_lengths=False)
        for layout, label, colour in SPLIT_LAYOUTS:
            rows = sorted((r for r in data["results"] if r["layout"] == layout
                           and all(r[k] == v for k, v in cell.items())), key=lambda r: r["num_splits"])
            if not rows:
                continue
            fig.add_trace(go.Scatter(
                x=[r["num_splits"] for r in rows], y=[r["gb_per_s"] for r in rows], mode="lines+markers",
                name=label, legendgroup=layout, showlegend=col == 1, line=dict(color=colour),
                hovertemplate=f"{label}<br>%{{x}} splits: %{{y:,.0f}} GB/s<extra></extra>"), row=1, col=col)
            wanted = rule_splits(rows[0], layout, data["sm_count"])
            at = min(rows, key=lambda r: (abs(math.log(r["num_splits"] / wanted)), r["num_splits"]))
            fig.add_trace(go.Scatter(
                x=[at["num_splits"]], y=[at["gb_per_s"]], mode="markers", name="the rule's choice",
                legendgroup="rule", showlegend=col == 1 and layout == "contiguous",
                marker=dict(symbol="star", size=14, color=colour, line=dict(color=INK, width=1)),
                hovertemplate=f"{label}: the rule picks {wanted} splits (measured at {at['num_splits']}): "
                              "%{y:,.0f} GB/s<extra></extra>"), row=1, col=col)
    fig.update_xaxes(title="splits", type="log", tickvals=[1, 2, 4, 8, 16, 32, 64, 128])
    fig.update_yaxes(title="GB/s of K and V read / GPU time", col=1, rangemode="tozero")
    choices = split_choices(data)
    summary = "; ".join(
        f"{label}: least {min(c['share'] for c in choices if c['shape'][-1] == layout):.2f}, median "
        f"{sorted(c['share'] for c in choices if c['shape'][-1] == layout)[len([c for c in choices if c['shape'][-1] == layout]) // 2]:.2f}"
        for layout, label in (("contiguous", "contiguous"), ("paged16", "16-token pages"), ("paged256", "256-token pages")))
    add_notes(fig, f"H = 32, d = 128, bfloat16, one new query per sequence; GPU time alone (a CUDA graph's replay). "
                   f"Over all {len(choices) // 3} measured shapes (B 1–64, H_kv 8 and 32, 4k–128k keys, d 64 and 128, "
                   f"equal and varying lengths), the rule's choice reads this share of the fastest split count's "
                   f"bandwidth: {summary}.")
    return measured_layout(fig, data, "How many splits: every count measured, the rule's choice starred", height=540)
