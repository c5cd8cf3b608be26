"""Our best kernel against torch's cuDNN and flash backends: the project's speed bars and the ratio table.

`PASSES` names the forward and backward benchmark files and our best kernel in each; `BARS` the
targets (a multiple of the reference's TFLOP/s, at N ≥ `BAR_MIN_N`); `ratio_rows` computes the ratios
cell by cell and `ratio_table` shows them with the cells below a bar flagged. Used by chapters 5
and 6 (`chapter_ratio_table`) and by the Benchmarks page.
"""

from __future__ import annotations

import plotly.graph_objects as go

from tutorial_kernels.figures.rows import ok_rows, provider_keys
from tutorial_kernels.figures.style import HEADER_FILL, measured_layout

# The two passes: the data file, the command that writes it, and our best kernel in it.
PASSES = {
    "forward": dict(file="ch05_fwd", suite="ch05-fwd", ours="flash-v2-tuned"),
    "backward": dict(file="ch06_bwd", suite="ch06-bwd", ours="flash-attention"),
}

# The project's speed targets, as a multiple of the reference, our best kernel only (chapter 5 and
# issue 8): forward at least 0.95× cuDNN at d = 64, 0.90× at d = 128 (no cuDNN target at d = 256) and
# 1.35× torch's flash backend; backward at least 0.75× cuDNN and 1.2× torch's flash backend. As in
# chapter 5, they apply where the GPU is full, N ≥ BAR_MIN_N.
BARS = {
    ("forward", "sdpa-cudnn"): {64: 0.95, 128: 0.90},
    ("forward", "sdpa-flash"): 1.35,
    ("backward", "sdpa-cudnn"): 0.75,
    ("backward", "sdpa-flash"): 1.2,
}
BAR_MIN_N = 4096
REFERENCES = ("sdpa-cudnn", "sdpa-flash")
OTHERS = {"forward": ("flash-v2-triton", "flash-v1-triton"), "backward": ()}


def bar(pass_name: str, reference: str, head_dim: int, n: int) -> float | None:
    """The target ratio of our best kernel to `reference` in this cell, or None where there is none."""
    target = BARS.get((pass_name, reference))
    if isinstance(target, dict):
        target = target.get(head_dim)
    return target if n >= BAR_MIN_N else None


def ratio_rows(data: dict, pass_name: str) -> list[dict]:
    """Per measured cell (d, causal, dtype, N) where our best kernel ran: its TFLOP/s, and for it and for
    the pass's other kernels of ours (teaching FlashAttention-2, FlashAttention-1) the ratio of TFLOP/s
    to each reference (torch's cuDNN and flash backends), under "ratios"[(who, reference)]; the bar of
    each of our best kernel's ratios under "bars"[reference] (None: no bar)."""
    ours = PASSES[pass_name]["ours"]
    by = {(r["provider_key"], r["head_dim"], r["causal"], r["dtype"], r["n"]): r["tflops"] for r in ok_rows(data)}
    cells = sorted({k[1:] for k in by if k[0] == ours}, key=lambda c: (c[0], c[1], c[2] != "float16", c[2], c[3]))
    out = []
    for d, causal, dtype, n in cells:
        row = dict(head_dim=d, causal=causal, dtype=dtype, n=n, tflops=by[(ours, d, causal, dtype, n)], ratios={},
                   bars={ref: bar(pass_name, ref, d, n) for ref in REFERENCES})
        for who in (ours, *OTHERS[pass_name]):
            for ref in REFERENCES:
                if (who, d, causal, dtype, n) in by and (ref, d, causal, dtype, n) in by:
                    row["ratios"][(who, ref)] = by[(who, d, causal, dtype, n)] / by[(ref, d, causal, dtype, n)]
        out.append(row)
    return out


def below_bar(row: dict, ours: str) -> bool:
    """Whether any of kernel `ours`'s ratios in `row` (one of `ratio_rows`) is below its bar."""
    return any(b is not None and (ours, ref) in row["ratios"] and row["ratios"][(ours, ref)] < b
               for ref, b in row["bars"].items())


_FAIL, _PASS, _PLAIN = "#fbd5d0", "#e3f2e5", "white"


def ratio_table(data: dict, pass_name: str, rows: list[dict]) -> go.Table:
    """`rows` (of `ratio_rows`) as a table: our best kernel's ratios red with ▼ below their bar, green
    with ✓ at or above it, white where no bar applies; the pass's other kernels of ours unflagged."""
    ours = PASSES[pass_name]["ours"]
    providers = set(provider_keys(data))
    who = [ours] + [k for k in OTHERS[pass_name] if k in providers]
    short = {"sdpa-cudnn": "cuDNN", "sdpa-flash": "torch flash"}
    name = {ours: "ours (ch. 6)" if pass_name == "backward" else "tuned (ch. 5)", "flash-v2-triton": "teaching (ch. 5)",
            "flash-v1-triton": "FA-1 (ch. 4)"}
    header = ["d", "causal", "dtype", "N", f"{name[ours]}<br>TFLOP/s"]
    columns = [[r["head_dim"] for r in rows], ["yes" if r["causal"] else "no" for r in rows],
               [r["dtype"] for r in rows], [r["n"] for r in rows], [f"{r['tflops']:.0f}" for r in rows]]
    fills = [[_PLAIN] * len(rows) for _ in columns]
    for w in who:
        for ref in REFERENCES:
            header.append(f"{name.get(w, w)}<br>× {short[ref]}")
            text, fill = [], []
            for r in rows:
                value = r["ratios"].get((w, ref))
                target = r["bars"][ref] if w == ours else None
                if value is None:
                    text.append("—")
                    fill.append(_PLAIN)
                elif target is None:
                    text.append(f"{value:.2f}")
                    fill.append(_PLAIN)
                elif value < target:
                    digits = 2 if f"{value:.2f}" != f"{target:.2f}" else 3  # 1.349 is below 1.35
                    text.append(f"<b>{value:.{digits}f} ▼</b> (bar {target:.2f})")
                    fill.append(_FAIL)
                else:
                    text.append(f"{value:.2f} ✓")
                    fill.append(_PASS)
            columns.append(text)
            fills.append(fill)
    widths = [0.6, 0.8, 1.0, 0.8, 1.0] + [1.4 if w == ours else 1.0 for w in who for _ in REFERENCES]
    return go.Table(
        header=dict(values=[f"<b>{h}</b>" for h in header], align="center", fill_color=HEADER_FILL),
        cells=dict(values=columns, align="center", height=24, fill_color=fills), columnwidth=widths,
    )


def chapter_ratio_table(data: dict, pass_name: str, title: str) -> go.Figure:
    """The Benchmarks page's ratio table (bars flagged) for one pass, restricted to the cells the
    chapter's targets cover, N ≥ BAR_MIN_N."""
    rows = [r for r in ratio_rows(data, pass_name) if r["n"] >= BAR_MIN_N]
    fig = go.Figure(ratio_table(data, pass_name, rows))
    fig.update_layout(height=min(34 * len(rows) + 260, 1600), margin=dict(t=150, l=10, r=10, b=10))
    return measured_layout(fig, data, title)
