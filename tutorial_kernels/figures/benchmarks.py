"""The Benchmarks page's figures (docs/benchmarks.md): every attention of the tutorial against torch's.

- `bench-tflops`: TFLOP/s against N, one line per provider, four dropdowns (pass, head dimension,
  causal, dtype) and the fp16 matmul ceiling of the same run;
- `bench-ratios`: our best kernel as a multiple of torch's cuDNN and flash backends, cell by cell,
  with the cells below the project's bars flagged (`tutorial_kernels.figures.ratios`).

They read data/ch05_fwd.json (`python -m tutorial_kernels.bench ch05-fwd`, forward rows) and
data/ch06_bwd.json (`ch06-bwd`, backward rows, "mode": "bwd"), and work with whatever subset of cells
and providers a file holds; when one file is missing they draw the other pass only and say so. Each
function takes the data as optional arguments (a dict as read from the file; `False` for "this file
does not exist") so that a notebook or a test can draw them from other measurements. The page's
other figures belong to the chapters that show them first (`bench-memory` to chapter 6).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from tutorial_kernels.figures.ratios import BAR_MIN_N, BARS, PASSES, below_bar, ratio_rows, ratio_table
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_optional, ok_rows, provider_keys, provider_label, run_ceiling
from tutorial_kernels.figures.style import TORCH_PROVIDERS, bench_colour, ordered_providers, provenance_line


def _pass_data(fwd, bwd) -> dict[str, dict]:
    """{pass: data} for the passes that have a file; backward rows other than mode "bwd" are dropped."""
    out = {}
    fwd, bwd = load_optional(PASSES["forward"]["file"], fwd), load_optional(PASSES["backward"]["file"], bwd)
    if fwd is not None:
        out["forward"] = fwd
    if bwd is not None:
        out["backward"] = {**bwd, "results": [r for r in bwd["results"] if r.get("mode", "bwd") == "bwd"]}
    if not out:
        raise FileNotFoundError("neither data/ch05_fwd.json nor data/ch06_bwd.json exists")
    return out


def _missing_note(passes: dict[str, dict]) -> str:
    return "; ".join(f"{p} pass not measured yet (data/{v['file']}.json is missing: "
                     f"<i>python -m tutorial_kernels.bench {v['suite']}</i>)" for p, v in PASSES.items() if p not in passes)


def _provenance(passes: dict[str, dict]) -> str:
    """Each file's provenance (`provenance_line`), and how many earlier --append runs it holds."""
    lines = []
    for p, data in passes.items():
        earlier = len(data.get("earlier_runs", []))
        extra = f" · and {earlier} earlier run{'s' if earlier > 1 else ''} (--append)" if earlier else ""
        partial = "" if data.get("complete", True) else " · <b>partial run</b>"
        lines.append(f"<b>{p}</b>: {provenance_line(data)}{extra}{partial}")
    return "<br>".join(lines)


def config_text(config: dict | None) -> str:
    """An autotuner's recorded choice, short: '128×64, 4 warps, 3 stages, TMA'; nested choices (one per
    kernel of the backward) as 'dkdv: …; dq: …'."""
    if not config:
        return ""
    if all(isinstance(v, dict) for v in config.values()):
        return "; ".join(f"{k}: {config_text(v)}" for k, v in config.items())
    c = dict(config)
    parts = []
    if "BLOCK_M" in c and "BLOCK_N" in c:
        parts.append(f"{c.pop('BLOCK_M')}×{c.pop('BLOCK_N')}")
    if "num_warps" in c:
        parts.append(f"{c.pop('num_warps')} warps")
    if "num_stages" in c:
        parts.append(f"{c.pop('num_stages')} stages")
    if "USE_DESCRIPTORS" in c:
        parts.append("TMA" if c.pop("USE_DESCRIPTORS") else "pointers")
    parts += [f"{k}={v}" for k, v in c.items()]
    return ", ".join(parts)


def _run_text(data: dict, row: dict) -> str:
    if row.get("run") is None:
        return ""
    p = data["earlier_runs"][row["run"]]["provenance"]
    return f" · measured {p['date_utc'][:10]}, commit {p['git_commit'][:8]}"


def _wrap(items: list[str], width: int = 150) -> str:
    """Join `items` with '; ', breaking lines (<br>) before `width` characters of text."""
    lines, line = [], ""
    for item in items:
        if line and len(line) + len(item) + 2 > width:
            lines.append(line + ";")
            line = item
        else:
            line = f"{line}; {item}" if line else item
    return "<br>".join(lines + [line])


# --- TFLOP/s vs N, with menus -----------------------------------------------------------------

DIMS = ("pass", "head_dim", "causal", "dtype")


def _option_label(dim: str, value) -> str:
    return {"pass": lambda v: f"{v} pass", "head_dim": lambda v: f"d = {v}",
            "causal": lambda v: "causal" if v else "not causal", "dtype": str}[dim](value)


def _closest_state(states: list[tuple], here: tuple, dim: int, value) -> tuple:
    """The measured state with `value` in dimension `dim` that changes the fewest other choices: keep the
    pass first, then the head dimension (or the nearest one), then the dtype, then causal."""
    weight = {0: 8, 1: 4, 2: 1, 3: 2}

    def cost(s: tuple) -> float:
        c = sum(weight[i] for i in range(4) if i != dim and s[i] != here[i])
        return c + (0.1 * abs(math.log2(s[1]) - math.log2(here[1])) if dim != 1 else 0)

    return min((s for s in states if s[dim] == value), key=cost)


def _options(states: list[tuple], s: tuple, dim: int) -> list:
    """The choices of state s's menu for dimension `dim`: every pass; otherwise the values measured in s's pass."""
    if dim == 0:
        return [p for p in PASSES if any(t[0] == p for t in states)]
    return sorted({t[dim] for t in states if t[0] == s[0]}, key=lambda v: (str(type(v)), v))


def _state_menus(states: list[tuple], traces: dict[tuple, list[int]], notes: dict[tuple, int]) -> list[dict]:
    """Four dropdowns (pass, head dimension, causal, dtype) that act together, without JavaScript.

    A plotly button sets fixed arguments: it cannot read what the other menus show. So there is one set
    of four menus per state (a combination of the four choices), drawn at the same place, and only the
    current state's set is visible. A button of state s that picks state t hides s's traces, note and
    menus and shows t's; it also resets t's menus to t's choices, since plotly marks the clicked
    option active in the menu that is then hidden. An option that leads to a combination that was not
    measured goes to the nearest measured one (`_closest_state`). A line hidden by a click on its legend
    entry shows again after the next pick.
    """
    index = {s: i for i, s in enumerate(states)}
    menus = []
    for s in states:
        for dim, name in enumerate(DIMS):
            values = _options(states, s, dim)
            buttons = []
            for value in values:
                t = _closest_state(states, s, dim, value)
                shown = traces[t]
                hidden = [i for i in traces[s] if i not in shown]
                relayout = {f"annotations[{notes[s]}].visible": False, f"annotations[{notes[t]}].visible": True}
                for k in range(4):
                    relayout[f"updatemenus[{4 * index[s] + k}].visible"] = False
                for k in range(4):  # after the hiding: t may be s
                    relayout[f"updatemenus[{4 * index[t] + k}].visible"] = True
                    relayout[f"updatemenus[{4 * index[t] + k}].active"] = _options(states, t, k).index(t[k])
                buttons.append(dict(label=_option_label(name, value), method="update",
                                    args=[{"visible": [False] * len(hidden) + [True] * len(shown)}, relayout,
                                          hidden + shown]))
            menus.append(dict(buttons=buttons, active=values.index(s[dim]), visible=s == states[0],
                              type="dropdown", direction="down", showactive=True, x=0.23 * dim, xanchor="left",
                              y=1.0, yanchor="bottom", pad=dict(t=0, b=26), font=dict(size=12)))
    return menus


@figure("bench-tflops")
def bench_tflops(fwd: dict | bool | None = None, bwd: dict | bool | None = None) -> go.Figure:
    """TFLOP/s against N for every provider in the data, forward and backward, one cell at a time.

    Four dropdowns pick the cell: the pass, the head dimension d, causal or not, and the dtype. In each
    cell, one line per provider (ours solid, torch's dashed), on the FlashAttention-2 paper's shapes
    (B = 16384 / N, H = 2048 / d), and as a dotted line the fp16 matmul ceiling (torch.matmul
    8192³) measured in the run that measured the cell. Hovering shows each provider's time, TFLOP/s, peak
    extra memory and, for autotuned kernels, the configuration the autotuner chose. Runs that did not
    produce a number (out of memory, a backend that refuses the shape) are listed above the plot.
    TFLOP/s counts 4·B·H·N²·d for the forward, halved when causal, and 2.5 times that for the backward.
    """
    passes = _pass_data(fwd, bwd)
    states = sorted({(p, r["head_dim"], r["causal"], r["dtype"]) for p, data in passes.items() for r in data["results"]},
                    key=lambda s: (list(PASSES).index(s[0]), s[1], s[2], s[3] != "float16", s[3]))
    # the paper's default view: forward, d = 128, not causal, float16 (when measured)
    for preferred in (("forward", 128, False, "float16"), ("backward", 128, False, "float16")):
        if preferred in states:
            states.remove(preferred)
            states.insert(0, preferred)
            break
    lengths = sorted({r["n"] for data in passes.values() for r in data["results"]})
    x_range = [math.log10(lengths[0]) - 0.06, math.log10(lengths[-1]) + 0.06]
    fig = go.Figure()
    traces: dict[tuple, list[int]] = {}
    notes_text: dict[tuple, str] = {}
    highest = 0.0
    for s in states:
        p, d, causal, dtype = s
        data = passes[p]
        cell = dict(head_dim=d, causal=causal, dtype=dtype)
        traces[s] = []
        cell_rows = []
        for key in ordered_providers(provider_keys(data)):
            rows = sorted(ok_rows(data, provider_key=key, **cell), key=lambda r: r["n"])
            if not rows:
                continue
            cell_rows += rows
            highest = max(highest, *(r["tflops"] for r in rows))
            traces[s].append(len(fig.data))
            fig.add_trace(go.Scatter(
                # rounded past what the hover shows: the figure is inlined in the page
                x=[r["n"] for r in rows], y=[round(r["tflops"], 1) for r in rows], mode="lines+markers",
                name=provider_label(data, key), visible=s == states[0],
                line=dict(color=bench_colour(key), dash="dash" if key in TORCH_PROVIDERS else "solid"),
                customdata=[[float(f"{r['ms']:.4g}"), round(r.get("peak_extra_mib", float("nan")), 1),
                             (" · " + config_text(r["config"])) if r.get("config") else "", _run_text(data, r)]
                            for r in rows],
                hovertemplate="%{y:.0f} TFLOP/s · %{customdata[0]:.3f} ms · peak %{customdata[1]:,.0f} MiB"
                              "%{customdata[2]}%{customdata[3]}",
            ))
        ceiling = run_ceiling(data, cell_rows)
        highest = max(highest, ceiling)
        traces[s].append(len(fig.data))
        fig.add_trace(go.Scatter(
            x=[10 ** x_range[0], 10 ** x_range[1]], y=[ceiling, ceiling], mode="lines", visible=s == states[0],
            name=f"fp16 matmul ceiling (torch.matmul 8192³, same run): {ceiling:.0f} TFLOP/s",
            line=dict(color="black", dash="dot", width=1.5), hoverinfo="skip",
        ))
        failed = [r for r in data["results"] if r["status"] != "ok" and all(r[k] == v for k, v in cell.items())]
        by_provider: dict[str, list[str]] = {}
        for r in sorted(failed, key=lambda r: r["n"]):
            by_provider.setdefault(f"{r['provider']}: {r['status']}", []).append(str(r["n"]))
        items = [f"{what} at N = {', '.join(ns)}" for what, ns in by_provider.items()]
        measured = {r["provider_key"] for r in data["results"] if all(r[k] == v for k, v in cell.items())}
        items += [f"{provider_label(data, k)}: not measured in this cell" for k in ordered_providers(provider_keys(data)) if k not in measured]
        notes_text[s] = ("not on the lines: " + _wrap(items, 140)) if items else "every measured provider ran at every N shown"

    # one note per state, shown with its state; then the menus, which refer to the notes by index
    missing = _missing_note(passes)
    notes = {}
    for s in states:
        notes[s] = len(fig.layout.annotations)
        fig.add_annotation(text=notes_text[s], visible=s == states[0], xref="paper", yref="paper", x=0, y=1.0,
                           xanchor="left", yanchor="bottom", showarrow=False, align="left", font=dict(size=11))
    if missing:
        fig.add_annotation(text=missing, xref="paper", yref="paper", x=1, y=1.0, xanchor="right", yanchor="top",
                           showarrow=False, align="right", font=dict(size=11, color="#b71c1c"),
                           bgcolor="rgba(255,255,255,0.8)")
    fig.update_layout(updatemenus=_state_menus(states, traces, notes))
    fig.update_xaxes(type="log", range=x_range, tickvals=lengths, ticktext=[str(n) for n in lengths],
                     title="sequence length N (batch B = 16384 / N, heads H = 2048 / d)",
                     unifiedhovertitle=dict(text="N = %{x}"))
    fig.update_yaxes(title="TFLOP/s (4·B·H·N²·d, ×½ causal, ×2.5 backward)", range=[0, 1.08 * highest])
    provenance = _provenance(passes)
    top = 130 + 20 * provenance.count("<br>")  # the title's lines, the menus and the note above the plot
    fig.update_layout(
        title=dict(text="Every attention of the tutorial against torch: throughput vs N"
                        f"<br><sup>{provenance}</sup>", font=dict(size=15),
                   yref="container", y=1, yanchor="top", pad=dict(t=26)),
        height=570 + top, margin=dict(t=top, b=60), hovermode="x unified", template="plotly_white",
        legend=dict(orientation="h", yanchor="top", y=-0.14, x=0),
    )
    return fig


# --- ratios -----------------------------------------------------------------------------------


@figure("bench-ratios")
def bench_ratios(fwd: dict | bool | None = None, bwd: dict | bool | None = None) -> go.Figure:
    """Our best kernel as a multiple of torch's cuDNN and flash backends, cell by cell.

    Best kernel: the tuned FlashAttention-2 forward (chapter 5) and the FlashAttention-2 backward
    (chapter 6). Each ratio is TFLOP/s over TFLOP/s of the same cell (d, causal, dtype, N) in the same
    file; the forward table adds the teaching FlashAttention-2 and FlashAttention-1 where they ran.
    Our best kernel's ratios are checked against the project's bars (`BARS`, at N ≥ `BAR_MIN_N`): red
    with ▼ below the bar, green with ✓ at or above it, white where no bar applies. A dropdown picks the
    pass, and all cells or only those below a bar.
    """
    passes = _pass_data(fwd, bwd)
    tables, labels = [], []
    for p, data in passes.items():
        rows = ratio_rows(data, p)
        failing = [r for r in rows if below_bar(r, PASSES[p]["ours"])]
        for subset, label in ((rows, f"{p}: every cell ({len(rows)})"),
                              (failing, f"{p}: below a bar ({len(failing)})")):
            tables.append(ratio_table(data, p, subset))
            labels.append(label)
    fig = go.Figure(tables)
    for i, t in enumerate(fig.data):
        t.visible = i == 0
    missing = _missing_note(passes)
    fig.update_layout(updatemenus=[dict(
        type="dropdown", direction="down", x=0, xanchor="left", y=1.0, yanchor="bottom", pad=dict(b=6),
        buttons=[dict(label=label, method="update", args=[{"visible": [j == i for j in range(len(tables))]}])
                 for i, label in enumerate(labels)],
    )])
    bars = ("bars (at N ≥ {n}): forward ≥ {f64:.2f}× cuDNN at d = 64, ≥ {f128:.2f}× at d = 128, ≥ {ff:.2f}× torch flash; "
            "backward ≥ {bc:.2f}× cuDNN, ≥ {bf:.2f}× torch flash").format(
        n=BAR_MIN_N, f64=BARS[("forward", "sdpa-cudnn")][64], f128=BARS[("forward", "sdpa-cudnn")][128],
        ff=BARS[("forward", "sdpa-flash")], bc=BARS[("backward", "sdpa-cudnn")], bf=BARS[("backward", "sdpa-flash")])
    most = max(len(t.cells.values[0]) for t in tables)
    subtitle = f"{bars}{'<br>' + missing if missing else ''}<br>{_provenance(passes)}"
    top = 105 + 20 * subtitle.count("<br>")
    fig.update_layout(
        title=dict(text="Our best kernel as a multiple of torch's cuDNN and flash backends (ratio of TFLOP/s)"
                        f"<br><sup>{subtitle}</sup>",
                   font=dict(size=15), x=0, xanchor="left", yref="container", y=1, yanchor="top", pad=dict(t=26)),
        height=min(900, top + 70 + 31 * most), margin=dict(t=top, l=10, r=10, b=10), template="plotly_white",
    )
    return fig
