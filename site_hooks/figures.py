"""Put figures on pages: a line `<!-- figure: NAME -->` becomes the figure `NAME` from
`tutorial_kernels.figures` (the registry the notebooks draw from too, so page and notebook agree).

A plot becomes `<div class="plotly-figure">` holding the Plotly div (and the script that fits it to a
narrow screen), then its notes and a collapsed "How this was measured"; a table becomes an HTML
`<table>` in a `div.figure-table` (id `figure-NAME` either way). A page with figures gets the few CSS
rules of `tutorial_kernels.figures.FIGURE_CSS` once, in a `<style>` before its content.

The figure HTML is not pasted into the Markdown: Python-Markdown passes raw HTML through
untouched only at column 0, not inside an admonition or a tab. So `on_page_markdown` turns the
marker into a placeholder paragraph, and `on_page_content` swaps it for the figure once
Markdown is done.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Iterator, NamedTuple

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^(?P<indent>[ \t]*)<!--\s*figure:\s*(?P<name>\S+?)\s*-->[ \t]*$")
FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})")
PLACEHOLDER = re.compile(r"(?:<p>)?plotly-figure-placeholder-(?P<hex>[0-9a-f]+)(?:</p>)?")


class Marker(NamedTuple):
    line: int  # 1-based
    indent: str
    name: str


def find_markers(markdown: str) -> Iterator[Marker]:
    """The figure markers of a page, skipping fenced code (a page may show a marker as code)."""
    fence = None
    for number, line in enumerate(markdown.split("\n"), start=1):
        if m := FENCE.match(line):
            if fence is None:
                fence = m["fence"]
            elif m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence):
                fence = None
        elif fence is None and (m := MARKER.match(line)):
            yield Marker(number, m["indent"], m["name"])


FIGURES_PACKAGE = "tutorial_kernels.figures"


def _figures():
    # Imported on first use: the package imports torch and triton, which pages without figures
    # need not wait for.
    return importlib.import_module(FIGURES_PACKAGE)


def on_pre_build(config) -> None:
    # `mkdocs serve` rebuilds in the same process: import the figures package afresh so that edited
    # figures show. Its modules import names from one another, so reloading them one at a time would
    # leave some bound to the old objects; instead every module of the package leaves sys.modules and
    # the package is imported again, which runs each module once, in import order, and registers
    # every figure in a new registry.
    stale = [name for name in sys.modules if name == FIGURES_PACKAGE or name.startswith(FIGURES_PACKAGE + ".")]
    if stale:
        for name in stale:
            del sys.modules[name]
        importlib.import_module(FIGURES_PACKAGE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    lines = markdown.split("\n")
    seen = set()
    for marker in find_markers(markdown):
        where = f"docs/{page.file.src_uri}, line {marker.line}"
        known = _figures().FIGURES
        if marker.name not in known:
            raise PluginError(f"{where}: no figure named {marker.name!r}; known figures: {', '.join(sorted(known))}")
        if marker.name in seen:  # the figure's div id comes from its name, and ids must be unique
            raise PluginError(f"{where}: figure {marker.name!r} appears twice on this page")
        seen.add(marker.name)
        # Blank lines make the placeholder a paragraph of its own; the marker's indentation keeps
        # it inside its admonition, tab or list item.
        token = f"plotly-figure-placeholder-{marker.name.encode().hex()}"
        lines[marker.line - 1] = f"\n{marker.indent}{token}\n"
    return "\n".join(lines)


def on_page_content(html: str, page, config, files) -> str:
    def figure(m: re.Match) -> str:
        figures = _figures()
        name = bytes.fromhex(m["hex"]).decode()
        try:
            drawing = figures.build(name)
            body = figures.drawing_html(drawing, name)
        except Exception as error:
            raise PluginError(f"docs/{page.file.src_uri}: drawing figure {name!r} failed: {error!r}") from error
        return body if figures.is_table(drawing) else f'<div class="plotly-figure">{body}</div>'

    html, count = PLACEHOLDER.subn(figure, html)
    return f"<style>{_figures().FIGURE_CSS}</style>\n{html}" if count else html
