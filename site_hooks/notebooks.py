"""Publish the executed notebooks in `notebooks/` as site pages, at `notebooks/<name>/`.

The notebooks live at the top of the repository (beside the package they import), outside
`docs/`, so mkdocs never sees them. `on_files` adds each one to the site's files under the URI
`notebooks/<name>.ipynb`: that is the path `nav` uses, and a chapter page links to it as
`../notebooks/<name>.ipynb`. Names starting with `_` are scratch notebooks and stay off the site.

mkdocs does not rewrite links inside notebooks, so `on_page_content` does: a notebook links to
a page by its path in the repository (`../docs/chapters/02-naive-attention.md`, or
`03_tiling.ipynb` for another notebook), which also works in Jupyter and on GitHub.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

import mkdocs.plugins
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
log = logging.getLogger("mkdocs.site_hooks.notebooks")  # under "mkdocs": --strict counts its warnings


# mkdocs-jupyter turns .ipynb files into pages in its own on_files (priority 0). Running first
# lets it see ours; run after it and a notebook is copied as a raw file, and --strict still passes.
@mkdocs.plugins.event_priority(100)
def on_files(files: Files, config) -> Files:
    for path in sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        if path.name.startswith("_"):
            continue
        uri = f"notebooks/{path.name}"
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} and {uri} both exist; keep only {uri}")
        # A plain File rooted at the repository, not File.generated: mkdocs-jupyter wraps the
        # File in a proxy that recomputes abs_src_path from src_dir, which a generated file lacks.
        files.append(File(uri, src_dir=str(ROOT), dest_dir=config.site_dir, use_directory_urls=config.use_directory_urls))
    return files


# nbconvert's template always emits a MathJax-2 loader (a <script src> with our empty URL, then
# its config) and a mermaid loader that imports from a CDN. The site renders math with KaTeX
# (katex-init.js) and has no mermaid diagrams, so both go.
_MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
_MERMAID = re.compile(r'<script type="module">(?:(?!</script>).)*?\.jp-Mermaid.*?</script>', re.S)
# A relative link to a Markdown page or a notebook (no scheme, not site-absolute).
_LINK = re.compile(r'href="(?P<path>[^"#?:/][^"#?:]*\.(?:md|ipynb))(?P<fragment>#[^"]*)?"')


def on_page_content(html: str, page, config, files: Files) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    html = _MATHJAX.sub("", html)
    html = _MERMAID.sub("", html)

    def link(m: re.Match) -> str:
        in_repo = posixpath.normpath(posixpath.join("notebooks", m["path"]))
        uri = in_repo.removeprefix("docs/")  # docs/chapters/x.md is the page chapters/x.md
        target = files.get_file_from_path(uri) if in_repo != uri or uri.startswith("notebooks/") else None
        if target is None:
            log.warning(
                f"{page.file.src_uri} links to {m['path']!r} ({in_repo} in the repository), which is not a page "
                f"of the site; link to a page as ../docs/<page>.md, to a notebook as <name>.ipynb"
            )
            return m.group(0)
        return f'href="{target.url_relative_to(page.file)}{m["fragment"] or ""}"'

    return _LINK.sub(link, html)
