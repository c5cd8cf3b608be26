"""The figure registry: every figure has a name, and pages and notebooks draw it by that name.

`@figure(NAME)` registers a factory (a function that returns a `plotly.graph_objects.Figure` when
called without arguments); `build(NAME)` calls it; `figure_html(NAME)` is what the site's hook puts
where a page says `<!-- figure: NAME -->`; `show(fig)` displays a figure in a notebook. This module
imports nothing from the rest of the package.
"""

from __future__ import annotations

from typing import Callable

import plotly.graph_objects as go

FigureFactory = Callable[[], go.Figure]
FIGURES: dict[str, FigureFactory] = {}


def figure(name: str) -> Callable[[FigureFactory], FigureFactory]:
    """Register a figure factory under `name`, the name pages and notebooks use."""

    def register(factory: FigureFactory) -> FigureFactory:
        FIGURES[name] = factory
        return factory

    return register


def build(name: str) -> go.Figure:
    if name not in FIGURES:
        raise KeyError(f"no figure named {name!r}; known figures: {', '.join(sorted(FIGURES))}")
    return FIGURES[name]()


def figure_html(name: str) -> str:
    """The figure as an HTML fragment for a site page: no plotly.js (the site serves it), no MathJax."""
    return build(name).to_html(
        full_html=False, include_plotlyjs=False, include_mathjax=False, div_id=f"figure-{name}"
    )


def show(fig: go.Figure) -> None:
    """Display `fig` in a notebook as plotly JSON (for Jupyter) and as HTML (for the site's nbconvert)."""
    from IPython.display import display

    html = fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False)
    display({"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": html}, raw=True)
