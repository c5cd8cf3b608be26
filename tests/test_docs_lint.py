"""The prose of every page the site renders teaches; the diary lives in BENCHMARKS.md and experiments/,
and one page of the site, "How the numbers were obtained", says where.

Scanned: docs/**/*.md and the markdown cells of notebooks/*.ipynb (each notebook is a page of the
site). Skipped: fenced code blocks, inline code spans, snippet include lines (`--8<--`), HTML
comments, and URLs (inside links, autolinks, href/src attributes, bare). Flagged, with page, line and
text:

- a commit hash: 7-40 lowercase hex characters with both a digit and a letter, as a word (a colour
  code `#1f77b4ff` is not a word of its own: the `#` before it excludes it);
- a `data/logs` path (the raw GPU logs);
- the word "session" or "sessions";
- one of our own issue or pull-request references: "issue 6", "issue #6", "issues 6/7", "PR #3", a
  bare "#6" (an upstream reference written `owner/repo#6242` is fine);
- any "seed": the seed documents ("the seed", "seed 003", "seed notes"), and random seeds too, which a
  reader cannot tell from them (say "random state" or "initialisation");
- a duration in microseconds or milliseconds: "12 µs", "3.4 ms", "0.5 us" (times belong in figures
  and tables drawn from data/, and in BENCHMARKS.md);
- run history named anywhere on a line, inline code included: `BENCHMARKS.md`, `experiments/…`, `data/logs`,
  on every page: none of them is on the site, so each is a dead end for a reader. A page links to the one
  page that says how its numbers were obtained, which names committed data files (their provenance names
  the command) and says in words where the rest of the record is kept.

Justified exceptions go in tests/docs_lint_allow.txt, one per line:

    PAGE :: TEXT # REASON

PAGE is the path from the repository root (`docs/benchmarks/index.md`, `notebooks/04_flash_v1.ipynb`);
TEXT is the exact text allowed: it must contain the flagged text and appear on the flagged line
(so it can be a little longer than the finding, to pin which occurrence); the reason follows the
first " # ". An entry that allows nothing fails the test too, so the list cannot rot.

The planted page below runs through the same checker and expects each pattern to fire, and each
skipped construct to stay silent, so that this test can fail.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOW_FILE = Path(__file__).with_name("docs_lint_allow.txt")


# ---------------------------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------------------------

RULES: dict[str, re.Pattern] = {
    "commit hash": re.compile(r"(?<![\w#&/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])"),
    "data/logs path": re.compile(r"\bdata/logs\b"),
    "session": re.compile(r"\bsessions?\b", re.I),
    "issue reference": re.compile(
        r"\b(?:issues?|PRs?|pull requests?)\s*#?\d+(?:\s*(?:/|,|&|and|or)\s*#?\d+)*\b"
        r"|(?<![\w/&#])#\d{1,5}(?![\w-])",
        re.I),
    "seed reference": re.compile(r"\bthe seeds?\b|\bseeds?(?:[\s_-]*#?0\d{2}|\s+notes?)?\b", re.I),
    "duration in prose": re.compile(
        r"(?<![\w.])\d[\d.,]*(?:\s*(?:–|-|to)\s*\d[\d.,]*)?[\s\u00a0\u2009\u202f]*(?:µs|μs|us|ms)\b"),
}

# Checked with inline code kept: a path to the run diary is as much a dead end in code as in prose.
CODE_RULES: dict[str, re.Pattern] = {
    "run history": re.compile(r"(?i:\bBENCHMARKS\.md\b)|(?<![\w/.-])experiments/|\bdata/logs\b"),
}

FENCE = re.compile(r"^[ \t>]*(?P<fence>`{3,}|~{3,})")
SNIPPET_LINE = re.compile(r"^[ \t]*-{1,2}8<-{1,2}")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE_SPAN = re.compile(r"(?<!`)(?P<ticks>`+)(?!`).*?(?<!`)(?P=ticks)(?!`)")
URLS = [
    re.compile(r"(?<=\]\()[^)\s]*(?:\s+\"[^\"]*\")?(?=\))"),  # [text](url "title")
    re.compile(r"^([ \t]*\[[^\]]+\]:[ \t]*)\S+.*$"),             # [ref]: url "title"
    re.compile(r"<[a-z][a-z0-9+.-]*://[^>\s]+>", re.I),         # <https://...>
    re.compile(r"\b(?:href|src)=(\"[^\"]*\"|'[^']*')", re.I),    # HTML attributes
    re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s)>\]]+", re.I),       # bare URLs
]


@dataclass(frozen=True)
class Finding:
    page: str   # path from the repository root
    where: str  # "line 12" or "cell 3, line 2"
    rule: str
    text: str   # what matched
    line: str   # the whole source line, as written

    def __str__(self) -> str:
        return f"{self.page}, {self.where}: {self.rule}: {self.text!r}   ({self.line.strip()[:140]})"


def prose_lines(markdown: str, keep_code_spans: bool = False) -> list[str]:
    """The markdown with everything that is not prose blanked out (inline code kept if asked); one
    output line per input line, so that line numbers carry over."""
    # HTML comments may span lines: keep their newlines, drop the rest.
    text = HTML_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        if fence is not None:
            m = FENCE.match(line)
            if m and m.group("fence")[0] == fence[0] and len(m.group("fence")) >= len(fence) \
                    and not line[m.end():].strip():
                fence = None
            out.append("")
            continue
        m = FENCE.match(line)
        if m:
            fence = m.group("fence")
            out.append("")
            continue
        if SNIPPET_LINE.match(line):
            out.append("")
            continue
        if not keep_code_spans:
            line = CODE_SPAN.sub(" ", line)
        line = URLS[0].sub("", line)
        line = URLS[1].sub(lambda m: m.group(1), line)
        for pattern in URLS[2:]:
            line = pattern.sub(" ", line)
        out.append(line)
    return out


def check_markdown(markdown: str, page: str, where_prefix: str = "") -> list[Finding]:
    findings = []
    originals = markdown.split("\n")
    passes = [(prose_lines(markdown), RULES), (prose_lines(markdown, keep_code_spans=True), CODE_RULES)]
    for lines, rules in passes:
        for number, line in enumerate(lines, start=1):
            for rule, pattern in rules.items():
                for m in pattern.finditer(line):
                    findings.append(Finding(page, f"{where_prefix}line {number}", rule, m.group(0),
                                            originals[number - 1] if number <= len(originals) else line))
    return findings


def check_notebook(source: str, page: str) -> list[Finding]:
    """Every markdown cell of a notebook (its JSON text), numbered from 1 as Jupyter shows them."""
    notebook = json.loads(source)
    findings = []
    for index, cell in enumerate(notebook.get("cells", []), start=1):
        if cell.get("cell_type") != "markdown":
            continue
        text = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        findings += check_markdown(text, page, f"cell {index}, ")
    return findings


def site_pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md")) + sorted(
        p for p in (ROOT / "notebooks").glob("*.ipynb") if not p.name.startswith("_"))


def check_page(path: Path) -> list[Finding]:
    page = path.relative_to(ROOT).as_posix()
    source = path.read_text(encoding="utf-8")
    return check_notebook(source, page) if path.suffix == ".ipynb" else check_markdown(source, page)


@dataclass(frozen=True)
class Allowed:
    page: str
    text: str
    reason: str
    number: int  # line of the allow-list file


def parse_allow_list(text: str) -> list[Allowed]:
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        page, sep, rest = line.partition(" :: ")
        body, hash_sep, reason = rest.partition(" # ")
        if not sep or not hash_sep or not body.strip() or not reason.strip():
            raise ValueError(f"docs_lint_allow.txt line {number}: expected 'PAGE :: TEXT # REASON', got {raw!r}")
        entries.append(Allowed(page.strip(), body.strip(), reason.strip(), number))
    return entries


def apply_allow_list(findings: list[Finding], entries: list[Allowed]) -> tuple[list[Finding], list[Allowed]]:
    """(findings no entry allows, entries that allowed nothing)."""
    used: set[Allowed] = set()
    left = []
    for finding in findings:
        match = next((e for e in entries if e.page == finding.page and finding.text in e.text
                      and e.text in finding.line), None)
        if match is None:
            left.append(finding)
        else:
            used.add(match)
    return left, [e for e in entries if e not in used]


# ---------------------------------------------------------------------------------------------
# The planted page: every rule fires on the FLAGGED lines, nothing fires on the rest
# ---------------------------------------------------------------------------------------------

PLANTED = """\
# A planted page

The kernel got faster at commit 3d5f4b4 and again at f16a9f7c0ffee.
The raw log is data/logs/ch05_run.txt.
In the second session we reran it; both sessions agree.
As issue 6 asked, and issue #12 too; issues 6/7 remain; see PR #3, and (#20).
Unlike the seed, we name sources; seed 003 said so in the seed notes.
It took 12 µs, then 3.4 ms, then 0.5 us, then 7–9 ms, then 40μs.
The diary: `BENCHMARKS.md` and `experiments/2026-11-22_x/probe.py`; the experiments/ folder too, benchmarks.md.

Colours #1f77b4 and #1f77b4ff, a date 2025-11-24, fp16, bf16, e4m3, 0x1f2e3d4c, 1e-5 and 2e10
are not hashes; 3e-05 neither. A random seed of 0, and seeds in general, read as the seed documents.
Upstream: triton-lang/triton#6242 and pytorch/pytorch#123456 are fine.
Words that are not units: 12 muses, 4 msgs, 16 users; a speed-up of 1.5x; 3 s; ms alone.
An entity &#8203; is no issue. A heading's "# Title" neither.
Inline `3d5f4b4 in data/logs session issue 6 12 µs` is code.
A link [the post](https://github.com/o/r/commit/3d5f4b4?session=1#issue-6) hides its URL;
so does <https://example.com/f16a9f7c0ffee/data/logs>, and https://example.com/abcdef1234 bare.
<a href="https://example.com/3d5f4b4">an anchor</a> too.
<!-- figure: a comment hides 3d5f4b4, data/logs, the session, issue 6 and 12 µs -->
<!-- a comment
over lines: issue 9, 7 ms
-->
--8<-- "tutorial_kernels/ch05_flash_v2.py:abc1234"

```python
# fenced code: 3d5f4b4 data/logs session issue 6 the seed 12 µs
```

!!! note "Inside an admonition"

    ~~~~
    indented fence: issue 7 and 3.4 ms
    ~~~~

    The admonition's prose is checked: issue 8.

[ref]: https://example.com/3d5f4b4 "a reference definition"
"""

EXPECTED = [
    ("line 3", "commit hash", "3d5f4b4"),
    ("line 3", "commit hash", "f16a9f7c0ffee"),
    ("line 4", "data/logs path", "data/logs"),
    ("line 5", "session", "session"),
    ("line 5", "session", "sessions"),
    ("line 6", "issue reference", "issue 6"),
    ("line 6", "issue reference", "issue #12"),
    ("line 6", "issue reference", "issues 6/7"),
    ("line 6", "issue reference", "PR #3"),
    ("line 6", "issue reference", "#20"),
    ("line 7", "seed reference", "the seed"),
    ("line 7", "seed reference", "seed 003"),
    ("line 7", "seed reference", "the seed"),  # "the seed notes" is one match: "the seed" comes first
    ("line 12", "seed reference", "seed"),
    ("line 12", "seed reference", "seeds"),
    ("line 12", "seed reference", "the seed"),
    ("line 8", "duration in prose", "12 µs"),
    ("line 8", "duration in prose", "3.4 ms"),
    ("line 8", "duration in prose", "0.5 us"),
    ("line 8", "duration in prose", "7–9 ms"),
    ("line 8", "duration in prose", "40μs"),
    ("line 36", "issue reference", "issue 8"),
    ("line 4", "run history", "data/logs"),
    ("line 9", "run history", "BENCHMARKS.md"),
    ("line 9", "run history", "experiments/"),
    ("line 9", "run history", "experiments/"),
    ("line 9", "run history", "benchmarks.md"),  # in any case: a link's text names the page, not the file
    ("line 16", "run history", "data/logs"),  # inline code is no hiding place for the diary
]


def test_every_rule_fires_on_the_planted_page_and_nothing_else_does():
    found = [(f.where, f.rule, f.text) for f in check_markdown(PLANTED, "docs/planted.md")]
    assert sorted(found) == sorted(EXPECTED), "\n".join(
        ["unexpected:"] + [str(x) for x in found if x not in EXPECTED]
        + ["missing:"] + [str(x) for x in EXPECTED if x not in found])


def test_seed_notes_fires_on_its_own():
    found = [(f.rule, f.text) for f in check_markdown("Our seed notes say so.", "docs/planted.md")]
    assert found == [("seed reference", "seed notes")]


def test_every_rule_is_planted():
    assert {rule for _, rule, _ in EXPECTED} == set(RULES) | set(CODE_RULES)


def test_no_page_may_name_the_record_not_even_the_page_of_record():
    line = "The runs are in `BENCHMARKS.md` and `experiments/2026-11-22_x/`."
    for page in ("docs/how-the-numbers-were-obtained.md", "docs/other.md"):
        assert [f.text for f in check_markdown(line, page)] == ["BENCHMARKS.md", "experiments/"]


def test_a_notebook_is_checked_cell_by_cell_and_its_code_is_not():
    notebook = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Title\n", "\n", "In one session, 12 ms."]},
        {"cell_type": "code", "metadata": {}, "source": "print('session 3d5f4b4, 12 ms')", "outputs": []},
        {"cell_type": "markdown", "metadata": {}, "source": "Commit 3d5f4b4."},
    ]}
    found = [(f.where, f.rule, f.text) for f in check_notebook(json.dumps(notebook), "notebooks/x.ipynb")]
    assert found == [("cell 1, line 3", "session", "session"), ("cell 1, line 3", "duration in prose", "12 ms"),
                     ("cell 3, line 1", "commit hash", "3d5f4b4")]


def test_the_allow_list_allows_exact_text_and_reports_unused_entries():
    findings = check_markdown("Run 3d5f4b4 here.\nIn one session.\nAnother session.", "docs/p.md")
    entries = parse_allow_list(
        "# comment\n\n"
        "docs/p.md :: Run 3d5f4b4 here # a planted reason\n"
        "docs/p.md :: Another session # pins the second occurrence only\n"
        "docs/p.md :: issue 6 # allows nothing\n"
        "docs/other.md :: In one session # another page\n")
    left, unused = apply_allow_list(findings, entries)
    assert [(f.where, f.text) for f in left] == [("line 2", "session")]
    assert [e.text for e in unused] == ["issue 6", "In one session"]


def test_a_malformed_allow_list_line_is_an_error():
    with pytest.raises(ValueError, match="PAGE :: TEXT # REASON"):
        parse_allow_list("docs/p.md :: no reason here\n")


# ---------------------------------------------------------------------------------------------
# The site
# ---------------------------------------------------------------------------------------------

def test_the_site_pages_are_found():
    pages = {p.relative_to(ROOT).as_posix() for p in site_pages()}
    assert "docs/index.md" in pages and any(p.startswith("notebooks/") for p in pages)


def test_no_page_carries_the_diary():
    entries = parse_allow_list(ALLOW_FILE.read_text(encoding="utf-8"))
    findings = [f for page in site_pages() for f in check_page(page)]
    left, unused = apply_allow_list(findings, entries)
    message = []
    if left:
        message.append(f"{len(left)} finding(s) in the pages' prose (move run history to BENCHMARKS.md and link "
                       "docs/how-the-numbers-were-obtained.md (committed data files only), name sources instead of 'the seed', let figures carry the times; or, if justified, add "
                       f"'PAGE :: TEXT # REASON' to {ALLOW_FILE.relative_to(ROOT)}):")
        message += [f"  {f}" for f in left]
    if unused:
        message.append(f"{len(unused)} allow-list entr(y/ies) that allow nothing any more (delete them):")
        message += [f"  line {e.number}: {e.page} :: {e.text}" for e in unused]
    assert not message, "\n".join(message)


# Every chapter page and the appendix show tested code: sections of tutorial_kernels/ included with
# `--8<-- "tutorial_kernels/FILE.py:SECTION"` (the strict build fails when a section does not exist).
INCLUDE = re.compile(r'--8<-- "tutorial_kernels/[\w/]+\.py:\w+"')
TEACHING_PAGES = sorted((ROOT / "docs" / "chapters").glob("*.md")) + sorted((ROOT / "docs" / "appendix").glob("*.md"))


@pytest.mark.parametrize("page", TEACHING_PAGES, ids=lambda p: p.name)
def test_every_teaching_page_includes_tested_code(page):
    includes = INCLUDE.findall(page.read_text(encoding="utf-8"))
    assert includes, f"{page.relative_to(ROOT)} includes no tested code from tutorial_kernels/ (--8<-- sections)"


def test_the_chapters_are_found():
    assert len(TEACHING_PAGES) >= 8, [p.name for p in TEACHING_PAGES]


def test_chapter_5_stays_a_chapter():
    """Chapter 5 was split to teach one kernel; its extras stay in a table. A page past 500 lines is a
    lab notebook again."""
    lines = len((ROOT / "docs" / "chapters" / "05-flash-v2.md").read_text(encoding="utf-8").splitlines())
    assert lines <= 500, f"docs/chapters/05-flash-v2.md has {lines} lines; keep it at 500 or fewer"


# A chapter teaches: the idea, the derivation, the code, what the measurements show, exercises. How its kernels
# are tested, and how its numbers were obtained, are the record: one short section at most (the full account
# lives on docs/how-the-numbers-were-obtained.md). A line is the record when it is in a section whose heading
# says so, or names the project's own tooling rather than the idea (conftest, pytest flags, xfail).
RECORD_HEADING = re.compile(r"^#{2,3} .*(\btest(ed|s|ing)?\b|how the numbers)", re.IGNORECASE)
RECORD_LINE = re.compile(r"\bxfail|conftest|pytest -|--durations|\bdeselect", re.IGNORECASE)
TEACHING_SHARE = 0.85


def teaching_share(text: str) -> float:
    """Non-blank lines outside record sections, and not naming the test tooling, over all non-blank lines
    (code blocks and figures count as teaching: they show the lesson's code and results)."""
    record = total = 0
    in_record = False
    for line in text.splitlines():
        if re.match(r"^#{1,3} ", line):
            in_record = bool(RECORD_HEADING.match(line))
        if not line.strip():
            continue
        total += 1
        record += in_record or bool(RECORD_LINE.search(line))
    return 1 - record / max(total, 1)


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "chapters").glob("*.md")), ids=lambda p: p.name)
def test_every_chapter_is_mostly_teaching(page):
    share = teaching_share(page.read_text(encoding="utf-8"))
    assert share >= TEACHING_SHARE, (f"{page.relative_to(ROOT)}: {share:.0%} of its lines teach (at least "
                                     f"{TEACHING_SHARE:.0%}); move testing notes to the how-the-numbers page")


def test_the_teaching_share_counts_record_sections():
    page = "# T\n\nidea\n\n## How it is tested\n\none\ntwo\n\n## Exercises\n\nthree\nrun with pytest -x\n"
    assert teaching_share(page) == pytest.approx(1 - 4 / 8)  # the heading, its two lines, the pytest line
