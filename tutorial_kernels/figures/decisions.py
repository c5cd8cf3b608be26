"""The figures of the page "Which kernel runs a call" (docs/decisions.md).

- `dispatch-rules`: the front door's dispatch rules for Hopper, from `perf/rules_sm90.json` (what
  `dispatch.RULES` holds), each with what it says, the measurement behind it and where that is shown.
"""

from __future__ import annotations

import html
import json

from tutorial_kernels.dispatch import RULES_FILE
from tutorial_kernels.figures.registry import figure
from tutorial_kernels.figures.tables import Table


def _value(value) -> str:
    """A rule's value as the table shows it: a list joined, a per-head-dimension table spelled out."""
    if isinstance(value, list):
        return " or ".join(map(str, value))
    if isinstance(value, dict):
        return "; ".join(f"d = {d}: " + ", ".join(f"{mask} {n:,}" for mask, n in masks.items())
                         for d, masks in value.items())
    return f"{value:,}"


def _where(rule: dict) -> str:
    """Links to the page that shows the measurement, and the data files behind it."""
    page, _, anchor = rule["page"].partition("#")
    name = page.split("/")[-1].removesuffix(".md")
    text = f"chapter {int(name[:2])}" if page.startswith("chapters/") else name.replace("-", " ")
    text += f", {anchor.replace('-', ' ')}" if anchor else ""
    links = [f'<a href="../{page.removesuffix(".md")}/{"#" + anchor if anchor else ""}">{html.escape(text)}</a>']
    links += [f"<code>{html.escape(path)}</code>" for path in rule["data"]]
    return "<br>".join(links)


@figure("dispatch-rules")
def dispatch_rules() -> Table:
    """Every rule of the Hopper table: its name, value, what it says, what was measured, and where."""
    table = json.loads(RULES_FILE.read_text())
    rules = table["rules"]
    return Table(
        ["rule", "value", "says", "measured", "shown on; data"],
        [[f"<code>{name}</code>" for name in rules], [_value(r["value"]) for r in rules.values()],
         [html.escape(r["says"]) for r in rules.values()], [html.escape(r["measured"]) for r in rules.values()],
         [_where(r) for r in rules.values()]],
        title="The front door's rules on Hopper (sm90)",
        subtitle="tutorial_kernels/perf/rules_sm90.json, read by tutorial_kernels.dispatch",
        notes=[html.escape(table["description"])])
