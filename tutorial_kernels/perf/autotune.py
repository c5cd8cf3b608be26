"""A kernel launched with the configuration Triton's autotuner chose for it, without asking again.

`triton.autotune` picks, per key, the fastest of its candidate configurations (tile sizes, warps,
pipeline stages) by timing each one; candidates that do not fit (shared memory, registers) fail to
compile and are skipped. It then rebuilds its key from all of the kernel's arguments on every
call, Python work that costs about as much as the launch itself, and a model pays it in every
layer. `TunedKernel` asks the autotuner once per tuning key, keeps its choice (`choices`), and
launches later calls with it directly; a call that also has a launch key (`perf.launch_plan`) is
remembered there (`plans`) and relaunched without Triton's dispatch next time.

Two things a user would otherwise pay for at every new shape:
* the timing itself, in every new process: the autotuner keeps its timings on disk
  (`cache_results=True`, in Triton's cache directory, keyed by Triton's version, the GPU's target,
  the kernel's source, the tuning key and the candidates), so a shape tuned once is not timed again;
* the noise of a candidate that fails to compile: the autotuner drops it (infinite time), but the
  compiler's reproducer and ptxas's own output reach the terminal. `quiet_tuning` sends everything
  written to the process's stderr during a tuning pass to the `tutorial_kernels.perf.autotune`
  logger instead, once, at debug level.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Hashable, Iterator, Sequence

import triton

from tutorial_kernels.perf.descriptors import use_descriptor_scratch
from tutorial_kernels.perf.launch_plan import LaunchPlans

Grid = Callable[[dict], tuple[int, ...]]
log = logging.getLogger(__name__)


@contextlib.contextmanager
def quiet_tuning(what: str) -> Iterator[None]:
    """Everything written to stderr inside the block, by Python (`sys.stderr`) or by a compiler
    subprocess (file descriptor 2), goes to `log.debug` afterwards, as one record naming `what`."""
    sys.stderr.flush()
    saved = os.dup(2)
    python_side = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            with contextlib.redirect_stderr(python_side):
                yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = (caught.read().decode(errors="replace") + python_side.getvalue()).strip()
            if text:
                log.debug("while tuning %s, the compiler said (failed candidates are dropped):\n%s", what, text)


class TunedKernel:
    """`kernel` (a @triton.jit function) with `configs` tuned per `key` (names of its arguments).

    `prune(configs, named_args, **kwargs)` may drop candidates per call (Triton's early_config_prune).
    `makes_descriptors(config)` says whether a launch with `config` builds tensor descriptors in the
    kernel, which need scratch memory set up in the launching thread before every launch."""

    def __init__(self, kernel, configs: Sequence[triton.Config], key: list[str], *,
                 prune: Callable | None = None, makes_descriptors: Callable[[triton.Config], bool] = lambda c: False):
        self.kernel = kernel
        self.autotuner = triton.autotune(
            configs=list(configs), key=key, cache_results=True,  # timings kept on disk across processes
            prune_configs_by={"early_config_prune": prune} if prune is not None else None,
        )(kernel)
        self.choices: dict[Hashable, triton.Config] = {}  # tuning key → the autotuner's choice
        self.plans = LaunchPlans(kernel)  # launch key → a remembered launch
        self._makes_descriptors = makes_descriptors
        self._plans_with_descriptors: set[Hashable] = set()

    @property
    def configs(self) -> list[triton.Config]:
        """The candidates the autotuner times (before pruning)."""
        return self.autotuner.configs

    def relaunch(self, plan: Hashable | None, *tensors) -> bool:
        """Repeat the launch remembered under `plan` with `tensors`; False (nothing launched) if none is."""
        if plan is None or plan not in self.plans:
            return False
        if plan in self._plans_with_descriptors:  # the allocator is per thread: this may be another one
            use_descriptor_scratch()
        return self.plans.relaunch(plan, *tensors)

    def launch(self, grid: Grid, tuning_key: Hashable, plan: Hashable | None, *args, **constexprs) -> None:
        """`kernel[grid](*args, **constexprs, **choice)` with the choice made for `tuning_key`; the first
        call with a tuning key lets the autotuner time its candidates and keeps what it picks.
        `grid(meta)` gets the launch's meta-parameters (BLOCK_M, ...). Remembered under `plan` unless None."""
        chosen = self.choices.get(tuning_key)
        if chosen is None:
            with quiet_tuning(f"{self.kernel.__name__} at {tuning_key}"):
                self.autotuner[grid](*args, **constexprs)
            self.choices[tuning_key] = self.autotuner.best_config
            return
        meta = chosen.all_kwargs()
        if self._makes_descriptors(chosen):
            use_descriptor_scratch()
            if plan is not None:
                self._plans_with_descriptors.add(plan)
        self.plans.launch(plan, grid(meta), *args, **constexprs, **meta)

    def choice_for(self, *key_prefix, dtype) -> dict | None:
        """The configuration the autotuner settled on for a key that starts with `key_prefix` (values of
        this kernel's `key` arguments, in order) with tensors of `dtype`, for reports; None if none yet.
        Triton's cache key is the `key` arguments in order, then the tensor arguments' dtypes, the first
        tensor's first."""
        n_keys = len(self.autotuner.keys)
        if len(key_prefix) > n_keys:
            raise ValueError(f"key_prefix has {len(key_prefix)} values, but the key has {n_keys}: {self.autotuner.keys}")
        for key, config in self.autotuner.cache.items():
            if tuple(key[:len(key_prefix)]) == key_prefix and key[n_keys] == str(dtype):
                return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
        return None
