"""Every page of the built site, loaded in headless Chromium with the network cut off, on a laptop's
screen and on a phone's.

Each page is visited once at each width of `WIDTHS` (the `visits` fixture), and a full-page
screenshot of every visit is saved under `.screenshots/<width>/` at the repository root for a person
to look at (the run's summary names the folder). The tests below then check one property each over
all visits, and name every page and problem they find.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

# The first test builds the site and visits every page twice (laptop and phone widths).
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (1400, 390)  # a laptop's viewport and a phone's (CSS pixels)
LAPTOP, PHONE = WIDTHS
HEIGHT = 900
SCREENSHOTS = ROOT / ".screenshots"

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


# Wait until the figures are drawn and stay as drawn: a figure may switch to its phone layout (or
# fonts may load) after the first draw. Resolves when nothing has moved for three polls in a row.
SETTLED = """async () => {
  const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
  const frame = () => new Promise(resolve => requestAnimationFrame(() => resolve()));
  const signature = () => JSON.stringify([document.documentElement.scrollHeight, ...[...document.querySelectorAll('.plotly-graph-div')]
    .map(gd => { const r = gd.getBoundingClientRect(); const fl = gd._fullLayout || {};
                 return [Math.round(r.width), Math.round(r.height), fl.width, fl.height, gd.querySelectorAll('text').length]; })]);
  await document.fonts.ready;
  let last = signature();
  for (let i = 0, still = 0; i < 40 && still < 3; i++) {
    await sleep(100); await frame();
    const now = signature();
    if (now === last) still++; else { still = 0; last = now; }
  }
}"""

# How a failure names a figure: its id, or (a notebook's figure has a random id) its place on the
# page and its title.
FIGURE_NAME = r"""const figureName = gd => {
    if (gd.id && !/^[0-9a-f]{8}-[0-9a-f]{4}-/.test(gd.id)) return gd.id;
    const title = gd.querySelector('.gtitle');
    const text = title ? title.textContent.replace(/[\s\u200b]+/g, ' ').trim() : '';
    return `figure ${[...document.querySelectorAll('.plotly-graph-div')].indexOf(gd) + 1}` + (text ? ` ("${text.slice(0, 40)}")` : '');
  };"""

# A bullet list that Markdown merged into the paragraph (or list item) above it: a line of the
# element's own text that starts with "- " and a bold or emphasised lead-in, or a literal " - **".
MERGED_LISTS = r"""() => {
  const found = [];
  const bullet = /(^|\n)[ \t]*([-*+]|\d+[.)])[ \t]+(<strong>|<b>|<em>|\*\*|__)/;
  for (const el of document.querySelectorAll('article p, article li')) {
    if (el.closest('pre, code, script, .highlight, .clipboard-copy-txt')) continue;
    const own = [...el.childNodes].filter(n => !(n.nodeType === 1 && /^(P|DIV|UL|OL|PRE|TABLE|BLOCKQUOTE|DETAILS|FIGURE)$/.test(n.tagName)))
      .map(n => n.nodeType === 3 ? n.textContent : n.nodeType === 1 ? n.outerHTML : '').join('');
    if (el.textContent.includes(' - **') || bullet.test(own))
      found.push(el.tagName.toLowerCase() + ': ' + el.textContent.trim().replace(/\s+/g, ' ').slice(0, 110));
  }
  return found;
}"""

# The text of every figure, measured: titles, annotations (subplot titles included), axis titles,
# legend entries, colour-bar titles and menus must not overlap one another or a tick label by more
# than a sliver, and no text may reach past the edge of the figure's svg. Tables are left out: their
# cells scroll inside the table on purpose.
FIGURE_GEOMETRY = r"""([sliver, edge]) => {
  /*FIGURE_NAME*/
  const collisions = [], cut = [];
  const label = t => '"' + t.textContent.replace(/[\s\u200b]+/g, ' ').trim().slice(0, 50) + '"';
  const KEY = '.g-gtitle, .annotation, .legend, .cbtitle, .colorbar, .updatemenu-container, .slider-container';
  for (const gd of document.querySelectorAll('.plotly-graph-div')) {
    const svg = gd.querySelector('.main-svg');
    if (!svg) continue;
    const fig = svg.getBoundingClientRect();
    const keys = [], ticks = [];
    for (const t of gd.querySelectorAll('text')) {
      if (t.closest('.table') || !t.textContent.trim()) continue;
      const r = t.getBoundingClientRect();
      const style = getComputedStyle(t);
      if (r.width < 1 || r.height < 1 || style.visibility === 'hidden' || style.display === 'none' || style.opacity === '0') continue;
      const past = [['left', fig.left - r.left], ['right', r.right - fig.right], ['top', fig.top - r.top], ['bottom', r.bottom - fig.bottom]]
        .filter(([, px]) => px > edge).map(([side, px]) => `${side} edge by ${Math.round(px)} px`);
      if (past.length) cut.push(`${figureName(gd)}: ${label(t)} is cut by the figure's ${past.join(' and ')}`);
      const group = t.parentElement.getAttribute('class') || '';
      if (t.closest(KEY) || /^g-[xy]\d*title$/.test(group)) keys.push({t, r});
      else if (/^[xy]\d*tick$/.test(group)) ticks.push({t, r});
    }
    const overlap = (a, b) => [Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left),
                               Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top)];
    const pairs = [];
    keys.forEach((a, i) => { keys.slice(i + 1).forEach(b => pairs.push([a, b])); ticks.forEach(b => pairs.push([a, b])); });
    for (const [a, b] of pairs) {
      const [w, h] = overlap(a, b);
      if (w > sliver && h > sliver)
        collisions.push(`${figureName(gd)}: ${label(a.t)} and ${label(b.t)} overlap (${Math.round(w)}×${Math.round(h)} px)`);
    }
  }
  return {collisions, cut};
}"""

# Hover over one point of each figure (the first point of the first trace that shows a label), the
# way Plotly does for the mouse, and measure the label against the figure.
HOVER = r"""async () => {
  /*FIGURE_NAME*/
  const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
  const problems = [];
  for (const gd of document.querySelectorAll('.plotly-graph-div')) {
    const svg = gd.querySelector('.main-svg');
    if (!svg || !window.Plotly || !gd._fullData) continue;
    const fig = svg.getBoundingClientRect();
    let tries = 0;
    for (const [i, t] of gd._fullData.entries()) {
      if (t.visible !== true || t.hoverinfo === 'skip' || !t.xaxis || !t.yaxis) continue;
      if (!(t._length || (t.z && t.z.length))) continue;
      if (tries++) await sleep(60);  // Plotly drops a second hover on a figure within 50 ms
      if (tries > 4) break;
      try {
        Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: t.type === 'heatmap' ? [0, 0] : 0}], t.xaxis + t.yaxis);
      } catch (error) { continue; }
      const layer = gd.querySelector('.hoverlayer');
      if (!layer || !layer.childElementCount) continue;
      const r = layer.getBoundingClientRect();
      const what = `${figureName(gd)}: the hover label of "${t.name}"`;
      if (r.width > fig.width + 1)
        problems.push(`${what} is ${Math.round(r.width)} px wide, the figure ${Math.round(fig.width)} px`);
      else {
        const past = [['left', fig.left - r.left], ['right', r.right - fig.right], ['top', fig.top - r.top], ['bottom', r.bottom - fig.bottom]]
          .filter(([, px]) => px > 1).map(([side, px]) => `${side} edge by ${Math.round(px)} px`);
        if (past.length) problems.push(`${what} reaches past the figure's ${past.join(' and ')}`);
      }
      Plotly.Fx.unhover(gd);
      break;
    }
  }
  return problems;
}"""

# Wider than the viewport: the document itself, or a visible element whose right edge passes the
# viewport's with no ancestor that scrolls (or clips) it sideways. Only the outermost such element
# is named.
OVERFLOW = r"""() => {
  const vw = document.documentElement.clientWidth;
  const problems = [];
  if (document.documentElement.scrollWidth > vw + 1)
    problems.push(`the document is ${document.documentElement.scrollWidth} px wide`);
  const describe = el => {
    let s = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '');
    const classes = (el.getAttribute('class') || '').trim().split(/\s+/).filter(Boolean).slice(0, 2);
    return s + (classes.length ? '.' + classes.join('.') : '');
  };
  const over = new Set();
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || r.right <= vw + 1) continue;
    if (getComputedStyle(el).visibility === 'hidden') continue;
    let held = false;
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement)
      if (getComputedStyle(a).overflowX !== 'visible') { held = true; break; }
    if (!held) over.add(el);
  }
  for (const el of over) {
    if (el.parentElement && over.has(el.parentElement)) continue;
    const text = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60);
    problems.push(`${describe(el)} reaches x = ${Math.round(el.getBoundingClientRect().right)} px` + (text ? ` ("${text}")` : ''));
  }
  return problems;
}"""

# What a figure says, as text: what it draws, every string of its data and layout (hover text and
# menus included), and its caption: the text of the box it comes in (the site's .plotly-figure with
# its notes and "How this was measured", a notebook's output), and a caption just after it.
FIGURE_TEXTS = r"""() => {
  /*FIGURE_NAME*/
  const texts = {};
  const strings = (value, out, depth) => {
    if (depth > 10 || out.length > 50000 || value == null) return;
    if (typeof value === 'string') out.push(value);
    else if (ArrayBuffer.isView(value)) return;
    else if (Array.isArray(value)) { for (const v of value.slice(0, 10000)) strings(v, out, depth + 1); }
    else if (typeof value === 'object')
      for (const [key, v] of Object.entries(value)) if (!key.startsWith('_') && key !== 'template') strings(v, out, depth + 1);
  };
  for (const gd of document.querySelectorAll('.plotly-graph-div')) {
    const out = [...gd.querySelectorAll('text')].map(t => t.textContent);
    strings(gd.data, out, 0);
    strings(gd.layout, out, 0);
    const box = gd.closest('figure, .plotly-figure, .jp-OutputArea-output');
    if (box) {
      const walker = document.createTreeWalker(box, NodeFilter.SHOW_TEXT, {
        acceptNode: n => n.parentElement.closest('script, style, .plotly-graph-div') ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
      });
      for (let n = walker.nextNode(); n; n = walker.nextNode()) out.push(n.textContent);
    }
    const next = (box || gd).nextElementSibling;
    if (next && next.matches('figcaption, .caption, [class*="caption"]')) out.push(next.textContent);
    texts[figureName(gd)] = out.join('\n');
  }
  return texts;
}"""

# (figure id, legend name, colour as the canvas spells it, line dash or null) for every trace in a
# legend: a line's colour for lines, a marker's otherwise.
LEGEND_COLOURS = r"""() => {
  /*FIGURE_NAME*/
  const ctx = document.createElement('canvas').getContext('2d');
  const normal = c => { if (typeof c !== 'string') return null; ctx.fillStyle = '#000000'; ctx.fillStyle = c; return ctx.fillStyle; };
  const entries = [];
  for (const gd of document.querySelectorAll('.plotly-graph-div')) {
    if (!gd._fullData || !gd._fullLayout || gd._fullLayout.showlegend === false) continue;
    for (const t of gd._fullData) {
      if (!t.showlegend || !t.name || t.visible === false) continue;
      const lines = String(t.type).startsWith('scatter') && String(t.mode || '').includes('lines');
      const marker = t.marker && typeof t.marker.color === 'string' ? t.marker.color : null;
      const colour = normal(lines ? t.line && t.line.color : marker || (t.line && t.line.color));
      if (colour) entries.push([figureName(gd), t.name, colour, lines ? (t.line.dash || 'solid') : null]);
    }
  }
  return entries;
}"""

# The titles a reader navigates by: the document's title, the primary navigation's entries (not the
# page's table of contents), the footer's previous/next links, and the header's title once the page
# is scrolled (Material swaps the site's name for the page's). Each: [where, text, target href].
TITLES = r"""async () => {
  const text = el => el ? el.textContent.trim().replace(/\s+/g, ' ') : '';
  const site = text(document.querySelector('.md-header__topic'));
  const titles = [['document title', document.title.replace(' - ' + site, ''), location.href]];
  for (const link of document.querySelectorAll('.md-nav--primary .md-nav__link')) {
    if ((link.getAttribute('href') || '').startsWith('#')) continue;
    titles.push(['navigation', text(link), link.href || '']);
  }
  for (const link of document.querySelectorAll('.md-footer__link')) {
    const title = link.querySelector('.md-footer__title .md-ellipsis') || link.querySelector('.md-footer__title') || link;
    titles.push(['footer link', text(title), link.href]);
  }
  window.scrollTo(0, document.documentElement.scrollHeight);
  const header = document.querySelector('.md-header__title');
  for (let i = 0; i < 10 && header && !header.classList.contains('md-header__title--active'); i++)
    await new Promise(resolve => setTimeout(resolve, 50));
  const topics = [...document.querySelectorAll('.md-header__topic')];
  if (topics.length) {
    const shown = header && header.classList.contains('md-header__title--active') ? topics[topics.length - 1] : topics[0];
    titles.push(['header title (scrolled)', text(shown), location.href]);
  }
  window.scrollTo(0, 0);
  return titles;
}"""

FIGURE_GEOMETRY, HOVER, FIGURE_TEXTS, LEGEND_COLOURS = (
    js.replace("/*FIGURE_NAME*/", FIGURE_NAME) for js in (FIGURE_GEOMETRY, HOVER, FIGURE_TEXTS, LEGEND_COLOURS)
)

SLIVER_PX = 2  # boxes of text may touch by this much; more is a collision
EDGE_PX = 3  # a text's box may pass the figure's edge by the blank top of its line; more is a cut


@dataclass
class Visit:
    url: str  # site-relative, '' for the home page
    width: int = LAPTOP  # of the viewport, CSS pixels
    blocked: list[str] = field(default_factory=list)  # non-local requests, aborted
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    undrawn_plots: list[str] = field(default_factory=list)
    plot_count: int = 0
    math_problems: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # absolute hrefs of every <a>
    ids: set[str] = field(default_factory=set)  # element ids, to check #fragment links
    merged_lists: list[str] = field(default_factory=list)
    figure_collisions: list[str] = field(default_factory=list)
    figure_cut_text: list[str] = field(default_factory=list)
    hover_problems: list[str] = field(default_factory=list)
    overflow: list[str] = field(default_factory=list)
    figure_texts: dict[str, str] = field(default_factory=dict)  # figure id → its text and caption
    legend_colours: list[tuple] = field(default_factory=list)  # (figure id, name, colour, dash)
    titles: list[tuple] = field(default_factory=list)  # (where, text, absolute href of its target)
    alt_texts: list[tuple] = field(default_factory=list)  # (concept diagram's id, its alt text or None)
    screenshot: Path | None = None

    @property
    def page(self) -> str:
        return self.url or "(home)"

    @property
    def name(self) -> str:
        return f"{self.page} at {self.width} px"


def screenshot_path(url: str, width: int) -> Path:
    return SCREENSHOTS / str(width) / ((url.strip("/").replace("/", "-") or "home") + ".png")


def new_context(browser, width: int):
    return browser.new_context(viewport={"width": width, "height": HEIGHT})


def visit(browser, base_url: str, url: str, width: int = LAPTOP, screenshot: bool = True, context=None) -> Visit:
    """Load one page in a new tab of `context` (one of its own if None, of `width`) and measure it."""
    record = Visit(url, width)
    own_context = context is None
    if own_context:
        context = new_context(browser, width)

    def route(route):
        host = urlsplit(route.request.url).hostname
        if host in LOCAL_HOSTS:
            route.continue_()
        else:
            record.blocked.append(route.request.url)
            route.abort()

    page = context.new_page()
    page.route("**/*", route)
    page.on("console", lambda m: m.type == "error" and record.console_errors.append(f"{m.text} ({m.location.get('url', '')})"))
    page.on("pageerror", lambda e: record.page_errors.append(str(e)))
    try:
        page.goto(base_url + url, wait_until="load", timeout=30_000)
        record.plot_count = page.locator(".plotly-graph-div").count()
        try:
            page.wait_for_function(PLOTS_DRAWN, timeout=10_000)
        except Exception:
            pass  # reported below, with the ids of the figures left blank
        page.evaluate(SETTLED)
        record.undrawn_plots = page.evaluate(UNDRAWN_PLOTS)
        record.math_problems = page.evaluate(MATH_PROBLEMS)
        record.links = page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)")
        record.ids = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        record.merged_lists = page.evaluate(MERGED_LISTS)
        geometry = page.evaluate(FIGURE_GEOMETRY, [SLIVER_PX, EDGE_PX])
        record.figure_collisions, record.figure_cut_text = geometry["collisions"], geometry["cut"]
        record.overflow = page.evaluate(OVERFLOW)
        record.figure_texts = page.evaluate(FIGURE_TEXTS)
        record.legend_colours = [tuple(e) for e in page.evaluate(LEGEND_COLOURS)]
        record.titles = [tuple(t) for t in page.evaluate(TITLES)]
        record.alt_texts = [tuple(a) for a in page.evaluate(ALT_TEXTS)]
        record.hover_problems = page.evaluate(HOVER)
        if screenshot:
            record.screenshot = screenshot_path(url, width)
            record.screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(record.screenshot), full_page=True, timeout=60_000)
    finally:
        page.close()
        if own_context:
            context.close()
    return record


class _ScreenshotNote:
    """A plugin registered by the `visits` fixture: the run's summary says where the screenshots are."""

    def pytest_terminal_summary(self, terminalreporter):
        folders = ", ".join(str(SCREENSHOTS / str(w)) for w in WIDTHS)
        terminalreporter.write_sep("-", f"full-page screenshots of every page: {folders}")


@pytest.fixture(scope="session")
def visits(request, browser, built_site, served_site) -> list[Visit]:
    """Every page at every width of WIDTHS, laptop first; screenshots go to .screenshots/<width>/."""
    for width in WIDTHS:
        shutil.rmtree(SCREENSHOTS / str(width), ignore_errors=True)
    if not request.config.pluginmanager.has_plugin("browser-screenshots"):
        request.config.pluginmanager.register(_ScreenshotNote(), "browser-screenshots")
    result = []
    for width in WIDTHS:  # one browser context per width (a new one per page costs a third of a second)
        context = new_context(browser, width)
        try:
            result += [visit(browser, served_site, url, width, context=context) for url in built_site.pages()]
        finally:
            context.close()
    return result


def laptop(visits: list[Visit]) -> list[Visit]:
    """One visit per page, for what does not depend on the width (text, links, colours)."""
    return [v for v in visits if v.width == LAPTOP]


def report(problems: list[str], what: str, screenshots: bool = False) -> str:
    where = f"\n(screenshots of every page: {SCREENSHOTS}/<width>/)" if screenshots else ""
    return f"{len(problems)} {what}:\n" + "\n".join(problems) + where


def test_every_page_was_visited(visits, built_site):
    urls = {v.url for v in visits}
    assert "" in urls and len(urls) > 1, f"pages found: {sorted(urls)}"
    notebooks = {f"notebooks/{p.stem}/" for p in (ROOT / "notebooks").glob("[!_]*.ipynb")}
    assert notebooks <= urls, f"notebook pages not built: {sorted(notebooks - urls)}"
    for width in WIDTHS:
        seen = {v.url for v in visits if v.width == width}
        assert seen == urls, f"pages not visited at {width} px: {sorted(urls - seen)}"


def test_every_page_has_a_screenshot_at_every_width(visits):
    problems = [f"{v.name}: no screenshot at {v.screenshot}" for v in visits
                if v.screenshot is None or not v.screenshot.is_file() or v.screenshot.stat().st_size == 0]
    assert not problems, report(problems, "screenshots missing")


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
    by_url = {v.url: v for v in laptop(visits)}
    problems = []
    for v in laptop(visits):
        for href in v.links:
            if not href.startswith(served_site):
                continue  # another site, or mailto: and the like
            target, fragment = urldefrag(href)
            rel = unquote(target[len(served_site) :])
            path = built_site.root / rel
            if path.is_dir():
                path = path / "index.html"
            if not path.is_file():
                problems.append(f"{v.page}: link to /{rel}: no such file in the site")
                continue
            target_visit = by_url.get(rel.removesuffix("index.html"))  # None for a non-page file
            if fragment and target_visit is not None and unquote(fragment) not in target_visit.ids:
                problems.append(f"{v.page}: link to /{rel}#{fragment}: no element with that id")
    assert not problems, report(sorted(set(problems)), "broken internal links")


# --- the checks of the issue "Every figure legible and every page navigable": each returns the
# problems it finds in the visits it is given (the tests below, and the planted page, call them).


def merged_list_problems(visits: list[Visit]) -> list[str]:
    return [f"{v.page}: {p}" for v in visits for p in v.merged_lists]


def collision_problems(visits: list[Visit]) -> list[str]:
    return [f"{v.name}: {p}" for v in visits for p in v.figure_collisions]


def cut_text_problems(visits: list[Visit]) -> list[str]:
    return [f"{v.name}: {p}" for v in visits for p in v.figure_cut_text]


def hover_label_problems(visits: list[Visit]) -> list[str]:
    return [f"{v.name}: {p}" for v in visits for p in v.hover_problems]


def overflow_problems(visits: list[Visit]) -> list[str]:
    return [f"{v.name}: {p}" for v in visits for p in v.overflow]


# A machine's path, or a run's output folder, has no place in what a reader sees.
MACHINE_PATH = re.compile(r"(?<![\w.~-])(?:/root|/tmp|/work|/home|/Users|/mnt|/scratch|/var/tmp)/[^\s\u200b\"'`<>)\]]*"
                          r"|(?<![\w.-])(?:[\w.-]+/)*out/[\w./-]*")
# A repository path: a top-level folder of the repository, then a path.
REPO_PATH = re.compile(r"(?<![\w./~-])((?:tools|experiments|data|tutorial_kernels|notebooks|docs|tests|site_hooks|"
                       r"overrides|scripts)/[\w./-]*[\w/])")
# python -m tutorial_kernels.bench ...: a module of the repository.
REPO_MODULE = re.compile(r"python3? -m ((?:tutorial_kernels|tools|experiments)(?:\.\w+)*)")


def missing_module(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or (path / "__main__.py").is_file())


@functools.cache
def in_git(commit: str, path: str) -> bool:
    """Does the repository's history have `path` at `commit`?"""
    git = subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT, capture_output=True)
    return git.returncode == 0


def path_problems(visits: list[Visit]) -> list[str]:
    """A figure names no machine path, and no repository file that is neither in the tree nor given
    as COMMIT:PATH (`git show 8fce1e4:tools/probe.py`, for a script since removed) that git has."""
    problems = []
    for v in visits:
        for figure, text in v.figure_texts.items():
            for path in sorted(set(m.group(0).rstrip(".,;:") for m in MACHINE_PATH.finditer(text))):
                problems.append(f"{v.page}: {figure} names a machine path: {path}")
            for path in sorted(set(REPO_PATH.findall(text))):
                if (ROOT / path).exists():
                    continue
                commits = re.findall(rf"\b([0-9a-f]{{7,40}}):{re.escape(path)}(?![\w/])", text)
                if not commits:
                    problems.append(f"{v.page}: {figure} names {path}, which is not in the repository")
                for commit in commits:
                    if not in_git(commit, path):
                        problems.append(f"{v.page}: {figure} names {commit}:{path}, which git does not have")
            for module in sorted(set(REPO_MODULE.findall(text))):
                if missing_module(module):
                    problems.append(f"{v.page}: {figure} names the module {module}, which is not in the repository")
    return problems


def colour_problems(visits: list[Visit]) -> list[str]:
    """Across the site, a legend name is drawn in one colour; within a figure, two names are never
    drawn alike (same colour and same line dash: a provider's variants may share its colour and
    differ by dash)."""
    colours: dict[str, dict[str, set[str]]] = {}  # name → colour → "page figure"
    alike: dict[tuple, set[str]] = {}  # (page, figure, colour, dash) → names
    for v in visits:
        for figure, name, colour, dash in v.legend_colours:
            colours.setdefault(name, {}).setdefault(colour, set()).add(f"{v.page} {figure}")
            alike.setdefault((v.page, figure, colour, dash), set()).add(name)
    problems = []
    for name, by_colour in sorted(colours.items()):
        if len(by_colour) > 1:
            uses = "; ".join(f"{c} in {', '.join(sorted(where))}" for c, where in sorted(by_colour.items()))
            problems.append(f'"{name}" has {len(by_colour)} colours: {uses}')
    for (page, figure, colour, dash), names in sorted(alike.items(), key=str):
        if len(names) > 1:
            drawn = colour + (f" {dash} line" if dash else "")
            problems.append(f"{page}: {figure} draws {len(names)} legend entries alike ({drawn}): "
                            + ", ".join(f'"{n}"' for n in sorted(names)))
    return problems


# Titles that say what kind of page it is but not which chapter.
GENERIC_TITLE = re.compile(r"(?i)^(text|notebook|the notebook|page|code|index|read|run it)s?$")
CHAPTER_PAGE = re.compile(r"^(?:chapters/(\d+)-([\w-]+)|notebooks/(\d+)_(\w+))/$")


def names_the_chapter(title: str, rel: str) -> bool:
    """For a chapter's text or notebook page (by its site-relative address `rel`): does `title`
    carry the chapter's number or a word of its name (as the address spells it)?"""
    m = CHAPTER_PAGE.match(rel)
    if not m:
        return True
    number, slug = (m[1], m[2]) if m[1] else (m[3], m[4])
    words = [w for w in re.split(r"[-_]", slug) if len(w) >= 3]
    return bool(re.search(rf"(?<![\d.-]){int(number)}(?!\d)", title)) or any(w in title.lower() for w in words)


def title_problems(visits: list[Visit], served_site: str) -> list[str]:
    """A title or link that names no chapter, once, with the pages it is on (a navigation entry is
    on every page)."""
    found: dict[tuple, set[str]] = {}  # (where, title, target) → pages
    for v in visits:
        for where, title, href in v.titles:
            rel = unquote(urldefrag(href)[0])
            rel = rel[len(served_site) :] if rel.startswith(served_site) else ""
            rel = rel.removesuffix("index.html")
            if GENERIC_TITLE.match(title.strip()) or not names_the_chapter(title, rel):
                target = f" (to /{rel})" if rel and rel != v.url else ""
                found.setdefault((where, title, target), set()).add(v.page)
    every = {v.page for v in visits}
    problems = []
    for (where, title, target), pages in sorted(found.items()):
        on = "every page" if pages == every and len(pages) > 1 else ", ".join(sorted(pages))
        problems.append(f'{where} "{title}"{target} does not name the chapter; on {on}')
    return problems


def test_no_bullet_list_is_merged_into_a_paragraph(visits):
    problems = merged_list_problems(laptop(visits))
    assert not problems, report(problems, "bullet lists run into the paragraph above them (a blank line is missing)")


def test_figure_texts_do_not_collide(visits):
    problems = collision_problems(visits)
    assert not problems, report(problems, "collisions of titles, annotations, axis titles and legend entries in figures", True)


def test_figure_texts_are_not_cut_by_the_figure_edge(visits):
    problems = cut_text_problems(visits)
    assert not problems, report(problems, "figure texts cut by the figure's edge", True)


def test_hover_labels_fit_their_figure(visits):
    problems = hover_label_problems(visits)
    assert not problems, report(problems, "hover labels that do not fit their figure", True)


def test_nothing_is_wider_than_the_viewport(visits):
    problems = overflow_problems(visits)
    assert not problems, report(problems, "elements wider than the viewport (the page scrolls or is cut sideways)", True)


def test_figures_name_no_machine_path_or_missing_file(visits):
    problems = path_problems(laptop(visits))
    assert not problems, report(problems, "paths in figures and captions that a reader cannot follow")


def test_each_provider_keeps_one_colour(visits):
    problems = colour_problems(laptop(visits))
    assert not problems, report(problems, "colour clashes between legend entries")


def test_titles_name_the_chapter(visits, served_site):
    problems = title_problems(visits, served_site)
    assert not problems, report(problems, "titles that do not say which chapter")


# A page with one problem of each kind above, put beside the built site (not a page of it: its name
# is not index.html), to show that every check still catches what it is for.
PLANTED_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Text - Planted</title>
<script src="assets/vendor/plotly/plotly.min.js"></script></head>
<body style="margin: 0">
<header><div class="md-header__title md-header__title--active">
  <div class="md-header__topic"><span class="md-ellipsis">Planted</span></div>
  <div class="md-header__topic"><span class="md-ellipsis">Notebook</span></div></div></header>
<nav class="md-nav md-nav--primary"><a class="md-nav__link" href="chapters/01-gpu-hierarchy/">Text</a></nav>
<article>
  <p>A paragraph, and the list that should have followed it:
- <strong>Merged.</strong> One item.</p>
  <div style="width: 600px">A box wider than a phone.</div>
  <div class="plotly-figure"><div id="figure-planted" class="plotly-graph-div" style="width: 340px; height: 320px"></div>
    <p>Measured by tools/no_such_probe.py into /root/out/planted.json; git show 0000000:tools/gone.py.</p></div>
  <div id="figure-planted-2" class="plotly-graph-div" style="width: 340px; height: 320px"></div>
</article>
<footer><a class="md-footer__link" href="notebooks/01_gpu_hierarchy/"><div class="md-footer__title">
  <span class="md-ellipsis">Notebook</span></div></a></footer>
<script>
  const paper = {xref: 'paper', yref: 'paper', showarrow: false};
  Plotly.newPlot('figure-planted', [
    {x: [1, 2, 3], y: [1, 2, 3], name: 'ours', line: {color: '#d62728'},
     hovertemplate: 'a hover label far too long for a figure this narrow, wider than all of it: %{y}<extra></extra>'},
    {x: [1, 2, 3], y: [3, 2, 1], name: 'theirs', line: {color: '#d62728'}},
  ], {width: 340, height: 320, title: {text: 'Planted'}, showlegend: true, annotations: [
    {...paper, text: 'an annotation here', x: 0.3, y: 1.08},
    {...paper, text: 'and one on top of it', x: 0.4, y: 1.08},
    {...paper, text: 'an annotation past the left edge', x: -0.9, y: 0.5},
  ]});
  Plotly.newPlot('figure-planted-2', [{x: [1, 2], y: [1, 2], name: 'ours', line: {color: '#1f77b4'}}],
                 {width: 340, height: 320, showlegend: true});
</script>
</body></html>
"""


def test_the_checks_catch_a_planted_page(browser, built_site, served_site):
    (built_site.root / "planted.html").write_text(PLANTED_PAGE, encoding="utf-8")
    page = visit(browser, served_site, "planted.html", PHONE, screenshot=False)
    assert page.plot_count == 2 and not page.undrawn_plots and not page.page_errors, page
    found = {
        "merged list": merged_list_problems([page]),
        "colliding annotations": collision_problems([page]),
        "text cut by the figure's edge": cut_text_problems([page]),
        "hover label wider than its figure": hover_label_problems([page]),
        "element wider than the phone": overflow_problems([page]),
        "machine path and missing file": path_problems([page]),
        "colour clashes": colour_problems([page]),
        "titles without the chapter": title_problems([page], served_site),
    }
    missed = [what for what, problems in found.items() if not problems]
    assert not missed, f"checks that missed their planted problem: {missed}\n" + "\n".join(
        f"{what}: {problems}" for what, problems in found.items())
    # each planted problem is named, not just some problem
    expected = {
        "colliding annotations": ["an annotation here", "and one on top of it"],
        "text cut by the figure's edge": ["an annotation past the left edge"],
        "machine path and missing file": ["/root/out/planted.json", "tools/no_such_probe.py", "0000000:tools/gone.py"],
        "colour clashes": ['"ours" has 2 colours', '"ours", "theirs"'],
        "titles without the chapter": ['document title "Text"', 'navigation "Text"', 'footer link "Notebook"',
                                       'header title (scrolled) "Notebook"'],
    }
    unnamed = [f"{what}: {word}" for what, words in expected.items() for word in words
               if not any(word in problem for problem in found[what])]
    assert not unnamed, f"planted problems not named: {unnamed}\n{found}"


# --- the dark palette and the diagrams' alt text ---------------------------------------------------

# For each text element of the page's prose, its colour against the first opaque background behind
# it (WCAG 2 contrast ratio); and every plot's own background. Run on a page in the dark palette.
PALETTE = """
() => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => [r, g, b].map(c => c / 255).map(c => c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4)
    .reduce((sum, c, i) => sum + c * [0.2126, 0.7152, 0.0722][i], 0);
  const background = el => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const low = [];
  const selector = '.md-typeset p, .md-typeset li, .md-typeset td, .md-typeset th, .md-typeset summary, .md-typeset figcaption';
  for (const el of document.querySelectorAll(selector)) {
    const text = (el.innerText || '').trim();
    if (!text || el.closest('.js-plotly-plot') || el.offsetParent === null) continue;
    const fg = rgb(getComputedStyle(el).color).slice(0, 3), bg = background(el);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    const ratio = (a + 0.05) / (b + 0.05);
    if (ratio < 4.5) low.push(`${ratio.toFixed(2)}: "${text.slice(0, 60)}"`);
  }
  const plots = [...document.querySelectorAll('.js-plotly-plot')]
    .filter(p => getComputedStyle(p).backgroundColor !== 'rgb(255, 255, 255)')
    .map(p => `${p.id || '(plot)'}: background ${getComputedStyle(p).backgroundColor}`);
  return {scheme: document.body.getAttribute('data-md-color-scheme'), low: low.slice(0, 8), plots};
}
"""

# Every diagram of an idea (`concept-…`) carries its alt text: a role="img" wrapper with an aria-label.
ALT_TEXTS = """
() => [...document.querySelectorAll('.plotly-graph-div[id^="figure-concept-"]')].map(div => {
  const wrapper = div.closest('[role="img"]');
  return [div.id, wrapper ? (wrapper.getAttribute('aria-label') || '') : null];
})
"""


def dark_visit(browser, base_url: str, url: str) -> dict:
    """One page at laptop width with the reader's system set to dark: the palette it chose, prose
    whose contrast is too low, and plots without their white card."""
    context = browser.new_context(viewport={"width": LAPTOP, "height": HEIGHT}, color_scheme="dark")
    page = context.new_page()
    page.route("**/*", lambda route: route.continue_() if urlsplit(route.request.url).hostname in LOCAL_HOSTS
               else route.abort())
    try:
        page.goto(base_url + url, wait_until="load", timeout=30_000)
        try:
            page.wait_for_function(PLOTS_DRAWN, timeout=10_000)
        except Exception:
            pass  # an undrawn plot is reported by the light-palette checks
        return page.evaluate(PALETTE)
    finally:
        context.close()


@pytest.fixture(scope="session")
def dark_visits(browser, built_site, served_site) -> dict[str, dict]:
    return {url: dark_visit(browser, served_site, url) for url in built_site.pages()}


def dark_problems(results: dict[str, dict]) -> list[str]:
    problems = []
    for url, r in results.items():
        where = url or "(home)"
        if r["scheme"] != "slate":
            problems.append(f"{where}: the dark palette was not chosen (data-md-color-scheme={r['scheme']!r})")
        problems += [f"{where}: text contrast {low}" for low in r["low"]]
        problems += [f"{where}: {plot} (no white card in the dark palette)" for plot in r["plots"]]
    return problems


def test_every_page_reads_in_the_dark_palette(dark_visits):
    """A reader whose system is dark gets the slate palette; prose keeps a contrast of at least 4.5:1,
    and every plot keeps the white paper its dark text is drawn for."""
    problems = dark_problems(dark_visits)
    assert not problems, report(problems, "problems in the dark palette")


def test_every_concept_diagram_has_alt_text(visits):
    problems, seen = [], 0
    for v in laptop(visits):
        for div_id, alt in v.alt_texts:
            seen += 1
            if alt is None:
                problems.append(f"{v.page}: {div_id} has no role=img wrapper with alt text")
            elif len(alt.split()) < 12:
                problems.append(f"{v.page}: {div_id}'s alt text is too short to describe it: {alt!r}")
    assert seen >= 6, f"only {seen} concept diagrams on the site; the chapters place at least six"
    assert not problems, report(problems, "diagrams without alt text")


def test_the_dark_palette_checks_catch_a_planted_page(browser, built_site, served_site):
    (built_site.root / "planted-dark.html").write_text(
        '<html><body data-md-color-scheme="default" style="background:#1e2129">'
        '<div class="md-typeset"><p style="color:#333">grey on slate</p>'
        '<div class="js-plotly-plot" id="transparent-plot" style="background:transparent;width:10px;height:10px"></div>'
        '</div></body></html>', encoding="utf-8")
    found = dark_problems({"planted-dark.html": dark_visit(browser, served_site, "planted-dark.html")})
    for expected in ("dark palette was not chosen", 'text contrast', '"grey on slate"', "transparent-plot"):
        assert any(expected in p for p in found), f"missed {expected!r}: {found}"
