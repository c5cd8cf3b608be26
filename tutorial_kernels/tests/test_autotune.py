"""`perf.autotune`: tuning passes are quiet, their results persist across processes, and by default
none runs (the tile table decides)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from tutorial_kernels.perf.autotune import quiet_tuning


def test_what_the_compiler_writes_while_tuning_goes_to_the_debug_log(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="tutorial_kernels.perf.autotune")
    with quiet_tuning("a kernel at (1, 2)"):
        os.write(2, b"ptxas fatal : Segmentation fault\n")  # as a compiler subprocess would
        print("// reproducer: .version 8.7", file=sys.stderr)  # as Python code would
    assert capfd.readouterr().err == ""
    [record] = [r for r in caplog.records if r.name == "tutorial_kernels.perf.autotune"]
    assert record.levelno == logging.DEBUG
    assert "a kernel at (1, 2)" in record.getMessage()
    assert "ptxas fatal" in record.getMessage() and "reproducer" in record.getMessage()
    print("after", file=sys.stderr)  # stderr is back
    assert capfd.readouterr().err == "after\n"


def test_a_quiet_pass_logs_nothing_and_restores_stderr_after_an_error(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="tutorial_kernels.perf.autotune")
    with pytest.raises(RuntimeError, match="boom"):
        with quiet_tuning("nothing"):
            raise RuntimeError("boom")
    assert not [r for r in caplog.records if r.name == "tutorial_kernels.perf.autotune"]
    os.write(2, b"visible\n")
    assert capfd.readouterr().err == "visible\n"


_TUNE_ONCE = textwrap.dedent("""
    import sys, torch
    from triton.runtime.autotuner import Autotuner
    from tutorial_kernels.ch05_flash_v2 import TUNED, flash_attn_v2_tuned
    assert TUNED.autotuner.cache_results, "the autotuner keeps its timings on disk"
    if sys.argv[1] == "second":  # a new process at a shape tuned before: no candidate is timed again
        Autotuner._bench = lambda *a, **k: (_ for _ in ()).throw(AssertionError("timed a candidate again"))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    flash_attn_v2_tuned(q, k, v, True)
    torch.cuda.synchronize()
""")


@pytest.mark.gpu("autotuning")
def test_a_shape_tuned_in_one_process_is_not_timed_again_in_the_next(tmp_path):
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), "TUTORIAL_KERNELS_AUTOTUNE": "1",
           "TUTORIAL_KERNELS_TILES": str(tmp_path / "tiles")}
    for run in ("first", "second"):
        done = subprocess.run([sys.executable, "-c", _TUNE_ONCE, run], env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{run} process: {done.stderr[-3000:]}"


_BY_RULE = textwrap.dedent("""
    import torch
    from triton.runtime.autotuner import Autotuner
    import tutorial_kernels
    Autotuner._bench = lambda *a, **k: (_ for _ in ()).throw(AssertionError("timed a candidate"))
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 4, 300, 64, device="cuda", dtype=torch.float16, generator=g).requires_grad_()
    tutorial_kernels.flash_attention(q, q, q, causal=True).sum().backward()
    torch.cuda.synchronize()
    assert torch.isfinite(q.grad).all()
""")


@pytest.mark.gpu("autotuning")
def test_by_default_a_new_shape_times_no_candidate(tmp_path):
    """The front door's first forward and backward at a new shape take the tile table's tiles."""
    env = {k: v for k, v in os.environ.items() if k != "TUTORIAL_KERNELS_AUTOTUNE"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), "TUTORIAL_KERNELS_TILES": str(tmp_path / "tiles")}
    done = subprocess.run([sys.executable, "-c", _BY_RULE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.strip() == "", f"the first call printed: {done.stderr[-3000:]}"
