"""Execute every notebook on the CPU and stamp it with what it was executed against.

    python tools/execute_notebooks.py            # re-execute notebooks/*.ipynb and notebooks/labs/*.ipynb in place
    python tools/execute_notebooks.py --check    # exit 1 if a notebook's stamp is stale
    python tools/execute_notebooks.py notebooks/labs/02_naive_attention_lab.ipynb   # only these

Committed notebooks must show what today's code and data produce. The stamp is a SHA-256 of the
notebook's code cells, the package's source (tests excluded) and the committed data files; it is
stored in the notebook's metadata, and tests/test_notebooks.py fails when it no longer matches.
Notebooks are executed with the GPU hidden, so the committed outputs come from the interpreter
path every reader can reproduce; a reader with a GPU gets live measurements on top. Lab notebooks
(`notebooks/labs/`) are committed with their skeletons unfilled: their outputs are the grader's reports.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
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


def stamp(nb: nbformat.NotebookNode) -> str:
    """Hash of everything a notebook's outputs depend on."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode())
    inputs = sorted((REPO_ROOT / "tutorial_kernels").rglob("*.py")) + sorted((REPO_ROOT / "data").glob("*.json"))
    for path in inputs:
        if "tests" in path.relative_to(REPO_ROOT).parts:
            continue
        h.update(str(path.relative_to(REPO_ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cpu_environment() -> dict[str, str]:
    """The environment a notebook is executed in: no GPU visible, Triton's interpreter on."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1", "PYTHONHASHSEED": "0"}


def execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    saved = dict(os.environ)
    os.environ.update(cpu_environment())  # the kernel process inherits this environment
    try:
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
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
