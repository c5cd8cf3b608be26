"""Every page of the built site, loaded in headless Chromium with the network cut off.

Each page is visited once (the `visits` fixture); the tests below then check one property each
over all pages, and name every page and problem they find.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

pytestmark = pytest.mark.timeout(240)

LOCAL_HOSTS = {"127.0.0.1", "localhost"}

# Every .plotly-graph-div has been drawn (Plotly.newPlot adds an svg.main-svg).
PLOTS_DRAWN = """() => [...document.querySelectorAll('.plotly-graph-div')].every(d => d.querySelector('.main-svg'))"""

UNDRAWN_PLOTS = """() => [...document.querySelectorAll('.plotly-graph-div')]
    .filter(d => !d.querySelector('.main-svg')).map(d => d.id || '(no id)')"""

# Math that KaTeX did not render: arithmatex output left alone, KaTeX errors, and TeX delimiters
# left in the article's prose (code, rendered math and mkdocs-jupyter's hidden copy-to-clipboard
# text are not prose).
MATH_PROBLEMS = r"""() => {
  const problems = [];
  const article = document.querySelector('article') || document.body;
  for (const el of article.querySelectorAll('.arithmatex'))
    if (!el.querySelector('.katex')) problems.push('not rendered: ' + el.textContent.trim().slice(0, 80));
  for (const el of article.querySelectorAll('.katex-error'))
    problems.push('KaTeX error: ' + (el.getAttribute('title') || el.textContent).slice(0, 160));
  const skip = 'pre, code, script, style, textarea, .katex, .clipboard-copy-txt';
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT, {
    acceptNode: n => n.parentElement.closest(skip) ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
  });
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const text = n.textContent;
    const inNotebookMarkdown = n.parentElement.closest('.jp-RenderedMarkdown');
    if (/\$\$|\\\(|\\\[/.test(text) || (inNotebookMarkdown && /\$[^$\s][^$]*\$/.test(text)))
      problems.push('raw TeX in the text: ' + text.trim().slice(0, 80));
  }
  return problems;
}"""


@dataclass
class Visit:
    url: str  # site-relative, '' for the home page
    blocked: list[str] = field(default_factory=list)  # non-local requests, aborted
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    undrawn_plots: list[str] = field(default_factory=list)
    plot_count: int = 0
    math_problems: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # absolute hrefs of every <a>
    ids: set[str] = field(default_factory=set)  # element ids, to check #fragment links

    @property
    def name(self) -> str:
        return self.url or "(home)"


def visit(browser, base_url: str, url: str) -> Visit:
    record = Visit(url)
    context = browser.new_context()

    def route(route):
        host = urlsplit(route.request.url).hostname
        if host in LOCAL_HOSTS:
            route.continue_()
        else:
            record.blocked.append(route.request.url)
            route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and record.console_errors.append(f"{m.text} ({m.location.get('url', '')})"))
    page.on("pageerror", lambda e: record.page_errors.append(str(e)))
    try:
        page.goto(base_url + url, wait_until="load", timeout=30_000)
        record.plot_count = page.locator(".plotly-graph-div").count()
        try:
            page.wait_for_function(PLOTS_DRAWN, timeout=10_000)
        except Exception:
            pass  # reported below, with the ids of the figures left blank
        record.undrawn_plots = page.evaluate(UNDRAWN_PLOTS)
        record.math_problems = page.evaluate(MATH_PROBLEMS)
        record.links = page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)")
        record.ids = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
    finally:
        context.close()
    return record


@pytest.fixture(scope="session")
def visits(browser, built_site, served_site) -> list[Visit]:
    return [visit(browser, served_site, url) for url in built_site.pages()]


def report(problems: list[str], what: str) -> str:
    return f"{len(problems)} {what}:\n" + "\n".join(problems)


def test_every_page_was_visited(visits, built_site):
    urls = {v.url for v in visits}
    assert "" in urls and len(urls) > 1, f"pages found: {sorted(urls)}"
    notebooks = {f"notebooks/{p.stem}/" for p in (Path(__file__).parents[1] / "notebooks").glob("[!_]*.ipynb")}
    assert notebooks <= urls, f"notebook pages not built: {sorted(notebooks - urls)}"


def test_no_request_leaves_the_machine(visits):
    problems = [f"{v.name}: {url}" for v in visits for url in v.blocked]
    assert not problems, report(problems, "requests to other hosts (the site must work offline)")


def test_no_console_or_page_errors(visits):
    problems = [f"{v.name}: console error: {e}" for v in visits for e in v.console_errors]
    problems += [f"{v.name}: uncaught exception: {e}" for v in visits for e in v.page_errors]
    assert not problems, report(problems, "JavaScript errors")


def test_every_plotly_figure_is_drawn(visits):
    problems = [f"{v.name}: figure {d} has no .main-svg" for v in visits for d in v.undrawn_plots]
    assert not problems, report(problems, "figures not drawn")


def test_every_formula_is_rendered(visits):
    problems = [f"{v.name}: {p}" for v in visits for p in v.math_problems]
    assert not problems, report(problems, "math problems")


def test_internal_links_resolve(visits, built_site, served_site):
    by_url = {v.url: v for v in visits}
    problems = []
    for v in visits:
        for href in v.links:
            if not href.startswith(served_site):
                continue  # another site, or mailto: and the like
            target, fragment = urldefrag(href)
            rel = unquote(target[len(served_site) :])
            path = built_site.root / rel
            if path.is_dir():
                path = path / "index.html"
            if not path.is_file():
                problems.append(f"{v.name}: link to /{rel}: no such file in the site")
                continue
            target_visit = by_url.get(rel.removesuffix("index.html"))  # None for a non-page file
            if fragment and target_visit is not None and unquote(fragment) not in target_visit.ids:
                problems.append(f"{v.name}: link to /{rel}#{fragment}: no element with that id")
    assert not problems, report(sorted(set(problems)), "broken internal links")
