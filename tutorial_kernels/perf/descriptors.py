"""Tensor descriptors (TMA on Hopper) made inside a kernel: the scratch memory they need, and which
tensors they can describe.

A `tl.make_tensor_descriptor` inside a kernel writes the descriptor itself into a little global
memory that Triton asks an allocator for. `use_descriptor_scratch()` installs ours for the calling
thread (Triton keeps the allocator in a context variable) just before such a launch; it hands out
scratch bytes on the current device and holds nothing else, so replacing another allocator is safe.
"""

from __future__ import annotations

import torch
import triton


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # on the device the kernel is launched on (the current one); torch's allocator aligns to 512 bytes
    return torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device())


def use_descriptor_scratch() -> None:
    """Let kernels launched from this thread make tensor descriptors (call before the launch)."""
    triton.set_allocator(_scratch)


def rows_describable(t: torch.Tensor) -> bool:
    """A 2-D view (rows, last axis) of `t` can be a tensor descriptor: unit stride along the last
    axis, rows a multiple of 16 bytes apart, and a 16-byte aligned base address."""
    return t.stride(-1) == 1 and (t.stride(-2) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
