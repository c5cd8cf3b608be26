"""Where the kernels run: natively on a CUDA GPU, or on the CPU through Triton's interpreter.

Triton decides at decoration time (`@triton.jit`) whether a kernel is compiled or interpreted, by
reading `TRITON_INTERPRET`. `tutorial_kernels/__init__.py` therefore calls
`choose_execution_mode()` before any chapter module defines a kernel: on a machine without a GPU
the interpreter is switched on, so `pytest tutorial_kernels` and the notebooks run on a laptop.
"""

from __future__ import annotations

import os

import torch

INTERPRET_VARIABLE = "TRITON_INTERPRET"


def choose_execution_mode() -> None:
    """Switch on Triton's interpreter when there is no GPU, unless the user already chose."""
    if INTERPRET_VARIABLE not in os.environ and not torch.cuda.is_available():
        os.environ[INTERPRET_VARIABLE] = "1"


def interpreter_active() -> bool:
    """True when kernels run through Triton's interpreter (NumPy on the CPU)."""
    return os.environ.get(INTERPRET_VARIABLE, "0").lower() in ("1", "true", "on", "yes")


def default_device() -> torch.device:
    """The device the kernels work on here: the GPU if present, else the CPU (interpreter)."""
    return torch.device("cuda") if torch.cuda.is_available() and not interpreter_active() else torch.device("cpu")
