"""Is racecheck's report on the Hopper kernels a race, or the tool not modelling mbarriers?

The smallest Gluon kernel with the Hopper backward's hand-off: a default partition of 4 warps
(a consumer warpgroup) writes a 64 × 64 float32 tile to shared memory and arrives on an mbarrier;
a 1-warp worker partition (the dQ writer) waits on that mbarrier, then reads the tile and copies it
to global memory. Race-free by construction: the worker's reads come after the barrier's phase
completes, which the one elected arrive does only after every writer thread has passed the
warpgroup barrier (`bar.sync 0, 128`) that Triton puts before it (checked in the PTX below), and
the arrive releases / the wait acquires (PTX memory model). Run plainly it checks the copy; run
under `compute-sanitizer --tool racecheck` it shows whether the tool reports this hand-off.

    python experiments/2026-11-25_racecheck_mbarrier/handoff.py            # checks the copy, prints the PTX's barriers
    compute-sanitizer --tool racecheck python experiments/2026-11-25_racecheck_mbarrier/handoff.py
"""
import re
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier


@gluon.jit
def _writer(buf, bar, seed):
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, 64, gl.SliceLayout(1, layout))
    cols = gl.arange(0, 64, gl.SliceLayout(0, layout))
    buf.store((rows[:, None] * 64 + cols[None, :] + seed).to(gl.float32))
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _reader(buf, bar, out_ptr, seed):
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [1, 1], [1, 0])
    mbarrier.wait(bar, 0)
    rows = gl.arange(0, 4, gl.SliceLayout(1, layout))
    cols = gl.arange(0, 64, gl.SliceLayout(0, layout))
    for r in gl.static_range(0, 64, 4):
        part = buf.slice(r, 4, dim=0).load(layout)
        gl.store(out_ptr + (r + rows[:, None]) * 64 + cols[None, :], part)


@gluon.jit
def handoff_kernel(out_ptr, seed):
    buf = gl.allocate_shared_memory(gl.float32, [64, 64], gl.SwizzledSharedLayout(4, 1, 4, order=[1, 0]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
    gl.warp_specialize([(_writer, (buf, bar, seed)), (_reader, (buf, bar, out_ptr, seed))], [1], [24])


if __name__ == "__main__":
    out = torch.full((64, 64), float("nan"), device="cuda")
    for seed in range(100):
        compiled = handoff_kernel[(1,)](out, seed, num_warps=4)
        expected = torch.arange(64 * 64, device="cuda", dtype=torch.float32).view(64, 64) + seed
        assert torch.equal(out, expected), f"seed {seed}: the copy differs"
    ptx = compiled.asm["ptx"]
    barriers = [line.strip() for line in ptx.splitlines()
                if re.search(r"bar\.sync|barrier\.sync|mbarrier\.(arrive|try_wait|test_wait)", line)]
    print("copies correct in 100 launches; the PTX's barriers in order:", *barriers, sep="\n  ")
    sys.exit(0)
