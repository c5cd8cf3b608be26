"""The site builds with `mkdocs build --strict`, shows the tested code, and needs no network.

These tests read the built files; tests/test_browser.py loads the pages in Chromium.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHAPTERS = sorted((DOCS / "chapters").glob("*.md"))
KERNEL_MODULES = sorted((ROOT / "tutorial_kernels").glob("ch[0-9][0-9]_*.py"))
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb") if not p.name.startswith("_"))

# `--8<-- "tutorial_kernels/ch02_naive_attention.py:scores_kernel"` (pymdownx.snippets, one line)
SNIPPET = re.compile(r"""^[ \t]*--8<--[ \t]+(["'])(?P<spec>[^"']+)\1[ \t]*$""", re.M)


def figure_hook():
    """site_hooks/figures.py as a module, for its marker parser (mkdocs loads hooks by path too)."""
    spec = importlib.util.spec_from_file_location("site_hooks_figures", ROOT / "site_hooks" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def built_page(site_root: Path, md: Path) -> Path:
    """docs/chapters/02-naive-attention.md -> <site>/chapters/02-naive-attention/index.html;
    docs/benchmarks/index.md -> <site>/benchmarks/index.html (as mkdocs' directory URLs)."""
    rel = md.relative_to(DOCS).with_suffix("")
    return site_root / (rel.parent if rel.name == "index" else rel) / "index.html"


def page_text(path: Path) -> str:
    """The page's text with tags dropped and entities decoded; highlighted code reads as source again."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def snippet_lines(spec: str) -> list[str]:
    """The lines pymdownx.snippets includes for `path`, `path:section` or `path:start:end`."""
    path, _, selector = spec.partition(":")
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    if re.fullmatch(r"\d+(:\d+)?", selector):
        start, _, end = selector.partition(":")
        lines = lines[int(start) - 1 : int(end) if end else None]
    elif selector:
        begin = next(i for i, line in enumerate(lines) if f"--8<-- [start:{selector}]" in line)
        end = next(i for i, line in enumerate(lines) if f"--8<-- [end:{selector}]" in line)
        lines = lines[begin + 1 : end]
    return [line.strip() for line in lines if line.strip() and "--8<--" not in line]


def test_strict_build_succeeds(built_site):
    assert "WARNING" not in built_site.log, built_site.log  # --strict fails on these; belt and braces
    assert (built_site.root / "index.html").is_file()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_shows_the_code_it_includes(built_site, chapter: Path):
    source = chapter.read_text(encoding="utf-8")
    text = page_text(built_page(built_site.root, chapter))
    for m in SNIPPET.finditer(source):
        missing = [line for line in snippet_lines(m["spec"]) if line not in text]
        assert not missing, f"{chapter.relative_to(ROOT)}: included {m['spec']!r}, but the built page lacks {missing[:3]}"


@pytest.mark.parametrize("module", KERNEL_MODULES, ids=lambda p: p.stem)
def test_each_kernel_module_is_shown_on_its_chapter(module: Path):
    """tutorial_kernels/ch02_*.py is included in docs/chapters/02-*.md: the page shows the tested code."""
    chapters = sorted((DOCS / "chapters").glob(f"{module.name[2:4]}-*.md"))
    assert chapters, f"{module.relative_to(ROOT)} has no chapter page docs/chapters/{module.name[2:4]}-*.md"
    wanted = module.relative_to(ROOT).as_posix()
    specs = [m["spec"] for chapter in chapters for m in SNIPPET.finditer(chapter.read_text(encoding="utf-8"))]
    assert any(spec.partition(":")[0] == wanted for spec in specs), (
        f"{chapters[0].relative_to(ROOT)} includes no code from {wanted}: add a line like --8<-- \"{wanted}:SECTION\""
    )


def test_figures_are_on_their_pages(built_site):
    find_markers = figure_hook().find_markers
    for md in sorted(DOCS.rglob("*.md")):
        page = built_page(built_site.root, md).read_text(encoding="utf-8")
        for marker in find_markers(md.read_text(encoding="utf-8")):
            assert f'id="figure-{marker.name}"' in page, f"{md.relative_to(ROOT)}: figure {marker.name!r} is not on the built page"
    for path in built_site.root.rglob("*.html"):
        assert "plotly-figure-placeholder-" not in path.read_text(encoding="utf-8"), f"{path}: a figure placeholder was left"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_page(built_site, notebook: Path):
    page_path = built_site.root / "notebooks" / notebook.stem / "index.html"
    assert page_path.is_file(), f"{notebook.name} has no page at notebooks/{notebook.stem}/"
    page = page_path.read_text(encoding="utf-8")
    assert "jupyter-wrapper" in page, f"{page_path}: not rendered by mkdocs-jupyter"
    assert (page_path.parent / notebook.name).is_file(), f"{notebook.name} is not offered for download beside its page"
    # site_hooks/notebooks.py drops nbconvert's MathJax-2 and CDN mermaid loaders; KaTeX renders the math.
    for word in ("MathJax", "cdnjs.cloudflare.com"):
        assert word not in page, f"{page_path}: still mentions {word}"
    # nbconvert shows a plotly figure only through a text/html output (plotly.show() alone gives
    # application/vnd.plotly.v1+json, which it drops silently): each must reach the page.
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    plotly_outputs = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    for o in plotly_outputs:
        assert "text/html" in o["data"], f"{notebook.name}: a plotly output has no text/html; draw it with tutorial_kernels.figures.show(fig)"
    assert page.count('class="plotly-graph-div"') >= len(plotly_outputs), f"{page_path}: figures missing"


def test_vendored_assets_are_in_the_site(built_site):
    import plotly

    plotly_js = built_site.root / "assets/vendor/plotly/plotly.min.js"
    shipped = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert plotly_js.is_file() and plotly_js.stat().st_size == shipped.stat().st_size
    katex = built_site.root / "assets/vendor/katex"
    for name in ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js", "LICENSE"):
        assert (katex / name).is_file(), f"KaTeX file {name} missing from the site"
    css = (katex / "katex.min.css").read_text(encoding="utf-8")
    fonts = re.findall(r"url\((fonts/[^)]+\.woff2)\)", css)
    assert fonts, "katex.min.css names no woff2 fonts"
    missing = [f for f in fonts if not (katex / f).is_file()]
    assert not missing, f"KaTeX fonts missing from the site: {missing}"
    assert (built_site.root / "assets/javascripts/katex-init.js").is_file()


REMOTE = re.compile(r"^\s*(https?:)?//", re.I)
CSS_REMOTE = re.compile(r"""(url\(\s*["']?|@import\s+["'])(https?:)?//""", re.I)
# (tag, attribute) pairs that make the browser fetch something; <a href> only links.
FETCHING = {
    "script": ("src",),
    "link": ("href",),
    "img": ("src", "srcset"),
    "source": ("src", "srcset"),
    "iframe": ("src",),
    "video": ("src", "poster"),
    "audio": ("src",),
    "embed": ("src",),
    "object": ("data",),
}


class _RemoteRefs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in FETCHING.get(tag, ()) and value and REMOTE.match(value):
                self.found.append(f"<{tag} {name}={value!r}>")


def test_no_page_loads_anything_from_the_network(built_site):
    problems = []
    for path in sorted(built_site.root.rglob("*.html")):
        text = path.read_text(encoding="utf-8")
        parser = _RemoteRefs()
        parser.feed(text)
        rel = path.relative_to(built_site.root)
        problems += [f"{rel}: {ref}" for ref in parser.found]
        for style in re.findall(r"<style[^>]*>(.*?)</style>", text, re.S):
            problems += [f"{rel}: inline CSS loads {m.group(0)!r}..." for m in CSS_REMOTE.finditer(style)]
    for path in sorted(built_site.root.rglob("*.css")):
        problems += [f"{path.relative_to(built_site.root)}: loads {m.group(0)!r}..." for m in CSS_REMOTE.finditer(path.read_text(encoding="utf-8"))]
    assert not problems, "remote resources in the built site:\n" + "\n".join(problems)


def test_figure_hook(tmp_path, mkdocs_build):
    """A known figure becomes a plotly div, even inside an admonition; a marker in code stays code;
    an unknown name fails the build and says where."""
    require("plotly")  # a site dependency: the GPU machine's image may lack it
    from tutorial_kernels import figures as plots

    import plotly.graph_objects as go

    from tutorial_kernels.figures.registry import build

    name = next(n for n in sorted(plots.FIGURES) if isinstance(build(n), go.Figure))  # a plot, not a table
    (tmp_path / "docs").mkdir()
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        "site_name: figure hook test\n"
        f"docs_dir: {tmp_path / 'docs'}\n"
        "markdown_extensions: [admonition]\n"
        f"hooks: [{ROOT / 'site_hooks' / 'figures.py'}]\n"
    )
    page = tmp_path / "docs" / "index.md"
    page.write_text(
        f"# Figures\n\nText.\n<!-- figure: {name} -->\n\n"
        f'!!! note "Inside"\n    <!-- figure: {name} -->\n\n'
        "```\n<!-- figure: shown-as-code -->\n```\n"
    )
    proc = mkdocs_build(tmp_path / "site", config_file=config)
    assert proc.returncode != 0, "the same figure twice on a page must fail the build"
    assert "appears twice" in proc.stderr + proc.stdout

    page.write_text(f"# Figures\n\n!!! note \"Inside\"\n    <!-- figure: {name} -->\n\n```\n<!-- figure: shown-as-code -->\n```\n")
    proc = mkdocs_build(tmp_path / "site", config_file=config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert re.search(rf'<p class="admonition-title">Inside</p>\s*<div class="plotly-figure"><div[^>]*>\s*<div id="figure-{name}"', built), (
        "the figure is not inside its admonition"
    )
    assert "&lt;!-- figure: shown-as-code --&gt;" in built

    page.write_text("# Figures\n\n<!-- figure: no-such-figure -->\n")
    proc = mkdocs_build(tmp_path / "site", config_file=config)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, "an unknown figure name must fail the build"
    assert "docs/index.md, line 3: no figure named 'no-such-figure'" in log, log
