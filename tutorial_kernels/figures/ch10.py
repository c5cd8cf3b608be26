"""Chapter 10's figures (docs/chapters/10-context-parallel.md): one sequence across several GPUs.

- `concept-ring-steps`: the causal score matrix of one sequence cut into 2P chunks, and which GPU computes
  which block at each step of the ring (a menu picks the step, or all of them), drawn from
  `ch10_context_parallel.ring_blocks`, the rule the ring itself follows;
- `concept-ring-balance`: the work of each GPU at each step of a causal ring, with the sequence cut into P
  contiguous slices or zig-zag; a step lasts as long as its busiest GPU.

And from data/ch10_context_parallel.json (`python -m tutorial_kernels.bench.context_parallel`):

- `ch10-scaling`: one causal layer on 1, 2 and 4 GPUs — time, speed-up over one GPU, peak memory per GPU —
  for the ring, all-to-all and PyTorch's context_parallel;
- `ch10-overlap`: the ring's forward against its kernels alone and its hops alone.
"""

from __future__ import annotations

import plotly.graph_objects as go

from tutorial_kernels.ch10_context_parallel import ring_blocks, zigzag_chunks
from tutorial_kernels.figures.concepts import (GRID, NOTE, SKIPPED, discrete_scale, hover, legend_entry,
                                               narrow_diagram)
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data
from tutorial_kernels.figures.runs import file_lines, short_line
from tutorial_kernels.figures.style import (SIZES, WAVE_COLOURS, add_notes, concept_layout, log_ticks, measured_layout,
                                           set_alt, style_figure)
from tutorial_kernels.figures.tables import Table

NOT_NOW = "#dfe3ea"  # computed at another step


def ring_schedule(world: int) -> dict[tuple[int, int], tuple[int, int, bool]]:
    """(query chunk, key chunk) → (step, rank, causal) for every block of the causal score matrix that the
    zig-zag ring computes, in chunks of the sequence's 2·world; blocks above the diagonal are absent."""
    n = 2 * world * 4  # any length the ranks divide evenly: the blocks are the same
    chunks = [b - a for a, b in zigzag_chunks(n, world)]
    size = chunks[0]
    done = {}
    for step in range(world):
        for rank in range(world):
            source = (rank - step) % world
            q_chunks, kv_chunks = (rank, 2 * world - 1 - rank), (source, 2 * world - 1 - source)
            for rows, keys, causal in ring_blocks(rank, source, True, (size, size), (size, size)):
                for a in range(rows.start // size, rows.stop // size):
                    for b in range(keys.start // size, keys.stop // size):
                        qa, kb = q_chunks[a], kv_chunks[b]
                        if qa < kb:  # a causal square's upper corner: the late chunk's keys, no early query sees
                            continue
                        done[(qa, kb)] = (step, rank, causal and qa == kb)
    return done


@figure("concept-ring-steps")
def ring_steps(world: int = 4) -> go.Figure:
    """The 2P × 2P chunk blocks of a causal score matrix, coloured by the GPU computing them at the
    chosen step of the ring (a menu: each step, then all)."""
    chunks = 2 * world
    done = ring_schedule(world)
    fig = go.Figure()
    buttons = []
    colours = WAVE_COLOURS[:world]
    views = [*range(world), None]
    for k, step in enumerate(views):
        z, text, about = [], [], []
        for a in range(chunks):
            zr, tr, ar = [], [], []
            for b in range(chunks):
                if (a, b) not in done:
                    zr.append(world + 1)
                    tr.append("")
                    ar.append(hover(f"queries of chunk {a} × keys of chunk {b}: never computed, every key is later "
                                    "than every query"))
                    continue
                s, rank, causal = done[(a, b)]
                now = step is None or s == step
                zr.append(rank if now else world)
                tr.append(f"GPU {rank}" + (" ◣" if causal else "") if now else "")
                ar.append(hover(f"queries of chunk {a} × keys of chunk {b}: GPU {rank} at step {s}, with the keys "
                                f"and values of GPU {(rank - s) % world}" + (" (causal: the chunk's own keys)"
                                                                             if causal else "")))
            z.append(zr)
            text.append(tr)
            about.append(ar)
        fig.add_trace(go.Heatmap(
            z=z, x=list(range(chunks)), y=list(range(chunks)), zmin=0, zmax=world + 1,
            colorscale=discrete_scale([*colours, NOT_NOW, SKIPPED]), showscale=False, xgap=2, ygap=2,
            text=text, texttemplate="%{text}", textfont=dict(size=NOTE, color="white"),
            customdata=about, hovertemplate="%{customdata}<extra></extra>", visible=k == 0))
        visible = [False] * len(views) + [True] * (world + 1)
        visible[k] = True
        label = "all steps" if step is None else (
            f"step {step}: own keys" if step == 0 else f"step {step}: keys from {step} GPU{'s' if step > 1 else ''} back")
        buttons.append(dict(method="update", label=label, args=[{"visible": visible}]))
    for rank in range(world):
        fig.add_trace(legend_entry(f"GPU {rank} (chunks {rank} and {chunks - 1 - rank})", colours[rank]))
    fig.add_trace(legend_entry("computed at another step", NOT_NOW))
    fig.update_layout(plot_bgcolor=GRID, updatemenus=[dict(
        type="dropdown", direction="down", buttons=buttons, active=0, showactive=True, x=0, xanchor="left", y=1,
        yanchor="bottom", pad=dict(b=10), font=dict(size=NOTE))])
    add_notes(fig, f"A causal sequence cut into {chunks} chunks for {world} GPUs; GPU r holds chunks r and "
                   f"{chunks - 1} − r. At step t it holds the keys and values of GPU r − t and computes the blocks "
                   "coloured as it; ◣ marks a chunk against its own keys (a causal square). Drawn from "
                   "<code>ch10_context_parallel.ring_blocks</code>, the rule the ring follows.")
    narrow_diagram(fig, ticks=True, **{"margin.l": 56})
    concept_layout(fig, "The ring, step by step: who computes which block", (
        f"The causal score matrix of one sequence in {chunks} × {chunks} blocks of chunks, queries down, keys across. "
        f"A menu picks a step of the ring: at each step each of the {world} GPUs computes its blocks, two chunk "
        "rows' worth of work each, and after the last step every block on or below the diagonal has been "
        "computed exactly once."), height=600, above=40)
    fig.update_xaxes(showticklabels=True, tickvals=list(range(chunks)), range=[-0.5, chunks - 0.5],
                     title=dict(text="key chunk", font=dict(size=SIZES["axis_title"])))
    fig.update_yaxes(showticklabels=True, tickvals=list(range(chunks)), range=[chunks - 0.5, -0.5],
                     title=dict(text="query chunk", font=dict(size=SIZES["axis_title"])))
    return fig


def step_work(world: int, cut: str) -> list[list[float]]:
    """work[step][rank]: (query, key) pairs a GPU computes at a step of a causal ring over a sequence of
    2·world units, in units of one chunk × chunk block (a causal block counts ½). cut: "contiguous" (GPU r
    holds units 2r, 2r + 1) or "zig-zag" (units r and 2·world − 1 − r)."""
    def held(r):
        return (2 * r, 2 * r + 1) if cut == "contiguous" else (r, 2 * world - 1 - r)
    work = []
    for step in range(world):
        row = []
        for rank in range(world):
            source = (rank - step) % world
            row.append(sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in held(rank) for b in held(source)))
        work.append(row)
    return work


@figure("concept-ring-balance")
def ring_balance(world: int = 4) -> go.Figure:
    """Work per GPU per ring step, contiguous slices against the zig-zag cut (two groups of bars)."""
    fig = go.Figure()
    colours = WAVE_COLOURS[:world]
    for cut in ("contiguous", "zig-zag"):
        work = step_work(world, cut)
        busy = sum(max(row) for row in work)
        total = sum(map(sum, work))
        for rank in range(world):
            fig.add_trace(go.Bar(
                x=[[f"{cut}: {total / (world * busy):.0%} busy"] * world, [f"step {s}" for s in range(world)]],
                y=[work[s][rank] for s in range(world)], name=f"GPU {rank}", marker_color=colours[rank],
                showlegend=cut == "contiguous", legendgroup=str(rank),
                hovertemplate=f"GPU {rank}, %{{x[1]}} ({cut}): %{{y}} blocks<extra></extra>"))
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_yaxes(title_text="blocks of chunk × chunk computed")
    add_notes(fig, f"A causal sequence in {2 * world} chunks on {world} GPUs. Cut into contiguous slices, the GPU "
                   "holding the sequence's start finds no keys it may see from step 1 on, while the last does full "
                   "blocks every step; a step lasts as long as its busiest GPU, so the others wait. Cut zig-zag, "
                   "every GPU does two blocks at every step. 'busy': the work done over what the GPUs could have "
                   "done in the steps' time.")
    set_alt(fig, f"Bars of the work each of {world} GPUs does at each step of a causal ring, for the sequence cut into "
                 "contiguous slices and cut zig-zag. Contiguous: from step 1 on the first GPU has nothing to do while the "
                 "last does full blocks. Zig-zag: every GPU does the same two blocks at every step.")
    style_figure(fig, "Why causal rings cut zig-zag: work per GPU per step", None, height=460)
    return fig


# --- measured: data/ch10_context_parallel.json (`python -m tutorial_kernels.bench.context_parallel`) -------------

METHODS = ["ring", "ulysses", "torch context_parallel (flash)", "torch context_parallel (cuDNN)"]
ONE_GPU = ["front door", "torch SDPA (flash)", "torch SDPA (cuDNN)"]


def _rows(data: dict) -> dict:
    """(gpus, n, method, backward) → row, over every run of the file."""
    return {(r["gpus"], r["n"], r["method"], r["backward"]): r for run in data["runs"] for r in run["rows"]}


def _length(n: int) -> str:
    return f"{n // 1024}k"


def _gpus_runs(data: dict) -> list[dict]:
    """The file's provenance with the GPU named as the host's GPUs and their links, for the subtitle."""
    p = data["provenance"]
    return [{**p, "gpu": f"{p['gpu']} ×{p.get('gpus_on_host', '?')}, one host"}]


@figure("ch10-scaling")
def scaling_table(data: dict | None = None):
    """Seconds per causal layer, forward and forward + backward, each method's speed-up over one GPU's front
    door at the same length, and peak memory per GPU."""
    data = data or load_data("ch10_context_parallel")
    rows = _rows(data)
    lengths = sorted({n for _, n, _, _ in rows})
    gpus = sorted({g for g, _, _, _ in rows})
    header = ["GPUs", "N", "method", "forward s", "× one GPU", "fwd + bwd s", "× one GPU", "peak GiB per GPU"]
    columns: list[list] = [[] for _ in header]
    for g in gpus:
        for n in lengths:
            base = {b: rows.get((1, n, "front door", b)) for b in (False, True)}
            for method in (ONE_GPU if g == 1 else METHODS):
                fwd, both = rows.get((g, n, method, False)), rows.get((g, n, method, True))
                if fwd is None or both is None or "seconds" not in fwd or "seconds" not in both:
                    continue
                speed = [f"{base[b]['seconds'] / r['seconds']:.2f}×" if base[b] else "–"
                         for b, r in ((False, fwd), (True, both))]
                peak = both.get("peak_gib_per_gpu")
                row = [str(g), _length(n), method, f"{fwd['seconds']:.3f}", speed[0], f"{both['seconds']:.3f}",
                       speed[1], "–" if peak is None else f"{peak:.1f}"]
                for column, value in zip(columns, row):
                    column.append(value)
    shape = data["shape"]
    return Table(header, columns, title="One causal layer over several GPUs: time, speed-up, memory",
                 subtitle=short_line(_gpus_runs(data)), provenance=file_lines(data), notes=[
                     f"{shape['dtype']}, batch {shape['batch']}, {shape['heads']} heads of {shape['head_dim']}, "
                     "causal. Seconds: the median over calls of the slowest GPU's time. × one GPU: the front door "
                     "on one GPU at the same length over this row's time (the ideal is the number of GPUs). Peak "
                     "memory: the most any GPU allocated during a forward + backward (inputs, outputs and "
                     "gradients included); PyTorch's context_parallel keeps each buffer's whole-sequence storage "
                     "after sharding it, so its peak is not comparable and not shown."])


@figure("ch10-overlap")
def overlap_bars(data: dict | None = None) -> go.Figure:
    """The ring's forward against its parts measured alone: the steps' kernels without sending, and the
    key/value hops without computing, per (GPUs, N)."""
    data = data or load_data("ch10_context_parallel")
    rows = _rows(data)
    cases = sorted({(g, n) for g, n, m, _ in rows if m == "ring parts"})
    labels = [f"{g} GPUs, {_length(n)}" for g, n in cases]
    parts = [rows[(g, n, "ring parts", False)] for g, n in cases]
    total = [rows[(g, n, "ring", False)]["seconds"] for g, n in cases]
    fig = go.Figure()
    for name, values, colour in (
            ("kernels alone", [p["computation_s"] * 1e3 for p in parts], WAVE_COLOURS[0]),
            ("hops alone", [p["communication_s"] * 1e3 for p in parts], WAVE_COLOURS[1]),
            ("the ring: both, overlapped", [t * 1e3 for t in total], WAVE_COLOURS[2])):
        fig.add_trace(go.Bar(y=labels, x=values, name=name, orientation="h", marker_color=colour,
                             hovertemplate=f"{name}, %{{y}}: %{{x:.1f}} ms<extra></extra>"))
    fig.update_layout(barmode="group", bargap=0.25)
    values = [v for trace in fig.data for v in trace.x]
    fig.update_xaxes(title_text="milliseconds per forward (log scale)", type="log",
                     tickvals=log_ticks(min(values) / 1.5, max(values) * 1.5))
    fig.update_yaxes(autorange="reversed")
    add_notes(fig, "The ring's forward (each GPU's P steps, the key/value shard sent on while a step computes) "
                   "against its two halves timed alone: the same steps' kernels on the GPU's own shard with nothing "
                   "sent (without the merges), and the P − 1 hops of the shard with nothing computed.")
    return measured_layout(fig, None, "Sending while computing: the ring's forward and its parts", runs=_gpus_runs(data),
                           height=520)
