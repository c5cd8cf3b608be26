"""Plotly figures for the chapters, built from committed data files (or from formulas).

The same function draws a figure in a notebook (`show(fig)`) and on a site page: a page names a
figure with an HTML comment on its own line, `<!-- figure: NAME -->`, and the site's build hook
replaces it with `figure_html(NAME)`. Nothing here touches a GPU.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Callable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.paths import data_file

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


# One colour per provider across every figure, so a reader can follow a line from chart to chart.
PROVIDER_COLOURS = {
    "eager": "#7f7f7f",
    "naive-triton": "#d62728",
    "sdpa-default": "#1f77b4",
    "sdpa-flash": "#1f77b4",
    "sdpa-efficient": "#9467bd",
    "sdpa-cudnn": "#2ca02c",
    "sdpa-math": "#8c564b",
    "online-triton": "#ff7f0e",
    "torch-matmul": "#2ca02c",
    "triton-matmul-pointers": "#d62728",
    "triton-matmul-descriptors": "#ff7f0e",
    "torch-softmax": "#2ca02c",
    "three-pass-softmax": "#d62728",
    "online-softmax": "#ff7f0e",
    "flash-v2-triton": "#ff7f0e",
    "flash-v2-tuned-pointers": "#e377c2",
    "flash-v2-tuned": "#d62728",
}


def load_data(name: str) -> dict:
    """A committed benchmark file, e.g. `load_data("ch02_sweep")` reads data/ch02_sweep.json."""
    return json.loads(data_file(f"{name}.json").read_text())


def provenance_line(data: dict) -> str:
    p = data["provenance"]
    line = (
        f"{p['gpu']} · torch {p['torch']} · triton {p['triton']} · CUDA {p['cuda']}<br>"
        f"{p['date_utc'][:10]} · commit {p['git_commit'][:8]} · <i>{p['command'].split(' --out')[0]}</i>"
    )
    for earlier in data.get("earlier_runs", []):  # a suite measured in parts (bench --append)
        e = earlier["provenance"]
        line += f"<br>and rows of {e['date_utc'][:10]} · commit {e['git_commit'][:8]} · <i>{e['command'].split(' --out')[0]}</i>"
    return line


def _layout(fig: go.Figure, data: dict, title: str) -> go.Figure:
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{provenance_line(data)}</sup>", font=dict(size=15)),
        template="plotly_white",
        hovermode="x unified",
        legend=dict(orientation="h", yanchor="top", y=-0.18),
        margin=dict(t=110),
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


# --- chapter 3 ----------------------------------------------------------------------------------


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

    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.14, row_heights=[0.55, 0.45])
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
        text = (f"<b>tile {t + 1} of {len(steps)}</b> (keys {st['start']}–{st['stop'] - 1}):  m = {st['m']:.3f}   "
                f"{alpha}   l = {st['l']:.3f}   o / l = {st['partial']:.4f}")
        slider_steps.append(dict(method="update", label=str(t + 1),
                                 args=[{"visible": visible}, {"annotations": _step_annotations(fig, text)}]))
    partials = [st["partial"] for st in steps] + [exact]
    spread = max(partials) - min(partials) or 1.0
    fig.update_yaxes(range=[min(partials) - 0.15 * spread, max(partials) + 0.15 * spread], row=2, col=1)
    fig.update_xaxes(range=[0.5, len(steps) + 0.5], row=2, col=1)
    fig.update_layout(
        sliders=[dict(active=0, steps=slider_steps, currentvalue=dict(prefix="tiles seen: "), y=-0.12, pad=dict(t=30))],
        annotations=_step_annotations(fig, slider_steps[0]["args"][1]["annotations"][-1]["text"]),
        template="plotly_white", height=720, margin=dict(t=140, b=40),
        title=dict(text=f"The online softmax, one tile at a time (N = {n}, tile = {block})<br>"
                        "<sup>float64 trace of tutorial_kernels.ch03_tiling_online_softmax.online_softmax_trace</sup>",
                   font=dict(size=15)),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"),
    )
    fig.update_xaxes(title="key j (orange: this tile, blue: seen, grey: not yet)", row=1, col=1)
    fig.update_yaxes(title="score s_j", row=1, col=1)
    fig.update_xaxes(title="tiles seen", dtick=1, row=2, col=1)
    fig.update_yaxes(title="o / l", row=2, col=1)
    return fig


def _step_annotations(fig: go.Figure, text: str) -> list:
    """The one line above the plots that describes the current step."""
    return [dict(text=text, xref="paper", yref="paper", x=0, y=1.12, showarrow=False, xanchor="left",
                          font=dict(size=12))]


def _provider_lines(fig: go.Figure, data: dict, x_of, y_of, keep=lambda row: True) -> None:
    """One line per provider through its measured (x, y) points, in the provider's colour."""
    for key in _providers(data):
        rows = [r for r in _ok_rows(data, provider_key=key) if keep(r)]
        fig.add_trace(go.Scatter(x=[x_of(r) for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                                 name=_label(data, key), line=dict(color=PROVIDER_COLOURS.get(key))))


@figure("ch03-matmul-tflops")
def matmul_tflops(data: dict | None = None) -> go.Figure:
    data = data or load_data("ch03_matmul")
    fig = go.Figure()
    _provider_lines(fig, data, lambda r: r["m"], lambda r: r["tflops"], keep=lambda r: r["m"] == r["n"] == r["k"])
    ceiling = data["ceilings"]["matmul_fp16_tflops"]
    fig.add_hline(y=ceiling, line=dict(color="black", dash="dot"),
                  annotation_text=f"torch.matmul 8192³ in the same run: {ceiling:.0f} TFLOP/s")
    sizes = sorted({r["m"] for r in data["results"] if r["m"] == r["n"] == r["k"]})
    fig.update_xaxes(title="M = N = K", type="log", tickvals=sizes, ticktext=[str(v) for v in sizes])
    fig.update_yaxes(title="TFLOP/s (2·M·N·K / time)", rangemode="tozero")
    return _layout(fig, data, "Tiled matmul, fp16, square sizes")


@figure("ch03-matmul-roofline")
def matmul_roofline(data: dict | None = None) -> go.Figure:
    """Every measured matmul on the roofline min(peak, bandwidth × intensity) of the same run."""
    data = data or load_data("ch03_matmul")
    bandwidth_tb = data["ceilings"]["copy_tb_per_s"]
    peak = data["ceilings"]["matmul_fp16_tflops"]
    intensities = [10 ** (i / 20) for i in range(0, 81)]  # 1 … 10⁴ FLOP/byte
    fig = go.Figure(go.Scatter(x=intensities, y=[min(peak, bandwidth_tb * i) for i in intensities], mode="lines",
                               name=f"roofline: {bandwidth_tb:.2f} TB/s × intensity, capped at {peak:.0f} TFLOP/s",
                               line=dict(color="black")))
    for key in _providers(data):
        rows = _ok_rows(data, provider_key=key)
        fig.add_trace(go.Scatter(
            x=[r["intensity_flop_per_byte"] for r in rows], y=[r["tflops"] for r in rows], mode="markers",
            name=_label(data, key), marker=dict(color=PROVIDER_COLOURS.get(key), size=9),
            text=[f"{r['m']}×{r['n']}×{r['k']}" for r in rows],
            hovertemplate="%{text}: %{y:.0f} TFLOP/s at %{x:.0f} FLOP/byte<extra></extra>",
        ))
    ridge = peak / bandwidth_tb
    fig.add_trace(go.Scatter(x=[ridge, ridge], y=[1, peak], mode="lines", line=dict(color="grey", dash="dot"),
                             name=f"ridge point: {ridge:.0f} FLOP/byte"))
    fig.update_xaxes(title="arithmetic intensity (FLOP per byte of HBM traffic, each operand once)", type="log",
                     range=[0, 4])
    fig.update_yaxes(title="TFLOP/s", type="log")
    fig.update_layout(hovermode="closest")
    return _layout(fig, data, "Matmul on the H100 roofline, fp16")


@figure("ch03-softmax-bandwidth")
def softmax_bandwidth(data: dict | None = None) -> go.Figure:
    data = data or load_data("ch03_softmax")
    fig = go.Figure()
    _provider_lines(fig, data, lambda r: r["cols"], lambda r: r["gb_per_s"])
    copy_gb = data["ceilings"]["copy_tb_per_s"] * 1000
    fig.add_hline(y=copy_gb, line=dict(color="black", dash="dot"), annotation_text=f"device copy: {copy_gb:.0f} GB/s")
    cols = sorted({r["cols"] for r in data["results"]})
    fig.update_xaxes(title="row length (columns); 4096 rows, fp32", type="log", tickvals=cols, ticktext=[str(c) for c in cols])
    fig.update_yaxes(title="GB/s (x read once + y written once)", rangemode="tozero")
    return _layout(fig, data, "Softmax bandwidth vs row length")


@figure("ch03-attention-tflops")
def attention_tflops_ch03(data: dict | None = None) -> go.Figure:
    data = data or load_data("ch03_attention")
    return _by_causal(data, None, lambda r: r["tflops"], "TFLOP/s (4·B·H·N²·d, ×½ causal)",
                      "Online-softmax attention vs the naive schedule (B=1, H=32, d=128, fp16)", log_y=False)


# --- chapter 1 ----------------------------------------------------------------------------------

PROVIDER_COLOURS.update({
    "torch-sum": "#2ca02c",
    "triton-sum": "#ff7f0e",
    "triton-sum-atomic": "#9467bd",
    "cuda-sum": "#d62728",
})
WAVE_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _strip_out(command: str) -> str:
    return command.split(" --out")[0]


def timeline_figure(run, *, title: str | None = None, fig: go.Figure | None = None, row: int | None = None,
                    col: int | None = None, showlegend: bool = True) -> go.Figure:
    """One lane per SM, one bar per program from its start to its end, coloured by wave.

    Programs that ran at the same time on one SM share its lane side by side (each gets a sub-lane);
    a program's wave is how many programs ran before it in its sub-lane, plus one. `run` is a
    `tutorial_kernels.instruments.timeline.Timeline` or its dict. Pass `fig`, `row`, `col` to draw into a subplot.
    """
    from tutorial_kernels.instruments.timeline import Timeline

    run = run if isinstance(run, Timeline) else Timeline.from_dict(run)
    lanes, waves = run.lanes(), run.waves()
    per_sm = max(lanes) + 1
    own = fig is None
    fig = fig or go.Figure()
    where = {} if row is None else dict(row=row, col=col)
    for w in sorted(set(waves)):
        ps = [p for p in range(run.n_programs) if waves[p] == w]
        fig.add_trace(go.Bar(
            orientation="h", base=[run.start_ns[p] / 1e3 for p in ps],
            x=[(run.end_ns[p] - run.start_ns[p]) / 1e3 for p in ps],
            y=[run.sm[p] - 0.5 + (lanes[p] + 0.5) / per_sm for p in ps], width=0.9 / per_sm,
            marker=dict(color=WAVE_COLOURS[(w - 1) % len(WAVE_COLOURS)], line=dict(width=0)),
            name=f"wave {w}", legendgroup=f"wave {w}", showlegend=showlegend,
            customdata=[[p, run.sm[p], run.start_ns[p] / 1e3, run.end_ns[p] / 1e3] for p in ps],
            hovertemplate="program %{customdata[0]} on SM %{customdata[1]}<br>"
                          "%{customdata[2]:.1f} → %{customdata[3]:.1f} µs<extra>wave " + str(w) + "</extra>",
        ), **where)
    fig.update_yaxes(range=[run.sm_count - 0.5, -0.5], title="SM", showgrid=False, zeroline=False, **where)
    fig.update_xaxes(title="µs since the first program started", rangemode="tozero", **where)
    if own:
        fig.update_layout(
            title=dict(text=title or run.label, font=dict(size=15)), template="plotly_white", barmode="overlay",
            height=520, bargap=0, legend=dict(orientation="h", yanchor="top", y=-0.14), hovermode="closest",
        )
    return fig


def _timelines(data: dict) -> dict:
    """The recorded runs by key: 'light-132' and '<scenario>-413' (3 · SMs + 17 programs)."""
    return {f"{r['meta']['scenario']}-{r['meta']['grid']}": r for r in data["timelines"]}


def _timeline_caption(data: dict) -> str:
    p = data["provenance"]
    return (f"{p['gpu']} · triton {p['triton']} · {p['date_utc'][:10]} · commit {p['git_commit'][:8]} · "
            f"<i>{_strip_out(p['command'])}</i>")


def _run_summary(r: dict) -> str:
    m = r["meta"]
    return (f"{m['grid']} programs of {m['num_warps']} warps, {m['regs_per_thread']} registers/thread, "
            f"{m['shared_bytes'] / 1024:.0f} KiB shared: at most {m['measured_per_sm']} at once per SM "
            f"(predicted {m['predicted_per_sm']}), {m['measured_waves']} wave(s)")


def _single_timeline(data: dict | None, key: str, title: str) -> go.Figure:
    data = data or load_data("ch01_timelines")
    run = _timelines(data)[key]
    fig = timeline_figure(run)
    fig.update_layout(title=dict(text=f"{title}<br><sup>{_run_summary(run)}<br>{_timeline_caption(data)}</sup>"),
                      margin=dict(t=120))
    return fig


@figure("ch01-timeline-132")
def timeline_132(data: dict | None = None) -> go.Figure:
    data = data or load_data("ch01_timelines")
    sms = data["device"]["sm_count"]
    return _single_timeline(data, f"light-{sms}", f"{sms} light programs: one per SM")


@figure("ch01-timeline-413")
def timeline_413(data: dict | None = None) -> go.Figure:
    data = data or load_data("ch01_timelines")
    sms = data["device"]["sm_count"]
    return _single_timeline(data, f"light-{3 * sms + 17}", f"3 × {sms} + 17 light programs")


@figure("ch01-timeline-footprints")
def timeline_footprints(data: dict | None = None) -> go.Figure:
    """The same 3 · SMs + 17 programs with four heavier footprints, side by side on one time axis."""
    data = data or load_data("ch01_timelines")
    grid = 3 * data["device"]["sm_count"] + 17
    runs = _timelines(data)
    keys = [k for k in ("registers", "warps-32", "shared-64k", "shared-128k") if f"{k}-{grid}" in runs]
    titles = []
    for k in keys:
        m = runs[f"{k}-{grid}"]["meta"]
        titles.append(f"{data['scenarios'][k]['label']}<br>{m['regs_per_thread']} regs/thread, "
                      f"{m['shared_bytes'] / 1024:.0f} KiB shared → ≤{m['measured_per_sm']} per SM, "
                      f"{m['measured_waves']} wave(s)")
    fig = make_subplots(rows=2, cols=2, subplot_titles=titles, shared_xaxes=True, vertical_spacing=0.16,
                        horizontal_spacing=0.07)
    waves_seen: set[int] = set()
    for i, k in enumerate(keys):
        run = runs[f"{k}-{grid}"]
        new = set(range(1, run["meta"]["measured_waves"] + 1)) - waves_seen
        waves_seen |= new
        before = len(fig.data)
        timeline_figure(run, fig=fig, row=i // 2 + 1, col=i % 2 + 1)
        for trace in fig.data[before:]:  # one legend entry per wave across the panels
            trace.showlegend = int(trace.name.split()[-1]) in new
    fig.update_annotations(font=dict(size=11))
    fig.update_layout(
        title=dict(text=f"{grid} programs, four heavier footprints<br><sup>{_timeline_caption(data)}</sup>",
                   font=dict(size=15)),
        template="plotly_white", barmode="overlay", bargap=0, height=860, margin=dict(t=150),
        legend=dict(orientation="h", yanchor="top", y=-0.07), hovermode="closest",
    )
    fig.update_xaxes(title=None, matches="x")  # one time scale for all four panels
    fig.update_xaxes(title="µs since the first program started", row=2)
    return fig


@figure("ch01-waves")
def waves_staircase(data: dict | None = None) -> go.Figure:
    """Launch duration against grid size, measured (solid) and predicted from the occupancy (dotted)."""
    data = data or load_data("ch01_timelines")
    spin_us = data["timelines"][0]["meta"]["spin_ns"] / 1e3
    fig = go.Figure()
    for i, (key, scenario) in enumerate(data["scenarios"].items()):
        rows = [r for r in data["sweep"] if r["scenario"] == key]
        if not rows:
            continue
        colour = WAVE_COLOURS[i % len(WAVE_COLOURS)]
        per_sm = rows[0]["predicted_per_sm"]
        fig.add_trace(go.Scatter(
            x=[r["grid"] for r in rows], y=[r["makespan_us"] for r in rows], mode="lines+markers",
            name=f"{scenario['label']} (≤{per_sm} per SM)", legendgroup=key, line=dict(color=colour, shape="linear"),
            hovertemplate="%{x} programs: %{y:.1f} µs<extra></extra>",
        ))
        fig.add_trace(go.Scatter(
            x=[r["grid"] for r in rows], y=[r["predicted_waves"] * spin_us for r in rows], mode="lines",
            name="predicted: waves × one program's time", legendgroup=key, showlegend=i == 0,
            line=dict(color=colour, dash="dot", shape="hv"), hoverinfo="skip",
        ))
    sms = data["device"]["sm_count"]
    top = max(r["grid"] for r in data["sweep"])
    fig.update_xaxes(title=f"programs in the grid (dotted grid lines: multiples of {sms} SMs)",
                     tickvals=list(range(sms, top + 1, sms)), showgrid=True, rangemode="tozero")
    fig.update_yaxes(title="launch duration (µs, first start to last end)", rangemode="tozero")
    fig.update_layout(
        title=dict(text=f"Waves: every program busy-waits {spin_us:.0f} µs<br><sup>{_timeline_caption(data)}</sup>",
                   font=dict(size=15)),
        template="plotly_white", height=560, legend=dict(orientation="h", yanchor="top", y=-0.16),
        margin=dict(t=100, b=170), hovermode="closest",
    )
    return fig


def _table(header: list[str], columns: list[list], title: str, height: int, widths: list[float] | None = None) -> go.Figure:
    fig = go.Figure(go.Table(
        header=dict(values=[f"<b>{h}</b>" for h in header], align="left", fill_color="#e8eaf6"),
        cells=dict(values=columns, align="left", height=26), columnwidth=widths,
    ))
    fig.update_layout(title=dict(text=title, font=dict(size=15)), height=height, margin=dict(l=10, r=10, t=90, b=10))
    return fig


@figure("ch01-occupancy")
def occupancy_table(data: dict | None = None) -> go.Figure:
    """Predicted and measured programs per SM for each recorded 3 · SMs + 17 launch."""
    data = data or load_data("ch01_timelines")
    grid = 3 * data["device"]["sm_count"] + 17
    runs = [r for r in data["timelines"] if r["meta"]["grid"] == grid]
    m = [r["meta"] for r in runs]
    limits = ["warps", "registers", "shared memory", "blocks"]
    columns = [
        [data["scenarios"][x["scenario"]]["label"] for x in m],
        [x["num_warps"] for x in m],
        [x["regs_per_thread"] for x in m],
        [f"{x['shared_bytes'] / 1024:.0f} KiB" for x in m],
        *[[x["limits"].get(name, "—") for x in m] for name in limits],
        [f"<b>{x['predicted_per_sm']}</b> ({', '.join(x['limited_by'])})" for x in m],
        [f"<b>{x['measured_per_sm']}</b>" for x in m],
        [f"{x['predicted_waves']} / {x['measured_waves']}" for x in m],
    ]
    header = ["footprint", "warps", "regs / thread", "shared", *[f"fit by {n}" for n in limits],
              "predicted per SM", "measured", "waves: pred. / meas."]
    return _table(header, columns, f"Occupancy of {grid}-program launches: the calculation against the timeline"
                  f"<br><sup>{_timeline_caption(data)}</sup>", 120 + 50 * len(m) + 50,
                  widths=[3.2, 1, 1.1, 1.1, 1, 1.1, 1.1, 1, 1.8, 1.1, 1.3])


@figure("ch01-device")
def device_table(data: dict | None = None) -> go.Figure:
    """The GPU's limits as the CUDA driver reports them, from the data file of the same run."""
    data = data or load_data("ch01_timelines")
    d = data["device"]
    kib = lambda b: f"{b / 1024:,.0f} KiB"  # noqa: E731
    rows = [
        ("streaming multiprocessors (SMs)", f"{d['sm_count']}", "independent processors; each runs whole thread blocks"),
        ("compute capability", f"{d['compute_capability_major']}.{d['compute_capability_minor']}", "the architecture generation (9.0 = Hopper)"),
        ("warp size", f"{d['warp_size']} threads", "threads that issue one instruction together"),
        ("threads per SM, at most", f"{d['max_threads_per_sm']:,} ({d['warps_per_sm']} warps)", "resident at once; the warp schedulers pick among them"),
        ("thread blocks per SM, at most", f"{d['max_blocks_per_sm']}", "even tiny blocks cannot exceed this"),
        ("threads per block, at most", f"{d['max_threads_per_block']:,}", f"{d['max_threads_per_block'] // d['warp_size']} warps; Triton's num_warps ≤ this / 32"),
        ("32-bit registers per SM", f"{d['registers_per_sm']:,} ({d['registers_per_sm'] * 4 // 1024} KiB)", "split among the resident threads"),
        ("registers per block, at most", f"{d['max_registers_per_block']:,}", ""),
        ("shared memory per SM", kib(d["shared_memory_per_sm_bytes"]), "split among the resident blocks"),
        ("shared memory per block, at most", kib(d["shared_memory_per_block_optin_bytes"]), "after opting in; 48 KiB without"),
        ("shared memory reserved per block", f"{d['reserved_shared_memory_per_block_bytes']:,} bytes", "taken by the driver from every resident block"),
        ("L2 cache", f"{d['l2_cache_bytes'] / 2**20:.0f} MiB", "shared by all SMs; sits in front of HBM"),
        ("HBM", f"{d['total_memory_bytes'] / 2**30:.1f} GiB", "the GPU's main memory"),
        ("HBM bandwidth from clock × bus width", f"{d['hbm_bandwidth_from_clock_tb_per_s']:.2f} TB/s",
         f"2 × {d['memory_clock_khz'] / 1e3:,.0f} MHz × {d['memory_bus_width_bits']:,} bits / 8; a datasheet figure"),
        ("SM clock (typical)", f"{d['sm_clock_khz'] / 1e3:,.0f} MHz", ""),
    ]
    return _table(["property", "value", "what it limits"], [list(c) for c in zip(*rows)],
                  f"{d['name']}, as the CUDA driver reports it<br><sup>{_timeline_caption(data)}</sup>",
                  110 + 27 * len(rows) + 40, widths=[2.2, 1.6, 3])


@figure("ch01-compiled")
def compiled_table(data: dict | None = None) -> go.Figure:
    """What Triton decided when it compiled the reduction's partial-sum kernel (read from its PTX)."""
    data = data or load_data("ch01_timelines")
    facts = data["compiled_reduction"]
    rows = [
        ("n (a multiple of 16?)", [f"{f['n']} ({'yes' if f['n'] % 16 == 0 else 'no'})" for f in facts], "ours (the input)"),
        ("BLOCK, num_warps", [f"{f['BLOCK']}, {f['num_warps']} ({f['threads']} threads)" for f in facts], "ours"),
        ("elements per thread", [f["elements_per_thread"] for f in facts], "follows from the two above"),
        ("global loads per thread", [f"{f['global_loads']} × {'/'.join(f['global_load_widths'])}" for f in facts], "Triton: width from alignment"),
        ("registers per thread", [f["regs_per_thread"] for f in facts], "Triton and ptxas"),
        ("shared memory", [f"{f['shared_bytes']} bytes" for f in facts], "Triton"),
        ("warp shuffles (shfl.sync)", [f["warp_shuffles"] for f in facts], "Triton: inside each warp"),
        ("shared-memory stores, barriers", [f"{f['shared_stores']}, {f['barriers']}" for f in facts], "Triton: across warps"),
    ]
    columns = [[r[0] for r in rows]] + [[r[1][i] for r in rows] for i in range(len(facts))] + [[r[2] for r in rows]]
    return _table(["", *[f"n = {f['n']}" for f in facts], "decided by"], columns,
                  "What Triton compiled _partial_sums_kernel into (float32)<br>"
                  f"<sup>{_timeline_caption(data)}</sup>", 110 + 27 * len(rows) + 40, widths=[2.2, 1.5, 1.5, 2])


@figure("ch01-reduction-bandwidth")
def reduction_bandwidth(data: dict | None = None, live: dict | None = None, earlier: dict | None = None) -> go.Figure:
    """GB/s read by each sum against vector length, one panel per dtype, under the copy ceiling.

    `earlier` (by default data/ch01_reduction_earlier.json, an earlier run of the same suite) is drawn
    thin and faint behind the recording, to show which points repeat from run to run and which do not.
    """
    data = data or load_data("ch01_reduction")
    if earlier is None and data_file("ch01_reduction_earlier.json").exists():
        earlier = load_data("ch01_reduction_earlier")
    dtypes = list(dict.fromkeys(r["dtype"] for r in data["results"]))
    fig = make_subplots(rows=1, cols=len(dtypes), subplot_titles=dtypes, shared_yaxes=True)
    for col, dtype in enumerate(dtypes, start=1):
        if earlier is not None:
            p = earlier["provenance"]
            if col == 1:  # one grey legend entry stands for the faint lines of every provider
                fig.add_trace(go.Scatter(
                    x=[None], y=[None], mode="lines", line=dict(color="#999999", width=1.5, dash="dot"),
                    name=f"dotted, faint: an earlier run of the same suite ({p['date_utc'][:16].replace('T', ' ')} "
                         f"UTC, commit {p['git_commit'][:8]})", legendgroup="earlier",
                ), row=1, col=1)
            for key in _providers(earlier):
                rows = _ok_rows(earlier, provider_key=key, dtype=dtype)
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in rows], y=[r["gb_per_s"] for r in rows], mode="lines", opacity=0.45,
                    name=_label(earlier, key), legendgroup="earlier", showlegend=False,
                    line=dict(color=PROVIDER_COLOURS.get(key), width=1.5, dash="dot"),
                    hovertemplate=f"earlier run, {_label(earlier, key)}: " + "%{y:,.0f} GB/s<extra></extra>",
                ), row=1, col=col)
        for source, dashed in ((data, False), (live, True)):
            if source is None:
                continue
            for key in _providers(source):
                rows = _ok_rows(source, provider_key=key, dtype=dtype)
                suffix = f" — your GPU ({source['provenance']['gpu']})" if dashed else ""
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in rows], y=[r["gb_per_s"] for r in rows], mode="lines+markers",
                    name=_label(source, key) + suffix, legendgroup=key + suffix, showlegend=col == 1,
                    line=dict(color=PROVIDER_COLOURS.get(key), dash="dash" if dashed else "solid"),
                    marker=dict(symbol="circle-open" if dashed else "circle"),
                    hovertemplate="n = %{x:,}: %{y:,.0f} GB/s<extra></extra>",
                ), row=1, col=col)
    copy_gb = data["ceilings"]["copy_tb_per_s"] * 1000
    for col in range(1, len(dtypes) + 1):
        label = dict(annotation_text=f"device copy, same run: {copy_gb:,.0f} GB/s", annotation_position="bottom right")
        fig.add_hline(y=copy_gb, line=dict(color="black", dash="dot"), row=1, col=col, **(label if col == 1 else {}))
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(title="elements n", type="log", tickvals=[n for n in lengths if n != 1_000_003],
                     ticktext=[f"2<sup>{n.bit_length() - 1}</sup>" for n in lengths if n != 1_000_003])
    fig.update_yaxes(type="log", tickvals=[1, 10, 100, 1000, 3000], ticktext=["1", "10", "100", "1,000", "3,000"])
    fig.update_yaxes(title="GB/s (n · bytes per element, read once / time)", col=1)
    fig.update_layout(height=560, margin=dict(b=170), hovermode="closest")
    return _layout(fig, data, "Sum of n elements: bandwidth vs length")


# --- chapter 5 ----------------------------------------------------------------------------------

TEACHING_KERNELS = {"flash-v2-triton"}  # drawn dotted next to their tuned versions


def _ch05_cells(data: dict) -> list[tuple[int, bool, str]]:
    return sorted({(r["head_dim"], r["causal"], r["dtype"]) for r in data["results"]})


def _tflops_by_cell(data: dict, title: str) -> go.Figure:
    """TFLOP/s vs N, one panel per (head_dim, causal), one button per dtype, with the matmul ceiling."""
    head_dims = sorted({r["head_dim"] for r in data["results"]})
    dtypes = sorted({r["dtype"] for r in data["results"]})
    panels = [(d, c) for d in head_dims for c in (False, True)]
    fig = make_subplots(rows=len(head_dims), cols=2, shared_yaxes=True, vertical_spacing=0.3 / len(head_dims),
                        subplot_titles=[f"d = {d}, {'causal' if c else 'not causal'}" for d, c in panels])
    trace_dtypes = []
    for dtype in dtypes:
        for i, (d, causal) in enumerate(panels):
            for key in _providers(data):
                rows = _ok_rows(data, provider_key=key, head_dim=d, causal=causal, dtype=dtype)
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in rows], y=[r["tflops"] for r in rows], mode="lines+markers",
                    name=_label(data, key), legendgroup=key, showlegend=i == 0, visible=dtype == dtypes[0],
                    line=dict(color=PROVIDER_COLOURS.get(key), dash="dot" if key in TEACHING_KERNELS else "solid"),
                    hovertemplate="N = %{x}: %{y:.0f} TFLOP/s<extra>" + _label(data, key) + "</extra>",
                ), row=i // 2 + 1, col=i % 2 + 1)
                trace_dtypes.append(dtype)
    from tutorial_kernels.figures.benchmarks import _run_ceiling

    lengths = sorted({r["n"] for r in data["results"]})
    for dtype in dtypes:  # the ceiling of the run that measured this dtype (a file may hold several runs)
        ceiling = _run_ceiling(data, [r for r in data["results"] if r["dtype"] == dtype])
        for i in range(len(panels)):
            fig.add_trace(go.Scatter(
                x=[lengths[0], lengths[-1]], y=[ceiling, ceiling], mode="lines", line=dict(color="black", dash="dot"),
                name=f"fp16 matmul, same run: {ceiling:.0f}", legendgroup="ceiling", showlegend=i == 0,
                visible=dtype == dtypes[0], hovertemplate=f"fp16 matmul ceiling: {ceiling:.0f} TFLOP/s<extra></extra>",
            ), row=i // 2 + 1, col=i % 2 + 1)
            trace_dtypes.append(dtype)
    fig.update_layout(updatemenus=[dict(
        type="buttons", direction="right", x=1, y=1.0 + 0.5 / len(head_dims), xanchor="right",
        buttons=[dict(label=dt, method="update", args=[{"visible": [t == dt for t in trace_dtypes]}]) for dt in dtypes],
    )], height=380 * len(head_dims) + 200, hovermode="closest", margin=dict(t=170, b=140))
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths], title="sequence length N")
    fig.update_yaxes(title="TFLOP/s", rangemode="tozero", col=1)
    return _layout(fig, data, title)


@figure("ch05-tflops")
def fa2_tflops(data: dict | None = None) -> go.Figure:
    return _tflops_by_cell(data or load_data("ch05_fwd"), "Forward TFLOP/s vs N (B·N = 16384, H·d = 2048)")


@figure("ch06-bwd-tflops")
def backward_tflops(data: dict | None = None) -> go.Figure:
    return _tflops_by_cell(data or load_data("ch06_bwd"), "Backward TFLOP/s vs N (B·N = 16384, H·d = 2048)")


PROBE_VARIANTS = [  # (warp_specialize, lazy_rescale) → label and colour in the schedule probe
    ((False, False), "plain (best forced configuration)", "#ff7f0e"),
    ((True, False), "+ warp specialisation", "#17becf"),
    ((False, True), "+ lazy rescale (threshold 8)", "#bcbd22"),
    ((True, True), "+ both", "#7f7f7f"),
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
                             name=picked[cells[0]]["provider"], marker_color=PROVIDER_COLOURS[key],
                             hovertemplate="%{x}: %{y:.0f} TFLOP/s<extra>%{fullData.name}</extra>"))
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
                             hovertemplate="%{x}: %{y:.0f} TFLOP/s<br>%{customdata}<extra>" + label + "</extra>"))
    fig.update_yaxes(title="TFLOP/s (float16, forward)", rangemode="tozero")
    fig.update_layout(barmode="group", height=600, margin=dict(b=170, t=150))
    _layout(fig, data, "Warp specialisation and lazy rescaling, tried: each variant's best of up to 6 forced "
                       "configurations<br>(each timed once, in turn, before the harness took turns between providers)")
    fig.update_layout(hovermode="closest", legend=dict(y=-0.3))
    return fig


SPLIT_PROBE_COLOURS = {  # provider label in data/ch05_head_dim_split.json → bar colour
    "torch SDPA: cuDNN": PROVIDER_COLOURS["sdpa-cudnn"],
    "tuned, two blocks when they save columns": "#ff7f0e",
    "tuned, one padded block": "#c7c7c7",
    "torch SDPA: flash": PROVIDER_COLOURS["sdpa-flash"],
}


def _probe_bars(data: dict, colours: dict[str, str], title: str, bottom: int, legend_y: float) -> go.Figure:
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
            hovertemplate="%{x}: %{y:.0f} TFLOP/s, %{customdata:.2f}× cuDNN<extra>" + label + "</extra>"))
    fig.update_yaxes(title="TFLOP/s (bfloat16, forward)", rangemode="tozero")
    fig.update_layout(barmode="group", height=560, margin=dict(b=bottom, t=150))
    _layout(fig, data, title)
    fig.update_layout(hovermode="closest", legend=dict(y=legend_y))
    return fig


@figure("ch05-head-dim-split")
def head_dim_split(data: dict | None = None) -> go.Figure:
    """Head dimensions 80 and 96 as two column blocks against one block padded to 128, with cuDNN and
    torch flash in the same run; d = 128 (one block either way) as the control
    (data/ch05_head_dim_split.json, tools/probe_head_dim_split.py)."""
    return _probe_bars(data or load_data("ch05_head_dim_split"), SPLIT_PROBE_COLOURS,
                       "Head dimension 80 and 96: two column blocks (64 + 16, 64 + 32) against one padded to 128",
                       bottom=150, legend_y=-0.3)


HOPPER_PROBE_COLOURS = {  # provider key in tutorial_kernels.bench → bar colour in the Hopper probe's figure
    "sdpa-cudnn": PROVIDER_COLOURS["sdpa-cudnn"],
    "flash-v2-hopper": "#d62728",
    "flash-v2-tuned": "#ff7f0e",
    "sdpa-flash": PROVIDER_COLOURS["sdpa-flash"],
}


@figure("ch05-hopper")
def hopper_schedule(data: dict | None = None) -> go.Figure:
    """Chapter 5's Hopper kernel (FA3's schedule in Gluon) against cuDNN, torch flash and the tuned
    Triton kernel, head_dim 128, bfloat16 (data/ch05_hopper.json, tools/probe_hopper_schedule.py)."""
    from tutorial_kernels.bench import PROVIDERS

    return _probe_bars(data or load_data("ch05_hopper"),
                       {PROVIDERS[key].label: colour for key, colour in HOPPER_PROBE_COLOURS.items()},
                       "Head dimension 128 on an H100: FA3's schedule in Gluon against cuDNN and the Triton kernel",
                       bottom=170, legend_y=-0.32)


PREFILL_SHAPE_COLOURS = {  # provider label in data/ch05_hopper_prefill_shape.json → bar colour
    "Hopper kernel (ch. 5), as launched": "#d62728",
    "Hopper kernel, forced persistent": "#ff9896",
    "Hopper kernel, forced one program per item": "#8c564b",
    "FlashAttention-2 tuned, Triton (ch. 5)": "#ff7f0e",
    "torch SDPA, as transformers calls it": PROVIDER_COLOURS["sdpa-cudnn"],
}


@figure("ch05-hopper-prefill-shape")
def hopper_prefill_shape(data: dict | None = None) -> go.Figure:
    """Speed relative to cuDNN at the prefill models' attention shape (1 × 32 query heads, 8 key/value
    heads, d = 128, causal, bfloat16), GPU time through CUDA graphs, one group of bars per length
    (data/ch05_hopper_prefill_shape.json, tools/probe_hopper_prefill_shape.py)."""
    data = data or load_data("ch05_hopper_prefill_shape")
    lengths = sorted({r["n"] for r in data["results"]})
    fig = go.Figure()
    for label, colour in PREFILL_SHAPE_COLOURS.items():
        by_n = {r["n"]: r for r in data["results"] if r["provider"] == label}
        fig.add_trace(go.Bar(
            x=[f"N = {n}" for n in lengths], y=[by_n[n]["speed_vs_cudnn"] if n in by_n else None for n in lengths],
            customdata=[by_n[n]["ms"] * 1e3 if n in by_n else None for n in lengths], name=label,
            marker_color=colour, hovertemplate="%{x}: %{y:.3f}× cuDNN, %{customdata:.1f} µs<extra>" + label + "</extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color=PROVIDER_COLOURS["sdpa-cudnn"],
                  annotation_text="cuDNN", annotation_position="top left")
    fig.update_yaxes(title="speed relative to cuDNN (its time / ours)", rangemode="tozero")
    fig.update_layout(barmode="group", height=540, margin=dict(b=170, t=150))
    _layout(fig, data, "Prefill attention shape (32 query heads, 8 key/value heads, d = 128, causal) on an H100")
    fig.update_layout(hovermode="closest", legend=dict(y=-0.3))
    return fig


def _chapter_ratio_table(data: dict, pass_name: str, title: str) -> go.Figure:
    """The Benchmarks page's ratio table (bars flagged) for one pass, restricted to the cells the
    chapter's targets cover, N ≥ BAR_MIN_N."""
    from tutorial_kernels.figures.benchmarks import BAR_MIN_N, _ratio_table, ratio_rows

    rows = [r for r in ratio_rows(data, pass_name) if r["n"] >= BAR_MIN_N]
    fig = go.Figure(_ratio_table(data, pass_name, rows))
    fig.update_layout(height=min(34 * len(rows) + 260, 1600), margin=dict(t=150, l=10, r=10, b=10))
    return _layout(fig, data, title)


@figure("ch05-ratio-table")
def fa2_ratio_table(data: dict | None = None) -> go.Figure:
    """The tuned forward against cuDNN and torch flash (and the teaching kernel and FlashAttention-1 against
    them), N ≥ 4096, each cell flagged against its bar."""
    return _chapter_ratio_table(data or load_data("ch05_fwd"), "forward",
                                "Forward: our kernels as multiples of torch's cuDNN and flash backends, N ≥ 4096")


@figure("ch06-ratio-table")
def backward_ratio_table(data: dict | None = None) -> go.Figure:
    """Chapter 6's backward against cuDNN's and torch flash's, N ≥ 4096, flagged against the bars."""
    return _chapter_ratio_table(data or load_data("ch06_bwd"), "backward",
                                "Backward (dQ, dK, dV) as a multiple of torch's cuDNN and flash backends, N ≥ 4096")


@figure("ch06-training")
def training_curves(data: dict | None = None, window: int = 20) -> go.Figure:
    """Loss per step (moving average over `window` steps) of the GPT trained with each attention and
    seed, and each run's median step time."""
    data = data or load_data("ch06_training")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.72, 0.28], horizontal_spacing=0.1,
                        subplot_titles=[f"training loss (mean of {window} steps)", "median step time"])
    colours = {"torch": PROVIDER_COLOURS.get("sdpa-flash", "#1f77b4"), "tutorial": PROVIDER_COLOURS.get("flash-v2-tuned", "#d62728")}
    names = {"torch": "F.scaled_dot_product_attention", "tutorial": "this tutorial's flash_attention"}
    for run in data["runs"]:
        losses = run["losses"]
        smooth = [sum(losses[max(0, i - window + 1):i + 1]) / len(losses[max(0, i - window + 1):i + 1]) for i in range(len(losses))]
        label = f"{names[run['attention']]}, seed {run['seed']}"
        fig.add_trace(go.Scatter(x=list(range(1, len(losses) + 1)), y=smooth, mode="lines", name=label,
                                 line=dict(color=colours[run["attention"]], dash="solid" if run["seed"] == 0 else "dot"),
                                 hovertemplate="step %{x}: %{y:.3f}<extra>" + label + "</extra>"), row=1, col=1)
        fig.add_trace(go.Bar(x=[f"{run['attention']} s{run['seed']}"], y=[run["median_step_ms"]], showlegend=False,
                             marker_color=colours[run["attention"]], hovertemplate="%{y:.1f} ms<extra>" + label + "</extra>"),
                      row=1, col=2)
    c = data["config"]
    fig.update_xaxes(title="step", row=1, col=1)
    fig.update_yaxes(title="cross-entropy (nats per character)", row=1, col=1)
    fig.update_yaxes(title="ms per step", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=520, hovermode="closest", margin=dict(t=150, b=150))
    return _layout(fig, data, f"A {c['n_layer']}-layer GPT ({c['n_head']} heads of {c['n_embd'] // c['n_head']}, "
                              f"context {c['block_size']}, batch {c['batch_size']}, bf16 autocast)")


# --- chapter 4 ----------------------------------------------------------------------------------

PROVIDER_COLOURS.update({"flash-v1-triton": "#17becf"})
CH04_SCHEDULE_COLOURS = {"naive": PROVIDER_COLOURS["naive-triton"], "flash-v1": PROVIDER_COLOURS["flash-v1-triton"],
                         "flash-v1 causal": "#0b6e79", "flash-v2": PROVIDER_COLOURS["flash-v2-triton"],
                         "flash-v2 causal": "#a64d00"}


def _ch04_by_dim_and_causal(data: dict, live: dict | None, y_of, y_title: str, title: str, log_y: bool) -> go.Figure:
    """A 2 × 2 grid: head_dim down (64, 128), causal across; one line per provider."""
    dims = sorted({r["head_dim"] for r in data["results"]})
    titles = [f"d = {d}, {'causal' if c else 'not causal'}" for d in dims for c in (False, True)]
    fig = make_subplots(rows=len(dims), cols=2, subplot_titles=titles, shared_xaxes=True, shared_yaxes=True,
                        vertical_spacing=0.1, horizontal_spacing=0.05)
    for row, d in enumerate(dims, start=1):
        for col, causal in ((1, False), (2, True)):
            for key in _providers(data):
                rows = _ok_rows(data, provider_key=key, causal=causal, head_dim=d)
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                    name=_label(data, key), legendgroup=key, showlegend=row == 1 and col == 1,
                    line=dict(color=PROVIDER_COLOURS.get(key)),
                    customdata=[[r["batch"], r["heads"]] for r in rows],
                    hovertemplate="N = %{x}, B = %{customdata[0]}, H = %{customdata[1]}: %{y:.3g}<extra>"
                                  + _label(data, key) + "</extra>",
                ), row=row, col=col)
            if live is not None:
                picked = {**live, "results": [r for r in live["results"] if r["causal"] == causal and r["head_dim"] == d]}
                _live_traces(fig, picked, y_of, row=row, col=col)
    failed = [r for r in data["results"] if r["status"] != "ok"]
    if failed:
        note = "; ".join(f"{r['provider']}: {r['status']} at N={r['n']}, d={r['head_dim']}{' causal' if r['causal'] else ''}"
                         for r in failed)
        fig.add_annotation(text=f"missing points — {note}", xref="paper", yref="paper", x=0, y=-0.2,
                           showarrow=False, font=dict(size=11), xanchor="left")
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_xaxes(title="sequence length N (batch = 16384 / N, heads = 2048 / d)", row=len(dims))
    fig.update_yaxes(type="log" if log_y else "linear")
    fig.update_yaxes(title=y_title, col=1)
    fig.update_layout(height=820, margin=dict(b=150), hovermode="closest")
    return _layout(fig, data, title)


@figure("ch04-tflops-vs-n")
def ch04_tflops_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch04_sweep")
    return _ch04_by_dim_and_causal(data, live, lambda r: r["tflops"], "TFLOP/s (4·B·H·N²·d, ×½ causal)",
                                   "Forward throughput vs N, fp16, 16k tokens per batch, hidden size 2048", log_y=False)


@figure("ch04-time-vs-n")
def ch04_time_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch04_sweep")
    return _ch04_by_dim_and_causal(data, live, lambda r: r["ms"], "time per forward (ms)",
                                   "Forward time vs N, fp16, 16k tokens per batch, hidden size 2048", log_y=True)


@figure("ch04-memory-vs-n")
def ch04_memory_vs_n(data: dict | None = None) -> go.Figure:
    """Peak extra memory of one non-causal call, d = 64 and d = 128 side by side."""
    data = data or load_data("ch04_sweep")
    dims = sorted({r["head_dim"] for r in data["results"]})
    fig = make_subplots(rows=1, cols=len(dims), subplot_titles=[f"d = {d}, not causal" for d in dims], shared_yaxes=True)
    for col, d in enumerate(dims, start=1):
        for key in _providers(data):
            rows = _ok_rows(data, provider_key=key, causal=False, head_dim=d)
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in rows], y=[r["peak_extra_mib"] for r in rows], mode="lines+markers",
                name=_label(data, key), legendgroup=key, showlegend=col == 1, line=dict(color=PROVIDER_COLOURS.get(key)),
                hovertemplate="N = %{x}: %{y:,.0f} MiB<extra>" + _label(data, key) + "</extra>",
            ), row=1, col=col)
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(title="sequence length N", type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_yaxes(type="log")
    fig.update_yaxes(title="peak extra memory of one call (MiB, output included)", col=1)
    fig.update_layout(height=540, margin=dict(b=140), hovermode="closest")
    return _layout(fig, data, "Memory vs N: B·N = 16384 tokens, H·d = 2048, fp16")


def hbm_totals(row: dict, source: str) -> float:
    """Bytes of one configuration of data/ch04_hbm_bytes.json summed over its kernels:
    'dram' or 'l2' (measured), or 'model' (predicted)."""
    if source == "model":
        return sum(p["read"] + p["write"] for p in row["predicted"].values())
    return sum((k[f"{source}_read_bytes"] or 0) + (k[f"{source}_write_bytes"] or 0) for k in row["kernels"])


def _hbm_caption(data: dict, series: tuple[str, ...] = ("by-n", "by-block")) -> str:
    """Provenance of the run(s) that measured `series`: a file merged from several runs
    (`--merge`) keeps each earlier run's provenance under 'earlier_runs'."""
    runs = [run["provenance"] for run in data.get("earlier_runs", []) if set(series) & set(run["series"])]
    claimed = {name for run in data.get("earlier_runs", []) for name in run["series"]}
    if set(series) - claimed:
        runs.append(data["provenance"])
    return "<br>".join(
        f"{p['gpu']} · Nsight Compute {p.get('ncu', '').replace('Version ', '').split(' ')[0]} · triton {p['triton']} · "
        f"{p['date_utc'][:10]} · commit {p['git_commit'][:8]} · <i>{_strip_out(p['command'])}</i>" for p in runs)


def _hbm_vs_n(data: dict, lines: list[tuple[str, str, bool, str]], title: str) -> go.Figure:
    """Measured DRAM bytes (solid), L2 requests (dotted) and the IO model (dashed) against N, one
    panel per head_dim; `lines` names (series, schedule, causal, label) of data/ch04_hbm_bytes.json."""
    rows = [r for r in data["measurements"] if any(r["series"] == series for series, *_ in lines)]
    dims = sorted({r["head_dim"] for r in rows})
    fig = make_subplots(rows=1, cols=len(dims), shared_yaxes=True,
                        subplot_titles=[f"d = {d}, batch = 16384 / N, heads = {2048 // d}" for d in dims])
    for col, d in enumerate(dims, start=1):
        for series, schedule, causal, name in lines:
            picked = sorted((r for r in rows if r["series"] == series and r["schedule"] == schedule
                             and r["causal"] == causal and r["head_dim"] == d), key=lambda r: r["n"])
            if not picked:
                continue
            colour = CH04_SCHEDULE_COLOURS[schedule + (" causal" if causal else "")]
            blocks = f" ({picked[0]['block_m']}×{picked[0]['block_n']} tiles)" if "block_m" in picked[0] else ""
            for source, dash, symbol, label in (("dram", "solid", "circle", "measured DRAM"),
                                                ("l2", "dot", "circle-open", "requested from L2"),
                                                ("model", "dash", "x", "IO model")):
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in picked], y=[hbm_totals(r, source) / 1e9 for r in picked],
                    mode="lines+markers", name=f"{name}{blocks}: {label}", legendgroup=f"{schedule}{causal}{source}",
                    showlegend=col == 1, line=dict(color=colour, dash=dash), marker=dict(symbol=symbol, size=8),
                    hovertemplate="N = %{x}: %{y:.3g} GB<extra>" + f"{name}: {label}" + "</extra>",
                ), row=1, col=col)
    lengths = sorted({r["n"] for r in rows})
    fig.update_xaxes(title="sequence length N", type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_yaxes(type="log")
    fig.update_yaxes(title="GB read + written, all kernels of one forward", col=1)
    caption = _hbm_caption(data, tuple(dict.fromkeys(series for series, *_ in lines)))
    runs = caption.count("<br>") + 1  # one caption line per run that measured these series
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{caption}</sup>", font=dict(size=15)),
        template="plotly_white", height=660 + 20 * len(lines), legend=dict(orientation="h", yanchor="top", y=-0.16),
        margin=dict(t=90 + 20 * runs, b=260 + 20 * len(lines)), hovermode="closest",
    )
    return fig


@figure("ch04-hbm-vs-n")
def ch04_hbm_vs_n(data: dict | None = None) -> go.Figure:
    """Naive attention and FlashAttention-1: measured bytes against the IO model."""
    return _hbm_vs_n(data or load_data("ch04_hbm_bytes"),
                     [("by-n", "naive", False, "naive, 3 kernels (ch. 2)"),
                      ("by-n", "flash-v1", False, "FlashAttention-1"),
                      ("by-n", "flash-v1", True, "FlashAttention-1, causal")],
                     "HBM traffic of one forward, measured with Nsight Compute, against the IO model (fp16)")


@figure("ch05-hbm-vs-n")
def ch05_hbm_vs_n(data: dict | None = None) -> go.Figure:
    """Naive attention, FlashAttention-1 and FlashAttention-2 (teaching tiles): measured and modelled bytes."""
    return _hbm_vs_n(data or load_data("ch04_hbm_bytes"),
                     [("by-n", "naive", False, "naive, 3 kernels (ch. 2)"),
                      ("by-n", "flash-v1", False, "FlashAttention-1"),
                      ("fa2-by-n", "flash-v2", False, "FlashAttention-2"),
                      ("fa2-by-n", "flash-v2", True, "FlashAttention-2, causal")],
                     "HBM traffic of one forward: naive, FlashAttention-1 and FlashAttention-2 (fp16, Nsight Compute)")


@figure("ch04-hbm-vs-block")
def ch04_hbm_vs_block(data: dict | None = None) -> go.Figure:
    """FlashAttention-1's traffic against the K/V tile size B_c at one N: T_c = N / B_c passes over Q and O."""
    data = data or load_data("ch04_hbm_bytes")
    rows = [r for r in data["measurements"] if r["series"] == "by-block"]
    sweep = sorted((r for r in rows if r["block_m"] == 64), key=lambda r: r["block_n"])
    other = sorted((r for r in rows if r["block_m"] != 64), key=lambda r: r["block_m"])
    fig = go.Figure()
    for source, dash, symbol, label in (("dram", "solid", "circle", "measured DRAM"),
                                        ("l2", "dot", "circle-open", "requested from L2"),
                                        ("model", "dash", "x", "IO model")):
        fig.add_trace(go.Scatter(
            x=[r["block_n"] for r in sweep], y=[hbm_totals(r, source) / 1e9 for r in sweep], mode="lines+markers",
            name=f"B_r = 64: {label}", line=dict(color=CH04_SCHEDULE_COLOURS["flash-v1"], dash=dash),
            marker=dict(symbol=symbol, size=9), hovertemplate="B_c = %{x}: %{y:.3g} GB<extra>" + label + "</extra>",
        ))
    if other:
        fig.add_trace(go.Scatter(
            x=[r["block_n"] for r in other], y=[hbm_totals(r, "dram") / 1e9 for r in other], mode="markers+text",
            text=[f"B_r = {r['block_m']}" for r in other], textposition="middle right",
            name="other query tiles B_r: measured DRAM", marker=dict(color="#555", symbol="diamond", size=9),
            hovertemplate="B_c = %{x}, %{text}: %{y:.3g} GB<extra></extra>",
        ))
    r0 = rows[0]
    fig.update_xaxes(title="B_c = BLOCK_N, keys per K/V tile (T_c = N / B_c outer steps)", type="log",
                     tickvals=[r["block_n"] for r in sweep], ticktext=[str(r["block_n"]) for r in sweep])
    fig.update_yaxes(title="GB read + written (fills and kernel)", type="log")
    fig.update_layout(
        title=dict(text=f"FlashAttention-1's traffic against the key tile (N = {r0['n']}, d = {r0['head_dim']}, "
                        f"B = {r0['batch']}, H = {r0['heads']}, fp16)<br><sup>{_hbm_caption(data)}</sup>",
                   font=dict(size=15)),
        template="plotly_white", height=560, legend=dict(orientation="h", yanchor="top", y=-0.2),
        margin=dict(t=110, b=160), hovermode="closest",
    )
    return fig


@figure("ch04-bandwidth-vs-programs")
def ch04_bandwidth_vs_programs(hbm: dict | None = None, sweep: dict | None = None) -> go.Figure:
    """DRAM bytes measured by Nsight Compute divided by the time of the same configuration in the sweep,
    against the number of programs B·H: how fast FlashAttention-1 moves its bytes."""
    hbm = hbm or load_data("ch04_hbm_bytes")
    sweep = sweep or load_data("ch04_sweep")
    times = {(r["provider_key"], r["n"], r["head_dim"], r["causal"]): r["ms"] for r in _ok_rows(sweep)}
    fig = go.Figure()
    for schedule, key, causal, symbol, name in (("flash-v1", "flash-v1-triton", False, "circle", "FlashAttention-1"),
                                                ("flash-v1", "flash-v1-triton", True, "circle-open", "FlashAttention-1, causal"),
                                                ("naive", "naive-triton", False, "square", "naive, 3 kernels (ch. 2)")):
        for d, dash in ((64, "solid"), (128, "dot")):
            picked = sorted((r for r in hbm["measurements"] if r["series"] == "by-n" and r["schedule"] == schedule
                             and r["causal"] == causal and r["head_dim"] == d
                             and (key, r["n"], d, causal) in times), key=lambda r: r["batch"] * r["heads"])
            if not picked:
                continue
            fig.add_trace(go.Scatter(
                x=[r["batch"] * r["heads"] for r in picked],
                y=[hbm_totals(r, "dram") / (times[(key, r["n"], d, causal)] * 1e-3) / 1e12 for r in picked],
                mode="lines+markers", name=f"{name}, d = {d}", text=[f"N = {r['n']}" for r in picked],
                line=dict(color=CH04_SCHEDULE_COLOURS[schedule + (" causal" if causal else "")], dash=dash),
                marker=dict(symbol=symbol, size=9),
                hovertemplate="%{text}, B·H = %{x}: %{y:.2f} TB/s<extra>" + f"{name}, d = {d}" + "</extra>",
            ))
    copy = sweep["ceilings"]["copy_tb_per_s"]
    fig.add_hline(y=copy, line=dict(color="black", dash="dot"), annotation_text=f"device copy, same run: {copy:.2f} TB/s")
    sms = hbm["provenance"]["sm_count"]
    fig.add_trace(go.Scatter(x=[sms, sms], y=[0, copy * 1.05], mode="lines", line=dict(color="grey", dash="dash"),
                             name=f"one program per SM ({sms} SMs)", hoverinfo="skip"))
    fig.update_xaxes(title="programs in the grid, B·H (one per (batch, head))", type="log",
                     tickvals=[16, 32, 64, 128, 256, 512, 1024])
    fig.update_yaxes(title="TB/s (measured DRAM bytes / time)", rangemode="tozero")
    p = sweep["provenance"]
    fig.update_layout(
        title=dict(text="How fast FlashAttention-1 moves its bytes, against the number of programs"
                        f"<br><sup>bytes: {_hbm_caption(hbm)}<br>time: {provenance_line(sweep).split('<br>')[1]} "
                        f"({p['gpu']})</sup>", font=dict(size=15)),
        template="plotly_white", height=580, legend=dict(orientation="h", yanchor="top", y=-0.18),
        margin=dict(t=130, b=170), hovermode="closest",
    )
    return fig


@figure("ch04-tiles")
def ch04_tiles(data: dict | None = None) -> go.Figure:
    """TFLOP/s of each timed tile configuration, one panel per head dimension, one bar colour per N."""
    from tutorial_kernels.ch04_flash_v1 import gpu_blocks

    data = data or load_data("ch04_tiles")
    rows = data["tiles"]
    dims = sorted({r["head_dim"] for r in rows})
    fig = make_subplots(rows=1, cols=len(dims), subplot_titles=[f"d = {d}" for d in dims], horizontal_spacing=0.08)
    colours = ["#17becf", "#0b6e79", "#9edae5"]
    for col, d in enumerate(dims, start=1):
        chosen = gpu_blocks(d)
        for i, n in enumerate(sorted({r["n"] for r in rows if r["head_dim"] == d})):
            picked = [r for r in rows if r["head_dim"] == d and r["n"] == n]
            labels = [f"{r['block_m']}×{r['block_n']}, {r['num_warps']}w, {r['num_stages']}s"
                      + (" ◀" if chosen == dict(block_m=r["block_m"], block_n=r["block_n"], num_warps=r["num_warps"],
                                                 num_stages=r["num_stages"]) else "") for r in picked]
            fig.add_trace(go.Bar(
                x=[r["tflops"] for r in picked], y=labels, orientation="h", name=f"N = {n} (B·H = {picked[0]['batch'] * picked[0]['heads']})",
                marker_color=colours[i % len(colours)], legendgroup=str(n), showlegend=col == 1,
                hovertemplate="%{y}: %{x:.1f} TFLOP/s<extra>N = " + str(n) + "</extra>",
            ), row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig.update_xaxes(title="TFLOP/s (not causal, fp16)")
    p = data["provenance"]
    fig.update_layout(
        title=dict(text="FlashAttention-1 tile configurations: B_r × B_c, warps, pipeline stages (◀ the default)"
                        f"<br><sup>{p['gpu']} · triton {p['triton']} · {p['date_utc'][:10]} · commit {p['git_commit'][:8]} · "
                        f"<i>{p['command'].split(' --out')[0]}</i></sup>", font=dict(size=15)),
        template="plotly_white", barmode="group", height=620, margin=dict(t=110, l=10),
        legend=dict(orientation="h", yanchor="top", y=-0.12), hovermode="closest",
    )
    return fig


def _stacked_timelines(data: dict, titles: list[str], heading: str) -> go.Figure:
    """The runs of a timeline file one above the other, each on its own time axis; the legend comes
    from the run with the most waves, so that it names every colour."""
    from tutorial_kernels.instruments.timeline import Timeline

    runs = [Timeline.from_dict(r) for r in data["timelines"]]
    fig = make_subplots(rows=len(runs), cols=1, subplot_titles=titles, vertical_spacing=0.12)
    most_waves = max(range(len(runs)), key=lambda i: max(runs[i].waves()))
    for i, run in enumerate(runs):
        timeline_figure(run, fig=fig, row=i + 1, col=1, showlegend=i == most_waves)
    fig.update_layout(
        title=dict(text=f"{heading}<br><sup>{_timeline_caption(data)}</sup>", font=dict(size=15)),
        template="plotly_white", barmode="overlay", bargap=0, height=900, margin=dict(t=120),
        legend=dict(orientation="h", yanchor="top", y=-0.06), hovermode="closest",
    )
    return fig


@figure("ch04-timeline")
def ch04_timeline(data: dict | None = None) -> go.Figure:
    """Chapter 1's timeline of FlashAttention-1 launches: which SM ran each (batch, head), and when."""
    data = data or load_data("ch04_timeline")
    titles = [f"B·H = {r['meta']['grid']} programs (B = {r['meta']['batch']}, H = {r['meta']['heads']}): "
              f"{len(set(r['sm']))} of {r['sm_count']} SMs busy" for r in data["timelines"]]
    m = data["timelines"][0]["meta"]
    return _stacked_timelines(data, titles, f"FlashAttention-1 programs on the SMs (N = {m['n']}, d = {m['head_dim']}, "
                                            f"{m['dtype']}, {m['block_m']}×{m['block_n']} tiles)")


@figure("ch05-timeline")
def ch05_timeline(data: dict | None = None) -> go.Figure:
    """Chapter 1's timeline at B·H = 8: FlashAttention-1's programs (one per head) against
    FlashAttention-2's (one per query tile of each head), each on its own time axis."""
    from tutorial_kernels.instruments.timeline import Timeline

    data = data or load_data("ch05_timeline")
    runs = [Timeline.from_dict(r) for r in data["timelines"]]
    titles = [f"{run.label}: {run.n_programs} programs on {len(set(run.sm))} of {run.sm_count} SMs, "
              f"{(max(run.end_ns) - min(run.start_ns)) / 1e3:,.0f} µs" for run in runs]
    m = data["timelines"][0]["meta"]
    return _stacked_timelines(data, titles, f"The same attention (B = {m['batch']}, H = {m['heads']}, N = {m['n']}, "
                                            f"d = {m['head_dim']}, {m['dtype']}) as FlashAttention-1 and "
                                            "FlashAttention-2 launch it")


@figure("ch04-loop-order")
def ch04_loop_order(n: int = 512, block: int = 128) -> go.Figure:
    """The order in which one program visits the tiles (i, j) of S: FlashAttention-1 against chapter 3's order.

    Drawn from `flash_v1_schedule` (the kernel's loops, in Python), causal, for one (batch, head).
    """
    from tutorial_kernels.ch04_flash_v1 import flash_v1_schedule

    tiles = -(-n // block)
    v1 = flash_v1_schedule(n, n, block, block, causal=True)
    v2 = [(j, i) for i in range(tiles) for j in range(tiles) if j <= i]  # queries outside, keys inside
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "FlashAttention-1 (this chapter): K/V tile j outside, Q tile i inside",
        "Chapter 3 / FlashAttention-2: Q tile i outside, K/V tile j inside"))
    for col, visits in ((1, v1), (2, v2)):
        z = [[None] * tiles for _ in range(tiles)]
        for step, (j, i) in enumerate(visits, start=1):
            z[i][j] = step
        text = [["" if v is None else str(v) for v in row] for row in z]
        fig.add_trace(go.Heatmap(z=z, text=text, texttemplate="%{text}", colorscale="Blues", showscale=False,
                                 xgap=3, ygap=3, hovertemplate="Q tile i = %{y}, K/V tile j = %{x}: step %{z}<extra></extra>"),
                      row=1, col=col)
        fig.update_xaxes(title="K/V tile j", dtick=1, row=1, col=col)
        fig.update_yaxes(title="Q tile i", dtick=1, autorange="reversed", row=1, col=col)
    fig.update_layout(
        title=dict(text=f"Visit order of the tiles of S for one (batch, head), causal, N = {n}, {block}×{block} tiles"
                        "<br><sup>empty: above the diagonal, skipped. Left: every step reads and writes O_i, ℓ_i, m_i in HBM. "
                        "Right: O_i stays on chip along each row.</sup>", font=dict(size=15)),
        template="plotly_white", height=470, margin=dict(t=120),
    )
    return fig


# --- pages that gather several chapters ----------------------------------------------------------
# The Benchmarks and LLM-prefill pages keep their figures in modules of their own; importing them
# registers those figures here. When `mkdocs serve` reloads this module (a fresh, empty FIGURES),
# they are reloaded too, so that they register again.
for _module in ("tutorial_kernels.figures.benchmarks", "tutorial_kernels.figures.prefill"):
    if _module in sys.modules:
        importlib.reload(sys.modules[_module])
    else:
        importlib.import_module(_module)
