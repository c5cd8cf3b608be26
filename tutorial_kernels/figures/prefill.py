"""The LLM prefill page's figures (docs/llm-prefill.md), from data/prefill.json (written by
`python -m tutorial_kernels.integrations.prefill`), data/launch_overhead.json and
data/prefill_attention_in_model.json: speedup over eager, latency against prompt length, ours against
sdpa with its interval, one attention call's cost, and one layer's attention inside the model.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data
from tutorial_kernels.figures.style import HEADER_FILL, PROVIDER_COLOURS, measured_layout
from tutorial_kernels.integrations.prefill import compare_with_sdpa

# the colours the benchmark pages use for the same kernels
IMPL_COLOURS = {
    "eager": PROVIDER_COLOURS["eager"],
    "sdpa": PROVIDER_COLOURS["sdpa-default"],
    "tutorial_fa2": PROVIDER_COLOURS["flash-v2-tuned"],
}
# one colour per prompt length, light to dark as in a sequential scale
LENGTH_COLOURS = ["#c6dbef", "#9ecae1", "#6baed6", "#3182bd", "#08519c", "#08306b"]


def _rows(data: dict) -> dict:
    """(model, impl, n) → row."""
    return {(r["model"], r["impl"], r["n"]): r for r in data["results"]}


def _lengths(data: dict) -> list[int]:
    return sorted({r["n"] for r in data["results"]})


def _impl_label(data: dict, impl: str) -> str:
    return data["implementations"][impl]


def _not_measured(data: dict) -> str:
    """A line naming every point that has no time, and why."""
    models = data["models"]
    gaps = [f"{models[r['model']]['label']} {r['impl']} N={r['n']}: {r['status']}"
            for r in data["results"] if r["status"] != "ok"]
    return "not measured — " + "; ".join(gaps) if gaps else ""


@figure("prefill-speedup")
def prefill_speedup(data: dict | None = None) -> go.Figure:
    """The ROCm blog's grouped bars: prefill speedup over eager attention, per model and prompt length,
    one panel per faster implementation (torch SDPA, and this tutorial's kernel)."""
    data = data or load_data("prefill")
    rows = _rows(data)
    lengths = _lengths(data)
    impls = [i for i in data["implementations"] if i != "eager"]
    fig = make_subplots(rows=1, cols=len(impls), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[_impl_label(data, i) for i in impls])
    labels = [m["label"] for m in data["models"].values()]
    for col, impl in enumerate(impls, start=1):
        for i, n in enumerate(lengths):
            speedups, texts, hovers = [], [], []
            for key, model in data["models"].items():
                eager, ours = rows.get((key, "eager", n)), rows.get((key, impl, n))
                if eager and ours and eager["status"] == ours["status"] == "ok":
                    s = eager["ms"] / ours["ms"]
                    speedups.append(s)
                    texts.append(f"{s:.2f}")
                    hovers.append(f"{s:.2f}× (eager {eager['ms']:.1f} ms → {ours['ms']:.1f} ms)")
                else:  # no bar, a short label on the axis instead: which side is missing
                    missing = [(name, r["status"] if r else "not run")
                               for name, r in (("eager", eager), (impl, ours)) if not r or r["status"] != "ok"]
                    speedups.append(0)
                    texts.append("OOM" if all(st in ("oom", "skipped") for _, st in missing) else "—")
                    hovers.append(", ".join(f"{name} {st}" for name, st in missing))
            fig.add_trace(go.Bar(
                x=labels, y=speedups, text=texts, textposition="outside", textfont=dict(size=9), cliponaxis=False,
                name=str(n), legendgroup=str(n), showlegend=col == 1,
                marker_color=LENGTH_COLOURS[i % len(LENGTH_COLOURS)], customdata=hovers,
                hovertemplate="%{x}, N = " + str(n) + ": %{customdata}<extra></extra>",
            ), row=1, col=col)
    fig.add_hline(y=1.0, line=dict(color=IMPL_COLOURS["eager"], dash="dot"))
    fig.update_yaxes(title="prefill speedup over eager attention (×)", rangemode="tozero", col=1)
    gaps = _not_measured(data)
    if gaps:
        fig.add_annotation(text=gaps, xref="paper", yref="paper", x=0, y=-0.28, showarrow=False,
                           font=dict(size=11), xanchor="left")
    fig.update_layout(barmode="group", height=540)
    fig = measured_layout(fig, data, "Prefill speedup over eager attention, batch 1, bfloat16 (grouped like the ROCm blog's)")
    fig.update_layout(hovermode="closest", legend=dict(y=-0.1, title_text="prompt length N:"),
                      margin=dict(t=140, b=150))
    return fig


@figure("prefill-latency")
def prefill_latency(data: dict | None = None) -> go.Figure:
    """Prefill latency against prompt length, one panel per model, one line per implementation.
    Points where an implementation ran out of memory are marked ✕ at the top of the panel."""
    data = data or load_data("prefill")
    rows = _rows(data)
    lengths = _lengths(data)
    models = data["models"]
    fig = make_subplots(rows=1, cols=len(models), horizontal_spacing=0.06,
                        subplot_titles=[f"{m['label']}<br><sup>{m['params_billion']:.1f} B parameters</sup>"
                                        for m in models.values()])
    for col, key in enumerate(models, start=1):
        ok_ms = [r["ms"] for (m, _, _), r in rows.items() if m == key and r["status"] == "ok"]
        top = max(ok_ms, default=1.0) * 1.8  # where the out-of-memory marks go, above every measured point
        for impl in data["implementations"]:
            picked = [rows[(key, impl, n)] for n in lengths if (key, impl, n) in rows]
            ok = [r for r in picked if r["status"] == "ok"]
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in ok], y=[r["ms"] for r in ok], mode="lines+markers",
                name=_impl_label(data, impl), legendgroup=impl, showlegend=col == 1,
                line=dict(color=IMPL_COLOURS.get(impl)),
                customdata=[[r["peak_gib"], r["reps"]] for r in ok],
                hovertemplate="N = %{x}: %{y:.1f} ms (peak %{customdata[0]:.1f} GiB, median of %{customdata[1]})"
                              "<extra>" + _impl_label(data, impl) + "</extra>",
            ), row=1, col=col)
            failed = [r for r in picked if r["status"] != "ok"]
            if failed:
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in failed], y=[top] * len(failed), mode="markers+text",
                    text=["OOM" if r["status"] in ("oom", "skipped") else r["status"] for r in failed],
                    textposition="bottom center", textfont=dict(size=10, color=IMPL_COLOURS.get(impl)),
                    marker=dict(symbol="x", size=10, color=IMPL_COLOURS.get(impl)),
                    name=f"{_impl_label(data, impl)}: not measured", legendgroup=impl, showlegend=False,
                    customdata=[r.get("reason", r["status"]) for r in failed],
                    hovertemplate="N = %{x}: %{customdata}<extra>" + _impl_label(data, impl) + "</extra>",
                ), row=1, col=col)
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_xaxes(title="prompt length N (tokens)", col=(len(models) + 1) // 2)
    fig.update_yaxes(type="log", dtick="D2")  # 1, 2, 5 per decade: the default labels every digit
    fig.update_yaxes(title="prefill latency, one forward (ms)", col=1)
    fig.update_layout(height=540)
    fig = measured_layout(fig, data, "Prefill latency vs prompt length, batch 1, bfloat16, random weights")
    fig.update_layout(hovermode="closest", legend=dict(y=-0.24), margin=dict(t=140, b=130))
    return fig


SDPA_BAR_MIN_N = 2048  # issue 8: from this length on, our prefill must be no slower than sdpa's
VERDICT_MARKS = {"faster": ("✓ faster", "#c7e9c0"), "undecided": ("≈ undecided", "#f0f0f0"),
                 "slower": ("✗ slower", "#fcbba1"), "too few turns": ("? too few turns", "#fff7bc")}


@figure("prefill-vs-sdpa")
def prefill_vs_sdpa(data: dict | None = None) -> go.Figure:
    """Our prefill latency over sdpa's, per model and length, by pairs of turns with a 95 % interval
    (`prefill.compare_with_sdpa`),
    against issue 8's bar: not slower at any length from SDPA_BAR_MIN_N on (below it, for reference)."""
    data = data or load_data("prefill")
    compared = compare_with_sdpa(data)
    lengths = _lengths(data)
    header = ["<b>model</b>", *[f"<b>N = {n}</b>" for n in lengths]]
    cells, colours = [[m["label"] for m in data["models"].values()]], [["white"] * len(data["models"])]
    for n in lengths:
        column, fill = [], []
        for key in data["models"]:
            c = compared.get((key, n))
            if c is None:
                column.append("—")
                fill.append("white")
                continue
            if c["low"] is None:
                text = f"{c['ratio']:.3f}" if c["verdict"] is None else f"{c['ratio']:.4f}"
            else:  # four decimals: an end just below 1 must not print as 1.000 beside "faster"
                text = f"{c['ratio']:.4f}<br>[{c['low']:.4f}, {c['high']:.4f}]"
            mark, colour = VERDICT_MARKS.get(c["verdict"], ("", "white"))
            column.append(f"{text}<br>{mark}" if mark else text)
            fill.append(colour if n >= SDPA_BAR_MIN_N else "white")
        cells.append(column)
        colours.append(fill)
    fig = go.Figure(go.Table(header=dict(values=header, align="left", fill_color=HEADER_FILL),
                             cells=dict(values=cells, fill_color=colours, align="left", height=64)))
    fig.update_layout(height=420)
    measured_layout(fig, data, "Prefill latency, ours / sdpa, by pairs of turns: median ratio [95 % interval]<br>"
            f"bar: not slower from N = {SDPA_BAR_MIN_N} (shaded cells)")
    fig.update_layout(margin=dict(t=150, l=10, r=10, b=10))
    return fig


@figure("prefill-launch-cost")
def prefill_launch_cost(data: dict | None = None) -> go.Figure:
    """One layer's attention call as the model makes it, ours against torch SDPA: CPU cost per call
    and GPU time (data/launch_overhead.json): what a prefill pays per layer besides the kernel's speed."""
    data = data or load_data("launch_overhead")
    rows = data["measurements"]
    keys = list(dict.fromkeys((r["model"], r["impl"]) for r in rows))
    lengths = sorted({r["n"] for r in rows if "gpu_ms" in r})
    cpu = {(r["model"], r["impl"]): r["cpu_us"] for r in rows if "cpu_us" in r}
    gpu = {(r["model"], r["impl"], r["n"]): r["gpu_ms"] for r in rows if "gpu_ms" in r}
    shape = {r["model"]: f"{r['model']} ({r['heads']}/{r['kv_heads']} heads, d={r['head_dim']})" for r in rows}
    cells = [[shape[m] for m, _ in keys], [i for _, i in keys],
             [f"{cpu[k]:.0f}" if k in cpu else "—" for k in keys],
             *[[f"{gpu[(m, i, n)] * 1e3:.0f}" if (m, i, n) in gpu else "—" for m, i in keys] for n in lengths]]
    fig = go.Figure(go.Table(
        header=dict(values=["<b>attention shape of</b>", "<b>implementation</b>", "<b>CPU µs per call (N = 16)</b>",
                            *[f"<b>GPU µs, N = {n}</b>" for n in lengths]], align="left", fill_color=HEADER_FILL),
        cells=dict(values=cells, align="left", height=30), columnwidth=[2.4, 2.2, 1.4, 1.2, 1.2, 1.2][: len(cells)],
    ))
    fig.update_layout(height=200 + 42 * len(keys))  # header and labels may wrap to two lines
    measured_layout(fig, data, "One layer's attention call as the model makes it, bfloat16, causal, batch 1")
    fig.update_layout(margin=dict(t=130, l=10, r=10, b=10))
    return fig


@figure("prefill-attention-in-model")
def prefill_attention_in_model(data: dict | None = None) -> go.Figure:
    """One layer's attention in Mistral-7B's prefill, timed alone and inside whole forwards, with the
    forward's latency (data/prefill_attention_in_model.json): where a kernel's speed alone and its
    speed in the model part."""
    data = data or load_data("prefill_attention_in_model")
    rows = data["results"]
    def us(r: dict, key: str) -> str:
        return f"{r[key]:.0f}" if key in r else "—"
    sdpa = {r["n"]: r for r in rows if r["impl"] == "sdpa"}
    cells = [[r["n"] for r in rows], [data["implementations"][r["impl"]] for r in rows],
             [us(r, "alone_l2_warm_us") for r in rows], [us(r, "in_model_us") for r in rows],
             [f"{r['ms']:.1f}" if r["status"] == "ok" else r["status"] for r in rows],
             [f"{r['ms'] / sdpa[r['n']]['ms']:.3f}" if r["status"] == "ok" else "—" for r in rows]]
    fig = go.Figure(go.Table(
        header=dict(values=["<b>N</b>", "<b>attention</b>", "<b>µs per call alone (L2 warm)</b>",
                            "<b>µs per call in the model</b>", "<b>forward ms (median)</b>", "<b>forward / sdpa</b>"],
                    align="left", fill_color=HEADER_FILL),
        cells=dict(values=cells, align="left", height=26), columnwidth=[0.7, 3.2, 1.4, 1.4, 1.3, 1.2],
    ))
    fig.update_layout(height=200 + 36 * len(rows))  # labels may wrap to two lines
    measured_layout(fig, data, "Mistral-7B prefill: one layer's attention alone and inside the forward pass")
    fig.update_layout(margin=dict(t=130, l=10, r=10, b=10))
    return fig
