"""Execute every notebook on the CPU and stamp it with what it was executed against.

    python tools/execute_notebooks.py            # re-execute notebooks/*.ipynb and notebooks/labs/*.ipynb in place
    python tools/execute_notebooks.py --check    # exit 1 if a notebook's stamp is stale
    python tools/execute_notebooks.py notebooks/labs/02_naive_attention_lab.ipynb   # only these

Committed notebooks must show what today's code and data produce. Executing a notebook records what it
depended on: the repository's Python modules it imported (directly or not) and the repository's files it
opened for reading (data/*.json, …), watched in its kernel by an audit hook. The stamp is a SHA-256 of the
notebook's code cells, of each recorded module's syntax tree (a comment or a blank line changes nothing)
and of each recorded file's bytes (a module whose source the notebook shows is such a file too); both
are stored in the notebook's metadata, and tests/test_notebooks.py fails when the stamp no longer
matches. So a notebook goes stale only when its own code, a module it imports or a file it reads
changes; a change elsewhere leaves it fresh.

Notebooks are executed with the GPU hidden, so the committed outputs come from the interpreter
path every reader can reproduce; a reader with a GPU gets live measurements on top. Lab notebooks
(`notebooks/labs/`) are committed with their skeletons unfilled: their outputs are the grader's reports.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
STAMP_KEY = "tutorial_stamp"
CELL_TIMEOUT_S = 600


def notebooks() -> list[Path]:
    """The chapter notebooks, then the lab notebooks; names starting with `_` are scratch."""
    found = sorted(NOTEBOOK_DIR.glob("*.ipynb")) + sorted(NOTEBOOK_DIR.glob("labs/*.ipynb"))
    return [p for p in found if not p.name.startswith("_")]


DEPS_KEY = "tutorial_dependencies"
# Run in the notebook's kernel before its first cell and after its last (and removed from the notebook):
# an audit hook collects the paths opened for reading; the end prints them with every imported module's file.
_WATCH = """
import os as _os, sys as _sys
_tutorial_opened = set()
def _tutorial_watch(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, _os.PathLike)):
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
        if not any(c in mode for c in "wax+"):
            _tutorial_opened.add(_os.path.abspath(_os.fsdecode(args[0])))
_sys.addaudithook(_tutorial_watch)
"""
_REPORT = """
import json as _json, linecache as _linecache
print(_json.dumps({"modules": sorted({m.__file__ for m in list(_sys.modules.values())
                                      if isinstance(getattr(m, "__file__", None), str)}),
                   "opened": sorted(_tutorial_opened),
                   "shown": sorted(f for f in _linecache.cache if _os.path.isabs(f))}))
"""


def _in_repository(path: str) -> str | None:
    """`path` relative to the repository, if it is a file of the repository (not of its environments or caches)."""
    try:
        relative = Path(path).resolve().relative_to(REPO_ROOT)
    except ValueError:
        return None
    if relative.parts[0].startswith(".") or "__pycache__" in relative.parts or not (REPO_ROOT / relative).is_file():
        return None
    return relative.as_posix()


def dependencies(report: dict) -> dict:
    """From _REPORT's output, relative paths: the modules (.py files of the repository) it imported, and
    the files it read, with the modules whose source it showed (inspect.getsource, a traceback: the
    lines linecache holds), whose every byte, comments included, is then part of the outputs."""
    modules = sorted({p for p in map(_in_repository, report["modules"]) if p and p.endswith(".py")})
    read = {p for p in map(_in_repository, report["opened"]) if p and not p.endswith((".py", ".ipynb"))}
    shown = {p for p in map(_in_repository, report.get("shown", [])) if p}
    return {"modules": modules, "files": sorted(read | shown)}


def _syntax(text: str) -> bytes:
    """A module's syntax tree: what it does, not how it is laid out or commented."""
    try:
        return ast.dump(ast.parse(text)).encode()
    except SyntaxError:
        return text.encode()


def stamp(nb: nbformat.NotebookNode, read: Callable[[Path], str] = lambda p: p.read_text()) -> str:
    """Hash of everything a notebook's outputs depend on: its code cells and its recorded dependencies
    (`read` gives a module's source; tests pass another to try edits). "unrecorded" if it has none."""
    recorded = nb.metadata.get(DEPS_KEY)
    if recorded is None:
        return "unrecorded"
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode())
    for kind in ("modules", "files"):
        for relative in recorded[kind]:
            path = REPO_ROOT / relative
            h.update(relative.encode())
            if not path.is_file():
                h.update(b"<missing>")
            else:
                h.update(_syntax(read(path)) if kind == "modules" else path.read_bytes())
    return h.hexdigest()


def cpu_environment() -> dict[str, str]:
    """The environment a notebook is executed in: no GPU visible, Triton's interpreter on."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1", "PYTHONHASHSEED": "0"}


def execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    """Execute `nb` in place on the CPU; record what it depended on in its metadata (DEPS_KEY)."""
    saved = dict(os.environ)
    os.environ.update(cpu_environment())  # the kernel process inherits this environment
    nb.cells.insert(0, nbformat.v4.new_code_cell(_WATCH))
    nb.cells.append(nbformat.v4.new_code_cell(_REPORT))
    try:
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        report = nb.cells.pop()
        nb.cells.pop(0)
        for cell in nb.cells:  # numbered as if the watch had not run first
            if cell.cell_type == "code" and cell.get("execution_count"):
                cell.execution_count -= 1
                for output in cell.outputs:
                    if output.get("execution_count"):
                        output.execution_count -= 1
    text = "".join(o.get("text", "") for o in report.outputs if o.output_type == "stream")
    nb.metadata[DEPS_KEY] = dependencies(json.loads(text.strip().splitlines()[-1]))
    return nb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report notebooks whose stamp is stale")
    parser.add_argument("paths", nargs="*", type=Path, help="only these notebooks (default: all)")
    args = parser.parse_args()
    chosen = [p.resolve() for p in args.paths] or notebooks()
    missing = [p for p in chosen if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(map(str, missing))}")
    stale = []
    for path in chosen:
        nb = nbformat.read(path, as_version=4)
        if args.check:
            if nb.metadata.get(STAMP_KEY) != stamp(nb):
                stale.append(path)
            continue
        print(f"executing {path.relative_to(REPO_ROOT)} ...", flush=True)
        execute(nb, path.parent)
        nb.metadata[STAMP_KEY] = stamp(nb)
        nbformat.write(nb, path)
    for path in stale:
        print(f"stale: {path.relative_to(REPO_ROOT)} (run python tools/execute_notebooks.py)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
