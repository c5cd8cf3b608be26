"""Repeating a kernel launch without paying for Triton's Python dispatch again.

`kernel[grid](*args)` does a good deal of Python before the GPU hears of it: it binds the arguments
to the kernel's parameters, derives a specialisation from each one (a tensor's dtype and whether its
address is a multiple of 16 bytes, whether an integer is 1 or a multiple of 16), hashes all that
into a key, looks the compiled kernel up, and only then calls the compiled C launcher: tens of
microseconds of CPU time per call (data/launch_overhead.json), paid in every layer of a model. For a
short prompt the GPU finishes a layer sooner than Python can issue the next one, and that time
becomes the model's latency.

A caller that already knows everything that decides the launch but the tensors' addresses (the
shapes, the strides, the dtypes, the scalars, each address's 16-byte alignment) can skip all of it:
the first call with a given key launches the normal way and remembers the compiled kernel, the
grid and the full argument list; later calls with that key put their tensors into the list and
call the compiled kernel's launcher, as Triton's dispatch does at its end. Where that launcher is the
one `direct_launch` knows, they skip its Python layer too and call the C launcher beneath it with
the argument list already expanded, only the TMA descriptors encoded again at their new addresses.
This is what CUDA graphs do for a whole sequence of launches, done here for one launch, and without
their constraint that the addresses stay fixed.

What the key must capture is the caller's responsibility: two calls with equal keys must make the
same specialisation and pass equal non-tensor arguments, and, for a host-side TMA descriptor, have
tensors of equal shapes and strides under it (a relaunch puts the first call's descriptor, shape and
strides included, over the new tensor). The key covers the call, not the launcher's
own settings: a launcher whose settings change (a tuning choice, a schedule) must `clear()` its plans.
A plan keeps no tensor of the call that made it (that would keep its memory allocated for good).
Nothing is remembered under Triton's interpreter (it compiles nothing). Launch hooks (a profiler's,
Proton's) are called as Triton calls them: while one is set, relaunches take Triton's launcher.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch
from triton import knobs
from triton.runtime.driver import driver

from tutorial_kernels.perf.direct_launch import DirectLaunch, all_tensors, direct_launch, no_launch_hooks


def address_aligned(t: torch.Tensor) -> bool:
    """Whether Triton will specialise `t` as 16-byte aligned: part of every launch key, since a
    kernel compiled for aligned addresses must not be handed an unaligned one."""
    return t.data_ptr() % 16 == 0


def tensor_signature(t: torch.Tensor) -> tuple:
    """Everything about a tensor argument that can change a launch, except its address: shape,
    strides, dtype, device and alignment."""
    return (t.shape, t.stride(), t.dtype, t.get_device(), address_aligned(t))


def attention_call_key(q: object, k: object, v: object, out: object, causal: object, sm_scale: object,
                       *extra: Hashable) -> tuple | None:
    """The launch key of an attention call `fn(q, k, v, causal, sm_scale, out=out)`: equal for two
    calls that every check would treat alike and that launch the same specialisation with the same
    scalars. None for arguments of a kind the full checks must see (they raise): a non-tensor, a
    causal flag that is not a bool, a scale that is not None or a float."""
    # Written out without loops or generators: every layer of a model computes this key for every call.
    if not (type(causal) is bool and (sm_scale is None or type(sm_scale) is float) and isinstance(q, torch.Tensor)
            and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
            and (out is None or isinstance(out, torch.Tensor))):
        return None
    try:
        if out is None:
            return (causal, sm_scale, True, *extra, tensor_signature(q), tensor_signature(k), tensor_signature(v))
        return (causal, sm_scale, False, *extra, tensor_signature(q), tensor_signature(k), tensor_signature(v),
                tensor_signature(out))
    except RuntimeError:  # a tensor without strides or storage (sparse, nested): the checks will say so
        return None


def _is_descriptor(arg: object) -> bool:
    """A host-side TMA descriptor (Triton's or Gluon's `TensorDescriptor`) over a tensor."""
    return isinstance(getattr(arg, "base", None), torch.Tensor)


def _replaceable(arg: object) -> bool:
    """A tensor, or a host-side TMA descriptor over one: the arguments a relaunch replaces."""
    return isinstance(arg, torch.Tensor) or _is_descriptor(arg)


def _template(descriptor: object) -> object:
    """A copy of a host-side descriptor without its tensor: block shape, layout, shape and strides."""
    template = object.__new__(type(descriptor))
    template.__dict__.update(descriptor.__dict__, base=None)
    return template


def _over(template: object, tensor: torch.Tensor) -> object:
    """`template`'s descriptor over `tensor`. The descriptor's constructor is skipped, and with it its
    checks (16-byte alignment and strides, positive sizes): a relaunch key equal to the remembered
    one means equal shapes, strides and alignment, all of which those checks passed at the first call.
    One to two microseconds less per descriptor (the constructor validates a dozen things), in every
    layer. The descriptor keeps the template's shape and strides: the key must imply them."""
    descriptor = object.__new__(type(template))
    descriptor.__dict__.update(template.__dict__, base=tensor)
    return descriptor


@dataclass(frozen=True)
class _Plan:
    compiled: Any  # triton.compiler.CompiledKernel
    grid: tuple[int, int, int]
    device: int
    arguments: tuple  # every parameter of the kernel, in order, as the launcher takes them; None where a
    # tensor (or descriptor) argument goes
    replaced: tuple[int, ...]  # the positions of the tensor (or descriptor) arguments
    templates: tuple  # per replaced position: None for a tensor, a descriptor's `_template` for a descriptor
    direct: DirectLaunch | None  # the same launch through Triton's C launcher alone, where it is known


class LaunchPlans:
    """The launches of one `@triton.jit` (or Gluon) kernel, remembered by key."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._plans: dict[Hashable, _Plan] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key: Hashable | None) -> bool:
        return key in self._plans

    def ready(self, key: Hashable | None) -> bool:
        """Whether `relaunch(key, ...)` would launch: a launch is remembered under `key` for the current device."""
        plan = self._plans.get(key)
        return plan is not None and plan.device == driver.active.get_current_device()

    def launch(self, key: Hashable | None, grid: tuple[int, ...], *args, **kwargs) -> None:
        """`kernel[grid](*args, **kwargs)`, remembered under `key` (None: not remembered) so that
        `relaunch(key, ...)` can repeat it with other tensors."""
        compiled = self.kernel[grid](*args, **kwargs)
        if key is None or not hasattr(compiled, "packed_metadata"):  # the interpreter compiles nothing
            return
        arguments = []
        for position, param in enumerate(self.kernel.params):
            if position < len(args):
                arguments.append(args[position])
            elif param.name in kwargs:
                arguments.append(kwargs[param.name])
            elif param.has_default:
                arguments.append(param.default)
            else:
                return  # cannot happen for a call that just compiled; remember nothing rather than guess
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if any(isinstance(a, (tuple, list)) and any(map(_replaceable, a)) for a in arguments):
            return  # a tensor inside a tuple argument: a relaunch would not replace it
        replaced = tuple(i for i, a in enumerate(arguments) if _replaceable(a))
        templates = tuple(_template(arguments[i]) if _is_descriptor(arguments[i]) else None for i in replaced)
        try:
            direct = direct_launch(compiled, grid, arguments, replaced, _is_descriptor)
        except Exception:  # noqa: BLE001 (a faster relaunch is optional: Triton's launcher serves instead)
            direct = None  # e.g. descriptor metadata this module does not know; the call itself has run
        for i in replaced:
            arguments[i] = None  # each relaunch brings its own; keeping these would keep their memory
        self._plans[key] = _Plan(compiled, grid, driver.active.get_current_device(), tuple(arguments), replaced,
                                 templates, direct)

    def clear(self) -> None:
        """Forget every remembered launch (after a change to what the launcher decides from its settings)."""
        self._plans.clear()

    # --8<-- [start:relaunch]
    def relaunch(self, key: Hashable, *tensors) -> bool:
        """Launch what was remembered under `key` with `tensors` in place of its tensor and descriptor
        arguments, in their order; where the remembered launch took a descriptor, the tensor it was over
        (the remembered descriptor's block and layout are put over it) or a descriptor. False, having
        launched nothing, when nothing is remembered under `key` or another device is current."""
        plan = self._plans.get(key)
        if plan is None:
            return False
        device = driver.active.get_current_device()
        if device != plan.device:  # the compiled function is loaded per device
            return False
        direct = plan.direct
        if (direct is not None and no_launch_hooks(knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
                and all_tensors(tensors)):  # Triton's C launcher with the arguments it would be given
            direct(driver.active.get_current_stream(device), tensors)
            return True
        arguments = list(plan.arguments)
        for position, template, tensor in zip(plan.replaced, plan.templates, tensors, strict=True):
            over_tensor = template is not None and isinstance(tensor, torch.Tensor)
            arguments[position] = _over(template, tensor) if over_tensor else tensor
        compiled, grid, stream = plan.compiled, plan.grid, driver.active.get_current_stream(device)
        # the call Triton's JITFunction.run ends with: launch hooks (a profiler's) are honoured
        compiled.run(*grid, stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *arguments),
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *arguments)
        return True
    # --8<-- [end:relaunch]
