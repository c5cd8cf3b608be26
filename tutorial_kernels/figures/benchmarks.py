"""The Benchmarks page's figures (docs/benchmarks/index.md): every attention of the tutorial against torch's.

- `bench-tflops`: TFLOP/s against N, one line per provider, four dropdowns (pass, head dimension,
  causal, dtype) and the fp16 matmul ceiling of the same run;
- `bench-ratios`: our best kernel as a multiple of torch's cuDNN and flash backends, cell by cell,
  with the cells below the project's bars flagged (`tutorial_kernels.figures.ratios`): an HTML table
  per pass, in tabs.

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

from tutorial_kernels.figures.ratios import (
    ALL_PASSES,
    BAR_MIN_N,
    BARS,
    FRONT_DOOR_PASSES,
    HOW_TO_READ,
    PASSES,
    below_bar,
    ratio_rows,
    ratio_table,
)
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_optional, ok_rows, provider_keys, provider_label, run_ceiling
from tutorial_kernels.figures.runs import file_lines, file_runs, short_line
from tutorial_kernels.figures.style import (
    CEILING_LINE,
    SUBTITLE_WIDTH,
    add_notes,
    line_count,
    measured_layout,
    ordered_providers,
    provider_line,
    set_narrow,
    wrap,
)
from tutorial_kernels.figures.tables import Tabs


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


def _partial_note(passes: dict[str, dict]) -> str:
    """Which files hold a run that stopped before the end of its suite."""
    partial = [p for p, data in passes.items() if not data.get("complete", True)]
    return f"Partial run: the {' and '.join(partial)} file{'s' if len(partial) > 1 else ''} did not finish its suite." \
        if partial else ""


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
    return f"<br>measured {p['date_utc'][:10]}, commit {p['git_commit'][:7]}"


# --- TFLOP/s vs N, with menus -----------------------------------------------------------------

DIMS = ("pass", "head_dim", "causal", "dtype")
MENU_X = (0, 0.25, 0.5, 0.75)  # the four menus in a row, over the plot's width (two rows of two on a phone)
MENU_ROW_PX = 38
NOTE_LINE_PX = 17
WIDE_NOTE_WIDTH = 120  # characters per line of the note under the menus, on a laptop


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


def _state_menus(states: list[tuple], traces: dict[tuple, list[int]], notes: dict[tuple, int],
                 above_menus: int) -> list[dict]:
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
                              type="dropdown", direction="down", showactive=True, x=MENU_X[dim], xanchor="left",
                              y=1.0, yanchor="bottom", pad=dict(t=0, b=above_menus), font=dict(size=12)))
    return menus


def _narrow_menus(menus: list[dict], above_menus: int) -> dict:
    """On a narrow screen the four menus of each state stand in two rows of two: pass and head
    dimension above, causal and dtype below (relayout keys for `style.set_narrow`)."""
    out = {}
    for i in range(len(menus)):
        dim = i % len(DIMS)
        out[f"updatemenus[{i}].x"] = 0 if dim % 2 == 0 else 0.5
        out[f"updatemenus[{i}].pad.b"] = above_menus + (MENU_ROW_PX if dim < 2 else 0)
    return out


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
                name=provider_label(data, key), visible=s == states[0], line=provider_line(key),
                customdata=[[float(f"{r['ms']:.4g}"), round(r.get("peak_extra_mib", float("nan")), 1),
                             ("<br>" + config_text(r["config"]).replace("; ", "<br>")) if r.get("config") else "",
                             _run_text(data, r)] for r in rows],
                # a few short lines per point: the box stays narrower than a phone's screen
                hovertemplate="%{fullData.name}<br>N = %{x}: <b>%{y:.0f} TFLOP/s</b>, %{customdata[0]:.3f} ms<br>"
                              "peak %{customdata[1]:,.0f} MiB%{customdata[2]}%{customdata[3]}<extra></extra>",
            ))
        ceiling = run_ceiling(data, cell_rows)
        highest = max(highest, ceiling)
        traces[s].append(len(fig.data))
        fig.add_trace(go.Scatter(
            x=[10 ** x_range[0], 10 ** x_range[1]], y=[ceiling, ceiling], mode="lines", visible=s == states[0],
            name=f"fp16 matmul ceiling, same run: {ceiling:.0f} TFLOP/s", line=CEILING_LINE, hoverinfo="skip",
        ))
        failed = [r for r in data["results"] if r["status"] != "ok" and all(r[k] == v for k, v in cell.items())]
        by_provider: dict[str, list[str]] = {}
        for r in sorted(failed, key=lambda r: r["n"]):
            by_provider.setdefault(f"{r['provider']}: {r['status']}", []).append(str(r["n"]))
        items = [f"{what} at N = {', '.join(ns)}" for what, ns in by_provider.items()]
        measured = {r["provider_key"] for r in data["results"] if all(r[k] == v for k, v in cell.items())}
        items += [f"{provider_label(data, k)}: not measured in this cell" for k in ordered_providers(provider_keys(data)) if k not in measured]
        notes_text[s] = "not on the lines: " + "; ".join(items) if items else "every measured provider ran at every N shown"

    # One note per state, under the menus, shown with its state (the menus refer to the notes by index);
    # wrapped for a laptop's width, and for a phone's in the narrow layout, with room for the tallest.
    notes = {}
    wide_notes = {s: wrap(t, WIDE_NOTE_WIDTH) for s, t in notes_text.items()}
    narrow_notes = {s: wrap(t, SUBTITLE_WIDTH) for s, t in notes_text.items()}
    above_menus = 8 + NOTE_LINE_PX * max(line_count(t) for t in wide_notes.values())
    above_narrow = 8 + NOTE_LINE_PX * max(line_count(t) for t in narrow_notes.values())
    narrow = {}
    for s in states:
        notes[s] = len(fig.layout.annotations)
        fig.add_annotation(text=wide_notes[s], visible=s == states[0], xref="paper", yref="paper", x=0, y=1.0,
                           xanchor="left", yanchor="top", showarrow=False, align="left", yshift=above_menus - 6)
        narrow[f"annotations[{notes[s]}].text"] = narrow_notes[s]
        narrow[f"annotations[{notes[s]}].yshift"] = above_narrow - 6
    menus = _state_menus(states, traces, notes, above_menus)
    fig.update_layout(updatemenus=menus)
    add_notes(fig, _missing_note(passes), _partial_note(passes))
    fig.update_xaxes(type="log", range=x_range, tickvals=lengths, ticktext=[str(n) for n in lengths],
                     title="sequence length N (batch B = 16384 / N, heads H = 2048 / d)")
    fig.update_yaxes(title="TFLOP/s (4·B·H·N²·d, ×½ causal, ×2.5 backward)", range=[0, 1.08 * highest])
    above = above_menus + MENU_ROW_PX + 6
    measured_layout(fig, list(passes.items()), "Every attention of the tutorial against torch: throughput vs N",
                    height=600 + above, above=above)
    more = MENU_ROW_PX + above_narrow - above_menus  # a second row of menus, and the notes' extra lines
    return set_narrow(fig, **narrow, **_narrow_menus(menus, above_narrow),
                      **{"margin.t": fig.layout.margin.t + more, "+height": more})


# --- ratios -----------------------------------------------------------------------------------


@figure("bench-ratios")
def bench_ratios(fwd: dict | bool | None = None, bwd: dict | bool | None = None) -> Tabs:
    """Our best kernel as a multiple of torch's cuDNN and flash backends, cell by cell: one table per pass.

    Best kernel: the tuned FlashAttention-2 forward (chapter 5) and the FlashAttention-2 backward
    (chapter 6). Each ratio is TFLOP/s over TFLOP/s of the same cell (d, causal, dtype, N) in the same
    file; the forward table adds the teaching FlashAttention-2 and FlashAttention-1 where they ran.
    Our best kernel's ratios are checked against the project's bars (`BARS`, at N ≥ `BAR_MIN_N`): red
    with ▼ below the bar, green with ✓ at or above it, uncoloured where no bar applies. A tab picks the
    pass, and a checkbox shows only the cells below a bar.
    """
    passes = _pass_data(fwd, bwd)
    bars = ("Bars (at N ≥ {n}): forward ≥ {f64:.2f}× cuDNN at d = 64, ≥ {f128:.2f}× at d = 128, ≥ {ff:.2f}× torch "
            "flash; backward ≥ {bc:.2f}× cuDNN, ≥ {bf:.2f}× torch flash.").format(
        n=BAR_MIN_N, f64=BARS[("forward", "sdpa-cudnn")][64], f128=BARS[("forward", "sdpa-cudnn")][128],
        ff=BARS[("forward", "sdpa-flash")], bc=BARS[("backward", "sdpa-cudnn")], bf=BARS[("backward", "sdpa-flash")])
    notes = [HOW_TO_READ, bars] + [n for n in (_missing_note(passes), _partial_note(passes)) if n]
    return _ratio_tabs(passes, "Our best kernel as a multiple of torch's cuDNN and flash backends (ratio of TFLOP/s)",
                       notes)


def _ratio_tabs(passes: dict[str, dict], title: str, notes: list[str], tab_label=lambda p: p) -> Tabs:
    """One ratio table per pass (`ratio_rows`, `ratio_table`) in tabs, with the checkbox that keeps the cells
    below a bar, and every file's run line and provenance."""
    tabs, failing = [], []
    for p, data in passes.items():
        rows = ratio_rows(data, p)
        failing.append(f"{p}: {sum(below_bar(r, ALL_PASSES[p]['ours']) for r in rows)}")
        tabs.append((f"{tab_label(p)} ({len(rows)} cells)", ratio_table(data, p, rows)))
    return Tabs(tabs, title=title, subtitle=short_line([p for data in passes.values() for p in file_runs(data)]),
                notes=notes, provenance=[line for p, data in passes.items() for line in file_lines(data, p)],
                only=f"only the cells below a bar ({', '.join(failing)})")


@figure("bench-front-door")
def bench_front_door(fwd: dict | bool | None = None, bwd: dict | bool | None = None) -> Tabs:
    """`tutorial_kernels.flash_attention`, as a model calls it, as a multiple of torch's cuDNN and flash
    backends, cell by cell: one table per pass, the front door's bars flagged (`BARS`, at N ≥ `BAR_MIN_N`).
    Reads data/front_door_fwd.json and data/front_door_bwd.json (`python -m tutorial_kernels.bench
    front-door-fwd`, `front-door-bwd`); draws the passes that have a file."""
    given = {"front door, forward": fwd, "front door, backward": bwd}
    passes = {p: data for p, v in FRONT_DOOR_PASSES.items()
              if (data := load_optional(v["file"], given[p])) is not None}
    if not passes:
        raise FileNotFoundError("neither data/front_door_fwd.json nor data/front_door_bwd.json exists")
    f = BARS[("front door, forward", "sdpa-cudnn")]
    bars = (f"Bars (at N ≥ {BAR_MIN_N}): forward ≥ {f[64]:.2f}× cuDNN at d = 64, ≥ {f[128]:.2f}× at d = 128; "
            f"backward ≥ {BARS[('front door, backward', 'sdpa-cudnn')]:.2f}× cuDNN. Torch's flash backend "
            "has no bar here.")
    missing = "; ".join(f"{p} not measured yet (<i>python -m tutorial_kernels.bench {v['suite']}</i>)"
                        for p, v in FRONT_DOOR_PASSES.items() if p not in passes)
    notes = [HOW_TO_READ, bars] + [n for n in (missing, _partial_note(passes)) if n]
    return _ratio_tabs(passes, "tutorial_kernels.flash_attention as a multiple of torch's cuDNN and flash backends "
                       "(ratio of TFLOP/s)", notes, tab_label=lambda p: p.removeprefix("front door, "))
