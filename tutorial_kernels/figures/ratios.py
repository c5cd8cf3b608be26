"""Our best kernel against torch's cuDNN and flash backends: the project's speed bars and the ratio table.

`PASSES` names the forward and backward benchmark files and our best kernel in each
(`FRONT_DOOR_PASSES` the same for `tutorial_kernels.flash_attention`, the call a model makes); `BARS` the
targets (a multiple of the reference's TFLOP/s, at N ≥ `BAR_MIN_N`); `ratio_rows` computes the ratios
cell by cell and `ratio_table` shows them as an HTML table (`tables.Table`) with the cells below a bar
flagged. Used by chapters 5 and 6 (`chapter_ratio_table`) and by the Benchmarks page.
"""

from __future__ import annotations

from tutorial_kernels.figures.rows import ok_rows, provider_keys
from tutorial_kernels.figures.runs import file_lines, file_runs, short_line
from tutorial_kernels.figures.tables import KEEP_CLASS, Table

# The two passes: the data file, the command that writes it, and our best kernel in it.
PASSES = {
    "forward": dict(file="ch05_fwd", suite="ch05-fwd", ours="flash-v2-tuned"),
    "backward": dict(file="ch06_bwd", suite="ch06-bwd", ours="flash-attention"),
}
# The front door (`tutorial_kernels.flash_attention`, the call a model makes), measured on its own suites.
FRONT_DOOR_PASSES = {
    "front door, forward": dict(file="front_door_fwd", suite="front-door-fwd", ours="front-door"),
    "front door, backward": dict(file="front_door_bwd", suite="front-door-bwd", ours="front-door"),
}
ALL_PASSES = {**PASSES, **FRONT_DOOR_PASSES}

# The project's speed targets, as a multiple of the reference, our best kernel only (chapter 5 and
# issue 8): forward at least 0.95× cuDNN at d = 64, 0.90× at d = 128 (no cuDNN target at d = 256) and
# 1.35× torch's flash backend; backward at least 0.75× cuDNN and 1.2× torch's flash backend. As in
# chapter 5, they apply where the GPU is full, N ≥ BAR_MIN_N.
BARS = {
    ("forward", "sdpa-cudnn"): {64: 0.95, 128: 0.90},
    ("forward", "sdpa-flash"): 1.35,
    ("backward", "sdpa-cudnn"): 0.75,
    ("backward", "sdpa-flash"): 1.2,
    # the front door's targets (issue 23), fixed before its first measurement: FlashAttention-3's claim
    # against cuDNN on Hopper is the model
    ("front door, forward", "sdpa-cudnn"): {64: 0.98, 128: 1.00},
    ("front door, backward", "sdpa-cudnn"): 0.95,
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
    ours = ALL_PASSES[pass_name]["ours"]
    by = {(r["provider_key"], r["head_dim"], r["causal"], r["dtype"], r["n"]): r["tflops"] for r in ok_rows(data)}
    cells = sorted({k[1:] for k in by if k[0] == ours}, key=lambda c: (c[0], c[1], c[2] != "float16", c[2], c[3]))
    out = []
    for d, causal, dtype, n in cells:
        row = dict(head_dim=d, causal=causal, dtype=dtype, n=n, tflops=by[(ours, d, causal, dtype, n)], ratios={},
                   bars={ref: bar(pass_name, ref, d, n) for ref in REFERENCES})
        for who in (ours, *OTHERS.get(pass_name, ())):
            for ref in REFERENCES:
                if (who, d, causal, dtype, n) in by and (ref, d, causal, dtype, n) in by:
                    row["ratios"][(who, ref)] = by[(who, d, causal, dtype, n)] / by[(ref, d, causal, dtype, n)]
        out.append(row)
    return out


def below_bar(row: dict, ours: str) -> bool:
    """Whether any of kernel `ours`'s ratios in `row` (one of `ratio_rows`) is below its bar."""
    return any(b is not None and (ours, ref) in row["ratios"] and row["ratios"][(ours, ref)] < b
               for ref, b in row["bars"].items())


FAIL_FILL, PASS_FILL = "#fbd5d0", "#e3f2e5"
NAMES = {"forward": "tuned (ch. 5)", "backward": "ours (ch. 6)", "front door, forward": "flash_attention",
         "front door, backward": "flash_attention", "flash-v2-triton": "teaching (ch. 5)",
         "flash-v1-triton": "FA-1 (ch. 4)"}
SHORT_REFERENCES = {"sdpa-cudnn": "× cuDNN", "sdpa-flash": "× torch flash"}
HOW_TO_READ = ("Each ratio is TFLOP/s over TFLOP/s in the same cell (d, causal, dtype, N) of the same file. "
               "Our best kernel's ratios: red with ▼ below the project's bar (in brackets), green with ✓ at or "
               "above it, uncoloured where no bar applies; the other kernels of ours are not flagged.")


def ratio_table(data: dict, pass_name: str, rows: list[dict]) -> Table:
    """`rows` (of `ratio_rows`) as an HTML table: our best kernel's ratios red with ▼ below their bar,
    green with ✓ at or above it, uncoloured where no bar applies; the pass's other kernels of ours
    unflagged. A row with a ratio below its bar has the class `KEEP_CLASS` (the Benchmarks page's
    checkbox keeps those)."""
    ours = ALL_PASSES[pass_name]["ours"]
    providers = set(provider_keys(data))
    who = [ours] + [k for k in OTHERS.get(pass_name, ()) if k in providers]
    header = ["d", "causal", "dtype", "N", "TFLOP/s"]
    columns = [[r["head_dim"] for r in rows], ["yes" if r["causal"] else "no" for r in rows],
               [r["dtype"] for r in rows], [r["n"] for r in rows], [f"{r['tflops']:.0f}" for r in rows]]
    fills: list[list] = [[None] * len(rows) for _ in columns]
    for w in who:
        for ref in REFERENCES:
            header.append(SHORT_REFERENCES[ref])
            text, fill = [], []
            for r in rows:
                value = r["ratios"].get((w, ref))
                target = r["bars"][ref] if w == ours else None
                if value is None:
                    text.append("—")
                    fill.append(None)
                elif target is None:
                    text.append(f"{value:.2f}")
                    fill.append(None)
                elif value < target:
                    digits = 2 if f"{value:.2f}" != f"{target:.2f}" else 3  # 1.349 is below 1.35
                    text.append(f"<b>{value:.{digits}f}&nbsp;▼</b> ({target:.2f})")
                    fill.append(FAIL_FILL)
                else:
                    text.append(f"{value:.2f}&nbsp;✓")
                    fill.append(PASS_FILL)
            columns.append(text)
            fills.append(fill)
    groups = [("cell", 4), (NAMES[pass_name], 1 + len(REFERENCES))] + [(NAMES.get(w, w), len(REFERENCES)) for w in who[1:]]
    return Table(header, columns, fills=fills, align=["left"] * 4 + ["right"] * (len(columns) - 4), header_groups=groups,
                 row_classes=[KEEP_CLASS if below_bar(r, ours) else "" for r in rows])


def chapter_ratio_table(data: dict, pass_name: str, title: str) -> Table:
    """A chapter's ratio table (bars flagged) for one pass, restricted to the cells the chapter's
    targets cover, N ≥ BAR_MIN_N."""
    rows = [r for r in ratio_rows(data, pass_name) if r["n"] >= BAR_MIN_N]
    table = ratio_table(data, pass_name, rows)
    table.title, table.subtitle = title, short_line(file_runs(data))
    table.notes, table.provenance = [HOW_TO_READ], file_lines(data)
    return table
