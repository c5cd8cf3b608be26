"""How every figure looks: colours, one template, font sizes, margins, legend, hover, titles.

- Colours. `PROVIDER_COLOURS` is the one source of a provider's colour on every page, so that a
  reader can follow a line from chart to chart; `provider_colour` and `provider_line` read it (ours
  solid, torch's dashed). The colour maps of figures that draw variants of a provider (the HBM
  schedules, the prefill implementations, the probes' variants) are built from it here, as shades of
  the provider's colour. `COLOUR_GROUPS` lists what one figure can show together, and
  `colour_clashes()` says where two of them would look alike (the tests call it).
- Layout. `TEMPLATE` (fonts, grid, hover, legend below the plot) and `style_figure(fig, title, ...)`,
  which every figure goes through: it wraps the title and subtitle to fit a phone's width, sizes the
  top margin for them, and applies the template. `measured_layout(fig, data, title)` does the same
  for a figure of measurements, with the run's short provenance line as subtitle and the full record
  for the caption under the figure.
- Diagrams. `concept_layout(fig, title, alt)` is `style_figure` for a picture of an idea (a
  `concept-…` figure): no axes, no grid, and the text a screen reader says instead of the picture.
- The caption under a figure. `add_notes`, `set_alt`, `set_provenance` and `set_narrow` keep what the page
  shows under the figure (notes, the collapsed "How this was measured") and the figure's layout for
  narrow screens in `fig.layout.meta`; `figure_meta` reads them back (the registry turns them into
  HTML and takes them out of the figure).

Nothing here reads a file; `runs` (imported) writes the provenance lines.
"""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go

from tutorial_kernels.figures.runs import file_lines, file_runs, run_lines, short_line
from tutorial_kernels.figures.tables import Table

# --- colours ------------------------------------------------------------------------------------

# One colour per provider key on every page. Ours: warm colours, the tuned kernel (and chapter 6's
# forward + backward, which plays its part in the backward) red; torch's: cool ones, cuDNN green.
# Chapter 1's sums and chapter 3's matmuls and softmaxes never share a figure with the attentions:
# there torch's reference is green too, and a kernel of ours takes its chapter's colour.
PROVIDER_COLOURS = {
    "flash-v2-tuned": "#d62728",
    "flash-attention": "#d62728",
    "front-door": "#a50f15",
    "flash-v2-tuned-pointers": "#ff9896",
    "flash-v2-hopper": "#e377c2",
    "flash-v2-triton": "#ff7f0e",
    "flash-v1-triton": "#17becf",
    "online-triton": "#bcbd22",
    "naive-triton": "#8c564b",
    "sdpa-cudnn": "#2ca02c",
    "sdpa-flash": "#1f77b4",
    "sdpa-default": "#393b79",
    "sdpa-efficient": "#9467bd",
    "sdpa-math": "#e6ab02",
    "eager": "#7f7f7f",
    "torch-matmul": "#2ca02c",
    "triton-matmul-pointers": "#9467bd",
    "triton-matmul-descriptors": "#ff7f0e",
    "torch-softmax": "#2ca02c",
    "three-pass-softmax": "#8c564b",
    "online-softmax": "#bcbd22",
    "torch-sum": "#2ca02c",
    "triton-sum": "#ff7f0e",
    "triton-sum-atomic": "#9467bd",
    "cuda-sum": "#17becf",
    # decoding (chapter 8): ours warm, torch's cool, as above
    "kvcache": "#d62728",
    "kvcache-paged256": "#ff7f0e",
    "kvcache-paged16": "#e377c2",
    "front-door-decode": "#8c564b",
    "sdpa-cudnn-gqa": "#2ca02c",
    "sdpa-flash-gqa": "#1f77b4",
}
UNKNOWN_COLOUR = "#555555"  # a provider no figure has seen yet: visible, but clearly not one of ours
WAVE_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
LENGTH_COLOURS = ["#c6dbef", "#9ecae1", "#6baed6", "#3182bd", "#08519c", "#08306b"]  # light to dark: short to long
HEADER_FILL = "#e8eaf6"
CEILING_LINE = dict(color="black", dash="dot", width=1.5)  # a measured ceiling (copy bandwidth, matmul peak)

# Our kernels first (best first), then torch's; a provider not listed goes last, in file order.
PROVIDER_ORDER = [
    "front-door", "flash-v2-tuned", "flash-attention", "flash-v2-tuned-pointers", "flash-v2-hopper", "flash-v2-triton",
    "flash-v1-triton", "online-triton", "naive-triton",
    "kvcache", "kvcache-paged256", "kvcache-paged16", "front-door-decode",
    "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-default", "sdpa-math", "eager", "sdpa-cudnn-gqa", "sdpa-flash-gqa",
]
TORCH_PROVIDERS = {"sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-default", "sdpa-math", "eager",
                   "torch-matmul", "torch-softmax", "torch-sum", "sdpa-cudnn-gqa", "sdpa-flash-gqa"}


def shade(colour: str, amount: float) -> str:
    """`colour` mixed with white (amount > 0) or black (amount < 0), |amount| ≤ 1."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    target = 255 if amount > 0 else 0
    return "#" + "".join(f"{round(c + (target - c) * abs(amount)):02x}" for c in rgb)


def provider_colour(key: str) -> str:
    return PROVIDER_COLOURS.get(key, UNKNOWN_COLOUR)


def provider_line(key: str, **more) -> dict:
    """A provider's line: its colour, solid for ours and dashed for torch's."""
    return dict(color=provider_colour(key), dash="dash" if key in TORCH_PROVIDERS else "solid", **more)


def ordered_providers(keys: list[str]) -> list[str]:
    """`keys` in PROVIDER_ORDER; keys not listed there go last, in their given order."""
    rank = {k: i for i, k in enumerate(PROVIDER_ORDER)}
    return sorted(keys, key=lambda k: (rank.get(k, len(rank)), keys.index(k)))


# Variants drawn beside their provider, in shades of its colour.
SCHEDULE_COLOURS = {  # the schedules of data/ch04_hbm_bytes.json (chapters 4 and 5)
    "naive": provider_colour("naive-triton"),
    "flash-v1": provider_colour("flash-v1-triton"),
    "flash-v1 causal": shade(provider_colour("flash-v1-triton"), -0.45),
    "flash-v2": provider_colour("flash-v2-triton"),
    "flash-v2 causal": shade(provider_colour("flash-v2-triton"), -0.45),
}
IMPL_COLOURS = {  # the implementations of the prefill study (data/prefill.json)
    "eager": provider_colour("eager"),
    "sdpa": provider_colour("sdpa-default"),
    "tutorial_fa2": provider_colour("flash-v2-tuned"),
}
TUNED_VARIANT_COLOURS = [  # the tuned kernel and its variants in chapter 5's probes
    provider_colour("flash-v2-tuned"), shade(provider_colour("flash-v2-tuned"), -0.5),
    shade(provider_colour("flash-v2-tuned"), 0.45), shade(provider_colour("flash-v2-tuned"), 0.75),
]
HOPPER_VARIANT_COLOURS = [  # chapter 5's Hopper kernel as launched and forced into its two modes
    provider_colour("flash-v2-hopper"), shade(provider_colour("flash-v2-hopper"), 0.55),
    shade(provider_colour("flash-v2-hopper"), -0.5),
]
TILE_COLOURS = [provider_colour("flash-v1-triton"), shade(provider_colour("flash-v1-triton"), -0.45),
                shade(provider_colour("flash-v1-triton"), 0.55)]  # chapter 4's tile sweep, one per N

# What one figure can show together: each group's colours must tell its members apart.
_ATTENTION = ["eager", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn", "sdpa-default"]
COLOUR_GROUPS: dict[str, dict[str, str]] = {
    "attention, forward (chapters 2 to 5, Benchmarks)": {
        k: provider_colour(k) for k in [*_ATTENTION, "naive-triton", "online-triton", "flash-v1-triton",
                                        "flash-v2-triton", "flash-v2-tuned", "flash-v2-tuned-pointers",
                                        "flash-v2-hopper"]},
    "attention, backward and memory (chapter 6, Benchmarks)": {
        k: provider_colour(k) for k in [*_ATTENTION, "flash-attention"]},
    "matmul (chapter 3)": {k: provider_colour(k) for k in ("torch-matmul", "triton-matmul-pointers",
                                                            "triton-matmul-descriptors")},
    "softmax (chapter 3)": {k: provider_colour(k) for k in ("torch-softmax", "three-pass-softmax", "online-softmax")},
    "sums (chapter 1)": {k: provider_colour(k) for k in ("torch-sum", "triton-sum", "triton-sum-atomic", "cuda-sum")},
    "HBM schedules (chapters 4 and 5)": SCHEDULE_COLOURS,
    "prefill implementations": IMPL_COLOURS,
    "schedule probe (chapter 5)": {"sdpa-cudnn": provider_colour("sdpa-cudnn"), "sdpa-flash": provider_colour("sdpa-flash"),
                                   **{f"tuned variant {i}": c for i, c in enumerate(TUNED_VARIANT_COLOURS)}},
    "Hopper prefill shape (chapter 5)": {"flash-v2-tuned": provider_colour("flash-v2-tuned"),
                                         "sdpa-default": provider_colour("sdpa-default"),
                                         **{f"Hopper variant {i}": c for i, c in enumerate(HOPPER_VARIANT_COLOURS)}},
}
MIN_COLOUR_DISTANCE = 15.0  # CIE76 ΔE: below this, two colours read as one


def _lab(colour: str) -> tuple[float, float, float]:
    """'#rrggbb' in CIE L*a*b*."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(int(colour[i:i + 2], 16) / 255) for i in (1, 3, 5))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047  # sRGB → XYZ, relative to the D65 white
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def colour_distance(a: str, b: str) -> float:
    """CIE76 ΔE between two '#rrggbb' colours (about 2.3: just noticeable; under 15: easily confused)."""
    return math.dist(_lab(a), _lab(b))


def colour_clashes(groups: dict[str, dict[str, str]] | None = None) -> list[str]:
    """Where two members of a group (by default `COLOUR_GROUPS`: what one figure can show together)
    would share a colour, or nearly (ΔE < MIN_COLOUR_DISTANCE); one readable line each. `groups` may
    also map a group to a list of provider keys, coloured from PROVIDER_COLOURS. Empty: no clash."""
    problems = []
    for group, members in (COLOUR_GROUPS if groups is None else groups).items():
        if not isinstance(members, dict):
            missing = [k for k in members if k not in PROVIDER_COLOURS]
            problems += [f"{group}: {k} has no colour in PROVIDER_COLOURS" for k in missing]
            members = {k: PROVIDER_COLOURS[k] for k in members if k in PROVIDER_COLOURS}
        items = list(members.items())
        for i, (a, ca) in enumerate(items):
            for b, cb in items[i + 1:]:
                if ca.lower() == cb.lower():
                    problems.append(f"{group}: {a} and {b} are both {ca}")
                elif (d := colour_distance(ca, cb)) < MIN_COLOUR_DISTANCE:
                    problems.append(f"{group}: {a} ({ca}) and {b} ({cb}) look alike (ΔE {d:.1f})")
    return problems


# --- text -----------------------------------------------------------------------------------------

FONT_FAMILY = '-apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial, sans-serif'
SIZES = dict(text=13, title=16, subtitle=12, axis_title=13, tick=12, legend=12, note=12, hover=12)
# Characters per line that fit a phone (a 390 px screen leaves the figure ~358 px) at each size.
TITLE_WIDTH, SUBTITLE_WIDTH, LABEL_WIDTH, LEGEND_WIDTH = 42, 56, 42, 46


def visible_length(text: str) -> int:
    """Characters a reader sees: tags not counted, an entity counted once."""
    return len(re.sub(r"&#?\w+;", "x", re.sub(r"<[^>]+>", "", text)))


def wrap(text: str, width: int) -> str:
    """`text` with <br> breaks at spaces, so that no line shows more than `width` characters (a word
    longer than that keeps its own line); breaks already there stay."""
    out = []
    for line in re.split(r"<br\s*/?>", text or ""):
        current = ""
        # "N = 4096", "3 × 132": an operator stays on the line of both its operands
        for word in re.split(r"(?<![=×≥≤→+]) (?![=×≥≤→+] |[=×≥≤→+]$)", line):
            if current and visible_length(current) + 1 + visible_length(word) > width:
                out.append(current)
                current = word
            else:
                current = f"{current} {word}" if current else word
        out.append(current)
    return "<br>".join(out)


def line_count(text: str | None) -> int:
    return 0 if not text else len(re.split(r"<br\s*/?>", text))


# --- the template and the figure's frame ---------------------------------------------------------

_AXIS = dict(gridcolor="#e6e9ef", linecolor="#c8ccd4", zerolinecolor="#d5d9e0", ticks="", automargin=True,
             title=dict(font=dict(size=SIZES["axis_title"]), standoff=8), tickfont=dict(size=SIZES["tick"]))
TEMPLATE = go.layout.Template(layout=dict(
    font=dict(family=FONT_FAMILY, size=SIZES["text"], color="#2a3f5f"),
    paper_bgcolor="white", plot_bgcolor="white", colorway=WAVE_COLOURS,
    title=dict(x=0, xref="container", xanchor="left", y=1, yref="container", yanchor="top",
               pad=dict(l=12, t=12), automargin=True, font=dict(size=SIZES["title"]),
               subtitle=dict(font=dict(size=SIZES["subtitle"], color="#5a6372"))),
    xaxis=_AXIS, yaxis=dict(_AXIS, ticklabelstandoff=4),
    # Below the plot, across the figure's width: on a phone it becomes one entry per row, and the
    # figure's bottom margin grows to hold it, under the axis title.
    legend=dict(orientation="h", xref="container", x=0.01, xanchor="left", yref="container", y=0.005,
                yanchor="bottom", font=dict(size=SIZES["legend"]), tracegroupgap=4, itemsizing="constant"),
    hovermode="closest",
    hoverlabel=dict(align="left", namelength=-1, font=dict(family=FONT_FAMILY, size=SIZES["hover"])),
    margin=dict(l=64, r=24, b=16, t=80),
    annotationdefaults=dict(font=dict(size=SIZES["note"])),
))


def title_block_height(title: str | None, subtitle: str | None) -> int:
    """Pixels the title and subtitle take at the top of the figure (`TEMPLATE`'s sizes and padding)."""
    height = 12 + 21 * line_count(title)
    if subtitle:
        height += 4 + 16 * line_count(subtitle)
    return height + 14


def style_figure(fig: go.Figure, title: str | None = None, subtitle: str | None = None, *, height: int | None = None,
                 above: int = 0, **layout) -> go.Figure:
    """Apply the template to a finished figure: `title` and `subtitle` wrapped to fit a phone, axis
    titles, panel titles and legend entries too, and a top margin that holds the title, the top row's
    panel titles and `above` more pixels (for menus or a note between the title and the plot)."""
    title = wrap(title, TITLE_WIDTH) if title else None
    subtitle = wrap(subtitle, SUBTITLE_WIDTH) if subtitle else None
    top_row = subplot_titles(fig)
    margin = dict(layout.pop("margin", {}) or {})
    margin.setdefault("t", title_block_height(title, subtitle) + above + (PANEL_TITLE_LINE_PX * top_row + 8 if top_row else 0))
    fig.update_layout(template=TEMPLATE, margin=margin, **({"height": height} if height else {}), **layout)
    if title:
        fig.update_layout(title=dict(text=title, subtitle=dict(text=subtitle)))
    fig.for_each_xaxis(lambda axis: axis.title.text and axis.title.update(text=wrap(axis.title.text, LABEL_WIDTH)))
    fig.for_each_yaxis(lambda axis: axis.title.text and axis.title.update(text=wrap(axis.title.text, LABEL_WIDTH)))
    for trace in fig.data:
        if trace.name and trace.showlegend is not False:
            trace.name = wrap(trace.name, LEGEND_WIDTH)
    return fig


PANEL_TITLE_LINE_PX = 17


def concept_layout(fig: go.Figure, title: str, alt: str, *, height: int | None = None, above: int = 0,
                   **layout) -> go.Figure:
    """`style_figure` for a diagram of an idea: axes, grid and zero lines hidden (shapes and
    annotations drawn in axis units stay where they were put), the figure's alt text set. The
    template's white paper keeps the diagram legible when the site is dark (the page gives every
    plot a white card there)."""
    set_alt(fig, alt)
    hidden = dict(showgrid=False, zeroline=False, showticklabels=False, ticks="", showline=False, title=None)
    fig.update_xaxes(**hidden)
    fig.update_yaxes(**hidden)
    return style_figure(fig, title, height=height, above=above, **layout)


def subplot_titles(fig: go.Figure) -> int:
    """make_subplots' panel titles at the template's axis-title size, wrapped to fit a phone; returns
    how many lines the tallest title of the top row has (0: no panel titles)."""
    titles = [a for a in fig.layout.annotations if a.xref == "paper" and a.yref == "paper" and a.yanchor == "bottom"
              and a.xanchor == "center" and a.showarrow is False and a.font.size in (16, SIZES["axis_title"])]
    for a in titles:
        a.update(text=wrap(a.text, LABEL_WIDTH), font=dict(size=SIZES["axis_title"]))
    top = max((a.y for a in titles), default=None)
    return max((line_count(a.text) for a in titles if a.y == top), default=0)


def measured_layout(fig: go.Figure, data: dict | list[tuple[str, dict]] | None, title: str, *, above: int = 0,
                    runs: list[dict | tuple[str, dict]] | None = None, **layout) -> go.Figure:
    """`style_figure` for a figure of measurements: under the title, the GPU that measured it; the full
    record (versions, date, commit, command) goes to the caption under the figure. `data` is a data file's
    dict, or (label, dict) pairs for a figure drawn from several files; `runs` (provenance records,
    or (label, record) pairs) replaces them when only some of a file's runs made the figure."""
    if runs is None:
        sources = [("", data)] if isinstance(data, dict) else list(data)
        runs = [p for _, d in sources for p in file_runs(d)]
        lines = [line for label, d in sources for line in file_lines(d, label)]
    else:
        pairs = [r if isinstance(r, tuple) else ("", r) for r in runs]
        runs = [p for _, p in pairs]
        lines = [run_lines(p, label) for label, p in pairs]
    set_provenance(fig, lines)
    return style_figure(fig, title, short_line(runs), above=above, **layout)


def log_ticks(low: float, high: float) -> list[float]:
    """1, 2, 5 × 10^k from `low` to `high`: labels of a logarithmic axis, all at the tick font's size
    (Plotly draws its own "D2" labels between the powers of ten smaller)."""
    out = []
    for k in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        out += [m * 10 ** k for m in (1, 2, 5) if low <= m * 10 ** k <= high]
    return out


def reference_line(fig: go.Figure, y: float, text: str | None = None, *, position: str = "bottom left",
                   log: bool = False, line: dict | None = None, **where) -> go.Figure:
    """A horizontal line across a plot (a measured ceiling, by default) with its label at `position`
    (keep the label where no data line runs: under the line at the left, usually); `log` when the
    y axis is logarithmic (a label's y is then log10 of the value); `where`: row=, col= of a subplot."""
    label = {} if text is None else dict(annotation_text=text, annotation_position=position)
    if text is not None and log:
        label["annotation"] = dict(y=math.log10(y))
    fig.add_hline(y=y, line=line or CEILING_LINE, **label, **where)
    return fig


def measured_table(header: list[str], columns: list[list], data: dict, title: str, **table) -> Table:
    """A `tables.Table` of measurements: `title`, the run's short provenance line under it, and the
    full record for the collapsed caption."""
    return Table(header, columns, title=title, subtitle=short_line(file_runs(data)), provenance=file_lines(data),
                 **table)


# --- what the page shows under a figure, kept in layout.meta until the registry renders it ----------

def figure_meta(fig: go.Figure) -> dict:
    meta = fig.layout.meta
    return dict(meta) if isinstance(meta, dict) else {}


def _update_meta(fig: go.Figure, **changes) -> None:
    fig.layout.meta = {**figure_meta(fig), **changes}


def add_notes(fig: go.Figure, *notes: str) -> go.Figure:
    """Lines of HTML shown under the figure (what is missing from it, how to read it)."""
    _update_meta(fig, notes=[*figure_meta(fig).get("notes", []), *(n for n in notes if n)])
    return fig


def set_alt(fig: go.Figure, text: str) -> go.Figure:
    """What the figure shows, in words, for a reader who cannot see it (the registry makes it the
    figure's `aria-label`, with `role="img"`). Required for a `concept-…` diagram."""
    if not text or not text.strip():
        raise ValueError("alt text must say what the figure shows, got an empty string")
    _update_meta(fig, alt=" ".join(text.split()))
    return fig


def set_provenance(fig: go.Figure, lines: list[str]) -> go.Figure:
    """The full record of the runs behind the figure, for its collapsed caption (HTML lines)."""
    _update_meta(fig, provenance=list(lines))
    return fig


def set_narrow(fig: go.Figure, **relayout) -> go.Figure:
    """Layout changes for a narrow screen beyond the generic ones (`responsive.narrow_layout`), as
    Plotly.relayout keys, e.g. set_narrow(fig, **{"updatemenus[0].x": 0}); "+height" adds pixels to
    the height the generic changes give."""
    _update_meta(fig, narrow={**figure_meta(fig).get("narrow", {}), **relayout})
    return fig
