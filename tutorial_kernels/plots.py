"""Plotly figures for the chapters, built from committed data files (or from formulas).

The same function draws a figure in a notebook (`show(fig)`) and on a site page: a page names a
figure with an HTML comment on its own line, `<!-- figure: NAME -->`, and the site's build hook
replaces it with `figure_html(NAME)`. Nothing here touches a GPU.
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


@figure("ch02-score-memory")
def score_memory() -> go.Figure:
    """Memory that S and P take in HBM, from the formula 2 · B · H · N² · bytes (B=1, H=32, fp16)."""
    lengths = [2**i for i in range(8, 17)]
    gib = [2 * 32 * n * n * 2 / 2**30 for n in lengths]
    fig = go.Figure(go.Scatter(x=lengths, y=gib, mode="lines+markers", name="S and P"))
    fig.update_layout(
        title="HBM taken by S and P (B=1, H=32, fp16; formula, not a measurement)",
        xaxis=dict(title="sequence length N", type="log", tickvals=lengths),
        yaxis=dict(title="GiB", type="log"),
        template="plotly_white",
    )
    return fig
