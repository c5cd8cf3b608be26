"""Triton's C launcher called directly, for a launch whose arguments are already known.

A compiled kernel's `run` (Triton's `CudaLauncher`) is Python around a launcher written in C: per call
it sizes scratch memory, and for every host-side TMA descriptor argument it reads the descriptor's
metadata in Python and has C encode a 128-byte `CUtensorMap` (`cuTensorMapEncodeTiled`), which it
passes with the descriptor's shape and strides. With three descriptors, that Python costs the H100
machine's CPU about as much as the C launch itself (docs/how-the-numbers-were-obtained.md, LLM prefill).

For a launch that `launch_plan` remembers, all of that is known once but the addresses: the argument
list in the C launcher's expanded form, and each descriptor's encoding arguments. `DirectLaunch`
keeps them; a relaunch encodes each descriptor at its new address (Triton's own C function, once per
address) and calls the C launcher, the same call Triton's wrapper ends with, so the kernel receives
the same bytes.

This reaches into Triton's internals (Triton 3.6's `CudaLauncher`, its descriptor wrapper's closure),
which no public API exposes. `direct_launch` recognises that layout and returns None for any other
(another Triton version, scratch memory, a descriptor kind it does not know): the caller then keeps
calling `compiled.run`, slower and never wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import FunctionType
from typing import Any

import torch

# The arguments Triton 3.6's C launcher takes before the kernel's own: grid x, y, z, stream, function,
# cooperative launch, programmatic dependent launch, global scratch, profile scratch, packed metadata,
# launch metadata, enter hook, exit hook, as its nvidia driver's `_BASE_ARGS_FORMAT` spells them. A
# Triton whose driver spells them otherwise (3.9 packs the kernel's arguments into one tuple) is not
# the layout known here.
_BASE_ARGS_FORMAT = "iiiKKppOOOOOO"
_BASE_ARGUMENTS = len(_BASE_ARGS_FORMAT)
MAX_ENCODED = 256  # TMA descriptors kept per launch, by address (128 bytes each)


@dataclass(frozen=True)
class DirectLaunch:
    """One remembered launch in the C launcher's own terms; holds no tensor of the call that made it."""
    launch: Callable  # the compiled module's C `launch`
    head: tuple  # its first `_BASE_ARGUMENTS` arguments but the stream (None in its place)
    expanded: tuple  # the kernel's arguments as the C launcher takes them; None where each call's goes
    slots: tuple[int, ...]  # per replaced argument (launch_plan's order), its position in `expanded`
    encodings: tuple  # per replaced argument: None for a tensor (the C launcher reads its data_ptr), or a
    # descriptor's encoding arguments after the address
    encode: Callable  # Triton's C `fill_tma_descriptor(address, *encoding)` → a CUtensorMap
    encoded: dict = field(default_factory=dict)  # (slot, address) → its CUtensorMap, at most MAX_ENCODED

    def __call__(self, stream: int, tensors: tuple) -> None:
        """Launch with `tensors` (torch tensors only, one per replaced argument) on `stream`. Launch hooks
        are not called: the caller takes `compiled.run` while one is set."""
        arguments = list(self.expanded)
        encoded = self.encoded
        for slot, encoding, tensor in zip(self.slots, self.encodings, tensors, strict=True):
            if encoding is None:
                arguments[slot] = tensor
                continue
            # A map is a function of the address alone here (shape, strides and block are the plan's), and
            # the launch copies it into the kernel's parameters: one per address serves every launch. A
            # model's layers get the same few addresses back from torch's caching allocator.
            address = tensor.data_ptr()
            tensor_map = encoded.get((slot, address))
            if tensor_map is None:
                if len(encoded) >= MAX_ENCODED:
                    encoded.clear()
                tensor_map = encoded[(slot, address)] = self.encode(address, *encoding)
            arguments[slot] = tensor_map
        head = self.head
        self.launch(head[0], head[1], head[2], stream, *head[4:], *arguments)


def _closure(fn: object) -> dict[str, Any]:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))


def _known_launcher() -> tuple[Callable, dict] | None:
    """Where Triton's nvidia driver is the one this module knows (its C launcher's leading arguments as
    `_BASE_ARGS_FORMAT` says): its C encoder of a tiled TMA descriptor and its table from the
    compiler's element-type codes to the driver's. None for any other Triton."""
    try:
        from triton.backends.nvidia import driver as nvidia
        from triton.runtime.driver import driver
        if getattr(nvidia, "_BASE_ARGS_FORMAT", None) != _BASE_ARGS_FORMAT:
            return None
        return driver.active.utils.fill_tma_descriptor, nvidia.TMA_DTYPE_DEVICE_TO_HOST
    except (ImportError, AttributeError, RuntimeError):
        return None


def direct_launch(compiled: Any, grid: tuple[int, int, int], arguments: list, replaced: tuple[int, ...],
                  is_descriptor: Callable[[object], bool]) -> DirectLaunch | None:
    """The direct form of `compiled.run(*grid, stream, ..., *arguments)`, where `arguments` are all the
    kernel's parameters of a call that just launched and `replaced` the positions of its tensors and
    descriptors; None unless Triton's launcher is the one this module knows."""
    run = getattr(compiled, "run", None)
    if type(run).__name__ != "CudaLauncher" or getattr(run, "global_scratch_size", None) != 0 \
            or getattr(run, "profile_scratch_size", None) != 0:
        return None  # scratch memory comes from a Python allocator at every launch: keep Triton's path
    if any(isinstance(a, (tuple, list)) for a in arguments):
        return None  # tensors inside a tuple argument would not be replaced
    descriptors = [i for i, a in enumerate(arguments) if is_descriptor(a)]
    wrapper = getattr(run, "launch", None)
    if not descriptors:
        c_launch, metas = wrapper, []
    else:
        cells = _closure(wrapper)
        c_launch, metas = cells.get("launcher"), cells.get("tensordesc_meta")
        if sorted(cells.get("tensordesc_indices", ())) != descriptors or metas is None \
                or len(metas) != len(descriptors) or any(m is None or m.get("fp4_padded") for m in metas):
            return None
    known = _known_launcher()
    if known is None or not callable(c_launch) or isinstance(c_launch, FunctionType):
        return None  # another Triton, or Python where the C launcher should be: not the layout known here
    encode, dtype_codes = known
    expanded, position_of, encoding_of = [], {}, {}
    meta_of = dict(zip(descriptors, metas))
    for i, argument in enumerate(arguments):
        position_of[i] = len(expanded)
        if i not in meta_of:
            expanded.append(None if i in replaced else argument)
            continue
        meta = meta_of[i]
        shape, strides, padding = list(argument.shape), list(argument.strides), getattr(argument, "padding", None)
        if strides[-1] != 1 or padding not in ("zero", "nan"):
            return None
        encoding_of[i] = (meta["swizzle"], meta["elem_size"], dtype_codes[meta["elem_type"]], meta["block_size"],
                          shape, strides, int(padding == "nan"))
        expanded.extend([None, *shape, *strides])  # as Triton's make_tensordesc_arg expands it
    head = (*grid, None, compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
            compiled.packed_metadata, None, None, None)
    assert len(head) == _BASE_ARGUMENTS
    return DirectLaunch(c_launch, head, tuple(expanded), tuple(position_of[i] for i in replaced),
                        tuple(encoding_of.get(i) for i in replaced), encode)


def no_launch_hooks(enter: object, exit: object) -> bool:
    """Whether Triton's launch hooks (`knobs.runtime.launch_enter_hook` / `_exit_hook`: None, or in
    Triton 3.6 a chain of hooks) would call nothing: a direct launch does not call them."""
    return (enter is None or getattr(enter, "calls", None) == []) and (exit is None or getattr(exit, "calls", None) == [])


def all_tensors(tensors: tuple) -> bool:
    """Whether every replacement is a tensor (a relaunch may also be handed ready descriptors)."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            return False
    return True
