"""The LLM prefill page's figures (docs/llm-prefill.md), from data/prefill.json (written by
`python -m tutorial_kernels.integrations.prefill`), data/launch_overhead.json and
data/prefill_attention_in_model.json: speedup over eager, latency against prompt length, ours against
sdpa with its interval, one attention call's cost and the layers a launch runs on the CPU, and one layer's
attention inside the model.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.concepts import (INK, NOTE, SHARED_GREY, SIDE_MARGIN, Diagram, fixed_axes, legend_entry,
                                               narrow_diagram)
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data
from tutorial_kernels.figures.style import (
    IMPL_COLOURS,
    LABEL_WIDTH,
    LENGTH_COLOURS,
    add_notes,
    concept_layout,
    log_ticks,
    measured_layout,
    measured_table,
    set_narrow,
    wrap,
)
from tutorial_kernels.figures.tables import Table
from tutorial_kernels.integrations.prefill import compare_with_sdpa


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
    return "Not measured: " + "; ".join(gaps) + "." if gaps else ""


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
                x=labels, y=speedups, text=texts, textposition="outside", textangle=-90, textfont=dict(size=10),
                cliponaxis=False,
                name=str(n), legendgroup=str(n), showlegend=col == 1,
                marker_color=LENGTH_COLOURS[i % len(LENGTH_COLOURS)], customdata=hovers,
                hovertemplate="%{x}, N = " + str(n) + "<br>%{customdata}<extra></extra>",
            ), row=1, col=col)
    fig.add_hline(y=1.0, line=dict(color=IMPL_COLOURS["eager"], dash="dot"))
    fig.update_yaxes(title="prefill speedup over eager attention (×)", rangemode="tozero", col=1)
    add_notes(fig, _not_measured(data))
    fig.update_layout(barmode="group", legend=dict(title=dict(text="prompt length N:", side="top")))
    set_narrow(fig, **{"uniformtext.minsize": 10, "uniformtext.mode": "hide"})  # a phone: the values on hover only
    return measured_layout(fig, data, "Prefill speedup over eager attention, batch 1, bfloat16 (grouped like the "
                                      "ROCm blog's)", height=600)


@figure("prefill-latency")
def prefill_latency(data: dict | None = None) -> go.Figure:
    """Prefill latency against prompt length, one panel per model, one line per implementation.
    Points where an implementation ran out of memory are marked ✕ at the top of the panel."""
    data = data or load_data("prefill")
    rows = _rows(data)
    lengths = _lengths(data)
    models = data["models"]
    fig = make_subplots(rows=1, cols=len(models), horizontal_spacing=0.06,
                        subplot_titles=[f"{m['label']}<br>{m['params_billion']:.1f} B parameters"
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
                hovertemplate="%{fullData.name}<br>N = %{x}: %{y:.1f} ms<br>"
                              "peak %{customdata[0]:.1f} GiB, median of %{customdata[1]}"
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
                    customdata=[wrap(r.get("reason", r["status"]), LABEL_WIDTH) for r in failed],
                    hovertemplate=_impl_label(data, impl) + "<br>N = %{x}: %{customdata}<extra></extra>",
                ), row=1, col=col)
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_xaxes(title="prompt length N (tokens)")
    times = [r["ms"] for r in data["results"] if r["status"] == "ok"]
    ticks = log_ticks(min(times) * 0.8, max(times) * 2.2)  # 1, 2, 5 per decade: the default labels every digit
    fig.update_yaxes(type="log", tickvals=ticks, ticktext=[f"{t:,g}" for t in ticks])
    fig.update_yaxes(title="prefill latency, one forward (ms)", col=1)
    return measured_layout(fig, data, "Prefill latency vs prompt length, batch 1, bfloat16, random weights",
                           height=580)


SDPA_BAR_MIN_N = 2048  # issue 8: from this length on, our prefill must be no slower than sdpa's
VERDICT_MARKS = {"faster": ("✓ faster", "#c7e9c0"), "undecided": ("≈ undecided", "#f0f0f0"),
                 "slower": ("✗ slower", "#fcbba1"), "too few turns": ("? too few turns", "#fff7bc")}


@figure("prefill-vs-sdpa")
def prefill_vs_sdpa(data: dict | None = None) -> Table:
    """Our prefill latency over sdpa's, per model and length, by pairs of turns with a 95 % interval
    (`prefill.compare_with_sdpa`),
    against issue 8's bar: not slower at any length from SDPA_BAR_MIN_N on (below it, for reference)."""
    data = data or load_data("prefill")
    compared = compare_with_sdpa(data)
    lengths = _lengths(data)
    header = ["model", *[f"N = {n}" for n in lengths]]
    cells, colours = [[m["label"] for m in data["models"].values()]], [[None] * len(data["models"])]
    for n in lengths:
        column, fill = [], []
        for key in data["models"]:
            c = compared.get((key, n))
            if c is None:
                column.append("—")
                fill.append(None)
                continue
            if c["low"] is None:
                text = f"{c['ratio']:.3f}" if c["verdict"] is None else f"{c['ratio']:.4f}"
            else:  # four decimals: an end just below 1 must not print as 1.000 beside "faster"
                text = f"{c['ratio']:.4f}<br>[{c['low']:.4f}, {c['high']:.4f}]"
            mark, colour = VERDICT_MARKS.get(c["verdict"], ("", None))
            column.append(f"{text}<br>{mark}" if mark else text)
            fill.append(colour if n >= SDPA_BAR_MIN_N else None)
        cells.append(column)
        colours.append(fill)
    return measured_table(header, cells, data, "Prefill latency, ours / sdpa, by pairs of turns: median ratio "
                          "[95 % interval]", fills=colours, align=["left"] + ["right"] * len(lengths),
                          notes=[f"The bar: not slower from N = {SDPA_BAR_MIN_N} on (shaded cells). A ratio without "
                                 "an interval comes from a run that did not record each forward's time."])


@figure("prefill-launch-cost")
def prefill_launch_cost(data: dict | None = None) -> Table:
    """One layer's attention call as the model makes it, ours against torch SDPA: CPU cost per call
    and GPU time (data/launch_overhead.json): what a prefill pays per layer besides the kernel's speed."""
    data = data or load_data("launch_overhead")
    rows = data["measurements"]
    keys = list(dict.fromkeys((r["model"], r["impl"]) for r in rows))
    cpu_lengths = sorted({r["n"] for r in rows if "cpu_us" in r})
    lengths = sorted({r["n"] for r in rows if "gpu_ms" in r})
    cpu = {(r["model"], r["impl"], r["n"]): r["cpu_us"] for r in rows if "cpu_us" in r}
    gpu = {(r["model"], r["impl"], r["n"]): r["gpu_ms"] for r in rows if "gpu_ms" in r}
    shape = {r["model"]: f"{r['model']} ({r['heads']}/{r['kv_heads']} heads, d={r['head_dim']})" for r in rows}
    cells = [[shape[m] for m, _ in keys], [i for _, i in keys],
             *[[f"{cpu[(m, i, n)]:.0f}" if (m, i, n) in cpu else "—" for m, i in keys] for n in cpu_lengths],
             *[[f"{gpu[(m, i, n)] * 1e3:.0f}" if (m, i, n) in gpu else "—" for m, i in keys] for n in lengths]]
    header = ["attention shape of", "implementation", *[f"CPU µs per call, N = {n}" for n in cpu_lengths],
              *[f"GPU µs, N = {n}" for n in lengths]]
    return measured_table(header, cells, data, "One layer's attention call as the model makes it, bfloat16, causal, "
                          "batch 1", align=["left", "left"] + ["right"] * (len(cells) - 2))


@figure("prefill-attention-in-model")
def prefill_attention_in_model(data: dict | None = None) -> Table:
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
    header = ["N", "attention", "µs per call alone (L2 warm)", "µs per call in the model", "forward ms (median)",
              "forward / sdpa"]
    return measured_table(header, cells, data, "Mistral-7B prefill: one layer's attention alone and inside the "
                          "forward pass", align=["right", "left", "right", "right", "right", "right"])



LAUNCH_STAGES = [
    ("dispatch<br>(Python)", "#fde0dd", "Triton's dispatch, kernel[grid](…): it binds some thirty arguments, derives "
     "what the compiled kernel is specialised on (dtypes, 16-byte alignment, integers equal to 1 or divisible "
     "by 16), hashes that into a key and looks the kernel up."),
    ("launcher<br>(Python)", "#fde0dd", "The compiled kernel's launcher, its Python layer: scratch memory sized, "
     "launch metadata built for the hooks, and for each TMA descriptor its metadata read and its encoding "
     "asked for."),
    ("encode<br>descriptors", "#e8f1fa", "cuTensorMapEncodeTiled, in C: a 128-byte TMA descriptor per tensor read "
     "by the copy engine, for its address, shape, strides and tile."),
    ("C<br>launcher", "#e8f1fa", "Triton's launcher written in C: it parses the argument list and hands the launch "
     "to the driver (cuLaunchKernelEx)."),
]
LAUNCH_PATHS = [  # (label, about, per stage: None (skipped) or what the path does there)
    ("first call", "The first call with a signature (shapes, strides, dtypes, alignment, flags): every check, and "
     "Triton's whole dispatch. launch_plan.LaunchPlans remembers the compiled kernel, grid and arguments.",
     ["runs", "runs", "3 per call", "runs"]),
    ("remembered,<br>Triton's<br>launcher", "A later call with the same signature, while a profiler's launch hook is "
     "set or on a Triton whose launcher this package does not know: LaunchPlans.relaunch puts the new tensors "
     "into the remembered arguments and calls the compiled kernel's launcher.", [None, "runs", "3 per call", "runs"]),
    ("remembered,<br>direct", "A later call with the same signature otherwise: DirectLaunch keeps the C launcher's "
     "argument list ready and encodes a descriptor only for an address it has not seen.",
     [None, None, "once per<br>address", "runs"]),
]


@figure("prefill-launch-path")
def launch_path() -> go.Figure:
    """The layers a kernel launch runs on the CPU (Triton's dispatch, its launcher's Python, the TMA
    descriptors' encoding, the C launcher), and which of them a first call, a remembered relaunch and
    a direct relaunch run."""
    fig = go.Figure()
    dia = Diagram(fig)
    left, width, gap = 24, 17.5, 1.5
    rows = [(64, 84), (36, 56), (8, 28)]
    for s, (label, fill, about) in enumerate(LAUNCH_STAGES):
        x0 = left + s * (width + gap)
        fig.add_annotation(x=x0 + width / 2, y=93, text=f"<b>{label}</b>", showarrow=False,
                           font=dict(size=NOTE, color=INK))
        for (y0, y1), (path, _, does) in zip(rows, LAUNCH_PATHS):
            done = does[s]
            name = path.replace("<br>", " ")
            if done is None:
                dia.box(x0, y0, x0 + width, y1, "—", f"{name}: skips this. {about}", fill="white", line=SHARED_GREY)
            else:
                dia.box(x0, y0, x0 + width, y1, done, f"{name}: {done.replace('<br>', ' ')}. {about}", fill=fill)
    for (y0, y1), (path, about, _) in zip(rows, LAUNCH_PATHS):
        dia.box(0, y0, left - gap, y1, path, about, fill="white", line="white")
    fig.add_trace(legend_entry("Python", "#fde0dd"))
    fig.add_trace(legend_entry("C", "#e8f1fa"))
    add_notes(fig, "For chapter 7's Hopper kernel, which reads Q, K and V through TMA descriptors; chapter 5's "
                   "kernel with pointer loads has no descriptor to encode.")
    fixed_axes(fig, (0, 100), (0, 100))
    narrow_diagram(fig, **{"+height": 80})
    dia.finish()
    return concept_layout(fig, "What a launch runs on the CPU", (
        "A grid: three ways to launch (a first call, a remembered relaunch through Triton's launcher, a direct "
        "relaunch) against four layers (Triton's dispatch in Python, its launcher's Python layer, the encoding "
        "of TMA descriptors in C, the C launcher). The first call runs all four; the remembered relaunch skips "
        "the dispatch; the direct relaunch also skips the Python layer and encodes a descriptor once per address."),
        height=380, margin=SIDE_MARGIN)
