"""The figure registry: every figure has a name, and pages and notebooks draw it by that name.

`@figure(NAME)` registers a factory (a function that returns a `plotly.graph_objects.Figure`, or a
`tables.Table` / `tables.Tabs` for a table, when called without arguments); `build(NAME)` calls it;
`figure_html(NAME)` is what the site's hook puts where a page says `<!-- figure: NAME -->`: the plot
(with its layout for narrow screens, `responsive`) or the HTML table, then the notes and the collapsed
"How this was measured" the figure carries (`style.add_notes`, `style.set_provenance`);
`provenance(NAME)` is that record alone. `show(fig)` displays a figure or a table in a notebook.
"""

from __future__ import annotations

import html
from typing import Callable, Union

import plotly.graph_objects as go

from tutorial_kernels.figures.responsive import narrow_layout, switch_script, wide_layout
from tutorial_kernels.figures.tables import Table, Tabs, caption_html

Drawing = Union[go.Figure, Table, Tabs]
FigureFactory = Callable[[], Drawing]
FIGURES: dict[str, FigureFactory] = {}
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def figure(name: str) -> Callable[[FigureFactory], FigureFactory]:
    """Register a figure factory under `name`, the name pages and notebooks use."""

    def register(factory: FigureFactory) -> FigureFactory:
        FIGURES[name] = factory
        return factory

    return register


def build(name: str) -> Drawing:
    if name not in FIGURES:
        raise KeyError(f"no figure named {name!r}; known figures: {', '.join(sorted(FIGURES))}")
    return FIGURES[name]()


def split_meta(fig: go.Figure) -> tuple[go.Figure, dict]:
    """A copy of `fig` without what `style` keeps in layout.meta for the page, and that meta."""
    meta = fig.layout.meta
    meta = dict(meta) if isinstance(meta, dict) else {}
    plain = go.Figure(fig)
    plain.layout.meta = None
    return plain, meta


def is_table(drawing: Drawing) -> bool:
    return isinstance(drawing, (Table, Tabs))


def plot_html(fig: go.Figure, name: str | None = None) -> str:
    """The plot alone (a `fig` without meta, see `split_meta`), with the script that gives it its
    layout for narrow screens; a figure with alt text (`style.set_alt`) is wrapped in a
    `role="img"` element that carries it."""
    plain, meta = split_meta(fig)
    narrow = narrow_layout(plain, meta.get("narrow"))
    alt = meta.get("alt")
    plot = plain.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, config=PLOT_CONFIG,
                         div_id=f"figure-{name}" if name else None,
                         post_script=switch_script(narrow, wide_layout(plain, narrow)))
    if not alt:
        return plot
    return f'<div class="figure-alt" role="img" aria-label="{html.escape(alt, quote=True)}">{plot}</div>'


def drawing_html(drawing: Drawing, name: str | None = None) -> str:
    """A figure or a table as an HTML fragment: no plotly.js (the page loads it), no MathJax; then
    the notes and the provenance record under it."""
    if is_table(drawing):
        return drawing.html(name)
    meta = split_meta(drawing)[1]
    return plot_html(drawing, name) + caption_html(meta.get("notes", ()), meta.get("provenance", ()))


def figure_html(name: str) -> str:
    """What the site's hook puts where a page says `<!-- figure: NAME -->`."""
    return drawing_html(build(name), name)


def provenance(name: str) -> list[str]:
    """The full provenance record of figure `name`, as HTML lines (empty for a drawing of no data)."""
    drawing = build(name)
    if is_table(drawing):
        return list(drawing.provenance)
    return list(split_meta(drawing)[1].get("provenance", []))


def show(drawing: Drawing) -> None:
    """Display a figure in a notebook as plotly JSON (for Jupyter) and as HTML (for the site's
    nbconvert), then its notes and provenance; a table as HTML."""
    from IPython.display import display

    if is_table(drawing):
        display({"text/html": drawing.html()}, raw=True)
        return
    fig, meta = split_meta(drawing)
    display({"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": plot_html(drawing)}, raw=True)
    caption = caption_html(meta.get("notes", ()), meta.get("provenance", ()))
    if caption:
        display({"text/html": caption}, raw=True)
