"""The labs' shared test of a planted mistake: the grader must refuse it and name it with its own hint."""

from __future__ import annotations

from typing import Callable

from tutorial_kernels.labs import check
from tutorial_kernels.labs.grader import find_step


def assert_caught_with_its_hint(step: str, fn: Callable, mistake: str) -> None:
    """`fn` (a step's solution with one typical slip) fails step `step` (e.g. "ch04.update"), and the
    report carries the hint of the step's Mistake named `mistake`, and no other Mistake's hint."""
    report = check(step, fn, quiet=True)
    assert not report.passed, f"{step}: the planted mistake {mistake!r} passed the grader"
    mistakes = find_step(step).mistakes
    hint = next(m.hint for m in mistakes if m.name == mistake)
    assert hint in report.message, report.message
    others = [m.name for m in mistakes if m.name != mistake and m.hint in report.message]
    assert not others, f"{step}: {mistake!r} was also diagnosed as {others}:\n{report.message}"
