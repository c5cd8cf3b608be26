"""How the figures look, shared by every page: colours, provider order, titles with provenance, tables.

- `PROVIDER_COLOURS`: one colour per provider key across every figure, so that a reader can follow a
  line from chart to chart; `WAVE_COLOURS` for the waves of an SM timeline; `HEADER_FILL` for the
  header row of tables;
- `PROVIDER_ORDER`, `TORCH_PROVIDERS`, `ordered_providers`, `bench_colour`: how the Benchmarks-style
  figures order and colour providers (ours first and solid, torch's dashed);
- `provenance_line(data)`, `measured_layout(fig, data, title)`, `short_command`: the title of a figure
  of measurements, with the GPU, versions, date, commit and command of the run;
- `table_figure(...)`: a table figure in the site's style.

Nothing here reads a file or imports from the rest of the package.
"""

from __future__ import annotations

import plotly.graph_objects as go

# One colour per provider across every figure, so a reader can follow a line from chart to chart.
PROVIDER_COLOURS = {
    "eager": "#7f7f7f",
    "naive-triton": "#d62728",
    "sdpa-default": "#1f77b4",
    "sdpa-flash": "#1f77b4",
    "sdpa-efficient": "#9467bd",
    "sdpa-cudnn": "#2ca02c",
    "sdpa-math": "#8c564b",
    "online-triton": "#ff7f0e",
    "torch-matmul": "#2ca02c",
    "triton-matmul-pointers": "#d62728",
    "triton-matmul-descriptors": "#ff7f0e",
    "torch-softmax": "#2ca02c",
    "three-pass-softmax": "#d62728",
    "online-softmax": "#ff7f0e",
    "flash-v1-triton": "#17becf",
    "flash-v2-triton": "#ff7f0e",
    "flash-v2-tuned-pointers": "#e377c2",
    "flash-v2-tuned": "#d62728",
    "torch-sum": "#2ca02c",
    "triton-sum": "#ff7f0e",
    "triton-sum-atomic": "#9467bd",
    "cuda-sum": "#d62728",
}
WAVE_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
HEADER_FILL = "#e8eaf6"  # the header row of every table

# Our kernels first (best first), then torch's; a provider not listed goes last, in file order.
PROVIDER_ORDER = [
    "flash-v2-tuned", "flash-attention", "flash-v2-tuned-pointers", "flash-v2-triton", "flash-v1-triton",
    "online-triton", "naive-triton",
    "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-default", "sdpa-math", "eager",
]
TORCH_PROVIDERS = {"sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-default", "sdpa-math", "eager"}

# The Benchmarks page (and chapter 6's memory figure, drawn the same way) shows the tuned kernel and
# chapter 2's naive kernel together, and both are red in PROVIDER_COLOURS: the naive kernel takes
# another colour there. The backward kernel plays the tuned kernel's part in the backward view; it
# gets its colour unless PROVIDER_COLOURS gives it one.
BENCH_COLOURS = {"naive-triton": "#bcbd22"}
_BENCH_FALLBACK_COLOURS = {"flash-attention": "#d62728"}


def bench_colour(key: str) -> str | None:
    """A provider's colour in the Benchmarks-style figures."""
    return BENCH_COLOURS.get(key) or PROVIDER_COLOURS.get(key) or _BENCH_FALLBACK_COLOURS.get(key)


def ordered_providers(keys: list[str]) -> list[str]:
    """`keys` in PROVIDER_ORDER; keys not listed there go last, in their given order."""
    rank = {k: i for i, k in enumerate(PROVIDER_ORDER)}
    return sorted(keys, key=lambda k: (rank.get(k, len(rank)), keys.index(k)))


def short_command(command: str) -> str:
    """A recorded command without its `--out PATH` (where the file went is no part of what was run)."""
    return command.split(" --out")[0]


def provenance_line(data: dict) -> str:
    """Where and how `data` was measured, as one HTML line: GPU, versions, date, commit, command; then
    a line per earlier run whose rows the file keeps."""
    p = data["provenance"]
    line = (
        f"{p['gpu']} · torch {p['torch']} · triton {p['triton']} · CUDA {p['cuda']}<br>"
        f"{p['date_utc'][:10]} · commit {p['git_commit'][:8]} · <i>{p['command'].split(' --out')[0]}</i>"
    )
    for earlier in data.get("earlier_runs", []):  # a suite measured in parts (bench --append)
        e = earlier["provenance"]
        line += f"<br>and rows of {e['date_utc'][:10]} · commit {e['git_commit'][:8]} · <i>{e['command'].split(' --out')[0]}</i>"
    return line


def measured_layout(fig: go.Figure, data: dict, title: str) -> go.Figure:
    """The shared layout of a figure of measurements: `title` over the run's provenance line."""
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{provenance_line(data)}</sup>", font=dict(size=15)),
        template="plotly_white",
        hovermode="x unified",
        legend=dict(orientation="h", yanchor="top", y=-0.18),
        margin=dict(t=110),
    )
    return fig


def table_figure(header: list[str], columns: list[list], title: str, height: int,
                 widths: list[float] | None = None) -> go.Figure:
    """A table figure: bold `header`, one list per column, left-aligned."""
    fig = go.Figure(go.Table(
        header=dict(values=[f"<b>{h}</b>" for h in header], align="left", fill_color=HEADER_FILL),
        cells=dict(values=columns, align="left", height=26), columnwidth=widths,
    ))
    fig.update_layout(title=dict(text=title, font=dict(size=15)), height=height, margin=dict(l=10, r=10, t=90, b=10))
    return fig
