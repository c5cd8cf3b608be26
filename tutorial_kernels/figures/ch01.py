"""Chapter 1's figures (docs/chapters/01-gpu-hierarchy.md): where programs run on the GPU.

SM timelines and waves (data/ch01_timelines.json), the occupancy calculation against the timeline,
the device's limits, what Triton compiled the reduction into, and the reductions' bandwidth
(data/ch01_reduction.json).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data, ok_rows, provider_keys, provider_label
from tutorial_kernels.figures.style import (
    WAVE_COLOURS,
    add_notes,
    measured_layout,
    measured_table,
    provider_colour,
    provider_line,
    reference_line,
)
from tutorial_kernels.figures.tables import Table
from tutorial_kernels.figures.timelines import timeline_figure
from tutorial_kernels.paths import data_file


def _timelines(data: dict) -> dict:
    """The recorded runs by key: 'light-132' and '<scenario>-413' (3 · SMs + 17 programs)."""
    return {f"{r['meta']['scenario']}-{r['meta']['grid']}": r for r in data["timelines"]}


def _run_summary(r: dict) -> str:
    m = r["meta"]
    return (f"{m['grid']} programs of {m['num_warps']} warps, {m['regs_per_thread']} registers/thread, "
            f"{m['shared_bytes'] / 1024:.0f} KiB shared: at most {m['measured_per_sm']} at once per SM "
            f"(predicted {m['predicted_per_sm']}), {m['measured_waves']} wave(s)")


def _single_timeline(data: dict | None, key: str, title: str) -> go.Figure:
    data = data or load_data("ch01_timelines")
    run = _timelines(data)[key]
    fig = timeline_figure(run)
    add_notes(fig, _run_summary(run) + ".")
    return measured_layout(fig, data, title, height=520)


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
                      f"{m['shared_bytes'] / 1024:.0f} KiB shared<br>→ ≤{m['measured_per_sm']} per SM, "
                      f"{m['measured_waves']} wave(s)")
    fig = make_subplots(rows=2, cols=2, subplot_titles=titles, shared_xaxes=True, vertical_spacing=0.2,
                        horizontal_spacing=0.08)
    waves_seen: set[int] = set()
    for i, k in enumerate(keys):
        run = runs[f"{k}-{grid}"]
        new = set(range(1, run["meta"]["measured_waves"] + 1)) - waves_seen
        waves_seen |= new
        before = len(fig.data)
        timeline_figure(run, fig=fig, row=i // 2 + 1, col=i % 2 + 1)
        for trace in fig.data[before:]:  # one legend entry per wave across the panels
            trace.showlegend = int(trace.name.split()[-1]) in new
    fig.update_layout(barmode="overlay", bargap=0)
    fig.update_xaxes(title=None, matches="x")  # one time scale for all four panels
    fig.update_xaxes(title="µs since the first program started", row=2)
    return measured_layout(fig, data, f"{grid} programs, four heavier footprints", height=900)


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
            hovertemplate="%{fullData.name}<br>%{x} programs: %{y:.1f} µs<extra></extra>",
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
    return measured_layout(fig, data, f"Waves: every program busy-waits {spin_us:.0f} µs", height=640)


@figure("ch01-occupancy")
def occupancy_table(data: dict | None = None) -> Table:
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
    return measured_table(header, columns, data, f"Occupancy of {grid}-program launches: the calculation against the timeline")


@figure("ch01-device")
def device_table(data: dict | None = None) -> Table:
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
    return measured_table(["property", "value", "what it limits"], [list(c) for c in zip(*rows)], data,
                          f"{d['name']}, as the CUDA driver reports it")


@figure("ch01-compiled")
def compiled_table(data: dict | None = None) -> Table:
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
    return measured_table(["", *[f"n = {f['n']}" for f in facts], "decided by"], columns, data,
                          "What Triton compiled <code>_partial_sums_kernel</code> into (float32)")


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
            if col == 1:  # one grey legend entry stands for the faint lines of every provider
                fig.add_trace(go.Scatter(
                    x=[None], y=[None], mode="lines", line=dict(color="#999999", width=1.5, dash="dot"),
                    name="dotted, faint: an earlier run of the same suite", legendgroup="earlier",
                ), row=1, col=1)
            for key in provider_keys(earlier):
                rows = ok_rows(earlier, provider_key=key, dtype=dtype)
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in rows], y=[r["gb_per_s"] for r in rows], mode="lines", opacity=0.45,
                    name=provider_label(earlier, key), legendgroup="earlier", showlegend=False,
                    line=dict(color=provider_colour(key), width=1.5, dash="dot"),
                    hovertemplate=f"earlier run<br>{provider_label(earlier, key)}<br>" + "n = %{x:,}: %{y:,.0f} GB/s"
                                  "<extra></extra>",
                ), row=1, col=col)
        for source, dashed in ((data, False), (live, True)):
            if source is None:
                continue
            for key in provider_keys(source):
                rows = ok_rows(source, provider_key=key, dtype=dtype)
                suffix = f" — your GPU ({source['provenance']['gpu']})" if dashed else ""
                fig.add_trace(go.Scatter(
                    x=[r["n"] for r in rows], y=[r["gb_per_s"] for r in rows], mode="lines+markers",
                    name=provider_label(source, key) + suffix, legendgroup=key + suffix, showlegend=col == 1,
                    line=dict(color=provider_colour(key), dash="dot") if dashed else provider_line(key),
                    marker=dict(symbol="circle-open" if dashed else "circle"),
                    hovertemplate="%{fullData.name}<br>n = %{x:,}: %{y:,.0f} GB/s<extra></extra>",
                ), row=1, col=col)
    copy_gb = data["ceilings"]["copy_tb_per_s"] * 1000
    for col in range(1, len(dtypes) + 1):
        reference_line(fig, copy_gb, f"device copy, same run: {copy_gb:,.0f} GB/s" if col == 1 else None, log=True,
                       row=1, col=col)
    lengths = sorted({r["n"] for r in data["results"]})
    fig.update_xaxes(title="elements n", type="log", tickvals=[n for n in lengths if n != 1_000_003],
                     ticktext=[f"2<sup>{n.bit_length() - 1}</sup>" for n in lengths if n != 1_000_003])
    fig.update_yaxes(type="log", tickvals=[1, 10, 100, 1000, 3000], ticktext=["1", "10", "100", "1,000", "3,000"])
    fig.update_yaxes(title="GB/s (n · bytes per element, read once / time)", col=1)
    sources = [("", data)] + ([("drawn faint", earlier)] if earlier is not None else [])
    return measured_layout(fig, sources, "Sum of n elements: bandwidth vs length", height=620)
