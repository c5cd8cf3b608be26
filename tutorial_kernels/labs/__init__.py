"""Labs: the learner writes each kernel's key lines and the grader checks them on a laptop CPU.

    from tutorial_kernels.labs import check, ch05
    check("ch05.online_softmax", my_update)   # prints ✓ or the first failing case with a hint
    solution("ch05.online_softmax")           # the tested answer, folded in a notebook

Each lab module `chNN.py` (one per chapter; `ch05`: FlashAttention-2's inner loop and causal stages)
holds the kernel the lab provides, a skeleton and a solution per step, the typical mistakes the grader
recognises, `STEPS` and its notebook's name `NOTEBOOK` (in `notebooks/labs/`). The grader finds every
such module by its name (`steps.py`: cases, float64 answers, failures; `grader.py`: `check`, `Report`).
"""

from tutorial_kernels.labs import ch05
from tutorial_kernels.labs.grader import Report, check, solution

__all__ = ["Report", "ch05", "check", "solution"]
