"""Chapter 6's figures (docs/chapters/06-backward.md): the backward pass.

Backward TFLOP/s per cell (data/ch06_bwd.json) and the ratio table against torch's backends, the
training curves of the small GPT (data/ch06_training.json), and the peak memory of forward +
backward (data/ch06_memory.json; on the Benchmarks page too).
"""

from __future__ import annotations

import re

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tutorial_kernels.figures.ch05 import tflops_by_cell
from tutorial_kernels.figures.ratios import chapter_ratio_table
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.rows import load_data, load_optional, ok_rows, provider_keys, provider_label
from tutorial_kernels.figures.style import (
    measured_layout,
    ordered_providers,
    provider_colour,
    provider_line,
    reference_line,
    style_figure,
)
from tutorial_kernels.figures.tables import Table


@figure("ch06-bwd-tflops")
def backward_tflops(data: dict | None = None) -> go.Figure:
    return tflops_by_cell(data or load_data("ch06_bwd"), "Backward TFLOP/s vs N (B·N = 16384, H·d = 2048)")


@figure("ch06-ratio-table")
def backward_ratio_table(data: dict | None = None) -> Table:
    """Chapter 6's backward against cuDNN's and torch flash's, N ≥ 4096, flagged against the bars."""
    return chapter_ratio_table(data or load_data("ch06_bwd"), "backward",
                                "Backward (dQ, dK, dV) as a multiple of torch's cuDNN and flash backends, N ≥ 4096")


@figure("ch06-training")
def training_curves(data: dict | None = None, window: int = 20) -> go.Figure:
    """Loss per step (moving average over `window` steps) of the GPT trained with each attention and
    seed, and each run's median step time."""
    data = data or load_data("ch06_training")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.7, 0.3], horizontal_spacing=0.12,
                        subplot_titles=[f"training loss (mean of {window} steps)", "median step time"])
    # torch's attention in training dispatches to its flash backend; ours is chapter 6's forward + backward
    colours = {"torch": provider_colour("sdpa-flash"), "tutorial": provider_colour("flash-attention")}
    names = {"torch": "F.scaled_dot_product_attention", "tutorial": "this tutorial's flash_attention"}
    for run in data["runs"]:
        losses = run["losses"]
        smooth = [sum(losses[max(0, i - window + 1):i + 1]) / len(losses[max(0, i - window + 1):i + 1]) for i in range(len(losses))]
        label = f"{names[run['attention']]}, initialisation {run['seed']}"
        fig.add_trace(go.Scatter(x=list(range(1, len(losses) + 1)), y=smooth, mode="lines", name=label,
                                 line=dict(color=colours[run["attention"]], dash="solid" if run["seed"] == 0 else "dot"),
                                 hovertemplate=label + "<br>step %{x}: %{y:.3f}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Bar(x=[f"{run['attention']}<br>init. {run['seed']}"], y=[run["median_step_ms"]], showlegend=False,
                             marker_color=colours[run["attention"]],
                             hovertemplate=label + "<br>%{y:.1f} ms per step<extra></extra>"), row=1, col=2)
    c = data["config"]
    fig.update_xaxes(title="step", row=1, col=1)
    fig.update_xaxes(tickangle=0, row=1, col=2)
    fig.update_yaxes(title="cross-entropy (nats per character)", row=1, col=1)
    fig.update_yaxes(title="ms per step", rangemode="tozero", row=1, col=2)
    return measured_layout(fig, data, f"A {c['n_layer']}-layer GPT ({c['n_head']} heads of {c['n_embd'] // c['n_head']}, "
                                      f"context {c['block_size']}, batch {c['batch_size']}, bf16 autocast)",
                           height=560)


OUT_OF_MEMORY = {"oom": "out of memory"}


@figure("bench-memory")
def bench_memory(data: dict | bool | None = None) -> go.Figure:
    """Peak memory of one forward + backward against N, one line per provider (log scales).

    From data/ch06_memory.json (suite ch06-memory: B = 1, H = 16, d = 128, fp16, causal): the most memory
    allocated during the call beyond the inputs and dO (gradients included). A run that ran out of memory
    is marked with a cross on the GPU's memory line. Hovering also shows the time of forward + backward.
    """
    data = load_optional("ch06_memory", data)
    if data is None:
        fig = go.Figure()
        fig.add_annotation(text="Not measured yet: data/ch06_memory.json is missing "
                                "(<i>python -m tutorial_kernels.bench ch06-memory</i> writes it).",
                           xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font=dict(size=14))
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return style_figure(fig, "Peak memory of forward + backward vs N", height=260)
    fig = go.Figure()
    capacity = data["provenance"].get("gpu_memory_gib")
    for key in ordered_providers(provider_keys(data)):
        rows = sorted(ok_rows(data, provider_key=key), key=lambda r: r["n"])
        fig.add_trace(go.Scatter(
            x=[r["n"] for r in rows], y=[r["peak_extra_mib"] for r in rows], mode="lines+markers",
            name=provider_label(data, key), legendgroup=key, line=provider_line(key),
            customdata=[[r["ms"]] for r in rows],
            hovertemplate="%{fullData.name}<br>N = %{x}: %{y:,.0f} MiB, %{customdata[0]:.2f} ms<extra></extra>",
        ))
        oom = sorted((r for r in data["results"] if r["provider_key"] == key and r["status"] != "ok"), key=lambda r: r["n"])
        if oom and capacity:
            what = ", ".join(sorted({OUT_OF_MEMORY.get(r["status"], r["status"]) for r in oom}))
            fig.add_trace(go.Scatter(
                x=[r["n"] for r in oom], y=[capacity * 1024] * len(oom), mode="markers", legendgroup=key,
                name=f"{provider_label(data, key)}: {what}",
                marker=dict(symbol="x", size=13, color=provider_colour(key), line=dict(width=2)),
                hovertemplate=f"{provider_label(data, key)}<br>" + "N = %{x}: " + what + "<extra></extra>",
            ))
    if capacity:
        # the label at the left end of the line, under it: a run out of memory has its × at the right end
        reference_line(fig, capacity * 1024, f"GPU memory: {capacity:.0f} GiB", log=True)
    lengths = sorted({r["n"] for r in data["results"]})
    r0 = data["results"][0]
    fig.update_xaxes(title="sequence length N", type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_yaxes(title="peak extra memory of forward + backward (MiB)", type="log", dtick=1, tickformat=",~g")
    return measured_layout(fig, data, f"Memory of one forward + backward vs N (B = {r0['batch']}, H = {r0['heads']}, "
                                      f"d = {r0['head_dim']}, {r0['dtype']}{', causal' if r0['causal'] else ''})",
                           height=600)


# (tensor, where it lives during the dK/dV kernel's step for one pair of tiles)
BACKWARD_TENSORS = [("Q_i", "HBM → chip"), ("dO_i", "HBM → chip"), ("L_i", "HBM → chip"), ("Δ_i", "HBM → chip"),
                    ("K_j", "chip, whole loop"), ("V_j", "chip, whole loop"), ("Sᵀ", "chip, this step"),
                    ("Pᵀ", "chip, this step"), ("dPᵀ", "chip, this step"), ("dSᵀ", "chip, this step"),
                    ("dV_j", "chip, float32 sum"), ("dK_j", "chip, float32 sum"), ("dQ_i", "HBM (2nd kernel)")]
# (operation, {tensor: role}); roles: "read" an operand, "made" computed here, "added" accumulated into
BACKWARD_STEPS = [
    ("load Q_i, dO_i, L_i, Δ_i", {"Q_i": "made", "dO_i": "made", "L_i": "made", "Δ_i": "made"}),
    ("1: Sᵀ = τ K_j Q_iᵀ", {"K_j": "read", "Q_i": "read", "Sᵀ": "made"}),
    ("Pᵀ = exp(Sᵀ − L_i)", {"Sᵀ": "read", "L_i": "read", "Pᵀ": "made"}),
    ("2: dV_j += Pᵀ dO_i", {"Pᵀ": "read", "dO_i": "read", "dV_j": "added"}),
    ("3: dPᵀ = V_j dO_iᵀ", {"V_j": "read", "dO_i": "read", "dPᵀ": "made"}),
    ("dSᵀ = Pᵀ∘(dPᵀ − Δ_i)", {"Pᵀ": "read", "dPᵀ": "read", "Δ_i": "read", "dSᵀ": "made"}),
    ("4: dK_j += τ dSᵀ Q_i", {"dSᵀ": "read", "Q_i": "read", "dK_j": "added"}),
    ("5: dQ_i += τ dS K_j", {"dSᵀ": "read", "K_j": "read", "dQ_i": "added"}),
]
ROLE_NAMES = ["not used", "read", "loaded or computed here", "accumulated into"]
ROLE_COLOURS = ["#f4f5f7", "#9ecae1", "#fdae6b", "#74c476"]


@figure("concept-backward-step")
def backward_step() -> go.Figure:
    """One step of chapter 6's dK/dV kernel for a pair of tiles (key tile j kept, query tile i visiting): which
    tensors each operation reads, computes and accumulates into, with where each lives; dQ's product is the
    separate kernel's, which recomputes Sᵀ, Pᵀ, dPᵀ and dSᵀ the same way."""
    from tutorial_kernels.figures.concepts import NOTE, discrete_scale, hover, legend_entry, narrow_diagram
    from tutorial_kernels.figures.style import add_notes, concept_layout

    names = [re.sub(r"_(\w)", r"<sub>\1</sub>", name) for name, _ in BACKWARD_TENSORS]  # Q_i → Q<sub>i</sub>
    z, about = [], []
    role_index = {"read": 1, "made": 2, "added": 3}
    for op, roles in BACKWARD_STEPS:
        z.append([role_index.get(roles.get(name), 0) for name, _ in BACKWARD_TENSORS])
        about.append([hover(f"{op}: {name} ({where}) is " + {0: "not used", 1: "read", 2: "computed here",
                                                             3: "accumulated into"}[role_index.get(roles.get(name), 0)])
                      for name, where in BACKWARD_TENSORS])
    rows = [re.sub(r"_(\w)", r"<sub>\1</sub>", op) for op, _ in BACKWARD_STEPS]
    fig = go.Figure(go.Heatmap(z=z, x=names, y=rows, zmin=0, zmax=3,
                               colorscale=discrete_scale(ROLE_COLOURS), showscale=False, xgap=2, ygap=2,
                               customdata=about, hovertemplate="%{customdata}<extra></extra>"))
    for name, colour in zip(ROLE_NAMES[1:], ROLE_COLOURS[1:]):
        fig.add_trace(legend_entry(name, colour))
    add_notes(fig, "Rows 1 to 5 are the five matrix products; the others are elementwise. Where each tensor lives: Q_i, dO_i, L_i, Δ_i come from HBM at each step; K_j, V_j and the float32 sums "
                   "dK_j, dV_j stay on chip for the program's whole loop; Sᵀ, Pᵀ, dPᵀ, dSᵀ exist on chip for one step; "
                   "dQ_i is summed in HBM by the second kernel.",
              "Rows: one step of the dK/dV kernel, in order, for key tile j and the visiting query tile i. Four of the "
                   "five products happen in it; the fifth, dQ_i += τ dS K_j, is the separate dQ kernel's, which "
                   "recomputes Sᵀ, Pᵀ, dPᵀ and dSᵀ for the same pair. Nothing n × n is ever written to HBM.")
    narrow_diagram(fig, ticks=True, **{"+height": 160})
    concept_layout(fig, "One step of the backward: five products, what each reads and where it lives", (
        "A grid of the backward's operations for one pair of tiles (rows) against the tensors involved "
        "(columns, each labelled with where it lives: loaded from HBM per step, kept on chip for the whole loop, "
        "computed on chip for this step only, or a float32 sum on chip). Cells mark what each operation reads, "
        "computes and accumulates into: the recomputation of S and P from Q, K and L, then the products for dV, "
        "dP and dK, and dQ's product in its own kernel."), height=520, margin=dict(l=170, t=120))
    fig.update_yaxes(autorange="reversed", showticklabels=True, tickfont=dict(size=NOTE))  # after the diagram's
    fig.update_xaxes(showticklabels=True, side="top", tickfont=dict(size=NOTE))  # layout, which hides ticks
    return fig
