"""Plotly figures for the chapters, built from committed data files (or from formulas).

The same function draws a figure in a notebook (`show(fig)`) and on a site page: a page names a
figure with an HTML comment on its own line, `<!-- figure: NAME -->`, and the site's build hook
replaces it with `figure_html(NAME)`. Nothing here touches a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

FigureFactory = Callable[[], go.Figure]
FIGURES: dict[str, FigureFactory] = {}


def figure(name: str) -> Callable[[FigureFactory], FigureFactory]:
    """Register a figure factory under `name`, the name pages and notebooks use."""

    def register(factory: FigureFactory) -> FigureFactory:
        FIGURES[name] = factory
        return factory

    return register


def build(name: str) -> go.Figure:
    if name not in FIGURES:
        raise KeyError(f"no figure named {name!r}; known figures: {', '.join(sorted(FIGURES))}")
    return FIGURES[name]()


def figure_html(name: str) -> str:
    """The figure as an HTML fragment for a site page: no plotly.js (the site serves it), no MathJax."""
    return build(name).to_html(
        full_html=False, include_plotlyjs=False, include_mathjax=False, div_id=f"figure-{name}"
    )


def show(fig: go.Figure) -> None:
    """Display `fig` in a notebook as plotly JSON (for Jupyter) and as HTML (for the site's nbconvert)."""
    from IPython.display import display

    html = fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False)
    display({"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": html}, raw=True)


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


# --- measured figures -------------------------------------------------------------------------

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

# One colour per provider across every figure, so a reader can follow a line from chart to chart.
PROVIDER_COLOURS = {
    "eager": "#7f7f7f",
    "naive-triton": "#d62728",
    "sdpa-default": "#1f77b4",
    "sdpa-flash": "#1f77b4",
    "sdpa-efficient": "#9467bd",
    "sdpa-cudnn": "#2ca02c",
    "sdpa-math": "#8c564b",
}


def load_data(name: str) -> dict:
    """A committed benchmark file, e.g. `load_data("ch02_sweep")` reads data/ch02_sweep.json."""
    return json.loads((DATA_DIR / f"{name}.json").read_text())


def provenance_line(data: dict) -> str:
    p = data["provenance"]
    return (
        f"{p['gpu']} · torch {p['torch']} · triton {p['triton']} · CUDA {p['cuda']} · "
        f"{p['date_utc'][:10]} · commit {p['git_commit'][:8]} · <i>{p['command'].split(' --out')[0]}</i>"
    )


def _layout(fig: go.Figure, data: dict, title: str) -> go.Figure:
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{provenance_line(data)}</sup>"),
        template="plotly_white",
        hovermode="x unified",
        legend=dict(orientation="h", yanchor="top", y=-0.18),
        margin=dict(t=90),
    )
    return fig


def _ok_rows(data: dict, **match) -> list[dict]:
    return [r for r in data["results"] if r["status"] == "ok" and all(r[k] == v for k, v in match.items())]


def _providers(data: dict) -> list[str]:
    return list(dict.fromkeys(r["provider_key"] for r in data["results"]))


def _label(data: dict, key: str) -> str:
    return next(r["provider"] for r in data["results"] if r["provider_key"] == key)


def _live_traces(fig: go.Figure, live: dict | None, y_of, **subplot) -> None:
    """Overlay the reader's own measurements (dashed, hollow markers) on the recorded ones."""
    if live is None:
        return
    for key in _providers(live):
        rows = _ok_rows(live, provider_key=key)
        fig.add_trace(
            go.Scatter(
                x=[r["n"] for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                name=f"{_label(live, key)} — your GPU ({live['provenance']['gpu']})",
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
        eager = {r["n"]: r["ms"] for r in _ok_rows(source, provider_key="eager")}
        for key in _providers(source):
            if key == "eager":
                continue
            rows = [r for r in _ok_rows(source, provider_key=key) if r["n"] in eager]
            suffix = f" — your GPU ({source['provenance']['gpu']})" if dashed else ""
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in rows], y=[eager[r["n"]] / r["ms"] for r in rows], mode="lines+markers",
                name=f"{_label(source, key)}{suffix}",
                line=dict(color=PROVIDER_COLOURS.get(key), dash="dash" if dashed else "solid"),
                hovertemplate="%{y:.2f}× faster than eager",
            ))

    add(data, dashed=False)
    if live is not None:
        add(live, dashed=True)
    fig.add_hline(y=1.0, line=dict(color=PROVIDER_COLOURS["eager"], dash="dot"), annotation_text="eager")
    fig.update_xaxes(title="sequence length N")
    fig.update_yaxes(title="speedup over eager PyTorch (×)", rangemode="tozero")
    return _layout(fig, data, "Speedup over eager attention (B=1, H=32, d=128, fp16, causal)")


def _by_causal(data: dict, live: dict | None, y_of, y_title: str, title: str, log_y: bool) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("not causal", "causal"), shared_yaxes=True)
    for col, causal in ((1, False), (2, True)):
        for key in _providers(data):
            rows = _ok_rows(data, provider_key=key, causal=causal)
            fig.add_trace(
                go.Scatter(
                    x=[r["n"] for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                    name=_label(data, key), legendgroup=key, showlegend=col == 1,
                    line=dict(color=PROVIDER_COLOURS.get(key)),
                ),
                row=1, col=col,
            )
        if live is not None:
            live_causal = {**live, "results": [r for r in live["results"] if r["causal"] == causal]}
            _live_traces(fig, live_causal, y_of, row=1, col=col)
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
    return _layout(fig, data, title)


@figure("ch02-time-vs-n")
def time_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return _by_causal(data, live, lambda r: r["ms"], "time per forward (ms)",
                      "Forward time vs N (B=1, H=32, d=128, fp16)", log_y=True)


@figure("ch02-tflops-vs-n")
def tflops_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return _by_causal(data, live, lambda r: r["tflops"], "TFLOP/s (4·B·H·N²·d, ×½ causal)",
                      "Throughput vs N (B=1, H=32, d=128, fp16)", log_y=False)


@figure("ch02-memory-vs-n")
def memory_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch02_sweep")
    return _by_causal(data, live, lambda r: r["peak_extra_mib"], "peak extra memory of one call (MiB)",
                      "Memory vs N (B=1, H=32, d=128, fp16)", log_y=True)


def probability_heatmap(p, title: str) -> go.Figure:
    """One head's attention probabilities P (n_q × n_k) as a heatmap: masked keys show as 0."""
    fig = go.Figure(go.Heatmap(z=p.double().cpu().numpy(), colorscale="Viridis", colorbar=dict(title="P_ij")))
    fig.update_layout(title=title, template="plotly_white", height=420, width=520)
    fig.update_xaxes(title="key j")
    fig.update_yaxes(title="query i", autorange="reversed")
    return fig
