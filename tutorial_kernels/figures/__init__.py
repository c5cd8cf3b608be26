"""Plotly figures for the site and the notebooks, drawn from the committed data files (or from formulas).

A page names a figure with an HTML comment on its own line, `<!-- figure: NAME -->`, and the site's
build hook replaces it with `figure_html(NAME)`; a notebook draws the same figure with
`show(build(NAME))`. Nothing here touches a GPU.

The modules, from the bottom up (each imports only from the layers below it, and a page module
from earlier pages):

- `runs` (provenance: the short line under a title, the full record, commands with today's paths),
  `tables` (HTML tables and the caption under a figure), `responsive` (a figure's layout on a narrow
  screen), `rows` (data files and their rows), `style` (colours, the template, titles, the meta a
  figure carries for its caption), `registry` (the names: `figure`, `build`, `figure_html`, `show`);
- `timelines` (SM timelines) and `ratios` (our best kernel against torch's backends): drawings
  shared by several pages;
- one module per page, holding the figures that page shows first: `ch01` … `ch10`, `benchmarks`,
  `prefill`, `decisions`, and `concepts` (the `concept-…` diagrams of several pages). Importing this package
  imports them all, which registers every figure.
"""

from __future__ import annotations

# Importing a page module registers its figures.
from tutorial_kernels.figures import (  # noqa: F401
    benchmarks, ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, concepts, decisions, prefill)
from tutorial_kernels.figures.ch01 import reduction_bandwidth
from tutorial_kernels.figures.ch02 import memory_vs_n, probability_heatmap, rocm_speedup, time_vs_n
from tutorial_kernels.figures.ch04 import hbm_totals
from tutorial_kernels.figures.registry import (
    FIGURES,
    build,
    drawing_html,
    figure,
    figure_html,
    is_table,
    provenance,
    show,
)
from tutorial_kernels.figures.rows import load_data
from tutorial_kernels.figures.runs import provenance_line
from tutorial_kernels.figures.style import PROVIDER_COLOURS, colour_clashes
from tutorial_kernels.figures.tables import FIGURE_CSS, Table, Tabs
from tutorial_kernels.figures.timelines import timeline_figure

__all__ = [
    "FIGURES", "build", "figure", "figure_html", "drawing_html", "is_table", "provenance", "show", "load_data",
    "provenance_line", "PROVIDER_COLOURS", "colour_clashes", "FIGURE_CSS", "Table", "Tabs",
    # the figures notebooks draw with their own data or with the reader's measurements
    "hbm_totals", "memory_vs_n", "probability_heatmap", "reduction_bandwidth", "rocm_speedup", "time_vs_n",
    "timeline_figure",
]
