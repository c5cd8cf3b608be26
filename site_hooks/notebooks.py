"""Publish the executed notebooks in `notebooks/` as site pages, at `notebooks/<name>/`.

The notebooks live at the top of the repository (beside the package they import), outside
`docs/`, so mkdocs never sees them. `on_files` adds each one to the site's files under the URI
`notebooks/<name>.ipynb`: that is the path `nav` uses, and a chapter page links to it as
`../notebooks/<name>.ipynb`. Names starting with `_` are scratch notebooks and stay off the site.
Lab notebooks (`notebooks/labs/<name>.ipynb`) are published the same way, at `notebooks/labs/<name>/`.

mkdocs does not rewrite links inside notebooks, so `on_page_content` does: a notebook links to
a page by its path in the repository (`../docs/chapters/02-naive-attention.md`, or
`03_tiling.ipynb` for another notebook), which also works in Jupyter and on GitHub.

A notebook page's header and browser tab show its H1 ("Chapter 2 notebook: naive attention, ...")
while the sidebar and the footer keep the short nav title ("2 · Notebook"). Its heading anchors
(the "¶" after each title), prompts and copy buttons are left out of the search index.

`on_post_build` rewrites the search index so results read as text: the TeX of every formula,
`\\(S\\)` or a notebook's `$S$`, becomes `S`, `\\frac{a}{b}` becomes `a/b`, `\\cdot` becomes `·`.
"""

from __future__ import annotations

import html as html_module
import json
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
    for path in sorted(NOTEBOOK_DIR.glob("*.ipynb")) + sorted(NOTEBOOK_DIR.glob("labs/*.ipynb")):
        if path.name.startswith("_"):
            continue
        uri = "notebooks/" + path.relative_to(NOTEBOOK_DIR).as_posix()
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
# What the search index should not hold: the "¶" of nbconvert's heading anchors (it would end every
# result's title), the "In [3]:" prompts and the copy buttons (with their hidden "Copied!").
# mkdocs-material's search skips an element marked data-search-exclude, and removes the mark.
_NOT_SEARCHED = re.compile(
    r'<(?P<tag>a|div) class="(?P<cls>anchor-link|zeroclipboard-container|jp-InputPrompt[^"]*|jp-OutputPrompt[^"]*)"'
)
_H1 = re.compile(r"<h1\b[^>]*>(?P<title>.*?)</h1>", re.S)


def on_page_content(html: str, page, config, files: Files) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    html = _MATHJAX.sub("", html)
    html = _MERMAID.sub("", html)
    html = _NOT_SEARCHED.sub(lambda m: f'<{m["tag"]} class="{m["cls"]}" data-search-exclude="true"', html)
    if "title" not in page.meta and (h1 := _H1.search(html)):
        heading = re.sub(r"<a class=\"anchor-link\".*?</a>|<[^>]+>", "", h1["title"], flags=re.S)
        page.meta["title"] = tex_to_text(html_module.unescape(heading)).strip()

    def link(m: re.Match) -> str:
        here = posixpath.dirname(page.file.src_uri)  # notebooks, or notebooks/labs for a lab
        in_repo = posixpath.normpath(posixpath.join(here, m["path"]))
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


# ------------------------------------------------------------------------------------------------
# The search index, as text

# Commands that stand for a character, and the character.
_SYMBOLS = {
    "cdot": "·", "times": "×", "div": "÷", "pm": "±", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥",
    "ne": "≠", "neq": "≠", "approx": "≈", "sim": "∼", "equiv": "≡", "propto": "∝", "ll": "≪", "gg": "≫",
    "to": "→", "rightarrow": "→", "leftarrow": "←", "gets": "←", "Rightarrow": "⇒", "iff": "⇔",
    "mapsto": "↦", "infty": "∞", "sum": "Σ", "prod": "Π", "int": "∫", "partial": "∂", "nabla": "∇",
    "in": "∈", "notin": "∉", "subset": "⊂", "cup": "∪", "cap": "∩", "forall": "∀", "exists": "∃",
    "odot": "⊙", "circ": "∘", "otimes": "⊗", "oplus": "⊕", "top": "ᵀ", "prime": "′",
    "lceil": "⌈", "rceil": "⌉", "lfloor": "⌊", "rfloor": "⌋", "lVert": "‖", "rVert": "‖", "Vert": "‖",
    "|": "‖", "lvert": "|", "rvert": "|", "vert": "|", "mid": "|", "langle": "⟨", "rangle": "⟩",
    "ldots": "…", "dots": "…", "cdots": "⋯", "vdots": "⋮", "ddots": "⋱",
    "{": "{", "}": "}", "%": "%", "_": "_", "&": "&", "#": "#", "$": "$",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε",
    "zeta": "ζ", "eta": "η", "theta": "θ", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν",
    "xi": "ξ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ", "phi": "φ", "varphi": "φ",
    "chi": "χ", "psi": "ψ", "omega": "ω", "ell": "ℓ", "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ",
    "Lambda": "Λ", "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω",
    ",": " ", ";": " ", ":": " ", "!": "", " ": " ", "quad": " ", "qquad": " ", "\\": "; ",
}
# Commands whose argument is the text: \text{key }, \mathrm{ref}, \operatorname{rowsum}.
_KEEP_ARGUMENT = {
    "text", "textrm", "textit", "textbf", "texttt", "mathrm", "mathit", "mathbf", "mathsf", "mathtt",
    "operatorname", "boldsymbol", "bm", "mathcal", "mathrel", "mathbin", "mathop", "underbrace",
    "overbrace", "underline", "overline", "smash", "displaystyle", "textstyle",
}
_ACCENTS = {"tilde": "\u0303", "hat": "\u0302", "widehat": "\u0302", "widetilde": "\u0303", "bar": "\u0304",
            "vec": "\u20d7", "dot": "\u0307"}
_DOUBLE_STRUCK = {"R": "ℝ", "N": "ℕ", "Z": "ℤ", "Q": "ℚ", "C": "ℂ", "E": "𝔼"}
# Commands that only size or space things, dropped with no argument: \left( is "(".
_DROPPED = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr",
            "limits", "nolimits", "middle", "nonumber", "notag"}
_SUPERSCRIPTS = str.maketrans("0123456789+-()n", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁽⁾ⁿ")


def _tex_group(tex: str, i: int) -> tuple[str, int]:
    """The argument starting at tex[i] (after spaces): a {group}'s inside, or one character or command."""
    while i < len(tex) and tex[i] == " ":
        i += 1
    if i >= len(tex):
        return "", i
    if tex[i] == "{":
        depth = 0
        for j in range(i, len(tex)):
            depth += {"{": 1, "}": -1}.get(tex[j], 0)
            if depth == 0:
                return tex[i + 1 : j], j + 1
        return tex[i + 1 :], len(tex)
    if tex[i] == "\\":
        m = re.match(r"\\([A-Za-z]+|.)", tex[i:])
        end = i + m.end()
        if m.group(1) in _KEEP_ARGUMENT or m.group(1) in _ACCENTS or m.group(1) == "mathbb":
            _, end = _tex_group(tex, end)  # m_\text{old}: the command with its argument
        return tex[i:end], end
    return tex[i], i + 1


def tex_to_text(tex: str) -> str:
    """A formula as plain text, for search results: `\\frac{4 B H N^2 d}{t}` -> `(4 B H N² d)/t`."""
    out: list[str] = []
    i = 0
    while i < len(tex):
        c = tex[i]
        if c == "\\":
            m = re.match(r"\\([A-Za-z]+|.)", tex[i:])
            name, i = m.group(1), i + m.end()
            if name in ("frac", "dfrac", "tfrac"):
                num, i = _tex_group(tex, i)
                den, i = _tex_group(tex, i)
                num, den = tex_to_text(num).strip(), tex_to_text(den).strip()
                wrap = lambda s: f"({s})" if re.search(r"[\s+\-−·×/]", s) else s  # noqa: E731
                out.append(f"{wrap(num)}/{wrap(den)}")
            elif name == "sqrt":
                arg, i = _tex_group(tex, i)
                arg = tex_to_text(arg).strip()
                out.append(f"√{arg}" if re.fullmatch(r"\w", arg) else f"√({arg})")
            elif name == "mathbb":
                arg, i = _tex_group(tex, i)
                out.append(_DOUBLE_STRUCK.get(arg.strip(), arg))
            elif name in _ACCENTS:
                arg, i = _tex_group(tex, i)
                arg = tex_to_text(arg)
                out.append(arg[:1] + _ACCENTS[name] + arg[1:] if len(arg) else arg)
            elif name in ("begin", "end"):
                _, i = _tex_group(tex, i)
                if tex[i : i + 1] == "{" and name == "begin":  # \begin{array}{cc}
                    _, i = _tex_group(tex, i)
                out.append(" ")
            elif name in ("underbrace", "overbrace"):  # \underbrace{4Nd}_{\text{K, V}}: "4Nd (K, V)"
                arg, i = _tex_group(tex, i)
                out.append(tex_to_text(arg))
                j = i
                while j < len(tex) and tex[j] == " ":
                    j += 1
                if tex[j : j + 1] in ("_", "^"):
                    label, i = _tex_group(tex, j + 1)
                    out.append(f" ({tex_to_text(label).strip()})")
            elif name in _KEEP_ARGUMENT:
                arg, i = _tex_group(tex, i)
                out.append(tex_to_text(arg))
            elif name in _SYMBOLS:
                out.append(_SYMBOLS[name])
            elif name in _DROPPED:
                pass
            else:  # \log, \max, \exp, \min, \ln, \sin...: the name itself
                out.append(name)
        elif c in "^_":
            arg, i = _tex_group(tex, i + 1)
            arg = tex_to_text(arg).strip()
            if c == "^" and re.fullmatch(r"[0-9n+\-()]+", arg):
                out.append(arg.translate(_SUPERSCRIPTS))
            elif c == "^" and arg in ("ᵀ", "′"):
                out.append(arg)
            else:
                bare = len(arg) == 1 or re.fullmatch(r"\w+|\(.*\)", arg)
                out.append(c + (arg if bare else f"({arg})"))
        elif c in "{}":
            i += 1
        elif c == "&":
            out.append(" ")
            i += 1
        elif c == "~":
            out.append(" ")
            i += 1
        else:
            out.append(c)
            i += 1
    return re.sub(r"[ \t\n]+", " ", "".join(out))


# \( \) and \[ \] from pymdownx.arithmatex; $ $ and $$ $$ in notebooks' Markdown cells.
_ARITHMATEX = re.compile(r"\\\((?P<inline>.+?)\\\)|\\\[(?P<display>.+?)\\\]", re.S)
_DOLLARS = re.compile(r"\$\$(?P<display>.+?)\$\$|(?<![\\$\w])\$(?P<inline>[^$\s](?:[^$]*?[^$\s])?)\$(?![\w$])", re.S)
_CODE = re.compile(r"(<pre>.*?</pre>|<code>.*?</code>|<[^>]+>)", re.S)


def _searchable(text: str, dollars: bool) -> str:
    """Formulas in an index entry's text (HTML) as plain text; code and tags are left alone."""
    parts = _CODE.split(text)
    for k in range(0, len(parts), 2):  # the even parts are outside code and tags
        plain = html_module.unescape(parts[k])
        formula = lambda m: tex_to_text(m["inline"] or m["display"]).strip()  # noqa: E731
        new = _ARITHMATEX.sub(formula, plain)
        if dollars:
            new = _DOLLARS.sub(formula, new)
        if new != plain:
            parts[k] = html_module.escape(new, quote=False)
    return "".join(parts)


# After mkdocs-material's search plugin has written the index (its on_post_build, priority 0).
@mkdocs.plugins.event_priority(-100)
def on_post_build(config) -> None:
    path = Path(config.site_dir) / "search" / "search_index.json"
    if not path.is_file():
        return
    index = json.loads(path.read_text(encoding="utf-8"))
    for doc in index.get("docs", []):
        dollars = doc.get("location", "").startswith("notebooks/")
        for key in ("title", "text"):
            if key in doc:
                doc[key] = _searchable(doc[key], dollars)
    path.write_text(json.dumps(index, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
