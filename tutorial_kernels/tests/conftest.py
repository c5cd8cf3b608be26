"""Kernel tests run natively on a GPU and through Triton's interpreter elsewhere.

Importing the package first lets it switch the interpreter on (when there is no GPU) before any
kernel is decorated; the header line says which mode this run uses.

What needs a GPU is chosen at collection time, not skipped at run time: without a GPU, tests marked
`@pytest.mark.gpu("kind")` are deselected, and bfloat16 cases are not generated at all (`testing.KERNEL_DTYPES`:
Triton's interpreter computes bfloat16 wrongly without an error). One line at the end of the run
says how many tests that left out, and of which kinds.

Fresh random inputs each run catch more over time, and make a rare draw possible whose error sits just past
the peers' rule (flash-attn's: 2× / 3× PyTorch's own error) without anything being wrong. A test whose
only failure is that ratio (`testing.PeerRuleError`; a NaN, ∞, wrong shape or any other assertion fails
at once) runs once more on fresh inputs: it fails if the second draw fails too, and passes otherwise, named
in one line at the end of the run with the first draw's numbers. A real error fails every draw.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import triton

import tutorial_kernels  # noqa: F401  (chooses the execution mode)
from tutorial_kernels.runtime import interpreter_active
from tutorial_kernels.testing import ON_GPU, PeerRuleError

_NOT_COLLECTED = pytest.StashKey[Counter]()
_SECOND_DRAWS: list[tuple[str, str]] = []  # (test, the first draw's failure) of the tests a second draw passed


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A failure of the peers' ratio alone: one more draw (see the module's docstring)."""
    try:
        return (yield)
    except PeerRuleError as first:
        args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        try:
            pyfuncitem.obj(**args)  # the test draws fresh inputs (testing.fresh_seed)
        except PeerRuleError as second:
            raise PeerRuleError(f"{first}\nand again on a second draw: {second}") from None
        _SECOND_DRAWS.append((pyfuncitem.nodeid, str(first).splitlines()[0]))
        return True


def pytest_report_header(config):
    if interpreter_active():
        mode = "Triton interpreter on the CPU (small shapes; bfloat16 and GPU-only tests are not collected)"
    else:
        mode = f"native on {torch.cuda.get_device_name()}"
    return f"tutorial_kernels: {mode}; torch {torch.__version__}, triton {triton.__version__}"


def pytest_collection_modifyitems(config, items):
    """Deselect what cannot run here: the tests marked `gpu` without a GPU, those marked `cpu` (they
    check what a machine without a GPU shows) with one. The marker's argument names their kind."""
    other = "cpu" if ON_GPU else "gpu"
    kept, left_out = [], []
    for item in items:
        (left_out if item.get_closest_marker(other) is not None else kept).append(item)
    if not left_out:
        return
    kinds = Counter()
    for item in left_out:
        args = item.get_closest_marker(other).args
        kinds[args[0] if args else "other"] += 1
    config.stash[_NOT_COLLECTED] = kinds
    config.hook.pytest_deselected(items=left_out)
    items[:] = kept


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for nodeid, first in _SECOND_DRAWS:
        terminalreporter.write_line(f"tutorial_kernels: passed on a second draw: {nodeid} (first draw: {first})")
    kinds = config.stash.get(_NOT_COLLECTED, Counter())
    if ON_GPU:
        parts = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
        terminalreporter.write_line(f"tutorial_kernels: {sum(kinds.values())} tests check a machine without a GPU "
                                    f"and were not collected here" + (f" ({parts})" if parts else ""))
        return
    parts = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
    terminalreporter.write_line(
        f"tutorial_kernels: {sum(kinds.values())} tests need a CUDA GPU and were not collected here"
        + (f" ({parts})" if parts else "")
        + "; nor were bfloat16 cases, which Triton's interpreter computes wrongly without an error "
        "(triton-lang/triton#4972)"
    )


@pytest.fixture
def matmul_precision():
    """`torch.set_float32_matmul_precision` for one test; the previous setting comes back after it."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory():
    """On a GPU, hand the memory a test's tensors left in PyTorch's cache back to the driver after
    each test: the suite runs in many processes on one GPU (pytest -n 16), and each process's cache
    would otherwise keep its largest test's memory for good, until the others run out."""
    yield
    if ON_GPU:
        torch.cuda.empty_cache()
