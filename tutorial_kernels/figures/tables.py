"""Tables of measurements as HTML: text a reader can select, search and zoom, styled by the site.

A figure factory may return a `Table` (or `Tabs`, several tables under one title) instead of a
Plotly figure: the site's hook puts its HTML where the page says `<!-- figure: NAME -->`, and a
notebook shows it with `show(table)` (or as the cell's value: it has `_repr_html_`). The table itself
is a plain `<table>`, which mkdocs-material styles like every table of the site; fills are inline
styles, so that the colours survive in a notebook. `caption_html` writes what goes under a figure or
a table (notes, and the collapsed "How this was measured"), and `FIGURE_CSS` the few rules the hook
adds to a page with figures. This module imports nothing from the package.
"""

from __future__ import annotations

import html
import itertools
from types import SimpleNamespace

_ids = itertools.count(1)
KEEP_CLASS = "figure-keep"  # the rows a `Tabs`' checkbox keeps


def caption_html(notes: list[str] | tuple = (), provenance: list[str] | tuple = ()) -> str:
    """Notes (shown) and the provenance record (collapsed) for under a figure; HTML lines each."""
    out = ""
    if notes:
        out += '<div class="figure-notes">' + "".join(f"<p>{n}</p>" for n in notes) + "</div>"
    if provenance:
        out += ('<details class="figure-provenance"><summary>How this was measured</summary>'
                + "".join(f"<p>{line}</p>" for line in provenance) + "</details>")
    return out


def _heading(title: str, subtitle: str) -> str:
    if not title:
        return ""
    sub = f'<br><span class="figure-subtitle">{subtitle}</span>' if subtitle else ""
    return f'<p class="figure-title"><strong>{title}</strong>{sub}</p>'


class Table:
    """A table: `header` (HTML per column), `columns` (one list of cells per column, each cell HTML text
    or a number), optional `fills` (one list of background colours per column, None or "" for none),
    `align` ('left', 'center' or 'right', one for all or one per column), `header_groups` (a header
    row above `header`: (text, number of columns) pairs), `row_classes` (a CSS class per row), and the
    `title`, `subtitle` (short provenance), `notes` and `provenance` lines shown around it."""

    def __init__(self, header: list[str], columns: list[list], *, title: str = "", subtitle: str = "",
                 fills: list[list[str | None]] | None = None, align: str | list[str] = "left",
                 header_groups: list[tuple[str, int]] | None = None, row_classes: list[str] | None = None,
                 notes: list[str] | tuple = (), provenance: list[str] | tuple = ()):
        if len(header) != len(columns):
            raise ValueError(f"{len(header)} headers for {len(columns)} columns")
        self.header, self.columns = list(header), [list(c) for c in columns]
        self.fills = fills
        self.align = [align] * len(columns) if isinstance(align, str) else list(align)
        self.header_groups, self.row_classes = header_groups, row_classes
        self.title, self.subtitle, self.notes, self.provenance = title, subtitle, list(notes), list(provenance)

    @property
    def rows(self) -> list[tuple]:
        return list(zip(*self.columns))

    def _style(self, col: int, fill: str | None = None) -> str:
        # numbers (right-aligned) keep their line: "0.94 ▼ (0.95)" is one value
        parts = [] if self.align[col] == "left" else [f"text-align:{self.align[col]}", "white-space:nowrap"]
        if fill:
            parts.append(f"background-color:{fill}")
        return f' style="{";".join(parts)}"' if parts else ""

    def table_html(self) -> str:
        """The `<table>` alone."""
        head = ""
        if self.header_groups:
            head += "<tr>" + "".join(f'<th colspan="{n}" style="text-align:center">{text}</th>' if n > 1 else f"<th>{text}</th>"
                                     for text, n in self.header_groups) + "</tr>"
        head += "<tr>" + "".join(f"<th{self._style(i)}>{h}</th>" for i, h in enumerate(self.header)) + "</tr>"
        body = []
        for r, row in enumerate(self.rows):
            cls = f' class="{self.row_classes[r]}"' if self.row_classes and self.row_classes[r] else ""
            cells = "".join(f"<td{self._style(c, self.fills[c][r] if self.fills else None)}>{value}</td>"
                            for c, value in enumerate(row))
            body.append(f"<tr{cls}>{cells}</tr>")
        return f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"

    def html(self, name: str | None = None) -> str:
        """Title, table, notes and provenance, in a `div.figure-table` (with id figure-NAME)."""
        ident = f' id="figure-{html.escape(name)}"' if name else ""
        return (f'<div class="figure-table"{ident}>{_heading(self.title, self.subtitle)}{self.table_html()}'
                f"{caption_html(self.notes, self.provenance)}</div>")

    def _repr_html_(self) -> str:
        return self.html()

    @property
    def data(self) -> tuple:
        """The table in the shape of the Plotly table figure it replaced (`table.data[0].cells.values`,
        `.cells.fill.color`, `.header.values`), for code written against that."""
        cells = SimpleNamespace(values=self.columns, fill=SimpleNamespace(color=self.fills))
        return (SimpleNamespace(header=SimpleNamespace(values=self.header), cells=cells),)


class Tabs:
    """Several tables under one title, one tab each (mkdocs-material's tabs, without JavaScript); with
    `only` (a label), a checkbox above them that shows only the rows of class `KEEP_CLASS`."""

    def __init__(self, tabs: list[tuple[str, Table]], *, title: str = "", subtitle: str = "",
                 notes: list[str] | tuple = (), provenance: list[str] | tuple = (),
                 only: str | None = None):
        self.tabs, self.title, self.subtitle = list(tabs), title, subtitle
        self.notes, self.provenance, self.only = list(notes), list(provenance), only

    def html(self, name: str | None = None) -> str:
        ident = f' id="figure-{html.escape(name)}"' if name else ""
        key = f"figure-{name}-tab" if name else f"figure-tabs-{next(_ids)}"  # unique on a page
        inputs = "".join(f'<input{" checked" if i == 0 else ""} id="{key}-{i}" name="{key}" type="radio">'
                         for i in range(len(self.tabs)))
        labels = "".join(f'<label for="{key}-{i}">{label}</label>' for i, (label, _) in enumerate(self.tabs))
        blocks = "".join(f'<div class="tabbed-block">{t.table_html()}</div>' for _, t in self.tabs)
        tabs = (f'<div class="tabbed-set tabbed-alternate" data-tabs="0:{len(self.tabs)}">{inputs}'
                f'<div class="tabbed-labels">{labels}</div><div class="tabbed-content">{blocks}</div></div>')
        only = ""
        if self.only:
            only = (f'<input class="figure-only" type="checkbox" id="{key}-only">'
                    f'<label class="figure-only-label" for="{key}-only">{self.only}</label>')
        return (f'<div class="figure-table"{ident}>{_heading(self.title, self.subtitle)}{only}{tabs}'
                f"{caption_html(self.notes, self.provenance)}</div>")

    def _repr_html_(self) -> str:
        return self.html()


# The rules the site's hook adds to a page with figures: tables, the caption under a figure.
FIGURE_CSS = """
.md-typeset .figure-table { margin: 1.5em 0; }
.md-typeset .figure-title { margin: 0 0 .6em; line-height: 1.4; }
.md-typeset .figure-subtitle { font-size: .85em; color: var(--md-default-fg-color--light); }
.md-typeset .figure-table table:not([class]) { font-size: .7rem; margin: 0; }
.md-typeset .figure-table table:not([class]) th { vertical-align: bottom; min-width: 0; }
.md-typeset .figure-table table:not([class]) td { vertical-align: top; }
.md-typeset .figure-table table:not([class]) th, .md-typeset .figure-table table:not([class]) td { padding: .45em .7em; }
.md-typeset .figure-table .tabbed-set { margin: .4em 0 0; }
.md-typeset .figure-only-label { font-size: .7rem; margin-left: .3em; cursor: pointer; }
.md-typeset .figure-only:checked ~ .tabbed-set tbody tr:not(.figure-keep) { display: none; }
.md-typeset .figure-notes { font-size: .7rem; color: var(--md-default-fg-color--light); margin: .3em 0 0; }
.md-typeset .figure-notes p { margin: .2em 0; }
.md-typeset details.figure-provenance { font-size: .68rem; margin: .4em 0 0; padding: 0; border: none;
  box-shadow: none; background: none; }
.md-typeset details.figure-provenance > summary { padding: .2em 0; margin: 0; background: none; font-weight: normal;
  color: var(--md-default-fg-color--light); cursor: pointer; }
.md-typeset details.figure-provenance > summary::before { content: "▸"; position: static; display: inline-block;
  width: 1em; height: auto; background: none; -webkit-mask-image: none; mask-image: none; transform: none;
  transition: transform .2s; }
.md-typeset details.figure-provenance[open] > summary::before { transform: rotate(90deg); }
.md-typeset details.figure-provenance > summary::after { display: none; }
.md-typeset details.figure-provenance > p { margin: .3em 0 .3em 1em; overflow-wrap: anywhere; }
.md-typeset details.figure-provenance code { font-size: .95em; word-break: break-all; }
"""
