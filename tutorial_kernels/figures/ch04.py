"""Chapter 4's figures (docs/chapters/04-flash-v1.md): FlashAttention-1.

The tiles' visit order, throughput, time and memory against N (data/ch04_sweep.json), HBM traffic
measured with Nsight Compute against the IO model (data/ch04_hbm_bytes.json; `hbm_totals`,
`hbm_vs_n`, which chapter 5 reuses), how fast the kernel moves its bytes, its tile configurations
(data/ch04_tiles.json) and its programs on the SMs (data/ch04_timeline.json).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.ch02 import live_traces
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data, ok_rows, provider_keys, provider_label
from tutorial_kernels.figures.runs import file_runs
from tutorial_kernels.figures.style import (
    SCHEDULE_COLOURS,
    TILE_COLOURS,
    add_notes,
    measured_layout,
    provider_line,
    reference_line,
    style_figure,
)
from tutorial_kernels.figures.timelines import stacked_timelines


def _by_dim_and_causal(data: dict, live: dict | None, y_of, y_title: str, title: str, log_y: bool) -> go.Figure:
    """A 2 × 2 grid: head_dim down (64, 128), causal across; one line per provider."""
    dims = sorted({r["head_dim"] for r in data["results"]})
    titles = [f"d = {d}, {'causal' if c else 'not causal'}" for d in dims for c in (False, True)]
    fig = make_subplots(rows=len(dims), cols=2, subplot_titles=titles, shared_xaxes=True, shared_yaxes=True,
                        vertical_spacing=0.1, horizontal_spacing=0.05)
    for row, d in enumerate(dims, start=1):
        for col, causal in ((1, False), (2, True)):
            for key in provider_keys(data):
                rows = ok_rows(data, provider_key=key, causal=causal, head_dim=d)
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in rows], y=[y_of(r) for r in rows], mode="lines+markers",
                    name=provider_label(data, key), legendgroup=key, showlegend=row == 1 and col == 1,
                    line=provider_line(key), customdata=[[r["batch"], r["heads"]] for r in rows],
                    hovertemplate="%{fullData.name}<br>N = %{x}, B = %{customdata[0]}, H = %{customdata[1]}: "
                                  "%{y:.3g}<extra></extra>",
                ), row=row, col=col)
            if live is not None:
                picked = {**live, "results": [r for r in live["results"] if r["causal"] == causal and r["head_dim"] == d]}
                live_traces(fig, picked, y_of, row=row, col=col)
    failed = [r for r in data["results"] if r["status"] != "ok"]
    if failed:
        add_notes(fig, "Missing points: " + "; ".join(
            f"{r['provider']}: {r['status']} at N = {r['n']}, d = {r['head_dim']}{', causal' if r['causal'] else ''}"
            for r in failed) + ".")
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_xaxes(title="sequence length N (batch = 16384 / N, heads = 2048 / d)", row=len(dims))
    fig.update_yaxes(type="log" if log_y else "linear")
    if log_y:
        fig.update_yaxes(dtick=1, tickformat=",~g")
    fig.update_yaxes(title=y_title, col=1)
    return measured_layout(fig, data, title, height=860)


@figure("ch04-tflops-vs-n")
def ch04_tflops_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch04_sweep")
    return _by_dim_and_causal(data, live, lambda r: r["tflops"], "TFLOP/s (4·B·H·N²·d, ×½ causal)",
                                   "Forward throughput vs N, fp16, 16k tokens per batch, hidden size 2048", log_y=False)


@figure("ch04-time-vs-n")
def ch04_time_vs_n(data: dict | None = None, live: dict | None = None) -> go.Figure:
    data = data or load_data("ch04_sweep")
    return _by_dim_and_causal(data, live, lambda r: r["ms"], "time per forward (ms)",
                                   "Forward time vs N, fp16, 16k tokens per batch, hidden size 2048", log_y=True)


@figure("ch04-memory-vs-n")
def ch04_memory_vs_n(data: dict | None = None) -> go.Figure:
    """Peak extra memory of one non-causal call, d = 64 and d = 128 side by side."""
    data = data or load_data("ch04_sweep")
    dims = sorted({r["head_dim"] for r in data["results"]})
    fig = make_subplots(rows=1, cols=len(dims), subplot_titles=[f"d = {d}, not causal" for d in dims], shared_yaxes=True)
    for col, d in enumerate(dims, start=1):
        for key in provider_keys(data):
            rows = ok_rows(data, provider_key=key, causal=False, head_dim=d)
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in rows], y=[r["peak_extra_mib"] for r in rows], mode="lines+markers",
                name=provider_label(data, key), legendgroup=key, showlegend=col == 1, line=provider_line(key),
                hovertemplate="%{fullData.name}<br>N = %{x}: %{y:,.0f} MiB<extra></extra>",
            ), row=1, col=col)
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(title="sequence length N", type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_yaxes(type="log", dtick=1, tickformat=",~g")
    fig.update_yaxes(title="peak extra memory of one call (MiB, output included)", col=1)
    return measured_layout(fig, data, "Memory vs N: B·N = 16384 tokens, H·d = 2048, fp16", height=600)


def hbm_totals(row: dict, source: str) -> float:
    """Bytes of one configuration of data/ch04_hbm_bytes.json summed over its kernels:
    'dram' or 'l2' (measured), or 'model' (predicted)."""
    if source == "model":
        return sum(p["read"] + p["write"] for p in row["predicted"].values())
    return sum((k[f"{source}_read_bytes"] or 0) + (k[f"{source}_write_bytes"] or 0) for k in row["kernels"])


def hbm_runs(data: dict, series: tuple[str, ...] = ("by-n", "by-block")) -> list[dict]:
    """Provenance of the run(s) that measured `series`: a file merged from several runs
    (`--merge`) keeps each earlier run's provenance under 'earlier_runs'."""
    runs = [run["provenance"] for run in data.get("earlier_runs", []) if set(series) & set(run["series"])]
    claimed = {name for run in data.get("earlier_runs", []) for name in run["series"]}
    if set(series) - claimed:
        runs.append(data["provenance"])
    return runs


def hbm_vs_n(data: dict, lines: list[tuple[str, str, bool, str]], title: str) -> go.Figure:
    """Measured DRAM bytes (solid), L2 requests (dotted) and the IO model (dashed) against N, one
    panel per head_dim; `lines` names (series, schedule, causal, label) of data/ch04_hbm_bytes.json."""
    rows = [r for r in data["measurements"] if any(r["series"] == series for series, *_ in lines)]
    dims = sorted({r["head_dim"] for r in rows})
    fig = make_subplots(rows=1, cols=len(dims), shared_yaxes=True,
                        subplot_titles=[f"d = {d}<br>batch = 16384 / N, heads = {2048 // d}" for d in dims])
    for col, d in enumerate(dims, start=1):
        for series, schedule, causal, name in lines:
            picked = sorted((r for r in rows if r["series"] == series and r["schedule"] == schedule
                             and r["causal"] == causal and r["head_dim"] == d), key=lambda r: r["n"])
            if not picked:
                continue
            colour = SCHEDULE_COLOURS[schedule + (" causal" if causal else "")]
            blocks = f" ({picked[0]['block_m']}×{picked[0]['block_n']} tiles)" if "block_m" in picked[0] else ""
            for source, dash, symbol, label in (("dram", "solid", "circle", "measured DRAM"),
                                                ("l2", "dot", "circle-open", "requested from L2"),
                                                ("model", "dash", "x", "IO model")):
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in picked], y=[hbm_totals(r, source) / 1e9 for r in picked],
                    mode="lines+markers", name=f"{name}{blocks}: {label}", legendgroup=f"{schedule}{causal}{source}",
                    showlegend=col == 1, line=dict(color=colour, dash=dash), marker=dict(symbol=symbol, size=8),
                    hovertemplate=f"{name}: {label}<br>" + "N = %{x}: %{y:.3g} GB<extra></extra>",
                ), row=1, col=col)
    lengths = sorted({r["n"] for r in rows})
    fig.update_xaxes(title="sequence length N", type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_yaxes(type="log", dtick=1, tickformat=",~g")
    fig.update_yaxes(title="GB read + written, all kernels of one forward", col=1)
    runs = hbm_runs(data, tuple(dict.fromkeys(series for series, *_ in lines)))
    return measured_layout(fig, data, title, runs=runs, height=620 + 22 * 3 * len(lines))


@figure("ch04-hbm-vs-n")
def ch04_hbm_vs_n(data: dict | None = None) -> go.Figure:
    """Naive attention and FlashAttention-1: measured bytes against the IO model."""
    return hbm_vs_n(data or load_data("ch04_hbm_bytes"),
                     [("by-n", "naive", False, "naive, 3 kernels (ch. 2)"),
                      ("by-n", "flash-v1", False, "FlashAttention-1"),
                      ("by-n", "flash-v1", True, "FlashAttention-1, causal")],
                     "HBM traffic of one forward, measured with Nsight Compute, against the IO model (fp16)")


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
            name=f"B_r = 64: {label}", line=dict(color=SCHEDULE_COLOURS["flash-v1"], dash=dash),
            marker=dict(symbol=symbol, size=9),
            hovertemplate=f"B_r = 64: {label}<br>" + "B_c = %{x}: %{y:.3g} GB<extra></extra>",
        ))
    if other:
        # Other query tiles, measured at one key tile each: points that (nearly) coincide share one
        # label, "B_r = 32, 128", under the line rather than one label per point printed on each other.
        fig.add_trace(go.Scatter(
            x=[r["block_n"] for r in other], y=[hbm_totals(r, "dram") / 1e9 for r in other], mode="markers",
            name="other query tiles B_r: measured DRAM", marker=dict(color="#555", symbol="diamond", size=9),
            text=[f"B_r = {r['block_m']}" for r in other],
            hovertemplate="%{text}, B_c = %{x}: %{y:.3g} GB<extra></extra>",
        ))
        groups: dict[tuple, list[dict]] = {}
        for r in other:
            groups.setdefault((r["block_n"], round(math.log10(hbm_totals(r, "dram")), 2)), []).append(r)
        for (block_n, _), members in groups.items():
            fig.add_annotation(x=math.log10(block_n), y=math.log10(hbm_totals(members[0], "dram") / 1e9),
                               text="B_r = " + ", ".join(str(r["block_m"]) for r in members), showarrow=True,
                               arrowhead=0, arrowcolor="#555", ax=0, ay=40, font=dict(color="#555"))
    r0 = rows[0]
    fig.update_xaxes(title="B_c = BLOCK_N, keys per K/V tile (T_c = N / B_c outer steps)", type="log",
                     tickvals=[r["block_n"] for r in sweep], ticktext=[str(r["block_n"]) for r in sweep])
    fig.update_yaxes(title="GB read + written (fills and kernel)", type="log", dtick=1, tickformat=",~g")
    return measured_layout(fig, data, f"FlashAttention-1's traffic against the key tile (N = {r0['n']}, "
                                      f"d = {r0['head_dim']}, B = {r0['batch']}, H = {r0['heads']}, fp16)",
                           runs=hbm_runs(data, ("by-block",)), height=600)


@figure("ch04-bandwidth-vs-programs")
def ch04_bandwidth_vs_programs(hbm: dict | None = None, sweep: dict | None = None) -> go.Figure:
    """DRAM bytes measured by Nsight Compute divided by the time of the same configuration in the sweep,
    against the number of programs B·H: how fast FlashAttention-1 moves its bytes."""
    hbm = hbm or load_data("ch04_hbm_bytes")
    sweep = sweep or load_data("ch04_sweep")
    times = {(r["provider_key"], r["n"], r["head_dim"], r["causal"]): r["ms"] for r in ok_rows(sweep)}
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
                line=dict(color=SCHEDULE_COLOURS[schedule + (" causal" if causal else "")], dash=dash),
                marker=dict(symbol=symbol, size=9),
                hovertemplate=f"{name}, d = {d}<br>" + "%{text}, B·H = %{x}: %{y:.2f} TB/s<extra></extra>",
            ))
    copy = sweep["ceilings"]["copy_tb_per_s"]
    reference_line(fig, copy, f"device copy, same run: {copy:.2f} TB/s", position="top left")
    sms = hbm["provenance"]["sm_count"]
    fig.add_trace(go.Scatter(x=[sms, sms], y=[0, copy], mode="lines", line=dict(color="grey", dash="dash"),
                             name=f"one program per SM ({sms} SMs)", hoverinfo="skip"))
    fig.update_xaxes(title="programs in the grid, B·H (one per (batch, head))", type="log",
                     tickvals=[16, 32, 64, 128, 256, 512, 1024])
    fig.update_yaxes(title="TB/s (measured DRAM bytes / time)", rangemode="tozero", range=[0, copy * 1.15])
    runs = [("bytes", p) for p in hbm_runs(hbm, ("by-n",))] + [("times", p) for p in file_runs(sweep)]
    return measured_layout(fig, None, "How fast FlashAttention-1 moves its bytes, against the number of programs",
                           runs=runs, height=640)


@figure("ch04-tiles")
def ch04_tiles(data: dict | None = None) -> go.Figure:
    """TFLOP/s of each timed tile configuration, one panel per head dimension, one bar colour per N."""
    from tutorial_kernels.ch04_flash_v1 import gpu_blocks

    data = data or load_data("ch04_tiles")
    rows = data["tiles"]
    dims = sorted({r["head_dim"] for r in rows})
    fig = make_subplots(rows=1, cols=len(dims), subplot_titles=[f"d = {d}" for d in dims], horizontal_spacing=0.2)
    colours = TILE_COLOURS
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
                hovertemplate="N = " + str(n) + "<br>%{y}: %{x:.1f} TFLOP/s<extra></extra>",
            ), row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig.update_xaxes(title="TFLOP/s (not causal, fp16)")
    fig.update_layout(barmode="group")
    return measured_layout(fig, data, "FlashAttention-1 tile configurations: B_r × B_c, warps, pipeline stages "
                                      "(◀ the default)", height=680, margin=dict(l=10))


@figure("ch04-timeline")
def ch04_timeline(data: dict | None = None) -> go.Figure:
    """Chapter 1's timeline of FlashAttention-1 launches: which SM ran each (batch, head), and when."""
    data = data or load_data("ch04_timeline")
    titles = [f"B·H = {r['meta']['grid']} programs (B = {r['meta']['batch']}, H = {r['meta']['heads']}): "
              f"{len(set(r['sm']))} of {r['sm_count']} SMs busy" for r in data["timelines"]]
    m = data["timelines"][0]["meta"]
    return stacked_timelines(data, titles, f"FlashAttention-1 programs on the SMs (N = {m['n']}, d = {m['head_dim']}, "
                                            f"{m['dtype']}, {m['block_m']}×{m['block_n']} tiles)")


@figure("ch04-loop-order")
def ch04_loop_order(n: int = 512, block: int = 128) -> go.Figure:
    """The order in which one program visits the tiles (i, j) of S: FlashAttention-1 against chapter 3's order.

    Drawn from `flash_v1_schedule` (the kernel's loops, in Python), causal, for one (batch, head).
    """
    from tutorial_kernels.ch04_flash_v1 import flash_v1_schedule

    tiles = -(-n // block)
    v1 = flash_v1_schedule(n, n, block, block, causal=True)
    v2 = [(j, i) for i in range(tiles) for j in range(tiles) if j <= i]  # queries outside, keys inside
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14, subplot_titles=(
        "FlashAttention-1 (this chapter):<br>K/V tile j outside, Q tile i inside",
        "Chapter 3 and FlashAttention-2:<br>Q tile i outside, K/V tile j inside"))
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
    add_notes(fig, "Empty: above the diagonal, skipped. Left: every step reads and writes O<sub>i</sub>, "
                   "ℓ<sub>i</sub>, m<sub>i</sub> in HBM. Right: O<sub>i</sub> stays on chip along each row.")
    return style_figure(fig, f"Visit order of the tiles of S for one (batch, head), causal, N = {n}, {block}×{block} tiles",
                        height=500)
