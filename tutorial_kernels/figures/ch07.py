"""Chapter 7's figures (docs/chapters/07-flash-v3-hopper.md): FlashAttention-3's schedule in Gluon.

The Hopper kernel against cuDNN, torch flash and the tuned Triton kernel on the FlashAttention-2
paper's shapes (data/ch05_hopper.json), and at the prefill models' attention shape
(data/ch05_hopper_prefill_shape.json); both are on the Benchmarks page too. The data files keep the
names they were measured under, when the kernel was part of chapter 5.
"""

from __future__ import annotations

import plotly.graph_objects as go

from tutorial_kernels.figures.ch05 import probe_bars
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data
from tutorial_kernels.figures.style import HOPPER_VARIANT_COLOURS, measured_layout, provider_colour

HOPPER_PROBE_PROVIDERS = ["sdpa-cudnn", "flash-v2-hopper", "flash-v2-tuned", "sdpa-flash"]  # in the Hopper probe's figure


@figure("ch07-hopper")
def hopper_schedule(data: dict | None = None) -> go.Figure:
    """Chapter 7's Hopper kernel (FA3's schedule in Gluon) against cuDNN, torch flash and the tuned
    Triton kernel, head_dim 128, bfloat16 (data/ch07_hopper.json, experiments/2026-11-22_hopper_schedule/probe_hopper_schedule.py)."""
    from tutorial_kernels.bench import PROVIDERS

    return probe_bars(data or load_data("ch05_hopper"),
                       {PROVIDERS[key].label: provider_colour(key) for key in HOPPER_PROBE_PROVIDERS},
                       "Head dimension 128 on an H100: FA3's schedule in Gluon against cuDNN and the Triton kernel")


PREFILL_SHAPE_COLOURS = {  # provider label in data/ch05_hopper_prefill_shape.json → bar colour
    "Hopper kernel (ch. 5), as launched": HOPPER_VARIANT_COLOURS[0],
    "Hopper kernel, forced persistent": HOPPER_VARIANT_COLOURS[1],
    "Hopper kernel, forced one program per item": HOPPER_VARIANT_COLOURS[2],
    "FlashAttention-2 tuned, Triton (ch. 5)": provider_colour("flash-v2-tuned"),
    "torch SDPA, as transformers calls it": provider_colour("sdpa-default"),
}


@figure("ch07-hopper-prefill-shape")
def hopper_prefill_shape(data: dict | None = None) -> go.Figure:
    """Speed relative to cuDNN at the prefill models' attention shape (1 × 32 query heads, 8 key/value
    heads, d = 128, causal, bfloat16), GPU time through CUDA graphs, one group of bars per length
    (data/ch05_hopper_prefill_shape.json, experiments/2026-11-22_hopper_schedule/probe_hopper_prefill_shape.py)."""
    data = data or load_data("ch05_hopper_prefill_shape")
    lengths = sorted({r["n"] for r in data["results"]})
    fig = go.Figure()
    for label, colour in PREFILL_SHAPE_COLOURS.items():
        by_n = {r["n"]: r for r in data["results"] if r["provider"] == label}
        fig.add_trace(go.Bar(
            x=[f"N = {n}" for n in lengths], y=[by_n[n]["speed_vs_cudnn"] if n in by_n else None for n in lengths],
            customdata=[by_n[n]["ms"] * 1e3 if n in by_n else None for n in lengths], name=label,
            marker_color=colour, hovertemplate=label + "<br>%{x}: %{y:.3f}× cuDNN<br>%{customdata:.1f} µs<extra></extra>"))
    # the reference line is named in the legend: a label on it would sit on the bars around 1
    fig.add_hline(y=1.0, line_dash="dot", line_color=provider_colour("sdpa-cudnn"))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="cuDNN's speed (= 1)",
                             line=dict(color=provider_colour("sdpa-cudnn"), dash="dot")))
    fig.update_yaxes(title="speed relative to cuDNN (its time / ours)", rangemode="tozero")
    fig.update_layout(barmode="group")
    return measured_layout(fig, data, "Prefill attention shape (32 query heads, 8 key/value heads, d = 128, causal) "
                                      "on an H100", height=560)
