"""Chapter 5's figures (docs/chapters/05-flash-v2.md): FlashAttention-2 and its tuning.

Forward TFLOP/s per cell (data/ch05_fwd.json; `tflops_by_cell`, which chapter 6 reuses) and the
ratio table against torch's backends, the FA-1 / FA-2 timeline, HBM traffic, and the probes: Hopper
schedules and head dimensions 80 and 96 (the
Hopper kernel's figures are chapter 7's, `figures.ch07`).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.ch04 import hbm_vs_n
from tutorial_kernels.figures.ratios import chapter_ratio_table
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data, ok_rows, provider_keys, provider_label, run_ceiling
from tutorial_kernels.figures.style import (
    CEILING_LINE,
    TUNED_VARIANT_COLOURS,
    add_notes,
    measured_layout,
    ordered_providers,
    provider_colour,
    provider_line,
)
from tutorial_kernels.figures.tables import Table
from tutorial_kernels.figures.timelines import stacked_timelines


def tflops_by_cell(data: dict, title: str) -> go.Figure:
    """TFLOP/s vs N, one panel per (head_dim, causal), one button per dtype, with the matmul ceiling."""
    head_dims = sorted({r["head_dim"] for r in data["results"]})
    dtypes = sorted({r["dtype"] for r in data["results"]})
    panels = [(d, c) for d in head_dims for c in (False, True)]
    fig = make_subplots(rows=len(head_dims), cols=2, shared_yaxes=True, vertical_spacing=0.22 / len(head_dims),
                        subplot_titles=[f"d = {d}, {'causal' if c else 'not causal'}" for d, c in panels])
    trace_dtypes = []
    for dtype in dtypes:
        for i, (d, causal) in enumerate(panels):
            for key in ordered_providers(provider_keys(data)):
                rows = ok_rows(data, provider_key=key, head_dim=d, causal=causal, dtype=dtype)
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in rows], y=[r["tflops"] for r in rows], mode="lines+markers",
                    name=provider_label(data, key), legendgroup=key, showlegend=i == 0, visible=dtype == dtypes[0],
                    line=provider_line(key),
                    hovertemplate="%{fullData.name}<br>N = %{x}: %{y:.0f} TFLOP/s<extra></extra>",
                ), row=i // 2 + 1, col=i % 2 + 1)
                trace_dtypes.append(dtype)
    lengths = sorted({r["n"] for r in data["results"]})
    for dtype in dtypes:  # the ceiling of the run that measured this dtype (a file may hold several runs)
        ceiling = run_ceiling(data, [r for r in data["results"] if r["dtype"] == dtype])
        for i in range(len(panels)):
            fig.add_trace(go.Scatter(
                x=[lengths[0], lengths[-1]], y=[ceiling, ceiling], mode="lines", line=CEILING_LINE,
                name=f"fp16 matmul ceiling, same run: {ceiling:.0f} TFLOP/s", legendgroup="ceiling", showlegend=i == 0,
                visible=dtype == dtypes[0], hovertemplate=f"fp16 matmul ceiling: {ceiling:.0f} TFLOP/s<extra></extra>",
            ), row=i // 2 + 1, col=i % 2 + 1)
            trace_dtypes.append(dtype)
    # The dtype buttons sit above the panels' titles, at the left (in the title's margin).
    fig.update_layout(updatemenus=[dict(
        type="buttons", direction="right", x=0, xanchor="left", y=1.0, yanchor="bottom", pad=dict(b=34, t=0),
        buttons=[dict(label=dt, method="update", args=[{"visible": [t == dt for t in trace_dtypes]}]) for dt in dtypes],
        active=0, showactive=True, font=dict(size=12),
    )])
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_xaxes(title="sequence length N", row=len(head_dims))
    fig.update_yaxes(title="TFLOP/s", rangemode="tozero", col=1)
    return measured_layout(fig, data, title, height=360 * len(head_dims) + 240, above=40)


@figure("ch05-tflops")
def fa2_tflops(data: dict | None = None) -> go.Figure:
    return tflops_by_cell(data or load_data("ch05_fwd"), "Forward TFLOP/s vs N (B·N = 16384, H·d = 2048)")


@figure("ch05-ratio-table")
def fa2_ratio_table(data: dict | None = None) -> Table:
    """The tuned forward against cuDNN and torch flash (and the teaching kernel and FlashAttention-1 against
    them), N ≥ 4096, each cell flagged against its bar."""
    return chapter_ratio_table(data or load_data("ch05_fwd"), "forward",
                                "Forward: our kernels as multiples of torch's cuDNN and flash backends, N ≥ 4096")


@figure("ch05-timeline")
def ch05_timeline(data: dict | None = None) -> go.Figure:
    """Chapter 1's timeline at B·H = 8: FlashAttention-1's programs (one per head) against
    FlashAttention-2's (one per query tile of each head), each on its own time axis."""
    from tutorial_kernels.recorder import Timeline

    data = data or load_data("ch05_timeline")
    runs = [Timeline.from_dict(r) for r in data["timelines"]]
    titles = [f"{run.label}: {run.n_programs} programs on {len(set(run.sm))} of {run.sm_count} SMs, "
              f"{(max(run.end_ns) - min(run.start_ns)) / 1e3:,.0f} µs" for run in runs]
    m = data["timelines"][0]["meta"]
    return stacked_timelines(data, titles, f"The same attention (B = {m['batch']}, H = {m['heads']}, N = {m['n']}, "
                                            f"d = {m['head_dim']}, {m['dtype']}) as FlashAttention-1 and "
                                            "FlashAttention-2 launch it")


@figure("ch05-hbm-vs-n")
def ch05_hbm_vs_n(data: dict | None = None) -> go.Figure:
    """Naive attention, FlashAttention-1 and FlashAttention-2 (teaching tiles): measured and modelled bytes."""
    return hbm_vs_n(data or load_data("ch04_hbm_bytes"),
                     [("by-n", "naive", False, "naive, 3 kernels (ch. 2)"),
                      ("by-n", "flash-v1", False, "FlashAttention-1"),
                      ("fa2-by-n", "flash-v2", False, "FlashAttention-2"),
                      ("fa2-by-n", "flash-v2", True, "FlashAttention-2, causal")],
                     "HBM traffic of one forward: naive, FlashAttention-1 and FlashAttention-2 (fp16, Nsight Compute)")


PROBE_VARIANTS = [  # (warp_specialize, lazy_rescale) → label and colour in the schedule probe: shades of the tuned kernel's
    ((False, False), "plain (best forced configuration)", TUNED_VARIANT_COLOURS[0]),
    ((True, False), "+ warp specialisation", TUNED_VARIANT_COLOURS[1]),
    ((False, True), "+ lazy rescale (threshold 8)", TUNED_VARIANT_COLOURS[2]),
    ((True, True), "+ both", TUNED_VARIANT_COLOURS[3]),
]


def _probe_cells(rows: list[dict]) -> tuple[list[tuple], list[str]]:
    """A probe's cells, (head_dim, causal, n) in order, and their axis labels."""
    cells = sorted({(r["head_dim"], r["causal"], r["n"]) for r in rows})
    return cells, [f"d={d}, {'causal' if c else 'full'}, N={n}" for d, c, n in cells]


@figure("ch05-schedule-probe")
def schedule_probe(data: dict | None = None) -> go.Figure:
    """Two Hopper schedules tried on the forward kernel, each cell's best forced configuration per
    variant against cuDNN and torch flash measured in the same run (data/ch05_schedule_probe.json)."""
    data = data or load_data("ch05_schedule_probe")
    rows = data["results"]
    cells, names = _probe_cells(rows)
    fig = go.Figure()
    for key in ("sdpa-cudnn", "sdpa-flash"):
        picked = {(r["head_dim"], r["causal"], r["n"]): r for r in rows if r["variant"] == key and r["status"] == "ok"}
        fig.add_trace(go.Bar(x=names, y=[picked[c]["tflops"] if c in picked else None for c in cells],
                             name=picked[cells[0]]["provider"], marker_color=provider_colour(key),
                             hovertemplate="%{fullData.name}<br>%{x}: %{y:.0f} TFLOP/s<extra></extra>"))
    for (ws, lazy), label, colour in PROBE_VARIANTS:
        best, configs = [], []
        for cell in cells:
            forced = [r for r in rows if r["variant"] == "forced" and r["status"] == "ok"
                      and (r["head_dim"], r["causal"], r["n"]) == cell
                      and r["warp_specialize"] == ws and r["lazy_rescale"] == lazy]
            top = max(forced, key=lambda r: r["tflops"], default=None)
            best.append(top["tflops"] if top else None)
            configs.append(top["provider"] if top else "none compiled")
        fig.add_trace(go.Bar(x=names, y=best, name=label, marker_color=colour, customdata=configs,
                             hovertemplate=label + "<br>%{x}: %{y:.0f} TFLOP/s<br>%{customdata}<extra></extra>"))
    fig.update_yaxes(title="TFLOP/s (float16, forward)", rangemode="tozero")
    fig.update_xaxes(tickangle=-40)
    fig.update_layout(barmode="group")
    add_notes(fig, "Each forced configuration was timed once, in turn, before the harness took turns between providers.")
    return measured_layout(fig, data, "Warp specialisation and lazy rescaling, tried: each variant's best of up to 6 "
                                      "forced configurations", height=620)


SPLIT_PROBE_COLOURS = {  # provider label in data/ch05_head_dim_split.json → bar colour
    "torch SDPA: cuDNN": provider_colour("sdpa-cudnn"),
    "tuned, two blocks when they save columns": TUNED_VARIANT_COLOURS[0],
    "tuned, one padded block": TUNED_VARIANT_COLOURS[2],
    "torch SDPA: flash": provider_colour("sdpa-flash"),
}


def probe_bars(data: dict, colours: dict[str, str], title: str) -> go.Figure:
    """A probe's TFLOP/s as grouped bars per cell, one trace per provider label in `colours`, each bar's
    ratio to cuDNN (measured in the same run) on hover."""
    from tutorial_kernels.bench import PROVIDERS

    rows = [r for r in data["results"] if r["status"] == "ok"]
    cells, names = _probe_cells(rows)
    cudnn = {(r["head_dim"], r["causal"], r["n"]): r["tflops"] for r in rows
             if r["provider"] == PROVIDERS["sdpa-cudnn"].label}
    fig = go.Figure()
    for label, colour in colours.items():
        by_cell = {(r["head_dim"], r["causal"], r["n"]): r for r in rows if r["provider"] == label}
        fig.add_trace(go.Bar(
            x=names, y=[by_cell[c]["tflops"] if c in by_cell else None for c in cells], name=label, marker_color=colour,
            customdata=[by_cell[c]["tflops"] / cudnn[c] if c in by_cell and c in cudnn else None for c in cells],
            hovertemplate=label + "<br>%{x}<br>%{y:.0f} TFLOP/s, %{customdata:.2f}× cuDNN<extra></extra>"))
    fig.update_yaxes(title="TFLOP/s (bfloat16, forward)", rangemode="tozero")
    fig.update_xaxes(tickangle=-40)
    fig.update_layout(barmode="group")
    return measured_layout(fig, data, title, height=600)


@figure("ch05-head-dim-split")
def head_dim_split(data: dict | None = None) -> go.Figure:
    """Head dimensions 80 and 96 as two column blocks against one block padded to 128, with cuDNN and
    torch flash in the same run; d = 128 (one block either way) as the control
    (data/ch05_head_dim_split.json)."""
    return probe_bars(data or load_data("ch05_head_dim_split"), SPLIT_PROBE_COLOURS,
                       "Head dimension 80 and 96: two column blocks (64 + 16, 64 + 32) against one padded to 128")
