"""A figure's layout for a narrow screen, and the script that switches to it.

Plotly has no media queries: a figure keeps its layout at every width, and panels side by side,
menus in a row or long labels that suit a laptop collide on a phone. `narrow_layout(fig)` works out
the changes for a container narrower than `NARROW_PX`, as keys for `Plotly.relayout`: a grid of
panels becomes one column (each panel keeps its title, tick labels and axis titles), the figure grows
to hold them, and the side margins shrink. A figure adds its own changes with `style.set_narrow`.
`wide_layout` reads the same keys' values in the figure as drawn, to switch back; `switch_script`
is the script, run after the figure is drawn, that picks the layout for the container's width
and follows resizes. This module imports nothing from the package.
"""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go

NARROW_PX = 600
WIDE_PX, PHONE_PX = 860, 350  # a figure's width in the site's text column on a laptop, and on a phone
PANEL_PX = (200, 300)  # a panel's height on a narrow screen: its height on a wide one, within these
GAP_PX = 46  # between stacked panels: this one's tick labels, then the next one's title (TITLE_LINE_PX a line)
TITLE_LINE_PX = 17


def _axis_name(ref: str, letter: str) -> str:
    """'x2' → 'xaxis2'."""
    return f"{letter}axis{ref[1:]}"


def _panels(fig: go.Figure) -> list[tuple[str, str, tuple, tuple]]:
    """(xaxis name, yaxis name, x domain, y domain) of each subplot that holds a trace, top row first."""
    seen = {}
    for trace in fig.data:
        x, y = getattr(trace, "xaxis", None), getattr(trace, "yaxis", None)
        if x is None or y is None:
            continue
        xa, ya = _axis_name(x, "x"), _axis_name(y, "y")
        xd = tuple(fig.layout[xa].domain or (0, 1))
        yd = tuple(fig.layout[ya].domain or (0, 1))
        seen[(xa, ya)] = (xa, ya, xd, yd)
    return sorted(seen.values(), key=lambda p: (-p[3][1], p[2][0]))


def _legend_entries(fig: go.Figure) -> list[str]:
    """The names the legend shows at first (a trace hidden at first has no entry yet)."""
    groups = set()
    names = []
    for trace in fig.data:
        if trace.showlegend is False or trace.visible is False or getattr(trace, "name", None) is None:
            continue
        if trace.legendgroup:
            if trace.legendgroup in groups and trace.showlegend is not True:
                continue
            groups.add(trace.legendgroup)
        names.append(trace.name)
    return names


def legend_height(fig: go.Figure, width_px: int) -> int:
    """Roughly the pixels a horizontal legend of `fig` takes in a figure `width_px` wide: entries laid
    left to right, a new row when the next one does not fit (12 px text, about 6.5 px a character)."""
    if fig.layout.showlegend is False:
        return 0
    total, row_width, row_height = 0, 0.0, 0
    for name in _legend_entries(fig):
        lines = re.split(r"<br\s*/?>", name)
        width = 48 + 6.5 * max(len(re.sub(r"<[^>]+>", "", line)) for line in lines)
        height = 5 + 16 * len(lines)
        if row_width and row_width + width > width_px:
            total, row_width, row_height = total + row_height, 0.0, 0
        row_width += width
        row_height = max(row_height, height)
    return total + row_height + 10 if row_height else 0


def narrow_layout(fig: go.Figure, extra: dict | None = None) -> dict:
    """The relayout keys that fit `fig` to a narrow screen (see the module's docstring); `extra` (the
    figure's own, from `style.set_narrow`) is applied last; its key "+height" adds to the height."""
    layout = fig.layout
    out: dict = {"margin.l": 52, "margin.r": 12, "modebar.orientation": "v"}  # the tool bar off the title
    panels = _panels(fig)
    height = layout.height or 450
    top = layout.margin.t if layout.margin.t is not None else 80
    legend = legend_height(fig, PHONE_PX)
    # the legend wraps to more rows: the figure grows by as much, so that the plot keeps its height
    out["height"] = height + max(legend - legend_height(fig, WIDE_PX), 0)
    columns = sorted({p[2] for p in panels})
    if len(columns) > 1:
        rows = sorted({p[3] for p in panels}, key=lambda d: -d[1])
        plot_px = max(height - top - 160, 200)  # the plot area on a wide screen, roughly
        panel_px = min(max(round(plot_px * (rows[0][1] - rows[0][0])), PANEL_PX[0]), PANEL_PX[1])
        count = len(panels)
        title_lines = max((len(re.split(r"<br\s*/?>", a.text or "")) for a in layout.annotations
                           if a.xref == "paper" and a.yref == "paper" and a.yanchor == "bottom"), default=0)
        gap = GAP_PX + TITLE_LINE_PX * title_lines  # the next panel's title and this one's tick labels
        area = count * panel_px + (count - 1) * gap
        out["height"] = top + area + 80 + legend
        for i, (xa, ya, xd, yd) in enumerate(panels):
            high = 1 - i * (panel_px + gap) / area
            low = high - panel_px / area
            out[f"{xa}.domain"] = [0, 1]
            out[f"{ya}.domain"] = [round(max(low, 0), 4), round(min(high, 1), 4)]
            out[f"{xa}.showticklabels"] = True
            out[f"{ya}.showticklabels"] = True
            for j, a in enumerate(layout.annotations):  # the panel's title, as make_subplots placed it
                if (a.xref == "paper" and a.yref == "paper" and a.yanchor == "bottom" and a.showarrow is False
                        and abs((a.x or 0) - (xd[0] + xd[1]) / 2) < 1e-6 and abs((a.y or 0) - yd[1]) < 1e-6):
                    out[f"annotations[{j}].x"] = 0.5
                    out[f"annotations[{j}].y"] = round(min(high, 1), 4)
        # Axis titles: the x title once, under the last panel, when the panels share one x axis and
        # its title (a panel left without one shares the axis of a panel that has it); a panel
        # without a y title takes the title of its row's first panel.
        x_titles = {xa: layout[xa].title.text for xa, *_ in panels}
        named = {t for t in x_titles.values() if t}
        root = {xa: (layout[xa].matches and f"xaxis{layout[xa].matches[1:]}") or xa for xa, *_ in panels}
        shared = all(t or any(root[xa] == root[other] or root[xa] == other or root[other] == xa
                              for other, t2 in x_titles.items() if t2) for xa, t in x_titles.items())
        if len(named) == 1 and shared:
            for k, (xa, *_) in enumerate(panels):
                out[f"{xa}.title.text"] = next(iter(named)) if k == len(panels) - 1 else ""
        for xa, ya, xd, yd in panels:
            if not layout[ya].title.text:
                row_title = next((layout[q[1]].title.text for q in panels if q[3] == yd and layout[q[1]].title.text), None)
                if row_title:
                    out[f"{ya}.title.text"] = row_title
    extra = dict(extra or {})
    out["height"] += extra.pop("+height", 0)  # the figure's own: more room than the generic changes give
    out.update(extra)
    return out


def _get(tree, path: str):
    """The value at a relayout key ('margin.l', 'annotations[3].x', 'xaxis2.domain') in a layout's JSON."""
    node = tree
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            index = int(part[1:-1])
            node = node[index] if isinstance(node, list) and index < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node


def wide_layout(fig: go.Figure, narrow: dict) -> dict:
    """The values the keys of `narrow` have in `fig` as drawn (None: Plotly's default)."""
    tree = fig.layout.to_plotly_json()
    out = {key: _get(tree, key) for key in narrow}
    if "height" in out and out["height"] is None:
        out["height"] = 450
    return out


def switch_script(narrow: dict, wide: dict) -> str:
    """JavaScript for `plotly.io.to_html(post_script=...)`: take the narrow layout while the figure's
    container is narrower than NARROW_PX, the wide one otherwise, now and on every resize. The height
    is set on the plot's div and on the box plotly.io wraps it in, which has the figure's height too."""
    return (
        "(function(){var gd=document.getElementById('{plot_id}');"
        f"var narrow={json.dumps(narrow, separators=(',', ':'))},wide={json.dumps(wide, separators=(',', ':'))};"
        "var isNarrow=false;function fit(){var n=gd.parentElement.clientWidth<" + str(NARROW_PX) + ";"
        "if(n===isNarrow)return;isNarrow=n;var l=n?narrow:wide;"
        "if(l.height){gd.style.height=l.height+'px';var box=gd.parentElement;"
        "if(box.style.height){box.style.height=l.height+'px';}}Plotly.relayout(gd,l);}"
        "fit();window.addEventListener('resize',fit);})();"
    )
