"""Chapter 2's figures (docs/chapters/02-naive-attention.md): naive attention against torch's.

The memory S and P take (a formula), the ROCm blog's speedup plot re-measured (data/ch02_rocm.json),
time, throughput and memory against N (data/ch02_sweep.json), and `probability_heatmap` for the
notebook. `by_causal` (a not-causal / causal pair of panels) and `live_traces` (the reader's own
measurements over the recorded ones) serve later chapters too.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data, ok_rows, provider_keys, provider_label
from tutorial_kernels.figures.style import add_notes, measured_layout, provider_colour, provider_line, style_figure


@figure("ch02-score-memory")
def score_memory() -> go.Figure:
    lengths = [2**i for i in range(8, 17)]
    gib = [2 * 32 * n * n * 2 / 2**30 for n in lengths]
    fig = go.Figure(go.Scatter(x=lengths, y=gib, mode="lines+markers", name="S and P",
                               line=dict(color=provider_colour("naive-triton")),
                               hovertemplate="N = %{x:,}: %{y:,.3~f} GiB<extra></extra>"))
    fig.update_xaxes(title="sequence length N", type="log", tickvals=lengths, ticktext=[f"{n:,}" for n in lengths])
    fig.update_yaxes(title="GiB", type="log", tickformat=",~g")
    return style_figure(fig, "HBM taken by S and P", "B = 1, H = 32, fp16; a formula, not a measurement",
                        height=460, showlegend=False)


def live_traces(fig: go.Figure, live: dict | None, y_of, **subplot) -> None:
    """Overlay the reader's own measurements (dashed, hollow markers) on the recorded ones."""
    if live is None:
        return
    for key in provider_keys(live):
        rows = ok_rows(live, provider_key=key)
        fig.add_trace(
            go.Scatter(
                x=[r["n"] for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                name=f"{provider_label(live, key)} — your GPU ({live['provenance']['gpu']})",
                line=dict(dash="dot", color=provider_colour(key)), marker=dict(symbol="circle-open"),
                hovertemplate="%{fullData.name}<br>N = %{x}: %{y:.3g}<extra></extra>",
            ),
            **subplot,
        )


@figure("ch02-rocm-speedup")
def rocm_speedup(data: dict | None = None, live: dict | None = None) -> go.Figure:
    """The ROCm blog's plot, re-measured: speedup over eager attention vs N."""
    data = data or load_data("ch02_rocm")
    fig = go.Figure()

    def add(source: dict, dashed: bool) -> None:
        eager = {r["n"]: r["ms"] for r in ok_rows(source, provider_key="eager")}
        for key in provider_keys(source):
            if key == "eager":
                continue
            rows = [r for r in ok_rows(source, provider_key=key) if r["n"] in eager]
            suffix = f" — your GPU ({source['provenance']['gpu']})" if dashed else ""
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in rows], y=[eager[r["n"]] / r["ms"] for r in rows], mode="lines+markers",
                name=f"{provider_label(source, key)}{suffix}",
                line=provider_line(key) if not dashed else dict(color=provider_colour(key), dash="dot"),
                marker=dict(symbol="circle-open" if dashed else "circle"),
                hovertemplate="%{fullData.name}<br>N = %{x}: %{y:.2f}× faster than eager<extra></extra>",
            ))

    add(data, dashed=False)
    if live is not None:
        add(live, dashed=True)
    fig.add_hline(y=1.0, line=dict(color=provider_colour("eager"), dash="dot"), annotation_text="eager",
                  annotation_position="top left")
    fig.update_xaxes(title="sequence length N")
    fig.update_yaxes(title="speedup over eager PyTorch (×)", rangemode="tozero")
    return measured_layout(fig, data, "Speedup over eager attention (B = 1, H = 32, d = 128, fp16, causal)",
                           height=500)


def by_causal(data: dict, live: dict | None, y_of, y_title: str, title: str, log_y: bool) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("not causal", "causal"), shared_yaxes=True)
    for col, causal in ((1, False), (2, True)):
        for key in provider_keys(data):
            rows = ok_rows(data, provider_key=key, causal=causal)
            fig.add_trace(
                go.Scatter(
                    x=[r["n"] for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                    name=provider_label(data, key), legendgroup=key, showlegend=col == 1, line=provider_line(key),
                    hovertemplate="%{fullData.name}<br>N = %{x}: %{y:.3g}<extra></extra>",
                ),
                row=1, col=col,
            )
        if live is not None:
            live_causal = {**live, "results": [r for r in live["results"] if r["causal"] == causal]}
            live_traces(fig, live_causal, y_of, row=1, col=col)
    failed = [r for r in data["results"] if r["status"] != "ok"]
    if failed:
        add_notes(fig, "Missing points: " + "; ".join(
            f"{r['provider']}: {r['status']} at N = {r['n']}{', causal' if r['causal'] else ''}" for r in failed) + ".")
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(title="sequence length N", type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_yaxes(type="log" if log_y else "linear")
    if log_y:
        fig.update_yaxes(dtick=1, tickformat=",~g")  # one label per decade: 0.01, 0.1, 1, …
    fig.update_yaxes(title=y_title, col=1)
    return measured_layout(fig, data, title, height=600)


@figure("ch02-time-vs-n")
def time_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return by_causal(data, live, lambda r: r["ms"], "time per forward (ms)",
                      "Forward time vs N (B = 1, H = 32, d = 128, fp16)", log_y=True)


@figure("ch02-tflops-vs-n")
def tflops_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return by_causal(data, live, lambda r: r["tflops"], "TFLOP/s (4·B·H·N²·d, ×½ causal)",
                      "Throughput vs N (B = 1, H = 32, d = 128, fp16)", log_y=False)


@figure("ch02-memory-vs-n")
def memory_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return by_causal(data, live, lambda r: r["peak_extra_mib"], "peak extra memory of one call (MiB)",
                      "Memory vs N (B = 1, H = 32, d = 128, fp16)", log_y=True)


def probability_heatmap(p, title: str) -> go.Figure:
    """One head's attention probabilities P (n_q × n_k) as a heatmap: masked keys show as 0."""
    fig = go.Figure(go.Heatmap(z=p.double().cpu().numpy(), colorscale="Viridis", colorbar=dict(title="P_ij"),
                               hovertemplate="query %{y}, key %{x}: P = %{z:.3f}<extra></extra>"))
    fig.update_xaxes(title="key j")
    fig.update_yaxes(title="query i", autorange="reversed")
    return style_figure(fig, title, height=440, width=540)


# (label, key/value heads) for 8 query heads: multi-head, grouped-query and multi-query attention
HEAD_LAYOUTS = [("multi-head: 8 K/V heads", 8), ("grouped-query: 2 K/V heads", 2), ("multi-query: 1 K/V head", 1)]


@figure("concept-attention-shapes")
def attention_shapes(heads: int = 8, n_q: int = 6, n_k: int = 9, head_dim: int = 3) -> go.Figure:
    """Left: which key/value head each query head reads (`reference.expand_kv_heads`'s rule h // G), a menu
    for multi-head, grouped-query and multi-query attention. Right: the matrices of one (batch, head) pair,
    Q, Kᵀ, S = τQKᵀ, P and V, O = PV, drawn to their shapes."""
    from tutorial_kernels.figures.concepts import GRID, NOTE, discrete_scale, hover, narrow_diagram
    from tutorial_kernels.figures.style import WAVE_COLOURS, concept_layout

    fig = make_subplots(rows=1, cols=2, column_widths=[0.32, 0.68], horizontal_spacing=0.04, subplot_titles=(
        "heads: which K/V head each query head reads", "one (batch, head) pair"))
    colours = WAVE_COLOURS[:heads]
    scale = discrete_scale(colours)
    for k, (label, kv_heads) in enumerate(HEAD_LAYOUTS):
        group = heads // kv_heads
        z = [[h // group * group, h // group * group if h % group == 0 else None] for h in range(heads)]
        text = [[f"Q head {h}", f"K/V head {h // group}" if h % group == 0 else ""] for h in range(heads)]
        about = [[hover(f"query head {h} reads key/value head {h} // {group} = {h // group}"),
                  hover(f"key/value head {h // group}: read by query heads {h // group * group}–"
                        f"{h // group * group + group - 1}") if h % group == 0 else ""] for h in range(heads)]
        fig.add_trace(go.Heatmap(z=z, x=[0, 1], y=list(range(heads)), text=text, texttemplate="%{text}",
                                 textfont=dict(size=NOTE, color="white"), customdata=about, zmin=0, zmax=heads - 1,
                                 colorscale=scale, showscale=False, xgap=6, ygap=3, visible=k == 1,
                                 hovertemplate="%{customdata}<extra></extra>"), row=1, col=1)
    # one pair's matrices, laid out as the products read (rows downwards, one cell per row and column):
    # Q left of S with Kᵀ above it, S = τ Q Kᵀ; P beside S; V above O, O = P V
    x_s, x_p = head_dim + 1, head_dim + n_k + 2
    x_o = x_p + n_k + 1
    blocks = [  # name, rows, columns, left, top, colour, label below (else above), hover
        ("Q", n_q, head_dim, 0, 0, 0, True, f"Q: n_q × d = {n_q} × {head_dim}, one row per query"),
        ("Kᵀ", head_dim, n_k, x_s, -head_dim - 1, 1, False, f"Kᵀ: d × n_k = {head_dim} × {n_k}, one column per key"),
        ("S = τ Q Kᵀ", n_q, n_k, x_s, 0, 2, True, f"S: n_q × n_k = {n_q} × {n_k}, query i's score for key j"),
        ("P = softmax(S)", n_q, n_k, x_p, 0, 3, True, "P: each row of S made positive and summing to 1"),
        ("V", n_k, head_dim, x_o, -n_k - 1, 4, False, f"V: n_k × d = {n_k} × {head_dim}, one row per key"),
        ("O = P V", n_q, head_dim, x_o, 0, 5, True, f"O: n_q × d = {n_q} × {head_dim}, Q's shape"),
    ]
    tones = ["#9ecae1", "#fdae6b", "#c7e9c0", "#74c476", "#fdd0a2", "#6baed6"]
    for name, rows, cols, left, top, tone, below, about in blocks:
        fig.add_trace(go.Heatmap(z=[[tone] * cols for _ in range(rows)], x=[left + c for c in range(cols)],
                                 y=[top + r for r in range(rows)], zmin=0, zmax=len(tones) - 1,
                                 colorscale=discrete_scale(tones), showscale=False, xgap=1, ygap=1,
                                 customdata=[[hover(about)] * cols for _ in range(rows)],
                                 hovertemplate="%{customdata}<extra></extra>"), row=1, col=2)
        fig.add_annotation(x=left + (cols - 1) / 2, y=top + rows - 0.3 if below else top - 0.7,
                           yanchor="top" if below else "bottom", text=name, showarrow=False, font=dict(size=NOTE),
                           row=1, col=2)
    visible = lambda k: [j == k for j in range(len(HEAD_LAYOUTS))] + [True] * len(blocks)  # noqa: E731
    fig.update_layout(plot_bgcolor=GRID, updatemenus=[dict(
        type="dropdown", direction="down", active=1, showactive=True, x=0, xanchor="left", y=1.1, yanchor="bottom",
        font=dict(size=NOTE), buttons=[dict(method="update", label=label, args=[{"visible": visible(k)}])
                                       for k, (label, _) in enumerate(HEAD_LAYOUTS)])])
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", scaleanchor="x2", row=1, col=2)
    add_notes(fig, f"Every tensor is (B, H, N, d). Each of the B · H (batch, head) pairs is one independent problem, "
                   f"drawn on the right for n_q = {n_q} queries, n_k = {n_k} keys and d = {head_dim}. With grouped-query "
                   "attention the key/value tensors have fewer heads, H_kv, and query head h reads key/value head "
                   "h // (H / H_kv): the menu on the left switches between the three layouts models use.")
    narrow_diagram(fig, **{"+height": 140})
    return concept_layout(fig, "The shapes of attention: heads, and one head's matrices", (
        f"Left: {heads} query heads and the key/value heads they read, for multi-head (one each), grouped-query (four "
        "query heads per key/value head) and multi-query (all share one) attention. Right: one head's Q, the "
        "transposed K, the score matrix S and the probabilities P, V and the output O, each drawn to its shape: "
        "S and P are n_q × n_k, O has Q's shape."), height=560, above=40)
