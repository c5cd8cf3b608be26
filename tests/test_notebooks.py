"""Every notebook runs on the CPU, and its committed outputs are what today's code and data produce."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_tool

NOTEBOOKS = [p for p in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks").glob("labs/*.ipynb"))
             if not p.name.startswith("_")]  # the chapter notebooks, then the labs (committed with skeletons unfilled)


@pytest.fixture(scope="module")
def runner():
    """tools/execute_notebooks.py, the one place that knows how notebooks are executed and stamped."""
    require_tool(
        all(importlib.util.find_spec(m) is not None for m in ("nbformat", "nbclient", "ipykernel")),
        "nbformat, nbclient and ipykernel are needed to execute notebooks: pip install -e '.[test]'",
    )
    sys.path.insert(0, str(ROOT / "tools"))
    import execute_notebooks

    assert execute_notebooks.notebooks() == NOTEBOOKS
    return execute_notebooks


def _comparable(nb) -> list[list[dict]]:
    """Each code cell's outputs without the parts that legitimately change between runs.

    text/html holds a Plotly div with a random id; execution counts and metadata are bookkeeping;
    where a stream was cut into chunks depends on when the kernel flushed.
    """
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.outputs:
            if out.output_type == "stream":
                # the kernel may flush one print in several chunks: compare the joined text
                if outputs and outputs[-1].get("stream") == out.name:
                    outputs[-1]["text"] += out.text
                else:
                    outputs.append({"stream": out.name, "text": out.text})
            elif out.output_type in ("display_data", "execute_result"):
                outputs.append({k: v for k, v in out.data.items() if k != "text/html"})
            else:
                outputs.append({"type": out.output_type})
        cells.append(outputs)
    return cells


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no chapter notebook"


def test_there_are_lab_notebooks():
    assert any(p.parent.name == "labs" for p in NOTEBOOKS), "notebooks/labs/ holds no lab notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_executed_and_not_stale(path, runner):
    nb = runner.nbformat.read(path, as_version=4)
    # a lab's cells for the learner to fill in only define a function or a class (a kernel helper, a host loop,
    # lab 6's autograd.Function): they print nothing
    code_cells = [c for c in nb.cells if c.cell_type == "code"
                  and not (path.parent.name == "labs" and c.source.startswith(("@triton.jit", "def ", "class ")))]
    assert all(c.outputs for c in code_cells), f"{path.name}: a code cell has no outputs; execute the notebook"
    assert nb.metadata.get(runner.STAMP_KEY) == runner.stamp(nb), (
        f"{path.name} is stale: the code or data it uses changed since it was executed; "
        "run `python tools/execute_notebooks.py` and commit the result"
    )


def test_a_notebook_goes_stale_only_with_what_it_depends_on(runner):
    """The stamp covers the modules a notebook imported and the files it read, as executing it recorded
    them: a comment added to every module leaves every notebook fresh; a statement added to a module a
    notebook imported makes it stale; the benchmark harness's command line, which no notebook imports,
    is not among any notebook's dependencies."""
    for path in NOTEBOOKS:
        nb = runner.nbformat.read(path, as_version=4)
        recorded = nb.metadata.get(runner.DEPS_KEY)
        assert recorded and recorded["modules"], f"{path.name}: no dependencies recorded; execute the notebook"
        fresh = runner.stamp(nb)
        assert runner.stamp(nb, read=lambda p: p.read_text() + "\n# a comment\n") == fresh, path.name
        used = ROOT / recorded["modules"][-1]
        edited = runner.stamp(nb, read=lambda p, used=used: p.read_text() + ("\nx = 1\n" if p == used else ""))
        assert edited != fresh, f"{path.name}: a statement added to {used.name}, which it imports, left it fresh"
        assert "tutorial_kernels/bench/cli.py" not in recorded["modules"], path.name
    # a module whose source a notebook prints counts byte for byte: notebook 6 shows the GPT's code
    shown = runner.nbformat.read(ROOT / "notebooks" / "06_backward.ipynb", as_version=4).metadata[runner.DEPS_KEY]
    assert "tutorial_kernels/integrations/gpt.py" in shown["files"], shown["files"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_reexecutes_to_the_committed_outputs(path, runner):
    committed = runner.nbformat.read(path, as_version=4)
    fresh = runner.execute(copy.deepcopy(committed), path.parent)  # raises if a cell errors
    for index, (old, new) in enumerate(zip(_comparable(committed), _comparable(fresh))):
        assert old == new, f"{path.name}: code cell {index} printed or drew something else than what is committed"


LABS = [p for p in NOTEBOOKS if p.parent.name == "labs"]


@pytest.mark.parametrize("path", LABS, ids=[p.name for p in LABS])
def test_a_lab_is_committed_unfilled_and_shows_the_graders_report(path, runner):
    """Every `check(...)` cell printed a failing report (the skeleton is unfilled), never an exception."""
    nb = runner.nbformat.read(path, as_version=4)
    checks = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("check(")]
    assert checks, f"{path.name} has no check(...) cell"
    for cell in checks:
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert "✗" in text and "hint:" in text, f"{path.name}: {cell.source!r} did not print a failing report:\n{text}"
        assert not any(o.output_type == "error" for o in cell.outputs), f"{path.name}: {cell.source!r} raised"
