"""The labs' grader: `check("ch05.online_softmax", my_update)` runs the learner's function through the
lab's kernel (Triton's interpreter on a CPU, natively on a GPU) on small odd cases against the float64
reference, prints what it found, and returns a `Report`.

A failure names the first case that failed (shape, causal, dtype), the first wrong element (head, query
row, column, expected vs got) and a hint for the typical mistake the wrong output looks like.
"""

from __future__ import annotations

import html
import importlib
import inspect
import pkgutil
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import triton.language as tl

from tutorial_kernels.labs.steps import Failure, Step
from tutorial_kernels.runtime import interpreter_active


def _discover() -> dict[str, object]:
    """Every lab module of the package, `labs/chNN.py`, by name: each holds `STEPS` and `NOTEBOOK`."""
    here = str(Path(__file__).resolve().parent)
    names = sorted(m.name for m in pkgutil.iter_modules([here]) if re.fullmatch(r"ch\d\d", m.name))
    return {name: importlib.import_module(f"tutorial_kernels.labs.{name}") for name in names}


LAB_MODULES = _discover()
LABS = {name: module.STEPS for name, module in LAB_MODULES.items()}


@dataclass
class Report:
    """What the grader found: `passed`, how many cases ran, and the message it printed."""

    step: str
    passed: bool
    cases_passed: int
    cases: int
    seconds: float
    failure: Failure | None
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"Report({self.step!r}, passed={self.passed}, {self.cases_passed}/{self.cases} cases)"


def find_step(step: str) -> Step:
    lab, _, name = step.partition(".")
    steps = LABS.get(lab, {})
    if name not in steps:
        known = ", ".join(f"{lab}.{name}" for lab, s in LABS.items() for name in s)
        raise ValueError(f"no lab step {step!r}; the steps are: {known}")
    return steps[name]


def check(step: str, fn: Callable, *, quiet: bool = False) -> Report:
    """Grade `fn` for lab step `step` (e.g. "ch05.mask"); print the verdict unless quiet."""
    spec = find_step(step)
    started = time.perf_counter()
    if interpreter_active() and type(tl.zeros).__name__ != "InterpretedFunction":
        # Triton decides at import whether its own jit helpers (tl.zeros …) are interpreted
        passed, total, failure = 0, 0, Failure(
            "(none ran)", "Triton was imported before Triton's interpreter was switched on, so no kernel can run "
            "on the CPU in this process.", ["Restart the kernel (or the script) and `import tutorial_kernels` "
                                            "before `import triton`: the package switches the interpreter on."])
    else:
        with warnings.catch_warnings():  # NumPy's "invalid value" on −∞ − (−∞): the report says it better
            warnings.simplefilter("ignore", RuntimeWarning)
            passed, total, failure = spec.grade(fn)
    seconds = time.perf_counter() - started
    if failure is None:
        message = f"✓ {step}: all {total} cases pass ({seconds:.1f} s). Well done — on to the next step."
    else:
        lines = [f"✗ {step}: {passed} of {total} cases pass; the first that fails:" if total else f"✗ {step}: no case ran",
                 *([f"  case: {failure.case}"] if total else []),
                 *(f"  {line}" for line in failure.detail.splitlines()),
                 *(f"  hint: {hint}" for hint in failure.hints)]
        message = "\n".join(lines)
    if not quiet:
        print(message)
    return Report(step, failure is None, passed, total, seconds, failure, message)


@dataclass(frozen=True)
class Solution:
    """A step's solution, shown folded: a collapsed <details> block in a notebook (and on the site), its
    source as plain text elsewhere. The source is read from the module, so it cannot drift."""

    step: str
    source: str
    where: str

    def _repr_html_(self) -> str:
        return (f"<details><summary>Solution of {self.step} (from <code>{self.where}</code>): click to unfold"
                f"</summary><pre><code>{html.escape(self.source)}</code></pre></details>")

    def __repr__(self) -> str:
        return f"# {self.step}, from {self.where}\n{self.source}"


def solution(step: str) -> Solution:
    """The solution of `step`, to display folded (`solution("ch05.mask")` as a notebook cell's last line)."""
    fn = find_step(step).solution
    fn = getattr(fn, "fn", fn)  # a @triton.jit function wraps the Python one
    module = inspect.getmodule(fn).__name__.replace(".", "/") + ".py"
    return Solution(step, inspect.getsource(fn), module)
