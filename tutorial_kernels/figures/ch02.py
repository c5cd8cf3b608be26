"""Chapter 2's figures (docs/chapters/02-naive-attention.md): naive attention against torch's.

The memory S and P take (a formula), the ROCm blog's speedup plot re-measured (data/ch02_seed.json),
time, throughput and memory against N (data/ch02_sweep.json), and `probability_heatmap` for the
notebook. `by_causal` (a not-causal / causal pair of panels) and `live_traces` (the reader's own
measurements over the recorded ones) serve later chapters too.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data, ok_rows, provider_keys, provider_label
from tutorial_kernels.figures.style import PROVIDER_COLOURS, measured_layout


@figure("ch02-score-memory")
def score_memory() -> go.Figure:
    """Memory that S and P take in HBM, from the formula 2 · B · H · N² · bytes (B=1, H=32, fp16)."""
    lengths = [2**i for i in range(8, 17)]
    gib = [2 * 32 * n * n * 2 / 2**30 for n in lengths]
    fig = go.Figure(go.Scatter(x=lengths, y=gib, mode="lines+markers", name="S and P"))
    fig.update_layout(
        title="HBM taken by S and P (B=1, H=32, fp16; formula, not a measurement)",
        xaxis=dict(title="sequence length N", type="log", tickvals=lengths),
        yaxis=dict(title="GiB", type="log"),
        template="plotly_white",
    )
    return fig


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
                line=dict(dash="dash", color=PROVIDER_COLOURS.get(key)), marker=dict(symbol="circle-open"),
            ),
            **subplot,
        )


@figure("ch02-seed-speedup")
def seed_speedup(data: dict | None = None, live: dict | None = None) -> go.Figure:
    """The ROCm blog's plot, re-measured: speedup over eager attention vs N."""
    data = data or load_data("ch02_seed")
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
                line=dict(color=PROVIDER_COLOURS.get(key), dash="dash" if dashed else "solid"),
                hovertemplate="%{y:.2f}× faster than eager",
            ))

    add(data, dashed=False)
    if live is not None:
        add(live, dashed=True)
    fig.add_hline(y=1.0, line=dict(color=PROVIDER_COLOURS["eager"], dash="dot"), annotation_text="eager")
    fig.update_xaxes(title="sequence length N")
    fig.update_yaxes(title="speedup over eager PyTorch (×)", rangemode="tozero")
    return measured_layout(fig, data, "Speedup over eager attention (B=1, H=32, d=128, fp16, causal)")


def by_causal(data: dict, live: dict | None, y_of, y_title: str, title: str, log_y: bool) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("not causal", "causal"), shared_yaxes=True)
    for col, causal in ((1, False), (2, True)):
        for key in provider_keys(data):
            rows = ok_rows(data, provider_key=key, causal=causal)
            fig.add_trace(
                go.Scatter(
                    x=[r["n"] for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                    name=provider_label(data, key), legendgroup=key, showlegend=col == 1,
                    line=dict(color=PROVIDER_COLOURS.get(key)),
                ),
                row=1, col=col,
            )
        if live is not None:
            live_causal = {**live, "results": [r for r in live["results"] if r["causal"] == causal]}
            live_traces(fig, live_causal, y_of, row=1, col=col)
    failed = [r for r in data["results"] if r["status"] != "ok"]
    if failed:
        note = "; ".join(f"{r['provider']}: {r['status']} at N={r['n']}{' causal' if r['causal'] else ''}" for r in failed)
        fig.add_annotation(text=f"missing points — {note}", xref="paper", yref="paper", x=0, y=-0.42,
                           showarrow=False, font=dict(size=11), xanchor="left")
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(title="sequence length N", type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_yaxes(type="log" if log_y else "linear")
    fig.update_yaxes(title=y_title, col=1)
    fig.update_layout(height=540, margin=dict(b=140))
    return measured_layout(fig, data, title)


@figure("ch02-time-vs-n")
def time_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return by_causal(data, live, lambda r: r["ms"], "time per forward (ms)",
                      "Forward time vs N (B=1, H=32, d=128, fp16)", log_y=True)


@figure("ch02-tflops-vs-n")
def tflops_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return by_causal(data, live, lambda r: r["tflops"], "TFLOP/s (4·B·H·N²·d, ×½ causal)",
                      "Throughput vs N (B=1, H=32, d=128, fp16)", log_y=False)


@figure("ch02-memory-vs-n")
def memory_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return by_causal(data, live, lambda r: r["peak_extra_mib"], "peak extra memory of one call (MiB)",
                      "Memory vs N (B=1, H=32, d=128, fp16)", log_y=True)


def probability_heatmap(p, title: str) -> go.Figure:
    """One head's attention probabilities P (n_q × n_k) as a heatmap: masked keys show as 0."""
    fig = go.Figure(go.Heatmap(z=p.double().cpu().numpy(), colorscale="Viridis", colorbar=dict(title="P_ij")))
    fig.update_layout(title=title, template="plotly_white", height=420, width=520)
    fig.update_xaxes(title="key j")
    fig.update_yaxes(title="query i", autorange="reversed")
    return fig
