"""The README's layout table matches the tree: every path it names exists, and every module and
folder of the package and of the repository's top level is named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _layout_rows() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows, started = [], False
    for line in text.split("## Layout", 1)[1].splitlines():  # the section's first table
        if line.startswith("|"):
            started = True
            rows.append(line)
        elif started:
            break
    return [line for line in rows if line.startswith("| `")]


def _named_paths() -> set[str]:
    """Every path of the first column as a glob (`chNN_*.py`: NN a chapter number), siblings written as
    `dir/a.py`, `b.py` expanded to dir/b.py."""
    named = set()
    for row in _layout_rows():
        first = row.split("|")[1]
        folder = ""
        for item in re.findall(r"`([^`]+)`", first):
            if "/" in item.rstrip("/"):
                folder = item.rsplit("/", 1)[0] + "/" if not item.endswith("/") else item.rstrip("/").rsplit("/", 1)[0] + "/"
                named.add(item)
            else:
                named.add(folder + item if folder else item)
    return {p.replace("NN", "[0-9][0-9]") for p in named}


def test_every_named_path_exists():
    for path in _named_paths():
        matches = list(ROOT.glob(path.rstrip("/")))
        assert matches, f"README's layout names {path}, which is not in the tree"


def test_every_part_of_the_package_is_named():
    named = _named_paths()
    package = ROOT / "tutorial_kernels"
    for entry in sorted(package.iterdir()):
        if entry.name.startswith(("_", ".")) and entry.name != "__init__.py" or entry.name == "conftest.py":
            continue
        rel = f"tutorial_kernels/{entry.name}" + ("/" if entry.is_dir() else "")
        covered = rel in named or any(
            Path(rel.rstrip("/")).match(p.rstrip("/")) for p in named if p.startswith("tutorial_kernels/"))
        assert covered, f"README's layout does not name {rel}"


def test_every_top_level_folder_is_named():
    named = {p.split("/")[0] for p in _named_paths()}
    for entry in sorted(ROOT.iterdir()):
        if entry.name.startswith(".") or entry.name in ("site", "build") or not entry.is_dir():
            continue
        if entry.name.endswith(".egg-info") or entry.name == "__pycache__":
            continue
        assert entry.name in named, f"README's layout does not name the folder {entry.name}/"


def test_the_tools_row_lists_exactly_the_supported_commands():
    """tools/ holds only the supported commands: the README's row names every file there, and no other."""
    row = next(r for r in _layout_rows() if r.startswith("| `tools/`"))
    named = set(re.findall(r"`([^`/]+)`", row.split("|")[2]))
    present = {p.name for p in (ROOT / "tools").iterdir() if p.is_file()}
    assert present == named, f"tools/ holds {sorted(present)}, the README's row names {sorted(named)}"
