"""Chapter 7's figures (docs/chapters/07-flash-v3-hopper.md): FlashAttention-3's schedule in Gluon.

Pictures of the schedule first (`concept-…`: the program's warps and memory, the mbarrier ring, the
overlap inside a warpgroup, the warp-specialised pipeline, persistent dealing), drawn from the kernel
module's constants and a plain-Python restatement of its scheduling functions; then the measurements.
The Hopper kernel against cuDNN, torch flash and the tuned Triton kernel on the FlashAttention-2
paper's shapes (data/ch05_hopper.json), and at the prefill models' attention shape
(data/ch05_hopper_prefill_shape.json); both are on the Benchmarks page too. The data files keep the
names they were measured under, when the kernel was part of chapter 5.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.ch07_hopper import CONSUMER_REGS, LOADER_REGS, ROWS_PER_WARPGROUP, TILES
from tutorial_kernels.ch07_hopper_backward import BLOCK_M_FOR as BWD_BLOCK_M_FOR
from tutorial_kernels.ch07_hopper_backward import BLOCK_N as BWD_BLOCK_N
from tutorial_kernels.ch07_hopper_backward import CONSUMER_REGS as BWD_CONSUMER_REGS
from tutorial_kernels.ch07_hopper_backward import STAGES as BWD_STAGES
from tutorial_kernels.figures.ch05 import probe_bars
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data
from tutorial_kernels.figures.style import (
    HOPPER_VARIANT_COLOURS, LENGTH_COLOURS, WAVE_COLOURS, add_notes, concept_layout, measured_layout, provider_colour, set_narrow,
    shade, wrap)

HEAD_DIM = 128  # the pictures draw the forward at the head dimension it was first built and measured for
BLOCK_N, STAGES = TILES[HEAD_DIM]
BWD_HEAD_DIM = 128  # and the backward at d = 128 too (at d = 64 its query tiles are 128 rows, not 64)
BWD_BLOCK_M = BWD_BLOCK_M_FOR[BWD_HEAD_DIM]

HOPPER_PROBE_PROVIDERS = ["sdpa-cudnn", "flash-v2-hopper", "flash-v2-tuned", "sdpa-flash"]  # in the Hopper probe's figure


@figure("ch07-hopper")
def hopper_schedule(data: dict | None = None) -> go.Figure:
    """Chapter 7's Hopper kernel (FA3's schedule in Gluon) against cuDNN, torch flash and the tuned
    Triton kernel, head_dim 128, bfloat16 (data/ch05_hopper.json)."""
    from tutorial_kernels.bench import PROVIDERS

    return probe_bars(data or load_data("ch05_hopper"),
                       {PROVIDERS[key].label: provider_colour(key) for key in HOPPER_PROBE_PROVIDERS},
                       "Head dimension 128 on an H100: FA3's schedule in Gluon against cuDNN and the Triton kernel")


@figure("ch07-hopper-head-dims")
def hopper_head_dims(data: dict | None = None) -> go.Figure:
    """The Hopper kernel at head_dim 64 and 256 against cuDNN, torch flash and the tuned Triton kernel,
    bfloat16 (data/ch07_hopper_head_dims.json, `python -m tutorial_kernels.bench ch07-head-dims`)."""
    from tutorial_kernels.bench import PROVIDERS

    return probe_bars(data or load_data("ch07_hopper_head_dims"),
                      {PROVIDERS[key].label: provider_colour(key) for key in HOPPER_PROBE_PROVIDERS},
                      "Head dimensions 64 and 256 on an H100: the same schedule, other tiles")


PREFILL_SHAPE_COLOURS = {  # provider label in data/ch05_hopper_prefill_shape.json → bar colour
    "Hopper kernel (ch. 7), as launched": HOPPER_VARIANT_COLOURS[0],
    "Hopper kernel, forced persistent": HOPPER_VARIANT_COLOURS[1],
    "Hopper kernel, forced one program per item": HOPPER_VARIANT_COLOURS[2],
    "FlashAttention-2 tuned, Triton (ch. 5)": provider_colour("flash-v2-tuned"),
    "torch SDPA, as transformers calls it": provider_colour("sdpa-default"),
}


@figure("ch07-hopper-prefill-shape")
def hopper_prefill_shape(data: dict | None = None) -> go.Figure:
    """Speed relative to cuDNN at the prefill models' attention shape (1 × 32 query heads, 8 key/value
    heads, d = 128, causal, bfloat16), GPU time through CUDA graphs, one group of bars per length
    (data/ch05_hopper_prefill_shape.json)."""
    data = data or load_data("ch05_hopper_prefill_shape")
    lengths = sorted({r["n"] for r in data["results"]})
    fig = go.Figure()
    for label, colour in PREFILL_SHAPE_COLOURS.items():
        by_n = {r["n"]: r for r in data["results"] if r["provider"] == label}
        fig.add_trace(go.Bar(
            x=[f"N = {n}" for n in lengths], y=[by_n[n]["speed_vs_cudnn"] if n in by_n else None for n in lengths],
            customdata=[by_n[n]["ms"] * 1e3 if n in by_n else None for n in lengths], name=label,
            marker_color=colour, hovertemplate=label + "<br>%{x}: %{y:.3f}× cuDNN<br>%{customdata:.1f} µs<extra></extra>"))
    # the reference line is named in the legend: a label on it would sit on the bars around 1
    fig.add_hline(y=1.0, line_dash="dot", line_color=provider_colour("sdpa-cudnn"))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="cuDNN's speed (= 1)",
                             line=dict(color=provider_colour("sdpa-cudnn"), dash="dot")))
    fig.update_yaxes(title="speed relative to cuDNN (its time / ours)", rangemode="tozero")
    fig.update_layout(barmode="group")
    return measured_layout(fig, data, "Prefill attention shape (32 query heads, 8 key/value heads, d = 128, causal) "
                                      "on an H100", height=560)


# --- pictures of the schedule (concept-… figures) ---------------------------------------------------
#
# Every size below is read from the kernel module (ch07_hopper.py): the tile sizes, the number of
# stages, the register budgets. The timelines are schematic: one unit of time per wgmma of one
# warpgroup (64 × 128 × 128), a tile's softmax 64/d × 2 units (chapter 5's arithmetic: exponentials
# at 1/256 of the tensor cores' rate, 4d FLOPs of products per score), a K/V tile's copy LOAD_UNITS.
# The scheduling functions (`work_items`, `dealt_item`) restate the kernel's `_work_item` and
# `_dealt_item` in plain Python; tests/test_ch07_hopper.py runs the kernel's own code on integers and
# checks that both give the same items.

MMA_UNITS = 1.0  # one warpgroup's S_t = Q K_tᵀ or O += P̃ V: 64 × BLOCK_N × HEAD_DIM multiply-adds
SOFTMAX_UNITS = 64 / HEAD_DIM * 2 * MMA_UNITS  # exponentials: 64/d of the two products' time
LOAD_UNITS = 1.5  # a K/V tile's TMA copy (schematic: shorter than the four products that use it)
LOADER_COLOUR = "#7f7f7f"
WARPGROUP_COLOURS = ["#1f77b4", "#ff7f0e"]
WRITER_COLOUR = "#2ca02c"
KV_TILE_BYTES = 2 * BLOCK_N * HEAD_DIM * 2  # K and V tiles of 16-bit elements: what `expect` waits for
Q_TILE_BYTES = 2 * ROWS_PER_WARPGROUP * HEAD_DIM * 2  # both halves of a 128-row Q tile
HOVER_WIDTH = 44  # characters a hover line may show and still fit a phone's figure (~358 px at 12 px)


def hover(text: str) -> str:
    """Hover text wrapped to fit a phone (a label wider than the figure is cut off there)."""
    return wrap(text, HOVER_WIDTH)


def work_items(n_q: int, n_k: int, n_bh: int, section: int, n_heads: int, group_size: int, causal: bool,
               block_m: int = 2 * ROWS_PER_WARPGROUP, block_n: int = BLOCK_N) -> list[tuple[int, ...]]:
    """Every work item in the kernel's order, as `_work_item` numbers them: (batch, head, kv_head,
    first_row, n_full, n_tiles) for w = 0, 1, …: section by section of `section` (batch, head) pairs,
    within a section query tile by query tile, causal tiles that see the most keys first."""
    n_m = -(-n_q // block_m)
    items = []
    for w in range(n_m * n_bh):
        first_bh = (w // (section * n_m)) * section
        pairs = min(section, n_bh - first_bh)
        within = w - first_bh * n_m
        m_rank, bh = within // pairs, first_bh + within % pairs
        if causal:
            pid_m = n_m - 1 - m_rank
            first_sees = pid_m * block_m + (n_k - n_q) + 1
            last_sees = (pid_m + 1) * block_m + (n_k - n_q)
            n_full = max(min(first_sees, n_k), 0) // block_n
            n_tiles = -(-max(min(last_sees, n_k), 0) // block_n)
        else:
            pid_m, n_full, n_tiles = m_rank, n_k // block_n, -(-n_k // block_n)
        head = bh % n_heads
        items.append((bh // n_heads, head, head // group_size, pid_m * block_m, n_full, n_tiles))
    return items


def dealt_item(deal: int, program: int, programs: int, backwards: bool = True) -> int:
    """The item program `program` of `programs` takes in deal number `deal`, as `_dealt_item` deals
    them: forwards in even deals, backwards in odd ones; `backwards=False` deals round-robin."""
    turn_back = deal % 2 if backwards else 0
    return deal * programs + program + turn_back * (programs - 1 - 2 * program)


def deal_items(n_items: int, programs: int, backwards: bool = True) -> list[list[int]]:
    """Each program's items, in the order it runs them."""
    deals = -(-n_items // programs)
    return [[w for d in range(deals) if (w := dealt_item(d, p, programs, backwards)) < n_items]
            for p in range(programs)]


def busiest_program_tiles(lengths: list[int], programs: int, backwards: bool = True) -> int:
    """The most key tiles any program is dealt, for items of these lengths in the kernel's order."""
    return max(sum(lengths[w] for w in mine) for mine in deal_items(len(lengths), programs, backwards))


def _consumer_ops(n_tiles: int, overlapped: bool) -> list[tuple]:
    """One warpgroup's steps over an item of n_tiles key tiles, as `_attend_item` runs them
    (overlapped) or with every product waited for at once (Triton's compiled loop)."""
    ops: list[tuple] = [("wait_q",)]
    if not overlapped:
        for t in range(n_tiles):
            ops += [("wait_full", t), ("issue", "S", t), ("wait", "S", t), ("softmax", t),
                    ("issue", "PV", t), ("wait", "PV", t), ("release", t)]
        return ops + [("epilogue",)]
    ops += [("wait_full", 0), ("issue", "S", 0), ("wait", "S", 0), ("softmax", 0)]
    for t in range(1, n_tiles):
        ops += [("wait_full", t), ("issue", "S", t), ("issue", "PV", t - 1), ("wait", "S", t), ("softmax", t),
                ("wait", "PV", t - 1), ("release", t - 1)]
    return ops + [("issue", "PV", n_tiles - 1), ("wait", "PV", n_tiles - 1), ("release", n_tiles - 1), ("epilogue",)]


def pipeline_schedule(n_tiles: int = 5, warpgroups: int = 2, overlapped: bool = True, stages: int = STAGES,
                      loads: bool = True) -> dict:
    """A schematic run of one work item: when the loader copies each tile into which stage, when each
    warpgroup's products run on the (shared) tensor cores and its softmax on its own units, and when
    each stage is released. Waits are those of the kernel: a consumer waits for its tile's "full"
    barrier, the loader for the "empty" barrier of the tile `stages` earlier (both warpgroups'
    releases). Returns {"loads": [(t, stage, start, end)], "mma": [(wg, kind, t, start, end)],
    "softmax": [(wg, t, start, end)], "epilogue": [(wg, start, end)], "release": {(wg, t): time}}."""
    release = {(wg, t): 0.0 for wg in range(warpgroups) for t in range(n_tiles)}
    for _ in range(4 * n_tiles + 4):  # loads depend on releases and releases on loads: iterate to the fixed point
        # `_loader`'s order: K/V tile 0, then Q (half a K/V tile's bytes), then tiles 1, 2, …
        copies, clock, q_start, q_ready = [], 0.0, 0.0, 0.0
        for t in range(n_tiles):
            empty = max(release[(wg, t - stages)] for wg in range(warpgroups)) if t >= stages else 0.0
            start = max(clock, empty) if loads else 0.0
            end = start + (LOAD_UNITS if loads else 0.0)
            copies.append((t, t % stages, start, end))
            clock = end
            if t == 0 and loads:
                q_start, q_ready = clock, clock + LOAD_UNITS / 2
                clock = q_ready
        full = {t: end for t, _, _, end in copies}
        run = _run_consumers(n_tiles, warpgroups, overlapped, full, q_ready)
        if run["release"] == release:
            break
        release = run["release"]
    return dict(run, loads=copies, q_load=(q_start, q_ready))


def _run_consumers(n_tiles: int, warpgroups: int, overlapped: bool, full: dict, q_ready: float) -> dict:
    programs = [_consumer_ops(n_tiles, overlapped) for _ in range(warpgroups)]
    pc, clock = [0] * warpgroups, [0.0] * warpgroups
    tensor_cores_free, done = 0.0, {}
    mma, softmax, epilogue, release = [], [], [], {}
    while any(pc[wg] < len(programs[wg]) for wg in range(warpgroups)):
        # the warpgroup that is furthest behind acts next, so products reach the tensor cores in issue order
        wg = min((w for w in range(warpgroups) if pc[w] < len(programs[w])), key=lambda w: (clock[w], w))
        op = programs[wg][pc[wg]]
        pc[wg] += 1
        if op[0] == "wait_q":
            clock[wg] = max(clock[wg], q_ready)
        elif op[0] == "wait_full":
            clock[wg] = max(clock[wg], full[op[1]])
        elif op[0] == "issue":
            start = max(clock[wg], tensor_cores_free)
            tensor_cores_free = done[(wg, op[1], op[2])] = start + MMA_UNITS
            mma.append((wg, op[1], op[2], start, start + MMA_UNITS))
        elif op[0] == "wait":
            clock[wg] = max(clock[wg], done[(wg, op[1], op[2])])
        elif op[0] == "softmax":
            softmax.append((wg, op[1], clock[wg], clock[wg] + SOFTMAX_UNITS))
            clock[wg] += SOFTMAX_UNITS
        elif op[0] == "release":
            release[(wg, op[1])] = clock[wg]
        else:
            epilogue.append((wg, clock[wg], clock[wg] + MMA_UNITS / 2))
            clock[wg] += MMA_UNITS / 2
    return dict(mma=mma, softmax=softmax, epilogue=epilogue, release=release, end=max(clock))


def _boxes(fig: go.Figure, row_label: str, spans: list[tuple[float, float]], labels: list[str], hovers: list[str],
           colour: str | list[str], name: str, *, showlegend: bool = True, **where) -> None:
    """Boxes on one row of a diagram: horizontal bars from start to end, labelled inside, explained on hover."""
    fig.add_trace(go.Bar(
        orientation="h", y=[row_label] * len(spans), base=[s for s, _ in spans], x=[e - s for s, e in spans],
        text=labels, textposition="inside", insidetextanchor="middle", textangle=0, hovertext=[hover(h) for h in hovers],
        hoverinfo="text", marker=dict(color=colour, line=dict(color="white", width=1)), name=name,
        legendgroup=name, showlegend=showlegend), **where)


def _mma_label(kind: str, t: int) -> str:
    return f"S<sub>{t}</sub>" if kind == "S" else f"P̃V<sub>{t}</sub>"


def _mma_hover(wg: int, kind: str, t: int, overlapped: bool) -> str:
    if kind == "S":
        return (f"warpgroup {wg}: S<sub>{t}</sub> = Q K<sub>{t}</sub><sup>T</sup>, an asynchronous wgmma "
                f"({ROWS_PER_WARPGROUP} × {BLOCK_N} scores, K read from shared memory)")
    later = f", issued beside S<sub>{t + 1}</sub>" if overlapped else ""
    return (f"warpgroup {wg}: O += P̃<sub>{t}</sub> V<sub>{t}</sub>{later} (P̃ from registers, "
            f"V from shared memory)")


def _draw_schedule(fig: go.Figure, run: dict, overlapped: bool, prefix: str = "", legend: bool = True,
                   stage_rows: bool = True, **where) -> None:
    warpgroups = 1 + max(wg for wg, *_ in run["mma"])
    if "loads" in run and run["loads"] and run["loads"][-1][3] > 0:
        q0, q1 = run["q_load"]
        _boxes(fig, prefix + "loader warp", [(q0, q1)] + [(s, e) for _, _, s, e in run["loads"]],
               ["Q"] + [f"K/V<sub>{t}</sub>" for t, *_ in run["loads"]],
               [f"TMA: both halves of the Q tile ({Q_TILE_BYTES // 1024} KiB) into the Q buffer"]
               + [f"TMA: K and V tile {t} ({KV_TILE_BYTES // 1024} KiB) into stage {s}; "
                  + (f"first waits until both warpgroups released tile {t - STAGES}" if t >= STAGES
                     else "the stage is still unused: no wait")
                  for t, s, *_ in run["loads"]], LOADER_COLOUR, "TMA copy (loader warp)", showlegend=legend, **where)
    for wg in range(warpgroups):
        mine = [m for m in run["mma"] if m[0] == wg]
        _boxes(fig, prefix + "tensor cores", [(s, e) for *_, s, e in mine], [_mma_label(k, t) for _, k, t, _, _ in mine],
               [_mma_hover(wg, k, t, overlapped) for _, k, t, _, _ in mine], WARPGROUP_COLOURS[wg],
               f"wgmma of warpgroup {wg}" if warpgroups > 1 else "wgmma", showlegend=legend, **where)
    for wg in range(warpgroups):
        mine = [s for s in run["softmax"] if s[0] == wg]
        row = prefix + (f"warpgroup {wg}: softmax" if warpgroups > 1 else "softmax (exp2, max, sum)")
        _boxes(fig, row, [(s, e) for *_, s, e in mine], [f"exp<sub>{t}</sub>" for _, t, *_ in mine],
               [f"warpgroup {wg}: P̃<sub>{t}</sub> = 2^(S<sub>{t}</sub> − m), the row maxima and sums, on its own units"
                + (f" while P̃<sub>{t - 1}</sub>V<sub>{t - 1}</sub> may still be on the tensor cores"
                   if overlapped and t > 0 else "") for _, t, *_ in mine],
               shade(WARPGROUP_COLOURS[wg], 0.5), f"softmax of warpgroup {wg}" if warpgroups > 1 else "softmax",
               showlegend=legend, **where)
        ends = [e for e in run["epilogue"] if e[0] == wg]
        _boxes(fig, row, [(s, e) for _, s, e in ends], ["O"] * len(ends),
               [f"warpgroup {wg}: O / ℓ, staged through its half of the Q buffer, then stored"] * len(ends),
               shade(WARPGROUP_COLOURS[wg], -0.35), "output", showlegend=legend and wg == 0, **where)
    if stage_rows and "loads" in run:
        for stage in range(STAGES):
            held = [(t, s, max(run["release"][(wg, t)] for wg in range(warpgroups)))
                    for t, st, s, _ in run["loads"] if st == stage]
            _boxes(fig, prefix + f"stage {stage}", [(s, e) for _, s, e in held], [f"tile {t}" for t, *_ in held],
                   [f"stage {stage} holds K/V tile {t} from its copy until both warpgroups have arrived on "
                    f"empty[{stage}]" for t, *_ in held], shade(LOADER_COLOUR, 0.6), "a stage in use",
                   showlegend=legend and stage == 0, **where)


@figure("concept-warp-specialised-pipeline")
def warp_specialised_pipeline(n_tiles: int = 6) -> go.Figure:
    """One program on one work item: the loader warp's TMA copies into the ring of stages, the two
    consumer warpgroups' products on the tensor cores and their softmaxes, schematic durations."""
    run = pipeline_schedule(n_tiles)
    fig = go.Figure()
    _draw_schedule(fig, run, overlapped=True)
    rows = ["loader warp", *[f"stage {s}" for s in range(STAGES)], "tensor cores",
            "warpgroup 0: softmax", "warpgroup 1: softmax"]
    fig.update_layout(barmode="overlay", bargap=0.25, uniformtext=dict(minsize=9, mode="hide"))
    concept_layout(
        fig, f"One program, one work item:<br>a loader warp, {STAGES} stages, two consumer warpgroups",
        f"A timeline with rows for the loader warp, the {STAGES} shared-memory stages, the tensor cores and "
        f"the softmax of each of the two consumer warpgroups. The loader copies Q, then K/V tiles "
        f"0 to {n_tiles - 1} into stages 0, 1, 2, 0, …; a stage is refilled only after both warpgroups "
        "released its previous tile. On the tensor-core row the products of warpgroup 0 and 1 interleave: "
        "while one warpgroup computes its softmax, the other's products run.", height=520)
    fig.update_yaxes(showticklabels=True, categoryorder="array", categoryarray=rows[::-1], automargin=True)
    add_notes(fig, f"Schematic durations: one unit per wgmma of a warpgroup ({ROWS_PER_WARPGROUP} × {BLOCK_N} × "
                   f"{HEAD_DIM}), the softmax 64/d × 2 = {SOFTMAX_UNITS:g} units at d = {HEAD_DIM}, a "
                   f"{KV_TILE_BYTES // 1024} KiB K/V copy {LOAD_UNITS:g} units. Hover over a box for what it is.")
    return set_narrow(fig, **{"+height": 120})


@figure("concept-hopper-backward")
def hopper_backward(steps: int = 3) -> go.Figure:
    """One program of chapter 7's backward (`ch07_hopper_backward`) over a few query tiles: the loader
    warp's copies, each consumer warpgroup's five products and its elementwise work, the dSᵀ exchange
    before dQ, and the dQ writer warp adding each step's dS K into memory while the next step runs."""
    fig = go.Figure()
    period, first = 6.0, 3.0  # schematic units: one per product of a warpgroup
    _boxes(fig, "loader warp", [(0.0, 1.5)] + [(first + period * i - 1.5, first + period * i) for i in range(steps)],
           ["K, V"] + [f"Q, dO<sub>{i}</sub>" for i in range(steps)],
           [f"TMA: the program's {BWD_BLOCK_N} keys and values, once, kept in shared memory"]
           + [f"TMA: query tile {i}'s Q and dO ({BWD_BLOCK_M} rows each at d = {BWD_HEAD_DIM}), and its rows' lse and Δ, into stage "
              f"{i % BWD_STAGES} of the ring, as soon as both warpgroups released what it held" for i in range(steps)],
           LOADER_COLOUR, "TMA copy (loader warp)")
    for wg in range(2):
        row = f"warpgroup {wg}: keys {wg * BWD_BLOCK_N // 2}–{(wg + 1) * BWD_BLOCK_N // 2 - 1}"
        spans, labels, hovers, colours = [], [], [], []
        for i in range(steps):
            t0 = first + period * i
            for start, end, label, text, tone in (
                    (0, 2, "Sᵀ, dPᵀ", "K Qᵀ (= Sᵀ / τ) and dPᵀ = V dOᵀ: two asynchronous wgmma, K and V from shared memory", 0.0),
                    (2, 3, "dS", "Pᵀ = e^(τ K Qᵀ − lse) recomputed, masked on the diagonal; τ dSᵀ = τ Pᵀ ∘ (dPᵀ − Δ), "
                                    "in registers (lse and Δ read from the stage as they are needed)", 0.5),
                    (3, 5, "dV, dK", "dV += Pᵀ dO and dK += dSᵀ Q, Pᵀ and dSᵀ from registers; meanwhile dSᵀ goes to "
                                     "shared memory and the warpgroup waits for the other's half", 0.0),
                    (5, 6, "dQ", "its half of dQ's columns: dS (both halves, from shared memory) times K", -0.3)):
                spans.append((t0 + start, t0 + end))
                labels.append(f"{label}<sub>{i}</sub>")
                hovers.append(f"warpgroup {wg}, query tile {i}: {text}")
                colours.append(shade(WARPGROUP_COLOURS[wg], tone))
        _boxes(fig, row, spans, labels, hovers, colours, f"warpgroup {wg}")
    _boxes(fig, "dQ writer warp", [(first + period * i + 6, first + period * i + 10) for i in range(steps)],
           [f"dQ<sub>{i}</sub> → memory" for i in range(steps)],
           [f"query tile {i}'s dS K, read from shared memory and added into the float32 dQ accumulator with "
            "vector reductions, while the warpgroups work on the next tile" for i in range(steps)],
           WRITER_COLOUR, "atomic additions (dQ writer warp)")
    fig.update_layout(barmode="overlay", bargap=0.3, uniformtext=dict(minsize=9, mode="hide"))
    concept_layout(
        fig, "The backward on Hopper: one 128-key tile,<br>query tiles streamed past it",
        "A timeline with rows for the loader warp, the two consumer warpgroups (64 keys each) and the dQ writer "
        f"warp over {steps} query tiles. The loader copies K and V once, then each query tile's Q and dO with its "
        "rows' lse and Δ. For "
        "each tile, each warpgroup computes S transposed and dP transposed, then P and dS in registers, then "
        "dV and dK, then its half of dQ from both warpgroups' dS; the writer warp adds that dQ into memory "
        "while the warpgroups go on to the next tile.", height=420)
    fig.update_yaxes(showticklabels=True, categoryorder="array", automargin=True,
                     categoryarray=["dQ writer warp", f"warpgroup 1: keys {BWD_BLOCK_N // 2}–{BWD_BLOCK_N - 1}",
                                    f"warpgroup 0: keys 0–{BWD_BLOCK_N // 2 - 1}", "loader warp"])
    add_notes(fig, "Schematic durations: one unit per product of a warpgroup (the two warpgroups share the "
                   "SM's tensor cores). Hover over a box for what it is.")
    return set_narrow(fig, **{"+height": 100})


def backward_register_budget() -> dict[str, dict[str, int]]:
    """Registers per consumer thread of the backward at the line that computes Pᵀ, by value, for the
    two placements of lse and Δ: a float32 tile of R × C spread over a warpgroup's 128 threads is
    R·C/128 registers; a per-query vector in the scores' layout is BLOCK_M/4 (each thread holds 16
    of the 64 columns)."""
    half, vector = BWD_BLOCK_N // 2, BWD_BLOCK_M // 4
    held = {"dK (64 keys × d)": half * BWD_HEAD_DIM // 128, "dV (64 keys × d)": half * BWD_HEAD_DIM // 128,
            "Sᵀ, then Pᵀ": half * BWD_BLOCK_M // 128, "dPᵀ (on its way)": half * BWD_BLOCK_M // 128}
    return {"loaded at step start": {**held, "lse": vector, "Δ": vector},
            "read where used": {**held, "lse": vector}}


@figure("concept-hopper-backward-registers")
def hopper_backward_registers() -> go.Figure:
    """The backward's register budget: what a consumer thread holds at the line that computes Pᵀ,
    with lse and Δ loaded at the start of the step or read from shared memory where used, against
    the 240 registers a consumer warpgroup gets (`backward_register_budget`)."""
    budget = backward_register_budget()
    colours = {"dK (64 keys × d)": WARPGROUP_COLOURS[0], "dV (64 keys × d)": shade(WARPGROUP_COLOURS[0], 0.45),
               "Sᵀ, then Pᵀ": WARPGROUP_COLOURS[1], "dPᵀ (on its way)": shade(WARPGROUP_COLOURS[1], 0.45),
               "lse": WRITER_COLOUR, "Δ": shade(WRITER_COLOUR, 0.45)}
    rows = list(budget)
    fig = go.Figure()
    for name, colour in colours.items():
        counts = [budget[row].get(name, 0) for row in rows]
        fig.add_trace(go.Bar(y=rows, x=counts, orientation="h", name=name, marker_color=colour,
                             text=[str(c) if c else "" for c in counts], textposition="inside",
                             hovertemplate=f"{name}: %{{x}} registers per thread<extra>%{{y}}</extra>"))
    fig.add_vline(x=BWD_CONSUMER_REGS, line=dict(color="#5a6372", dash="dot", width=2),
                  annotation_text=f"{BWD_CONSUMER_REGS}", annotation_position="top")
    fig.update_layout(barmode="stack", bargap=0.35, uniformtext=dict(minsize=9, mode="hide"),
                      legend=dict(traceorder="normal"))
    totals = {row: sum(budget[row].values()) for row in rows}
    concept_layout(
        fig, "Registers of one consumer thread<br>at the line that computes Pᵀ",
        f"Two stacked horizontal bars of registers per thread against a line at {BWD_CONSUMER_REGS}. With lse and "
        f"Δ loaded at the start of the step: dK and dV {budget[rows[0]]['dK (64 keys × d)']} each, Sᵀ and dPᵀ "
        f"{budget[rows[0]]['Sᵀ, then Pᵀ']} each, lse and Δ {budget[rows[0]]['lse']} each, "
        f"{totals[rows[0]]} in all. With each read from shared memory on the line before its use, Δ is not "
        f"loaded yet: {totals[rows[1]]}. What is left under the line is all the compiler has for addresses, "
        "loop counters and the descriptors wgmma takes.", height=330)
    fig.update_xaxes(showticklabels=True, ticks="outside", range=[0, 256], title="registers per thread")
    fig.update_yaxes(showticklabels=True, automargin=True, categoryorder="array", categoryarray=rows[::-1])
    add_notes(fig, "Counted from the tile sizes, not measured: a 64 × 128 float32 tile over 128 threads is 64 "
                   "registers each. When the compiler's own values do not fit in what is left, it spills them "
                   "(`python -m tutorial_kernels.tests.gluon_offline` prints the spilled bytes).")
    return set_narrow(fig, **{"+height": 80})


@figure("concept-intra-warpgroup-overlap")
def intra_warpgroup_overlap(n_tiles: int = 5) -> go.Figure:
    """One warpgroup, all tiles already in shared memory: every product waited for at once (as
    Triton compiles chapter 5's loop) against FA3's order (S_t issued with P̃_{t-1}V_{t-1}, wait for S_t only)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.16,
                        subplot_titles=["Every wgmma<br>waited for at once",
                                        "Issue S<sub>t</sub> and P̃<sub>t−1</sub>V<sub>t−1</sub>,<br>wait for S<sub>t</sub> only"])
    ends = []
    for row, overlapped in ((1, False), (2, True)):
        run = pipeline_schedule(n_tiles, warpgroups=1, overlapped=overlapped, loads=False)
        _draw_schedule(fig, run, overlapped, prefix="" if row == 1 else " ", legend=row == 2, stage_rows=False,
                       row=row, col=1)
        ends.append(run["end"])
        fig.add_vline(x=run["end"], line=dict(color="#5a6372", dash="dot", width=1), row=row, col=1)
    fig.update_layout(barmode="overlay", bargap=0.3, uniformtext=dict(minsize=9, mode="hide"))
    concept_layout(
        fig, "Inside one warpgroup: the softmax of tile t beside the product of tile t − 1",
        f"Two timelines of one warpgroup over {n_tiles} key tiles, each with a tensor-core row and a softmax row. "
        "Above, each product is waited for before the next step: the tensor cores idle during every softmax. "
        "Below, the scores of tile t are issued together with the product of tile t − 1, and the softmax of "
        f"tile t runs while that product is on the tensor cores: the item ends after {ends[1]:g} units "
        f"instead of {ends[0]:g}.", height=460)
    fig.update_yaxes(showticklabels=True, automargin=True)
    add_notes(fig, f"Schematic: one unit per wgmma, the softmax {SOFTMAX_UNITS:g} units (64/d × 2 at d = {HEAD_DIM}). "
                   "The loop's first and last steps overlap nothing, which is why short items gain least.")
    return fig


@figure("concept-mbarrier-ring")
def mbarrier_ring(n_tiles: int = 3 * STAGES) -> go.Figure:
    """Tile t of the ring in stage t % STAGES; the phase each side waits for on the stage's full and
    empty barriers, as `_load_kv_tile` and `_overlapped_step` compute them."""
    fig = go.Figure()
    for t in range(n_tiles):
        stage, lap = t % STAGES, t // STAGES
        consumer_phase = lap & 1  # _overlapped_step: mbarrier.wait(full_bars[stage], (ring_t // stages) & 1)
        loader_phase = (lap + 1) & 1  # _load_kv_tile: wait(empty_bars[stage], ((loaded // stages) + 1) & 1, pred=…)
        loader = (f"waits on empty[{stage}] for phase {loader_phase}: both consumers released tile {t - STAGES}"
                  if t >= STAGES else f"stage {stage} never used yet: no wait (pred = False)")
        # the box's label is an annotation, not the bar's text: a phone's narrower boxes take a shorter one
        _boxes(fig, f"stage {stage}", [(t + 0.05, t + 0.95)], [""],
               [f"K/V tile {t} → stage {stage} (round {lap} of the ring)<br>loader: {loader};<br>"
                f"then expect({KV_TILE_BYTES // 1024} KiB) on full[{stage}] and two TMA copies<br>"
                f"consumers: wait on full[{stage}] for phase {consumer_phase} (the bytes have arrived);<br>"
                f"each arrives on empty[{stage}] (count 2) once its P̃<sub>{t}</sub>V<sub>{t}</sub> is done"],
               [WARPGROUP_COLOURS[0], shade(WARPGROUP_COLOURS[0], 0.45)][consumer_phase], f"phase {consumer_phase}",
               showlegend=t in (0, STAGES))
    narrow = {}
    for t in range(n_tiles):
        phase = (t // STAGES) & 1
        narrow[f"annotations[{len(fig.layout.annotations)}].text"] = f"tile<br>{t}"
        fig.add_annotation(x=t + 0.5, y=f"stage {t % STAGES}", xref="x", yref="y", showarrow=False,
                           text=f"tile {t}<br>phase {phase}", font=dict(size=12, color=("white", "#2a3f5f")[phase]))
    # each round's phase above its tiles, in the margin: one line on a laptop, two on a phone
    for lap in range(-(-n_tiles // STAGES)):
        narrow[f"annotations[{len(fig.layout.annotations)}].text"] = f"round {lap}:<br>full phase {lap & 1}"
        fig.add_annotation(x=lap * STAGES + STAGES / 2, y=1, xref="x", yref="paper", yanchor="bottom", yshift=4,
                           showarrow=False, text=f"round {lap}: full phase {lap & 1}",
                           font=dict(size=12, color="#5a6372"))
    fig.update_layout(barmode="overlay", bargap=0.15)
    concept_layout(
        fig, f"The ring: K/V tile t goes to stage t mod {STAGES}, and the phase bit flips every round",
        f"A grid of {n_tiles} K/V tiles on {STAGES} rows, one per shared-memory stage: tile t sits in stage t mod "
        f"{STAGES}. Tiles 0 to {STAGES - 1} are waited for on their full barriers with phase 0, the next "
        f"{STAGES} with phase 1, then phase 0 again. The loader waits on a stage's empty barrier before "
        "refilling it, from the second round on.", height=380, above=24)
    fig.update_yaxes(showticklabels=True, categoryorder="array",
                     categoryarray=[f"stage {s}" for s in range(STAGES)][::-1], automargin=True)
    set_narrow(fig, **narrow, **{"margin.t": fig.layout.margin.t + 16, "+height": 16})
    add_notes(fig, "Each barrier counts arrivals and flips its phase when the count is complete: full[s] after one "
                   f"arrival and {KV_TILE_BYTES // 1024} KiB of TMA bytes, empty[s] after two arrivals (both consumer "
                   "warpgroups). Waiting for the phase of this round, not a count, lets one barrier serve every round.")
    return fig


@figure("concept-persistent-dealing")
def persistent_dealing(n: int = 1024, heads: int = 3, programs: int = 5) -> go.Figure:
    """Causal items of `heads` heads at n tokens, longest first (`work_items`), dealt to `programs`
    persistent programs forwards then backwards (`dealt_item`), against round-robin."""
    items = work_items(n, n, heads, heads, heads, 1, causal=True)
    lengths = [it[5] for it in items]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.18,
                        subplot_titles=["Dealt forwards, then backwards (the kernel)", "Dealt round-robin"])
    longest = max(lengths)
    for row, backwards in ((1, True), (2, False)):
        dealt = deal_items(len(items), programs, backwards)
        for deal in range(-(-len(items) // programs)):
            spans, labels, hovers, ys, colours = [], [], [], [], []
            for p, mine in enumerate(dealt):
                if deal >= len(mine):
                    continue
                w = mine[deal]
                start = sum(lengths[v] for v in mine[:deal])
                batch, head, _, first_row, _, n_tiles = items[w]
                spans.append((start, start + n_tiles))
                labels.append(str(w))
                ys.append(f"program {p}")
                colours.append(LENGTH_COLOURS[min(len(LENGTH_COLOURS) - 1,
                                                  (n_tiles - 1) * len(LENGTH_COLOURS) // longest)])
                hovers.append(hover(f"item {w} (deal {deal}, {'backwards' if backwards and deal % 2 else 'forwards'}): "
                                    f"head {head}, query rows {first_row}–{first_row + 127}, {n_tiles} key tiles"))
            fig.add_trace(go.Bar(orientation="h", y=ys, base=[s for s, _ in spans], x=[e - s for s, e in spans],
                                 text=labels, textposition="inside", insidetextanchor="middle", textangle=0,
                                 hovertext=hovers, hoverinfo="text", showlegend=False,
                                 marker=dict(color=colours, line=dict(color="white", width=1))), row=row, col=1)
        totals = [sum(lengths[w] for w in mine) for mine in dealt]
        fig.add_trace(go.Scatter(x=[t + 0.3 for t in totals], y=[f"program {p}" for p in range(programs)],
                                 mode="text", text=[str(t) for t in totals], textposition="middle right",
                                 hoverinfo="skip", showlegend=False), row=row, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=[f"program {p}" for p in range(programs)][::-1],
                         row=row, col=1)
    fig.update_layout(barmode="overlay", bargap=0.2, uniformtext=dict(minsize=9, mode="hide"))
    rr, fb = busiest_program_tiles(lengths, programs, False), busiest_program_tiles(lengths, programs, True)
    concept_layout(
        fig, f"{len(items)} causal items, longest first, on {programs} persistent programs",
        f"Two panels of {programs} rows, one per program, each a row of the items it runs, as long as their key "
        f"tiles, numbered in the kernel's order: the {heads} heads' last query tiles (8 key tiles each) first, "
        f"their first ones (1 key tile) last. Dealt forwards then backwards, the busiest program runs {fb} key "
        f"tiles; dealt round-robin, program 0 draws the longest item of every deal and runs {rr}.", height=520)
    fig.update_yaxes(showticklabels=True, automargin=True)
    add_notes(fig, f"Causal, {heads} heads of {n} tokens: {n // 128} query tiles of 128 rows per head, seeing 1 to "
                   f"{n // BLOCK_N} key tiles of {BLOCK_N}. The number at the end of each row is that program's key "
                   "tiles in all; darker items are longer.")
    return fig


@figure("concept-hopper-program")
def hopper_program() -> go.Figure:
    """What one program of the kernel holds: its warps (two consumer warpgroups and a loader warp),
    their registers, and its shared memory, from the module's constants."""
    threads = [("consumer warpgroup 0", 128, WARPGROUP_COLOURS[0]), ("consumer warpgroup 1", 128, WARPGROUP_COLOURS[1]),
               ("loader warp", 32, LOADER_COLOUR)]
    regs = [(name, n * (LOADER_REGS if "loader" in name else CONSUMER_REGS), c) for name, n, c in threads]
    q_half = ROWS_PER_WARPGROUP * HEAD_DIM * 2 // 1024
    kv = BLOCK_N * HEAD_DIM * 2 // 1024
    smem = ([(f"Q rows of warpgroup {i} (then its O)", q_half, shade(WARPGROUP_COLOURS[i], 0.3)) for i in range(2)]
            + [(f"K, stage {s}", kv, shade(LOADER_COLOUR, 0.25 + 0.1 * s)) for s in range(STAGES)]
            + [(f"V, stage {s}", kv, shade(LOADER_COLOUR, 0.5 + 0.1 * s)) for s in range(STAGES)])
    limits = [("threads", None), ("registers (of 65,536)", 65536), ("shared memory, KiB (of 227)", 227)]
    fig = make_subplots(rows=3, cols=1, vertical_spacing=0.2, subplot_titles=[name for name, _ in limits])
    for row, parts in enumerate((threads, regs, smem), start=1):
        start = 0
        for name, size, colour in parts:
            short = name.replace("consumer warpgroup", "WG").replace("loader warp", "loader")
            short = short.split(" (")[0].replace("Q rows of warpgroup ", "Q").replace(", stage ", "")
            about = f"{name}: {size:,}" + {1: " threads", 2: " registers", 3: " KiB"}[row]
            if row == 1:
                about += f" ({size // 32} warps)"
            if row == 2:
                per = LOADER_REGS if "loader" in name else CONSUMER_REGS
                about += f" ({per} per thread)"
            if row == 1 and "loader" in name:
                short = ""  # too narrow a bar for its name on a phone: named beside it, below
            fig.add_trace(go.Bar(orientation="h", y=[""], base=[start], x=[size], text=[short], textposition="inside",
                                 insidetextanchor="middle", textangle=0, hovertext=[hover(about)], hoverinfo="text",
                                 marker=dict(color=colour, line=dict(color="white", width=1)), showlegend=False),
                          row=row, col=1)
            start += size
        limit = limits[row - 1][1]
        if limit:
            fig.add_vline(x=limit, line=dict(color="black", dash="dot", width=1.5), row=row, col=1)
    # the loader warp named to the right of its bar, where the threads' axis leaves room (no limit there)
    total_threads = sum(n for _, n, _ in threads)
    narrow = {f"annotations[{len(fig.layout.annotations)}].text": "loader"}
    fig.add_annotation(x=total_threads, y=0, xanchor="left", xshift=4, showarrow=False, text="loader warp",
                       font=dict(size=12, color="#2a3f5f"), row=1, col=1)
    fig.update_xaxes(range=[0, total_threads * 7 / 6], row=1, col=1)
    fig.update_layout(barmode="overlay", uniformtext=dict(minsize=8, mode="hide"))
    used = 2 * q_half + 2 * STAGES * kv
    concept_layout(
        fig, "One program of the kernel: two consumer warpgroups, one loader warp",
        f"Three bars. Threads: two consumer warpgroups of 128 threads (4 warps each) and a loader warp of 32. "
        f"Registers: {CONSUMER_REGS} per consumer thread and {LOADER_REGS} per loader thread, "
        f"{sum(r for _, r, _ in regs):,} of the SM's 65,536. Shared memory: the Q tile's two halves of "
        f"{q_half} KiB and {STAGES} stages of K and V, {kv} KiB each, {used} of the 227 KiB a program may use.",
        height=420)
    return set_narrow(fig, **narrow, **{"margin.l": 12})  # no tick labels at the left: the bars take the width


def store_pattern(staged: bool, rows: int = 8, cols: int = 32) -> tuple[list[list[int]], list[list[int]]]:
    """For the first `rows` × `cols` elements of warp 0's part of O (16-bit): which lane holds each
    element when it is stored, and which of the warp's store instructions writes it. Straight from
    wgmma's accumulator layout, lane l holds columns 2(l mod 4) + {0, 1} + 8j of rows l div 4 (and
    + 8), one instruction per j and row half; staged (`store_layout`: [1, 8] per thread, 16 threads per row), lane
    l holds 8 adjacent columns 8(l mod 16) … of row l div 16 + 2i in instruction i."""
    lanes, instructions = [], []
    for r in range(rows):
        lane_row, instr_row = [], []
        for c in range(cols):
            if staged:
                per_row = HEAD_DIM // 8  # threads per row
                lane_row.append((r % (32 // per_row)) * per_row + c // 8)
                instr_row.append(r // (32 // per_row))
            else:
                lane_row.append((r % 8) * 4 + (c % 8) // 2)
                instr_row.append(c // 8 + (HEAD_DIM // 8) * ((r // 8) % 2))  # rows l div 4 + 8: other instructions
        lanes.append(lane_row)
        instructions.append(instr_row)
    return lanes, instructions


NARROW_STORE_COLUMNS = 20  # of O's columns, shown on a phone: one 32-byte sector and part of the next


@figure("concept-output-stores")
def output_stores(rows: int = 8, cols: int = 32) -> go.Figure:
    """Which lane stores which element of O, and in which instruction, from wgmma's layout and after
    staging through shared memory; 32-byte sectors marked."""
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2, subplot_titles=[
        "From wgmma's accumulator layout: 4 bytes per thread per store", "Staged through shared memory: 16 bytes per thread"])
    colours = WAVE_COLOURS[:4]
    for panel, staged in ((1, False), (2, True)):
        lanes, instr = store_pattern(staged, rows, cols)
        width = 16 if staged else 4
        about = [[hover(f"row {r}, column {c}: lane {lanes[r][c]}, store instruction {instr[r][c]} "
                        f"({width} bytes from this thread)") for c in range(cols)] for r in range(rows)]
        top = max(max(row) for row in instr)
        scale = [[i / (top + 1) + e / (top + 1), colours[i % len(colours)]] for i in range(top + 1) for e in (0, 1)]
        fig.add_trace(go.Heatmap(z=instr, text=lanes, texttemplate="%{text}", hovertext=about, hoverinfo="text",
                                 colorscale=scale, zmin=-0.5, zmax=top + 0.5, showscale=False, xgap=1, ygap=1,
                                 textfont=dict(size=9, color="white")), row=panel, col=1)
        for sector in range(16, cols, 16):  # a 32-byte sector: 16 columns of 16-bit elements
            fig.add_vline(x=sector - 0.5, line=dict(color="black", width=2), row=panel, col=1)
        fig.update_yaxes(autorange="reversed", row=panel, col=1)
    concept_layout(
        fig, "Writing O: two half-sector stores, or one whole-sector store",
        f"Two grids of the first {rows} rows and {cols} columns of O, each cell labelled with the lane that "
        "stores it and coloured by store instruction, thick lines every 16 columns (one 32-byte sector). "
        "Above, from wgmma's layout, each lane holds two adjacent columns and every sector is written half "
        "by one instruction and half by the next. Below, after staging through shared memory, each lane "
        "holds eight adjacent columns and each sector is written whole by one instruction.", height=520)
    add_notes(fig, f"Warp 0 of a consumer warpgroup, {HEAD_DIM} columns of 16-bit values in all; a cell's number is "
                   "its lane, its colour the store instruction that writes it (hover for both).",
              f"On a narrow screen the grids show their first {NARROW_STORE_COLUMNS} columns, so that the lane "
              "numbers stay legible; drag a grid sideways for the rest.")
    # a phone: fewer, wider cells (the first sector and the start of the next), no margin at the sides
    return set_narrow(fig, **{"+height": 60, "margin.l": 8, "margin.r": 8, "dragmode": "pan",
                              **{f"xaxis{i}.range": [-0.5, NARROW_STORE_COLUMNS - 0.5] for i in ("", "2")}})
