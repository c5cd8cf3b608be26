"""Chapter 3's figures (docs/chapters/03-tiling-online-softmax.md): tiling and the online softmax.

The online softmax one tile at a time (from the float64 trace of the chapter's module), the tiled
matmul's throughput and roofline (data/ch03_matmul.json), softmax bandwidth (data/ch03_softmax.json)
and online-softmax attention against the naive schedule (data/ch03_attention.json).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.ch02 import by_causal
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data, ok_rows, provider_keys, provider_label
from tutorial_kernels.figures.style import (
    measured_layout,
    provider_colour,
    provider_line,
    reference_line,
    style_figure,
)


@figure("ch03-online-steps")
def online_steps(n: int = 32, block: int = 8, seed: int = 7) -> go.Figure:
    """A slider over the tiles of one row: what the online softmax knows after each tile.

    Computed by `online_softmax_trace`, the float64 specification the kernels follow (tested
    against the exact softmax), on a fixed random row with a large score in a late tile so the
    running max jumps and α < 1 shows.
    """
    import torch

    from tutorial_kernels.ch03_tiling_online_softmax import online_softmax_trace

    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=g) * 1.5
    scores[n - block + 2] = 4.5  # a late maximum: the old sum must be rescaled by α = e^{m_old − m_new}
    values = torch.randn(n, generator=g)
    steps = online_softmax_trace(scores, values, block)
    exact = (torch.softmax(scores.double(), 0) * values.double()).sum().item()

    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2, row_heights=[0.55, 0.45])
    cols = list(range(n))
    for t, st in enumerate(steps):
        colour = ["#ff7f0e" if st["start"] <= j < st["stop"] else "#1f77b4" if j < st["start"] else "#d9d9d9" for j in cols]
        visible = t == 0
        fig.add_trace(go.Bar(x=cols, y=scores.tolist(), marker_color=colour, visible=visible, showlegend=False,
                             hovertemplate="key %{x}: s = %{y:.2f}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[-0.5, st["stop"] - 0.5], y=[st["m"], st["m"]], mode="lines", visible=visible,
                                 line=dict(color="#d62728", dash="dash"), name="running max m"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=list(range(1, t + 2)), y=[s_["partial"] for s_ in steps[: t + 1]],
                                 mode="lines+markers", visible=visible, line=dict(color="#ff7f0e"),
                                 name="o / l so far"), row=2, col=1)
    fig.add_trace(go.Scatter(x=[0.5, len(steps) + 0.5], y=[exact, exact], mode="lines", name="exact softmax(s)·v",
                             line=dict(color="#2ca02c", dash="dot")), row=2, col=1)

    per_step = 3
    slider_steps = []
    for t, st in enumerate(steps):
        visible = [False] * (per_step * len(steps)) + [True]
        visible[per_step * t: per_step * (t + 1)] = [True] * per_step
        alpha = "α: nothing to rescale yet" if t == 0 else f"α = e^(m_old − m_new) = {st['alpha']:.3f}"
        text = (f"<b>tile {t + 1} of {len(steps)}</b> (keys {st['start']}–{st['stop'] - 1}):  {alpha}<br>"
                f"m = {st['m']:.3f}   l = {st['l']:.3f}   o / l = {st['partial']:.4f}")
        slider_steps.append(dict(method="update", label=str(t + 1),
                                 args=[{"visible": visible}, {"annotations": _step_annotations(fig, text)}]))
    partials = [st["partial"] for st in steps] + [exact]
    spread = max(partials) - min(partials) or 1.0
    fig.update_yaxes(range=[min(partials) - 0.15 * spread, max(partials) + 0.15 * spread], row=2, col=1)
    fig.update_xaxes(range=[0.5, len(steps) + 0.5], row=2, col=1)
    fig.update_layout(
        # the slider under the plots, the legend under the slider (the template puts it at the bottom)
        sliders=[dict(active=0, steps=slider_steps, currentvalue=dict(prefix="tiles seen: "), y=0, yanchor="top",
                      pad=dict(t=70), len=1, x=0)],
        annotations=_step_annotations(fig, slider_steps[0]["args"][1]["annotations"][-1]["text"]),
    )
    fig.update_xaxes(title="key j (orange: this tile, blue: seen, grey: not yet)", row=1, col=1)
    fig.update_yaxes(title="score s_j", row=1, col=1)
    fig.update_xaxes(title="tiles seen", dtick=1, row=2, col=1)
    fig.update_yaxes(title="o / l", row=2, col=1)
    style_figure(fig, f"The online softmax, one tile at a time (N = {n}, tile = {block})",
                 "float64 trace of ch03_tiling_online_softmax.online_softmax_trace", height=860, above=46,
                 margin=dict(b=150))
    return fig


def _step_annotations(fig: go.Figure, text: str) -> list:
    """The two lines above the plots that describe the current step."""
    return [dict(text=text, xref="paper", yref="paper", x=0, y=1.0, yanchor="bottom", showarrow=False, xanchor="left",
                 align="left", font=dict(size=12))]


def _provider_lines(fig: go.Figure, data: dict, x_of, y_of, hover: str, keep=lambda row: True) -> None:
    """One line per provider through its measured (x, y) points, in the provider's colour."""
    for key in provider_keys(data):
        rows = [r for r in ok_rows(data, provider_key=key) if keep(r)]
        fig.add_trace(go.Scatter(x=[x_of(r) for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                                 name=provider_label(data, key), line=provider_line(key), hovertemplate=hover))


@figure("ch03-matmul-tflops")
def matmul_tflops(data: dict | None = None) -> go.Figure:
    data = data or load_data("ch03_matmul")
    fig = go.Figure()
    _provider_lines(fig, data, lambda r: r["m"], lambda r: r["tflops"], keep=lambda r: r["m"] == r["n"] == r["k"],
                    hover="%{fullData.name}<br>M = N = K = %{x}: %{y:.0f} TFLOP/s<extra></extra>")
    ceiling = data["ceilings"]["matmul_fp16_tflops"]
    # The ceiling's label sits under its line at the left, where the lines are still far below it
    # (at the right they meet it).
    reference_line(fig, ceiling, f"torch.matmul 8192³, same run: {ceiling:.0f} TFLOP/s")
    sizes = sorted({r["m"] for r in data["results"] if r["m"] == r["n"] == r["k"]})
    fig.update_xaxes(title="M = N = K", type="log", tickvals=sizes, ticktext=[str(v) for v in sizes])
    fig.update_yaxes(title="TFLOP/s (2·M·N·K / time)", rangemode="tozero", range=[0, ceiling * 1.12])
    return measured_layout(fig, data, "Tiled matmul, fp16, square sizes", height=500)


@figure("ch03-matmul-roofline")
def matmul_roofline(data: dict | None = None) -> go.Figure:
    """Every measured matmul on the roofline min(peak, bandwidth × intensity) of the same run."""
    data = data or load_data("ch03_matmul")
    bandwidth_tb = data["ceilings"]["copy_tb_per_s"]
    peak = data["ceilings"]["matmul_fp16_tflops"]
    intensities = [10 ** (i / 20) for i in range(0, 81)]  # 1 … 10⁴ FLOP/byte
    fig = go.Figure(go.Scatter(x=intensities, y=[min(peak, bandwidth_tb * i) for i in intensities], mode="lines",
                               name=f"roofline: {bandwidth_tb:.2f} TB/s × intensity, capped at {peak:.0f} TFLOP/s",
                               line=dict(color="black"), hoverinfo="skip"))
    for key in provider_keys(data):
        rows = ok_rows(data, provider_key=key)
        fig.add_trace(go.Scatter(
            x=[r["intensity_flop_per_byte"] for r in rows], y=[r["tflops"] for r in rows], mode="markers",
            name=provider_label(data, key), marker=dict(color=provider_colour(key), size=9),
            text=[f"{r['m']}×{r['n']}×{r['k']}" for r in rows],
            hovertemplate="%{fullData.name}<br>%{text}: %{y:.0f} TFLOP/s<br>at %{x:.0f} FLOP/byte<extra></extra>",
        ))
    ridge = peak / bandwidth_tb
    fig.add_trace(go.Scatter(x=[ridge, ridge], y=[1, peak], mode="lines", line=dict(color="grey", dash="dot"),
                             name=f"ridge point: {ridge:.0f} FLOP/byte", hoverinfo="skip"))
    fig.update_xaxes(title="arithmetic intensity (FLOP per byte of HBM traffic, each operand once)", type="log",
                     range=[0, 4], dtick=1, tickformat=",~g")
    fig.update_yaxes(title="TFLOP/s", type="log", dtick=1, tickformat=",~g")
    return measured_layout(fig, data, f"Matmul on the {data['provenance']['gpu'].removeprefix('NVIDIA ').split()[0]} "
                                      "roofline, fp16", height=540)


@figure("ch03-softmax-bandwidth")
def softmax_bandwidth(data: dict | None = None) -> go.Figure:
    data = data or load_data("ch03_softmax")
    fig = go.Figure()
    _provider_lines(fig, data, lambda r: r["cols"], lambda r: r["gb_per_s"],
                    hover="%{fullData.name}<br>%{x} columns: %{y:,.0f} GB/s<extra></extra>")
    copy_gb = data["ceilings"]["copy_tb_per_s"] * 1000
    reference_line(fig, copy_gb, f"device copy: {copy_gb:,.0f} GB/s")
    cols = sorted({r["cols"] for r in data["results"]})
    fig.update_xaxes(title="row length (columns); 4096 rows, fp32", type="log", tickvals=cols, ticktext=[str(c) for c in cols])
    fig.update_yaxes(title="GB/s (x read once + y written once)", rangemode="tozero", range=[0, copy_gb * 1.12])
    return measured_layout(fig, data, "Softmax bandwidth vs row length", height=500)


@figure("ch03-attention-tflops")
def attention_tflops_ch03(data: dict | None = None) -> go.Figure:
    data = data or load_data("ch03_attention")
    return by_causal(data, None, lambda r: r["tflops"], "TFLOP/s (4·B·H·N²·d, ×½ causal)",
                      "Online-softmax attention vs the naive schedule (B = 1, H = 32, d = 128, fp16)", log_y=False)
