"""A kernel launched with the configuration chosen for its tuning key, by rule or by the autotuner.

`TunedKernel` takes, for each new tuning key, the configuration (tile sizes, warps, pipeline stages)
that its `rule` gives — the tile table measured for this GPU (`perf.tile_table`), one compilation, no
timing — or, where autotuning is asked for (`tile_table.autotuning_requested`), the one `triton.autotune`
finds by timing every candidate. It keeps the choice (`choices`) and launches later calls with it
directly: the autotuner would rebuild its key from all of the kernel's arguments on every call, Python
work that costs about as much as the launch itself, paid in every layer of a model. A call that also
has a launch key (`perf.launch_plan`) is remembered there (`plans`) and relaunched without Triton's
dispatch next time.

When autotuning:
* the timings stay on disk (`cache_results=True`, in Triton's cache directory, keyed by Triton's
  version, the GPU's target, the kernel's source, the tuning key and the candidates), so a shape tuned
  once is not timed again, and `on_tuned` hands the choice and its timings to the tile table;
* a candidate that fails to compile is dropped (infinite time), but the compiler's reproducer and
  ptxas's own output would reach the terminal: `quiet_tuning` sends everything written to the
  process's stderr during a tuning pass to the `tutorial_kernels.perf.autotune` logger instead, once,
  at debug level.
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
from triton.runtime.errors import OutOfResources

from tutorial_kernels.perf import tile_table
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


def loaded(compiled) -> None:
    """Load a kernel compiled by `warmup` into the current CUDA context and build its launcher (Triton
    does both at the first launch otherwise; the launcher is C compiled by the system's compiler, about
    0.3 s per new signature). Triton 3.6 names this step `_init_handles`; another Triton that lacks it
    does it at the launch, as before."""
    init = getattr(compiled, "_init_handles", None)
    if callable(init):
        init()


class TunedKernel:
    """`kernel` (a @triton.jit function) with `configs` tuned per `key` (names of its arguments).

    `prune(configs, named_args, **kwargs)` may drop candidates per call (Triton's early_config_prune).
    `makes_descriptors(config)` says whether a launch with `config` builds tensor descriptors in the
    kernel, which need scratch memory set up in the launching thread before every launch.
    `rule(tuning_key)` gives a configuration's keyword arguments (the tile table's) or None, and
    `fallback(tuning_key)` the one that fits every GPU (the teaching configuration): used where the
    rule has none, or its choice does not fit this GPU. `on_tuned(tuning_key, config, timings)` hears
    of each autotuner choice (timings: {config: [median, 20th, 80th percentile ms]}, or None)."""

    def __init__(self, kernel, configs: Sequence[triton.Config], key: list[str], *,
                 prune: Callable | None = None, makes_descriptors: Callable[[triton.Config], bool] = lambda c: False,
                 rule: Callable[[Hashable], dict | None] = lambda key: None,
                 fallback: Callable[[Hashable], dict] | None = None,
                 on_tuned: Callable[[Hashable, triton.Config, dict | None], None] | None = None):
        self.kernel = kernel
        self.autotuner = triton.autotune(
            configs=list(configs), key=key, cache_results=True,  # timings kept on disk across processes
            prune_configs_by={"early_config_prune": prune} if prune is not None else None,
        )(kernel)
        self.choices: dict[Hashable, triton.Config] = {}  # tuning key → the autotuner's choice
        self.plans = LaunchPlans(kernel)  # launch key → a remembered launch
        self._makes_descriptors = makes_descriptors
        self._plans_with_descriptors: set[Hashable] = set()
        self._rule, self._fallback, self._on_tuned = rule, fallback, on_tuned

    def forget(self) -> None:
        """Drop every choice and remembered launch (after the tile table changed)."""
        self.choices.clear()
        self.autotuner.cache.clear()  # or the autotuner answers from memory, timing nothing
        self.plans = LaunchPlans(self.kernel)
        self._plans_with_descriptors.clear()

    def _by_rule(self, tuning_key: Hashable) -> triton.Config:
        chosen = self._rule(tuning_key)
        if chosen is None:
            if self._fallback is None:
                raise LookupError(f"{self.kernel.__name__}: no configuration for {tuning_key}")
            chosen = self._fallback(tuning_key)
        return _as_config(chosen)

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
        if chosen is None and tile_table.autotuning_requested():
            self.autotuner.configs_timings = None
            with quiet_tuning(f"{self.kernel.__name__} at {tuning_key}"):
                self.autotuner[grid](*args, **constexprs)
            self.choices[tuning_key] = self.autotuner.best_config
            if self._on_tuned is not None:
                self._on_tuned(tuning_key, self.autotuner.best_config, self.autotuner.configs_timings)
            return
        by_rule = chosen is None
        if by_rule:
            chosen = self._by_rule(tuning_key)
        try:
            self._launch_with(chosen, grid, plan, *args, **constexprs)
        except OutOfResources as error:  # the table's tiles, too large for this GPU or dtype
            if not by_rule or self._fallback is None:
                raise
            log.debug("%s at %s: %s does not fit (%s); the fallback configuration instead",
                      self.kernel.__name__, tuning_key, chosen, error)
            chosen = _as_config(self._fallback(tuning_key))
            self._launch_with(chosen, grid, plan, *args, **constexprs)
        self.choices[tuning_key] = chosen

    def compile_ahead(self, tuning_key: Hashable, *args, **constexprs) -> None:
        """Compile, without launching, what `launch(grid, tuning_key, None, *args, **constexprs)` will
        run when no choice is remembered for tuning_key yet, so that its launch finds the binary ready.
        `args` as `launch`'s, with a tensor's dtype in its place (only the dtype and the integers decide
        what Triton compiles). Nothing when the autotuner is asked for (it compiles every candidate)."""
        if tile_table.autotuning_requested():
            return
        chosen = self.choices.get(tuning_key) or self._by_rule(tuning_key)
        loaded(self.kernel.warmup(*args, grid=(1,), **constexprs, **chosen.all_kwargs()))

    def _launch_with(self, chosen: triton.Config, grid: Grid, plan: Hashable | None, *args, **constexprs) -> None:
        meta = chosen.all_kwargs()
        if self._makes_descriptors(chosen):
            use_descriptor_scratch()
            if plan is not None:
                self._plans_with_descriptors.add(plan)
        self.plans.launch(plan, grid(meta), *args, **constexprs, **meta)

    def choice_for(self, *key_prefix, dtype) -> dict | None:
        """The configuration chosen (by rule or by the autotuner) for a tuning key that starts with
        `key_prefix` (values of this kernel's `key` arguments, in order) with tensors of `dtype`, for
        reports; None if none yet."""
        n_keys = len(self.autotuner.keys)
        if len(key_prefix) > n_keys:
            raise ValueError(f"key_prefix has {len(key_prefix)} values, but the key has {n_keys}: {self.autotuner.keys}")
        for key, config in self.choices.items():
            if tuple(key[:len(key_prefix)]) == key_prefix and dtype in key:
                return tile_table.config_dict(config)
        return None


def _as_config(kwargs: dict | triton.Config) -> triton.Config:
    """A table row's keyword arguments (BLOCK_M, …, num_warps, num_stages) as a `triton.Config`."""
    if isinstance(kwargs, triton.Config):
        return kwargs
    meta = dict(kwargs)
    return triton.Config(meta, num_warps=meta.pop("num_warps", 4), num_stages=meta.pop("num_stages", 2))
