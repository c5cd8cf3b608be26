"""Kernel tests run natively on a GPU and through Triton's interpreter elsewhere.

Importing the package first lets it switch the interpreter on (when there is no GPU) before any
kernel is decorated; the header line says which mode this run uses.
"""

import torch
import triton

import tutorial_kernels  # noqa: F401  (chooses the execution mode)
from tutorial_kernels.runtime import interpreter_active


def pytest_report_header(config):
    if interpreter_active():
        mode = "Triton interpreter on the CPU (small shapes; bfloat16 cases skip)"
    else:
        mode = f"native on {torch.cuda.get_device_name()}"
    return f"tutorial_kernels: {mode}; torch {torch.__version__}, triton {triton.__version__}"
