"""Concept diagrams: pictures of ideas, not measurements (`concept-…` figures, chapters 1 and 3 to 6).

Each is drawn through `style.concept_layout` (no axes, alt text) and, where the package has a rule
for what it shows, from that rule: the causal tile maps from `tiling.key_stages` / `query_stages`
(the host forms of the kernels' causal bounds), the byte counts from `instruments.hbm_model`, the
GPU's sizes from chapter 1's device record. Every box and tile says what it is on hover.

- `concept-gpu-hierarchy` (chapter 1): an SM, its sub-partitions, the 132 SMs, L2 and HBM;
- `concept-score-tiles` (chapter 3): S in tiles, one program sweeping the K/V tiles (a slider);
- `concept-fa1-vs-fa2-dataflow` (chapters 4 and 5): what crosses between HBM and the chip, per step;
- `concept-split-k-vs-split-q` (chapter 5): how the 4 warps of a program share a tile;
- `concept-causal-tile-map` (chapter 5): unmasked, masked and skipped tiles for a few (N_q, N_k);
- `concept-backward-traversals` (chapter 6): the dK/dV and dQ kernels' walks over S (a slider).
Chapter 9's tile map, drawn with the same tiles, is in `ch09`.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data
from tutorial_kernels.figures.runs import file_lines
from tutorial_kernels.figures.style import SIZES, WAVE_COLOURS, add_notes, concept_layout, set_narrow, set_provenance, wrap
from tutorial_kernels.instruments.hbm_model import flash_v1_hbm_bytes, flash_v2_hbm_bytes
from tutorial_kernels.tiling import key_stages, query_stages

HOVER_WIDTH = 44  # characters a hover line may show and still fit a phone's figure (~358 px at 12 px)
NOTE = SIZES["note"]
INK, EDGE, GRID = "#2a3f5f", "#5a6372", "#d9dde3"
UNMASKED, MASKED, SKIPPED, OTHER = "#3182bd", "#fd8d3c", "#ffffff", "#eef1f5"  # the causal stages' colours
WARP_COLOURS = WAVE_COLOURS[:4]
SHARED_GREY = "#c8ccd4"  # what all warps of a program share


def hover(text: str) -> str:
    """Hover text wrapped to fit a phone."""
    return wrap(text, HOVER_WIDTH)


def discrete_scale(colours: list[str]) -> list[list]:
    """A colorscale that maps z = 0, 1, …, len − 1 (zmin 0, zmax len − 1) to one flat colour each."""
    n = len(colours)
    out = []
    for k, c in enumerate(colours):
        low, high = max((k - 0.5) / (n - 1), 0), min((k + 0.5) / (n - 1), 1)
        out += [[low, c], [high, c]]
    return out


def legend_entry(name: str, colour: str) -> go.Scatter:
    """A legend-only entry (no point drawn): a square of `colour`."""
    return go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                      marker=dict(symbol="square", size=12, color=colour, line=dict(color=EDGE, width=1)))


class Diagram:
    """Boxes, labels and arrows in axis units, each box with a hover region. Regions are added
    innermost first when the figure is finished, so that hovering an inner box names it, not its
    parent."""

    def __init__(self, fig: go.Figure):
        self.fig = fig
        self.regions: list[tuple[int, go.Scatter, dict]] = []

    def box(self, x0, y0, x1, y1, label: str | None, about: str, *, fill: str, depth: int = 0, line: str = EDGE,
            corner: bool = False, size: int = NOTE, **where) -> None:
        """A rectangle with `label` in its middle (or its top-left `corner`) and `about` on hover."""
        self.fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, fillcolor=fill, layer="below",
                           line=dict(color=line, width=1.2), **where)
        if label:
            place = (dict(x=x0 + 1, y=y1 - 1, xanchor="left", yanchor="top") if corner
                     else dict(x=(x0 + x1) / 2, y=(y0 + y1) / 2))
            self.fig.add_annotation(text=label, showarrow=False, font=dict(size=size, color=INK), **place, **where)
        region = go.Scatter(x=[x0, x1, x1, x0, x0], y=[y0, y0, y1, y1, y0], mode="lines", fill="toself",
                            fillcolor="rgba(0,0,0,0)", line=dict(width=0), hoveron="fills", hoverinfo="text",
                            text=hover(about), name=(label or about).split("<br>")[0], showlegend=False)
        self.regions.append((depth, region, where))

    def arrow(self, x0, y0, x1, y1, label: str | None = None, about: str | None = None, *, colour: str = INK,
              label_at: tuple[float, float] | None = None, **where) -> None:
        """An arrow from (x0, y0) to (x1, y1); `label` beside it (at `label_at`, else its middle),
        which says `about` on hover."""
        self.fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, text="", showarrow=True, arrowhead=2, arrowsize=1.2,
                                arrowwidth=1.8, arrowcolor=colour, **_axis_refs(where, self.fig), **where)
        if label:
            lx, ly = label_at or ((x0 + x1) / 2, (y0 + y1) / 2)
            self.fig.add_annotation(x=lx, y=ly, text=label, showarrow=False, bgcolor="white",
                                    font=dict(size=NOTE, color=colour), **where)
            if about:
                self.fig.add_trace(go.Scatter(x=[lx], y=[ly], mode="markers", marker=dict(size=28, opacity=0),
                                              hovertemplate=hover(about) + "<extra></extra>", showlegend=False,
                                              name=label.split("<br>")[0]), **where)

    def finish(self) -> go.Figure:
        for _, region, where in sorted(self.regions, key=lambda r: r[0]):
            self.fig.add_trace(region, **where)
        return self.fig


def _axis_refs(where: dict, fig: go.Figure) -> dict:
    """axref/ayref for an arrow in axis units (the tail in the same axes as the head)."""
    if not where:
        return dict(axref="x", ayref="y")
    index = (where["row"] - 1) * len(fig._grid_ref[0]) + where["col"] if fig._grid_ref else 1
    suffix = "" if index == 1 else str(index)
    return dict(axref=f"x{suffix}", ayref=f"y{suffix}")


def fixed_axes(fig: go.Figure, x=(0, 100), y=(0, 100)) -> None:
    fig.update_xaxes(range=list(x), fixedrange=True)
    fig.update_yaxes(range=list(y), fixedrange=True)


SIDE_MARGIN = dict(l=12, r=24)  # a diagram has no tick labels to make room for


def narrow_diagram(fig: go.Figure, ticks: bool = False, **more) -> None:
    """A diagram on a phone: thin side margins, and its panels stacked without the tick labels the
    generic narrow layout turns on (unless `ticks`)."""
    axes = [k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]
    hidden = {} if ticks else {f"{axis}.showticklabels": False for axis in axes}
    set_narrow(fig, **{"margin.l": 8, "margin.r": 8, **hidden, **more})


# --- chapter 1: the GPU --------------------------------------------------------------------------

@figure("concept-gpu-hierarchy")
def gpu_hierarchy(device: dict | None = None, reduction: dict | None = None) -> go.Figure:
    """The H100's memory hierarchy, from an SM's registers to HBM: chapter 1's device record and
    measured copy bandwidth, the whitepaper's sizes for what the driver does not report."""
    timelines = device or load_data("ch01_timelines")
    reduction = reduction or load_data("ch01_reduction")
    d = timelines["device"]
    sms, regs = d["sm_count"], d["registers_per_sm"]
    shared_kib = d["shared_memory_per_sm_bytes"] // 1024
    l2_mib = d["l2_cache_bytes"] / 2**20
    hbm_gib = d["total_memory_bytes"] / 2**30
    clock_tb = d["hbm_bandwidth_from_clock_tb_per_s"]
    copy_tb = reduction["ceilings"]["copy_tb_per_s"]
    reg_kib = regs * 4 // 1024
    fig = go.Figure()
    dia = Diagram(fig)
    sm_fill, part_fill = "#e8f1fa", "#ffffff"
    dia.box(1, 52, 99, 99, "<b>One SM</b> (of " + str(sms) + ")", (
        f"A streaming multiprocessor: {sms} of them on the H100 SXM. Each runs whole thread blocks (Triton "
        f"programs); up to {d['warps_per_sm']} warps ({d['max_threads_per_sm']:,} threads) live on it at once."),
        fill=sm_fill, corner=True)
    gap = 1.5
    width = (95 - 3 * gap) / 4
    for p in range(4):
        x0 = 2.5 + p * (width + gap)
        x1 = x0 + width
        dia.box(x0, 68, x1, 93, None, (
            f"Sub-partition {p} of 4: a quarter of the SM, with its own warp scheduler, register file and "
            "tensor core. A warp stays on one sub-partition."), fill=part_fill, depth=1)
        dia.box(x0 + 1, 86, x1 - 1, 92, "scheduler", (
            f"Warp scheduler {p}: each clock it picks one of its resident warps that is ready and issues its "
            "next instruction; waiting warps hide each other's latency."), fill="#fdf3e1", depth=2)
        dia.box(x0 + 1, 77.5, x1 - 1, 85, f"{reg_kib // 4} KiB<br>registers", (
            f"Register file of sub-partition {p}: {regs // 4:,} 32-bit registers ({reg_kib // 4} KiB); the SM has "
            f"{regs:,} ({reg_kib} KiB), split among the threads that live on it. The fastest memory: a "
            "FlashAttention program keeps its O_i, m_i and ℓ_i accumulators here."), fill="#e5f5e0", depth=2)
        dia.box(x0 + 1, 69, x1 - 1, 76.5, "tensor<br>core", (
            f"Tensor core of sub-partition {p} (fourth generation): the unit behind tl.dot, a small matrix "
            "multiply per instruction; 4 per SM."), fill="#f2e6f7", depth=2)
    dia.box(2.5, 54, 97.5, 66, f"shared memory / L1: 256 KiB<br>(up to {shared_kib} KiB as shared memory)", (
        f"One 256 KiB store per SM, split between L1 cache and shared memory; up to {shared_kib} KiB can be shared "
        "memory, which the threads of a block share. Triton stages tiles of K and V here for tl.dot."),
        fill="#fff7d6", depth=1)
    # the SMs: one small square each, the one drawn above highlighted
    per_row = 33
    rows = -(-sms // per_row)
    z = [[1 if r == 0 and c == 0 else 0 if r * per_row + c < sms else None for c in range(per_row)] for r in range(rows)]
    top, row_h = 46, 2.9
    text = [[f"SM {r * per_row + c}" for c in range(per_row)] for r in range(rows)]
    fig.add_trace(go.Heatmap(
        z=z, text=text, x0=2.5 + 95 / per_row / 2, dx=95 / per_row, y0=top - row_h / 2, dy=-row_h, zmin=0, zmax=1,
        colorscale=[[0, "#9ecae1"], [1, "#08519c"]], showscale=False, xgap=2, ygap=2,
        hovertemplate=hover(f"%{{text}} of {sms}: each SM is built as the one drawn above; the L2 cache "
                            "and HBM below are shared by all of them.") + "<extra></extra>", name="SMs"))
    bottom = top - rows * row_h
    fig.add_annotation(x=97.5, y=bottom - 0.6, xanchor="right", yanchor="top", text=f"<b>{sms} SMs</b>, all alike",
                       showarrow=False, font=dict(size=NOTE, color=INK))
    fig.add_shape(type="line", x0=2.5, y0=46, x1=1, y1=52, line=dict(color=EDGE, width=1, dash="dot"))
    fig.add_shape(type="line", x0=2.5 + 95 / per_row, y0=46, x1=99, y1=52, line=dict(color=EDGE, width=1, dash="dot"))
    dia.box(2.5, 17, 97.5, 27, f"<b>L2 cache</b>: {l2_mib:.0f} MiB, shared by all SMs", (
        f"The L2 cache ({l2_mib:.0f} MiB, as the driver reports it): every load from HBM passes through it; "
        "programs that read the same K and V tiles at about the same time share them here."), fill="#e6f0e0")
    dia.arrow(30, bottom - 0.3, 30, 27.3, None)
    dia.arrow(30, 27.3, 30, bottom - 0.3, None)
    dia.box(2.5, 1, 97.5, 9, f"<b>HBM3</b>: 80 GB", (
        f"HBM3, the GPU's main memory: 80 GB on the datasheet (the driver reports {hbm_gib:.1f} GiB usable). "
        "Every tensor lives here; a kernel's time is often the bytes it moves here divided by the bandwidth."),
        fill="#fde0dd")
    dia.arrow(30, 9.3, 30, 16.7, None)
    dia.arrow(30, 16.7, 30, 9.3, None)
    dia.arrow(30, 13, 30, 13, f"{clock_tb:.2f} TB/s peak · {copy_tb:.2f} TB/s measured copy", (
        f"Between HBM and L2: {clock_tb:.2f} TB/s from the memory clock × bus width (the datasheet's "
        f"3.35 TB/s); a device-to-device copy measured {copy_tb:.2f} TB/s on this H100 (chapter 1's run)."),
        label_at=(62, 13))
    fixed_axes(fig)
    fig.update_layout(showlegend=False)
    dia.finish()
    set_provenance(fig, file_lines(timelines, "sizes") + file_lines(reduction, "copy bandwidth"))
    add_notes(fig, "Sizes and bandwidths from NVIDIA's H100 Tensor Core GPU Architecture whitepaper and the H100 "
                   "SXM datasheet (80 GB HBM3, 3.35 TB/s, 50 MiB L2, 256 KiB of L1 and shared memory per SM); "
                   "the SM count, registers, shared memory and L2 as the CUDA driver reports them, and the "
                   "copy bandwidth measured, in chapter 1's runs.")
    narrow_diagram(fig, height=760)
    return concept_layout(fig, "Where data lives on an H100: from registers to HBM", (
        f"A diagram of the H100's hierarchy. One SM, of {sms}, has four sub-partitions, each with a warp "
        f"scheduler, {reg_kib // 4} KiB of registers and a tensor core, and a 256 KiB store shared by L1 and "
        f"shared memory (up to {shared_kib} KiB shared). All SMs share a {l2_mib:.0f} MiB L2 cache, which sits "
        f"in front of 80 GB of HBM3, read at {clock_tb:.2f} TB/s peak, {copy_tb:.2f} TB/s measured."),
        height=720, margin=SIDE_MARGIN)


# --- chapter 3: S in tiles -----------------------------------------------------------------------

SCORE_STATES = ["another program's row", "to come", "folded into O_i, then dropped", "on chip now"]
SCORE_COLOURS = ["#eef1f5", "#c6dbef", "#ffffff", "#08519c"]


def score_tile_states(tiles_q: int, tiles_k: int, program: int, step: int) -> list[list[int]]:
    """The state (an index of SCORE_STATES) of every tile (i, j) of S while `program` is at `step`."""
    def state(i: int, j: int) -> int:
        if i != program:
            return 0
        return 3 if j == step else 2 if j < step else 1
    return [[state(i, j) for j in range(tiles_k)] for i in range(tiles_q)]


def _score_frame(tiles_q: int, tiles_k: int, program: int, step: int) -> dict:
    z = score_tile_states(tiles_q, tiles_k, program, step)
    about = []
    for i, row in enumerate(z):
        line = []
        for j, s in enumerate(row):
            tile = f"S<sub>{i},{j}</sub> = Q<sub>{i}</sub> K<sub>{j}</sub>ᵀ / √d"
            line.append(hover({
                3: f"{tile}, computed by program {i} at step {j}: the one tile of S that exists now, in registers.",
                2: f"{tile}, computed by program {i} at step {j}, folded into O<sub>{i}</sub>, m<sub>{i}</sub>, "
                   f"ℓ<sub>{i}</sub> and dropped: never stored.",
                1: f"{tile}: program {i} computes it at step {j}, after step {step}.",
                0: f"{tile}: computed by program {i} at step {j}, on another SM at the same time; never stored.",
            }[s]))
            # (the sub/sup tags count as no width: wrap measures visible characters)
        about.append(line)
    text = [[f"S<sub>{i},{j}</sub>" if s == 3 else "" for j, s in enumerate(row)] for i, row in enumerate(z)]
    kz = [[3 if j == step else 1 for j in range(tiles_k)]]
    kabout = [[hover(f"K<sub>{j}</sub>, V<sub>{j}</sub>: " + ("loaded on chip for this step." if j == step else
                     "in HBM; loaded at step " + str(j) + ".")) for j in range(tiles_k)]]
    return dict(z=[z, kz], customdata=[about, kabout], text=[text, [[f"K<sub>{step}</sub>" if j == step else "" for j in range(tiles_k)]]])


@figure("concept-score-tiles")
def score_tiles(n_q: int = 768, n_k: int = 1024, block_m: int = 128, block_n: int = 128, program: int = 2,
                step: int = 3) -> go.Figure:
    """The N_q × N_k scores in BLOCK_M × BLOCK_N tiles; program `program` owns Q tile i and sweeps
    the K/V tiles j (the slider); only the tile at the current step exists."""
    tq, tk = -(-n_q // block_m), -(-n_k // block_n)
    first = _score_frame(tq, tk, program, step)
    scale = discrete_scale(SCORE_COLOURS)
    fig = go.Figure()
    fig.add_trace(go.Heatmap(z=first["z"][0], customdata=first["customdata"][0], text=first["text"][0],
                             texttemplate="%{text}", textfont=dict(size=NOTE), zmin=0, zmax=3, colorscale=scale,
                             showscale=False, xgap=2, ygap=2, hovertemplate="%{customdata}<extra></extra>",
                             name="tiles of S"))
    fig.add_trace(go.Heatmap(z=first["z"][1], customdata=first["customdata"][1], text=first["text"][1],
                             texttemplate="%{text}", textfont=dict(size=NOTE), y=[-1.3], zmin=0, zmax=3,
                             colorscale=scale, showscale=False, xgap=2, ygap=2,
                             hovertemplate="%{customdata}<extra></extra>", name="K/V tiles"))
    qz = [[3] if i == program else [0] for i in range(tq)]
    qabout = [[hover(f"Q<sub>{i}</sub>: " + (f"program {program}'s query tile, loaded once and kept on chip."
                                              if i == program else f"program {i}'s query tile."))] for i in range(tq)]
    fig.add_trace(go.Heatmap(z=qz, customdata=qabout, x=[-1.3], text=[[f"Q<sub>{i}</sub>" if i == program else ""]
                                                                      for i in range(tq)],
                             texttemplate="%{text}", textfont=dict(size=NOTE), zmin=0, zmax=3, colorscale=scale,
                             showscale=False, xgap=2, ygap=2, hovertemplate="%{customdata}<extra></extra>",
                             name="Q tiles"))
    for state, colour in zip(SCORE_STATES, SCORE_COLOURS):
        fig.add_trace(legend_entry(state.replace("O_i", "O<sub>i</sub>"), colour))
    steps = []
    for j in range(tk):
        frame = _score_frame(tq, tk, program, j)
        steps.append(dict(method="restyle", label=str(j), args=[frame, [0, 1]]))
    fig.update_layout(sliders=[dict(active=step, steps=steps, x=0.02, len=0.96, y=0, yanchor="top",
                                    pad=dict(t=8, b=4), font=dict(size=NOTE),
                                    currentvalue=dict(prefix="step j = ", font=dict(size=NOTE)))],
                      plot_bgcolor="white")
    fig.update_xaxes(range=[-1.9, tk - 0.5], fixedrange=True)
    fig.update_yaxes(range=[tq - 0.5, -1.9], fixedrange=True)
    fig.add_shape(type="rect", x0=-0.5, x1=tk - 0.5, y0=-0.5, y1=tq - 0.5, fillcolor=GRID, line=dict(width=0),
                  layer="below")  # shows through the gaps between tiles: a dropped tile is an empty box
    add_notes(fig, f"N<sub>q</sub> = {n_q}, N<sub>k</sub> = {n_k}, {block_m} × {block_n} tiles: {tq} × {tk}. "
                   "Move the slider to step through program i's loop; every row band belongs to one program, "
                   "and all of them run at once, each on its own SM.")
    narrow_diagram(fig, ticks=True, **{"margin.b": 170, "+height": 60})
    concept_layout(fig, f"S in tiles: program {program} sweeps the K/V tiles", (
        f"The {n_q} × {n_k} score matrix S drawn as a grid of {tq} × {tk} tiles of {block_m} × {block_n}. "
        f"Program {program} owns row band {program} (its Q tile) and computes one tile S_ij = Q_i K_jᵀ / √d per step "
        "j, loading K_j and V_j; the tiles before the current step were folded into the output and dropped, so "
        "only one tile of S exists at a time. A slider steps j."), height=580, above=38)
    fig.update_layout(margin=dict(b=110, l=12, r=24))
    fig.update_xaxes(side="top", showticklabels=True, tickvals=list(range(tk)), title=dict(
        text=f"K/V tile j ({block_n} keys each)", font=dict(size=SIZES["axis_title"])))
    fig.update_yaxes(showticklabels=True, tickvals=list(range(tq)), title=dict(
        text=f"Q tile i ({block_m} queries each)", font=dict(size=SIZES["axis_title"])))
    return fig


# --- chapters 4 and 5: what crosses between HBM and the chip -------------------------------------

def dataflow_bytes(n: int = 4096, head_dim: int = 64, element_size: int = 2, block: int = 128) -> dict[str, int]:
    """Bytes one (batch, head) moves in HBM under each schedule, by the IO model (`hbm_model`)."""
    v1 = flash_v1_hbm_bytes(1, 1, n, n, head_dim, element_size, block, block)
    v2 = flash_v2_hbm_bytes(1, 1, n, n, head_dim, element_size, block, block)
    return {"flash-v1": sum(v1.values()), "flash-v2": sum(v2.values())}


@figure("concept-fa1-vs-fa2-dataflow")
def fa1_vs_fa2_dataflow(n: int = 4096, head_dim: int = 64, block: int = 128) -> go.Figure:
    """FlashAttention-1 (K/V outside: O_i, ℓ_i, m_i go back to HBM every step) against
    FlashAttention-2 (Q outside: they stay on chip and are written once)."""
    moved = dataflow_bytes(n, head_dim, 2, block)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.06, subplot_titles=(
        "FlashAttention-1: K/V tile j outside,<br>Q tile i inside", "FlashAttention-2: Q tile i outside,<br>K/V tile j inside"))
    dia = Diagram(fig)
    hbm_fill, chip_fill = "#fde0dd", "#e8f1fa"
    tile = f"{block} × {head_dim}"
    for col, v1 in ((1, True), (2, False)):
        at = dict(row=1, col=col)
        name = "FlashAttention-1" if v1 else "FlashAttention-2"
        dia.box(1, 62, 99, 99, "<b>HBM</b>", (
            f"HBM: where the tensors live. For one head of N = {n}, d = {head_dim}, fp16, {block} × {block} tiles, "
            f"the IO model counts {moved['flash-v1' if v1 else 'flash-v2'] / 1e6:.0f} MB moved by {name}."),
            fill=hbm_fill, corner=True, **at)
        dia.box(1, 1, 99, 38, "<b>on chip</b>", (
            "Registers and shared memory of the SM that runs the program: S_ij and P_ij are computed here and "
            "never leave."), fill=chip_fill, corner=True, **at)
        hbm = [("Q", "Q: the queries, N × d."), ("K, V", "K and V: the keys and values, N × d each."),
               ("O, ℓ, m<br>(fp32)" if v1 else "O, lse", "O in float32 with the running ℓ and m per row: "
                "FlashAttention-1's accumulators live here between steps." if v1 else
                "O (in the input's dtype) and one log-sum-exp per row, written once at the end.")]
        chip = [("Q<sub>i</sub>", f"Q_i, one {tile} tile of queries."),
                ("K<sub>j</sub>, V<sub>j</sub>", f"K_j and V_j, two {tile} tiles."),
                ("O<sub>i</sub>, ℓ<sub>i</sub>, m<sub>i</sub>", "O_i (float32) and the running sum ℓ_i and max m_i of "
                 "the online softmax " + ("for this step only: read from HBM, updated, written back." if v1 else
                                         "in registers for the program's whole life."))]
        for k, ((h_label, h_about), (c_label, c_about)) in enumerate(zip(hbm, chip)):
            x0 = 4 + k * 32
            dia.box(x0, 67, x0 + 28, 86, h_label, h_about, fill="white", depth=1, **at)
            dia.box(x0, 10, x0 + 28, 28, c_label, c_about, fill="white", depth=1, **at)
        per_step_q = f"{block} · {head_dim} · 2 B = {block * head_dim * 2 // 1024} KiB"
        if v1:
            dia.arrow(18, 66.5, 18, 28.5, "every<br>step", (
                f"Q_i is read on every step of the inner loop: {per_step_q} each time, N/BLOCK_M times per program."),
                **at)
            dia.arrow(50, 66.5, 50, 28.5, "once", "K_j and V_j are read once: the program keeps them while it "
                      "sweeps every Q tile.", **at)
            dia.arrow(77, 66.5, 77, 28.5, None, colour="#b2182b", **at)
            dia.arrow(89, 28.5, 89, 66.5, None, colour="#b2182b", **at)
            dia.arrow(83, 47, 83, 47, "read +<br>write,<br>every<br>step", (
                f"O_i, ℓ_i and m_i are read and written back on every step: {block} · ({head_dim} + 2) · 4 B "
                f"= {block * (head_dim + 2) * 4 // 1024} KiB each way, N/BLOCK_M times per program."),
                colour="#b2182b", label_at=(83, 47), **at)
        else:
            dia.arrow(18, 66.5, 18, 28.5, "once", f"Q_i is read once ({per_step_q}) and stays on chip.", **at)
            dia.arrow(50, 66.5, 50, 28.5, "every<br>step", (
                f"K_j and V_j are read on every step: 2 · {per_step_q} each time; programs of one head read the "
                "same tiles, which the L2 cache can share."), **at)
            dia.arrow(83, 28.5, 83, 66.5, "write<br>once", (
                f"O_i and the log-sum-exp are written once, at the end: {block} · ({head_dim} · 2 + 4) B."), **at)
        fixed_axes(fig, (0, 100), (0, 100))
    add_notes(fig, f"For one head of N = {n}, d = {head_dim}, fp16 and {block} × {block} tiles, the IO model "
                   f"(<code>hbm_model</code>, chapters 4 and 5) counts {moved['flash-v1'] / 1e6:.0f} MB for "
                   f"FlashAttention-1 and {moved['flash-v2'] / 1e6:.0f} MB for FlashAttention-2, if no cache helps.")
    narrow_diagram(fig, **{"+height": 160})
    fig.update_layout(showlegend=False)
    dia.finish()
    return concept_layout(fig, "What crosses between HBM and the chip, per program", (
        "Two panels, HBM above and the chip below. FlashAttention-1 keeps K_j and V_j on chip and sweeps the "
        "Q tiles: every step reads Q_i and reads and writes O_i, ℓ_i and m_i in HBM. FlashAttention-2 keeps "
        "Q_i on chip and sweeps the K/V tiles: O_i, ℓ_i and m_i stay in registers and are written once."),
        height=520, margin=SIDE_MARGIN)


# --- chapter 5: the warps of one program -----------------------------------------------------------

@figure("concept-split-k-vs-split-q")
def split_k_vs_split_q(num_warps: int = 4, block_m: int = 128, block_n: int = 64) -> go.Figure:
    """How the warps of one program share the work of S_ij = Q_i K_jᵀ: split-K (FlashAttention-1's
    layout) against split-Q (FlashAttention-2's)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.06, subplot_titles=(
        "split-K (FlashAttention-1): each warp<br>takes a slice of K<sub>j</sub>, V<sub>j</sub>",
        "split-Q (FlashAttention-2): each warp<br>takes a slice of Q<sub>i</sub>"))
    colours = [*WARP_COLOURS[:num_warps], SHARED_GREY]
    scale = discrete_scale(colours)
    shared = num_warps
    rows_per, keys_per = block_m // num_warps, block_n // num_warps
    dia = Diagram(fig)
    y_edges = [20 + 52 * r / num_warps for r in range(num_warps + 1)]  # cell edges; row 0 at the top
    x_cols = [32 + 64 * c / num_warps for c in range(num_warps + 1)]
    for col, split_k in ((1, True), (2, False)):
        at = dict(row=1, col=col)
        owner = (lambda r, c: c) if split_k else (lambda r, c: r)
        sz = [[owner(r, c) for c in range(num_warps)] for r in range(num_warps)][::-1]
        sabout = [[hover(f"S_ij rows {r * rows_per}–{(r + 1) * rows_per - 1} × keys {c * keys_per}–"
                         f"{(c + 1) * keys_per - 1}: computed by warp {owner(r, c)}.") for c in range(num_warps)]
                  for r in range(num_warps)][::-1]
        stext = [[f"warp {owner(r, c)}" for c in range(num_warps)] for r in range(num_warps)][::-1]
        fig.add_trace(go.Heatmap(z=sz, x=x_cols, y=y_edges, customdata=sabout, text=stext,
                                 texttemplate="%{text}", textfont=dict(size=NOTE), zmin=0, zmax=shared,
                                 colorscale=scale, showscale=False, xgap=2, ygap=2, name="S tile",
                                 hovertemplate="%{customdata}<extra></extra>"), **at)
        qz = [[shared if split_k else r] for r in range(num_warps)][::-1]
        qabout = [[hover(f"Q_i rows {r * rows_per}–{(r + 1) * rows_per - 1}: " + (
            "read by all warps (each multiplies every query row)." if split_k else f"warp {r}'s rows, its alone."))]
            for r in range(num_warps)][::-1]
        fig.add_trace(go.Heatmap(z=qz, x=[6, 24], y=y_edges, customdata=qabout, zmin=0, zmax=shared,
                                 colorscale=scale, showscale=False, xgap=2, ygap=2, name="Q tile",
                                 hovertemplate="%{customdata}<extra></extra>"), **at)
        kz = [[c if split_k else shared for c in range(num_warps)]]
        kabout = [[hover(f"K_j, V_j keys {c * keys_per}–{(c + 1) * keys_per - 1}: " + (
            f"warp {c}'s slice." if split_k else "read by all warps."))] for c in range(num_warps)]
        fig.add_trace(go.Heatmap(z=kz, x=x_cols, y=[78, 90], customdata=[[a[0] for a in kabout]], zmin=0, zmax=shared,
                                 colorscale=scale, showscale=False, xgap=2, ygap=2, name="K tile",
                                 hovertemplate="%{customdata}<extra></extra>"), **at)
        fig.add_annotation(x=15, y=72.5, yanchor="bottom", text="Q<sub>i</sub>", showarrow=False, **at)
        fig.add_annotation(x=64, y=90.5, yanchor="bottom", text="K<sub>j</sub>ᵀ, V<sub>j</sub>", showarrow=False, **at)
        if split_k:
            dia.box(2, 1, 98, 15, "partial O<sub>i</sub> per warp → shared<br>memory, barrier, sum", (
                f"Each warp holds a partial O_i ({block_m} × d) over its {keys_per} keys, and its own row max and sum: "
                "the warps write them to shared memory, wait at a barrier, and one combines them. Every step."),
                fill="#fde0dd", **at)
        else:
            dia.box(2, 1, 98, 15, "each warp writes its own rows<br>of O<sub>i</sub>: no exchange", (
                f"Each warp owns {rows_per} rows of S, P and O_i and sees all of K_j and V_j: the softmax's row max "
                "and sum stay inside the warp; no shared memory, no barrier between the warps."),
                fill="#e5f5e0", **at)
        fixed_axes(fig)
    for w in range(num_warps):
        fig.add_trace(legend_entry(f"warp {w}", WARP_COLOURS[w]))
    fig.add_trace(legend_entry(f"all {num_warps} warps", SHARED_GREY))
    dia.finish()
    add_notes(fig, f"One program of {num_warps} warps, a {block_m} × {block_n} tile of S. Triton picks the layout itself; "
                   "FlashAttention-2's kernels (and ours, chapter 5) get split-Q because a program owns one Q tile.")
    narrow_diagram(fig, **{"+height": 120})
    return concept_layout(fig, f"The {num_warps} warps of one program: split-K or split-Q", (
        f"Two panels, the {num_warps} warps of one program coloured. Split-K (FlashAttention-1): each warp "
        "multiplies all query rows by its own slice of K_j and V_j, so the warps must sum their partial outputs "
        "through shared memory after a barrier. Split-Q (FlashAttention-2): each warp owns a quarter of the query "
        "rows and sees all of K_j and V_j, so the warps never communicate."), height=520, margin=SIDE_MARGIN)


# --- chapters 5 and 6: causal tiles, from the kernels' rule ------------------------------------------

STAGE_NAMES = ["skipped", "masked", "unmasked"]  # z of a tile map: 0, 1, 2
STAGE_COLOURS = [SKIPPED, MASKED, UNMASKED]


def causal_tile_stages(n_q: int, n_k: int, block_m: int, block_n: int) -> list[list[str]]:
    """'unmasked', 'masked' or 'skipped' for every tile (Q tile i, K/V tile j) of a causal S, as the
    forward (and chapter 6's dQ kernel) loops over it: `tiling.key_stages` of each query tile."""
    out = []
    for start_m in range(0, n_q, block_m):
        unmasked_end, masked_end = key_stages(start_m, n_q, n_k, block_m, block_n)
        out.append(["unmasked" if start_n < unmasked_end else "masked" if start_n < masked_end else "skipped"
                    for start_n in range(0, n_k, block_n)])
    return out


def dkdv_visits(start_n: int, n_q: int, n_k: int, block_m: int, block_n: int) -> list[tuple[int, bool]]:
    """(start_m, masked) of the query tiles chapter 6's dK/dV program at key tile `start_n` visits, in
    order: the masked ones (crossing the diagonal) first, then the unmasked ones (`tiling.query_stages`)."""
    masked_start, unmasked_start = query_stages(start_n, n_q, n_k, block_n, block_m)
    return ([(m, True) for m in range(masked_start, min(unmasked_start, n_q), block_m)]
            + [(m, False) for m in range(unmasked_start, n_q, block_m)])


def dq_visits(start_m: int, n_q: int, n_k: int, block_m: int, block_n: int) -> list[tuple[int, bool]]:
    """(start_n, masked) of the key tiles chapter 6's dQ program at query tile `start_m` visits, in
    order: the unmasked ones first, then the masked ones (`tiling.key_stages`, as the forward)."""
    unmasked_end, masked_end = key_stages(start_m, n_q, n_k, block_m, block_n)
    return [(n, False) for n in range(0, unmasked_end, block_n)] + [(n, True) for n in range(unmasked_end, masked_end, block_n)]


def tile_edges(n: int, block: int) -> list[int]:
    return [*range(0, n, block), n]


def tile_ticks(n: int, block: int, every: int = 1) -> list[int]:
    """Tick values at every `every`-th tile edge and at n, none crowding n (a ragged last tile)."""
    return [t for t in range(0, n, block * every) if n - t >= block * every * 0.6] + [n]


def tile_span(start: int, block: int, n: int) -> str:
    return f"{start}–{min(start + block, n) - 1}"


def _why(stage: str, start_m: int, start_n: int, n_q: int, n_k: int, block_m: int, block_n: int) -> str:
    """Why a tile is in its stage, in words (bottom-right alignment: query i sees key j ≤ i + δ)."""
    delta = n_k - n_q
    first, last = start_m, min(start_m + block_m, n_q) - 1
    end = start_n + block_n - 1
    if stage == "unmasked":
        return f"its first query, {first}, already sees its last key, {end} (j ≤ i + {delta}): no mask needed."
    if stage == "skipped":
        sees = f"sees no key" if last + delta < 0 else f"sees keys up to {last + delta}"
        return f"its last query, {last}, {sees}: no query sees any of its keys, and the loop never gets here."
    if first + delta >= min(end, n_k - 1):
        return f"it runs past the last key ({n_k - 1}): the mask hides the padding keys."
    return (f"the diagonal crosses it: query {first} sees keys up to {first + delta}, query {last} up to "
            f"{min(last + delta, n_k - 1)}; the mask is applied.")


def tile_map_trace(n_q: int, n_k: int, block_m: int, block_n: int, *, stages=None, text=None, about=None,
                   **trace) -> go.Heatmap:
    """A heatmap of the tiles of S in element units (a ragged last tile drawn narrower), coloured by stage."""
    stages = stages or causal_tile_stages(n_q, n_k, block_m, block_n)
    z = [[STAGE_NAMES.index(s) for s in row] for row in stages]
    return go.Heatmap(z=z, x=tile_edges(n_k, block_n), y=tile_edges(n_q, block_m), zmin=0, zmax=2,
                      colorscale=discrete_scale(STAGE_COLOURS), showscale=False, xgap=2, ygap=2, customdata=about,
                      text=text, texttemplate="%{text}" if text else None, textfont=dict(size=NOTE),
                      hovertemplate="%{customdata}<extra></extra>", **trace)


CAUSAL_PAIRS = [(256, 256), (192, 320), (320, 192), (200, 300), (300, 200)]


@figure("concept-causal-tile-map")
def causal_tile_map(pairs: list[tuple[int, int]] = CAUSAL_PAIRS, block_m: int = 64, block_n: int = 32) -> go.Figure:
    """The tiles of a causal S for a few (N_q, N_k), as `tiling.key_stages` sorts them: stage 1
    (no mask), stage 2 (masked), or never visited. Buttons pick the pair."""
    fig = go.Figure()
    buttons = []
    per_pair = 2
    for k, (n_q, n_k) in enumerate(pairs):
        stages = causal_tile_stages(n_q, n_k, block_m, block_n)
        about = [[hover(f"Q tile {a} (queries {tile_span(sm, block_m, n_q)}) × K/V tile {b} (keys {tile_span(sn, block_n, n_k)}): "
                        + {"unmasked": "stage 1, ", "masked": "stage 2, ", "skipped": "never visited: "}[s]
                        + _why(s, sm, sn, n_q, n_k, block_m, block_n))
                  for b, (sn, s) in enumerate(zip(range(0, n_k, block_n), row))]
                 for a, (sm, row) in enumerate(zip(range(0, n_q, block_m), stages))]
        text = [[{"unmasked": "1", "masked": "2", "skipped": ""}[s] for s in row] for row in stages]
        fig.add_trace(tile_map_trace(n_q, n_k, block_m, block_n, stages=stages, text=text, about=about,
                                     visible=k == 0, name=f"{n_q} × {n_k}"))
        delta = n_k - n_q
        start = (delta, 0) if delta >= 0 else (0, -delta)
        fig.add_trace(go.Scatter(x=[start[0], n_k], y=[start[1], n_q], mode="lines", visible=k == 0,
                                 line=dict(color=INK, width=2, dash="dash"), name="diagonal", showlegend=False,
                                 hovertemplate=hover(f"The diagonal j = i + (N_k − N_q) = i + {delta}: query i sees "
                                                     "key j when j ≤ i + N_k − N_q (bottom-right aligned).")
                                 + "<extra></extra>"))
        visible = [False] * (per_pair * len(pairs)) + [True] * 3
        visible[per_pair * k:per_pair * k + per_pair] = [True] * per_pair
        buttons.append(dict(method="update", label=f"N<sub>q</sub> × N<sub>k</sub> = {n_q} × {n_k}", args=[
            {"visible": visible},
            {"xaxis.range": [0, n_k], "yaxis.range": [n_q, 0], "xaxis.tickvals": tile_ticks(n_k, block_n, 2),
             "yaxis.tickvals": tile_ticks(n_q, block_m)}]))
    for name, colour in zip(["stage 1: no mask", "stage 2: masked", "never visited"], [UNMASKED, MASKED, SKIPPED]):
        fig.add_trace(legend_entry(name, colour))
    n_q, n_k = pairs[0]
    fig.update_layout(plot_bgcolor=GRID, updatemenus=[dict(
        type="dropdown", direction="down", buttons=buttons, active=0, showactive=True, x=0, xanchor="left", y=1,
        yanchor="bottom", pad=dict(b=10), font=dict(size=NOTE))])
    add_notes(fig, f"{block_m} × {block_n} tiles (BLOCK_M × BLOCK_N); the buttons pick N<sub>q</sub> × N<sub>k</sub>. "
                   "Causal attention here is bottom-right aligned: the last query sees every key, so with "
                   "N<sub>q</sub> &gt; N<sub>k</sub> the first queries see none. Computed with "
                   "<code>tiling.key_stages</code>, the host form of the kernel's bounds.")
    narrow_diagram(fig, ticks=True, **{"margin.l": 56})
    concept_layout(fig, "Causal attention: which tiles of S run masked", (
        f"A map of the {block_m} × {block_n} tiles of the score matrix for causal attention, queries down and keys "
        "across. Tiles wholly under the diagonal run in stage 1 without a mask, tiles the diagonal crosses (or that "
        "run past the last key) run in stage 2 with the mask, and tiles wholly above it are never visited. Buttons "
        "switch between square and non-square lengths, some not multiples of the tile."), height=580, above=40)
    fig.update_xaxes(showticklabels=True, range=[0, n_k], tickvals=tile_ticks(n_k, block_n, 2),
                     title=dict(text="key j", font=dict(size=SIZES["axis_title"])))
    fig.update_yaxes(showticklabels=True, range=[n_q, 0], tickvals=tile_ticks(n_q, block_m),
                     title=dict(text="query i", font=dict(size=SIZES["axis_title"])))
    return fig


@figure("concept-backward-traversals")
def backward_traversals(n: int = 256, block_m: int = 32, block_n: int = 64) -> go.Figure:
    """Chapter 6's two backward kernels over a causal S: each dK/dV program walks down its column band
    of K/V tile j, each dQ program along its row band of Q tile i; numbers are visit order."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "dK/dV kernel: program j owns K/V tile j,<br>walks the Q tiles i (down)",
        "dQ kernel: program i owns Q tile i,<br>walks the K/V tiles j (across)"))
    tq, tk = -(-n // block_m), -(-n // block_n)
    for col, kernel in ((1, "dkdv"), (2, "dq")):
        stages = [["skipped"] * tk for _ in range(tq)]
        step = [[""] * tk for _ in range(tq)]
        if kernel == "dkdv":
            for b, start_n in enumerate(range(0, n, block_n)):
                for s, (start_m, masked) in enumerate(dkdv_visits(start_n, n, n, block_m, block_n), start=1):
                    stages[start_m // block_m][b] = "masked" if masked else "unmasked"
                    step[start_m // block_m][b] = str(s)
        else:
            for a, start_m in enumerate(range(0, n, block_m)):
                for s, (start_n, masked) in enumerate(dq_visits(start_m, n, n, block_m, block_n), start=1):
                    stages[a][start_n // block_n] = "masked" if masked else "unmasked"
                    step[a][start_n // block_n] = str(s)
        about = []
        for a in range(tq):
            line = []
            for b in range(tk):
                tile = f"Q tile {a} × K/V tile {b}"
                if not step[a][b]:
                    line.append(hover(f"{tile}: above the diagonal, skipped by both kernels (P = 0 there)."))
                    continue
                mask = "masked (the diagonal crosses it)" if stages[a][b] == "masked" else "no mask"
                if kernel == "dkdv":
                    line.append(hover(f"{tile}: step {step[a][b]} of dK/dV program {b}, {mask}. It recomputes P_ij "
                                      f"and adds P_ijᵀ dO_i to dV_{b} and τ dS_ijᵀ Q_i to dK_{b}, on chip; both are "
                                      "written once, after the last step."))
                else:
                    line.append(hover(f"{tile}: step {step[a][b]} of dQ program {a}, {mask}. It recomputes P_ij "
                                      f"and dS_ij and adds τ dS_ij K_j to dQ_{a}, on chip; dQ_{a} is written once."))
            about.append(line)
        fig.add_trace(tile_map_trace(n, n, block_m, block_n, stages=stages, text=step, about=about,
                                     name="dK/dV steps" if kernel == "dkdv" else "dQ steps"), row=1, col=col)
        fig.update_xaxes(range=[0, n], tickvals=tile_ticks(n, block_n), row=1, col=col)
        fig.update_yaxes(range=[n, 0], tickvals=tile_ticks(n, block_m, 2), row=1, col=col)
    for name, colour in zip(["no mask", "masked", "skipped"], [UNMASKED, MASKED, SKIPPED]):
        fig.add_trace(legend_entry(name, colour))
    fig.update_layout(plot_bgcolor=GRID)
    add_notes(fig, f"Causal, N = {n}, BLOCK_M = {block_m}, BLOCK_N = {block_n}; a number is the step at which the tile's "
                   "program visits it. The dK/dV program starts with the masked tiles (<code>tiling.query_stages</code>), "
                   "the dQ program ends with them (<code>tiling.key_stages</code>), as chapter 6's kernels do.")
    narrow_diagram(fig, ticks=True, **{"margin.l": 48, "+height": 80})
    concept_layout(fig, "The backward's two walks over S", (
        "Two maps of the tiles of a causal score matrix. In the dK/dV kernel each program owns one column band "
        "(a K/V tile) and walks down the query tiles, the masked diagonal tiles first, keeping dK_j and dV_j on chip. "
        "In the dQ kernel each program owns one row band (a Q tile) and walks across the key tiles, the masked ones "
        "last. Tiles above the diagonal are skipped by both."), height=560)
    fig.update_xaxes(showticklabels=True, title=dict(text="key j", font=dict(size=SIZES["axis_title"])))
    fig.update_yaxes(showticklabels=True, title=dict(text="query i", font=dict(size=SIZES["axis_title"])), col=1)
    fig.update_yaxes(showticklabels=True, col=2)
    return fig
