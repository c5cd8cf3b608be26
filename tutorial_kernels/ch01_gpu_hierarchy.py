"""Chapter 1 — the GPU hierarchy: threads, warps, blocks, SMs, and a first kernel that uses them.

Everything the later chapters rely on, shown with one small problem, the sum of a vector:

1. `triton_sum`: a Triton reduction. Each program (≈ a CUDA thread block) loads one tile from HBM
   into registers, reduces it, and writes ONE float32 partial sum back. The partial sums are then
   combined either by running the same kernel again on them until one value is left
   (`method="two-pass"`: deterministic) or by `tl.atomic_add` into one float (`method="atomic"`:
   a single launch, but the additions happen in whatever order the programs finish).
2. `cuda_sum`: the same computation as CUDA C, compiled from Python with
   `torch.utils.cpp_extension.load_inline`. It is a corrected version of a warp-shuffle kernel that
   circulates in tutorials: warps reduce with `__shfl_down_sync`, then warp 0 combines the per-warp
   results through shared memory. GPU only (it needs nvcc and a CUDA device).
3. `device_properties` and `resident_programs_per_sm`: the numbers that decide how many programs an
   SM holds at once (its occupancy), read off the device, and the calculation that uses them.
   `tutorial_kernels.instruments.timeline` then measures where programs actually ran.

Every sum accumulates in float32 whatever the input dtype, and is checked against `torch.sum` in
float64 with the error measured relative to Σ|x_i| (see `reduction_error`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import shutil
import tempfile

import torch
import triton
import triton.language as tl

from tutorial_kernels import recorder
from tutorial_kernels.validation import SUPPORTED_DTYPES, check_triton_tensor

REDUCTION_BLOCK = 4096  # elements per program: 16 float32 (four 16-byte loads) per thread at 8 warps
REDUCTION_WARPS = 8


# --8<-- [start:partial_sums_kernel]
@triton.jit
def partial_sums_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    """Program p sums x[p·BLOCK : (p+1)·BLOCK] in float32 and writes partial[p]."""
    pid = tl.program_id(0).to(tl.int64)  # 64-bit: pid · BLOCK passes 2³¹ for inputs over 8 GiB
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) element indices of this program's tile
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)  # HBM → registers; past the end adds 0
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))  # registers → HBM: one float
# --8<-- [end:partial_sums_kernel]


# --8<-- [start:atomic_sum_kernel]
@triton.jit
def _atomic_sum_kernel(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    """Program p adds the sum of its tile straight into total[0] with an atomic read-modify-write."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    # Atomics serialise the additions at one address in arrival order, which changes from run to run:
    # float addition is not associative, so the last bits of the result change with it.
    tl.atomic_add(total_ptr, tl.sum(x.to(tl.float32), axis=0), sem="relaxed")
# --8<-- [end:atomic_sum_kernel]


# --8<-- [start:triton_sum]
def triton_sum(x: torch.Tensor, *, method: str = "two-pass") -> torch.Tensor:
    """Σ x_i over every element of a contiguous float16/bfloat16/float32 tensor, as a float32 scalar.

    method="two-pass": each launch turns n values into ⌈n / BLOCK⌉ partial sums, and is repeated on
    the partial sums until one is left (2²⁶ → 16384 → 4 → 1); the same input always gives the same
    bits. method="atomic": one launch, partial sums added with atomics, order (and last bits) vary.
    """
    _check_vector(x)
    if method not in ("two-pass", "atomic"):
        raise ValueError(f"method must be 'two-pass' or 'atomic', got {method!r}")
    n = x.numel()
    if n == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)  # the empty sum, as torch.sum
    if method == "atomic":
        total = torch.zeros(1, dtype=torch.float32, device=x.device)  # atomics add into it: start at 0
        _atomic_sum_kernel[(triton.cdiv(n, REDUCTION_BLOCK),)](
            x, total, n, BLOCK=REDUCTION_BLOCK, num_warps=REDUCTION_WARPS
        )
        return total.reshape(())
    values = x
    while True:  # at least one pass, so a float16 input of one element still comes back as float32
        partial = torch.empty(triton.cdiv(n, REDUCTION_BLOCK), dtype=torch.float32, device=x.device)
        partial_sums_kernel[(partial.numel(),)](
            values, partial, n, BLOCK=REDUCTION_BLOCK, num_warps=REDUCTION_WARPS
        )
        values, n = partial, partial.numel()
        if n == 1:
            return partial.reshape(())
# --8<-- [end:triton_sum]


def reduction_passes(n: int, block: int = REDUCTION_BLOCK) -> list[int]:
    """How many values each two-pass launch leaves: [⌈n/B⌉, ⌈n/B²⌉, …, 1]."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    sizes = []
    while True:
        n = math.ceil(n / block)
        sizes.append(n)
        if n == 1:
            return sizes


def _check_vector(x: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x.dtype must be torch.float16, torch.bfloat16 or torch.float32, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous (call .contiguous() first), got shape {tuple(x.shape)} "
                         f"with strides {x.stride()}")
    check_triton_tensor(x, "x")


# --8<-- [start:reduction_error]
def reduction_error(total: torch.Tensor, x: torch.Tensor) -> float:
    """|total − Σx| / Σ|x|, with Σx = torch.sum in float64: the error of a float32 sum, on the right scale.

    Relative to |Σx| the error of a sum of mean-zero numbers is unbounded (Σx can be ~0); relative to
    Σ|x| a float32 summation is off by at most (number of additions in a chain) · 2⁻²⁴, and a tree of
    additions has short chains: log₂ n for a pairwise sum.
    """
    exact = x.double().sum()
    scale = x.double().abs().sum().clamp_min(torch.finfo(torch.float64).tiny)
    return ((total.double() - exact).abs() / scale).item()
# --8<-- [end:reduction_error]


# --- the CUDA C version -----------------------------------------------------------------------

CUDA_THREADS = 256  # threads per block: 8 warps of 32

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

// --8<-- [start:cuda_block_sum]
constexpr int THREADS = 256;                 // one block = 8 warps of 32 threads
constexpr int WARPS = THREADS / 32;
constexpr unsigned FULL_MASK = 0xffffffffu;  // all 32 lanes take part in each shuffle

template <typename scalar_t>
__global__ void block_sum_kernel(const scalar_t* __restrict__ x, float* __restrict__ partial,
                                 int64_t n) {
    __shared__ float warp_sums[WARPS];  // one slot per warp, visible to the whole block
    const int lane = threadIdx.x % 32;  // position inside the warp
    const int warp = threadIdx.x / 32;  // which warp of the block
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;

    // Stage 1: each thread loads one element (0 past the end); each warp adds its 32 values
    // with shuffles, and after offsets 16, 8, 4, 2, 1 lane 0 holds the warp's sum. No thread
    // returns early, so all 32 lanes named by FULL_MASK reach every shuffle.
    float v = i < n ? static_cast<float>(x[i]) : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_down_sync(FULL_MASK, v, offset);  // v += v of lane (lane + offset)
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();  // all 8 slots written before anyone reads them

    // Stage 2: the whole of warp 0 reads the 8 slots; lanes 8..31 contribute 0, so every
    // lane the mask names executes the shuffles and holds a defined value.
    if (warp == 0) {
        v = lane < WARPS ? warp_sums[lane] : 0.0f;
        for (int offset = WARPS / 2; offset > 0; offset /= 2)
            v += __shfl_down_sync(FULL_MASK, v, offset);
        if (lane == 0) partial[blockIdx.x] = v;  // one partial sum per block, never the input
    }
}
// --8<-- [end:cuda_block_sum]

// --8<-- [start:cuda_launch]
torch::Tensor block_sums(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
    const int64_t n = x.numel();
    const int64_t blocks = (n + THREADS - 1) / THREADS;
    auto partial = torch::empty({blocks}, x.options().dtype(torch::kFloat32));
    const auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "block_sums", [&] {
        block_sum_kernel<scalar_t><<<blocks, THREADS, 0, stream>>>(
            x.data_ptr<scalar_t>(), partial.data_ptr<float>(), n);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return partial;
}
// --8<-- [end:cuda_launch]
"""

CPP_SOURCE = "torch::Tensor block_sums(torch::Tensor x);"


def cuda_extension_unavailable_reason() -> str | None:
    """Why `cuda_sum` cannot run here, or None when it can (a CUDA GPU, nvcc and ninja are present)."""
    from tutorial_kernels.runtime import default_device

    if default_device().type != "cuda":
        return "the CUDA C reduction needs a CUDA GPU (this machine runs kernels through Triton's interpreter)"
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        return ("the CUDA C reduction is compiled with nvcc, which is not on PATH "
                "(set CUDA_HOME or install the CUDA toolkit)")
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401
        except ImportError:
            return "torch.utils.cpp_extension.load_inline needs ninja: pip install ninja"
    return None


@functools.cache
def _cuda_module():
    """Compile the CUDA source once per process (about a minute the first time; cached on disk after)."""
    reason = cuda_extension_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    from torch.utils.cpp_extension import load_inline

    digest = hashlib.sha256((CUDA_SOURCE + CPP_SOURCE + torch.__version__).encode()).hexdigest()[:12]
    build_dir = os.path.join(tempfile.gettempdir(), f"tutorial_kernels_ch01_{digest}")
    os.makedirs(build_dir, exist_ok=True)
    return load_inline(
        name=f"ch01_block_sum_{digest}", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
        functions=["block_sums"], build_directory=build_dir, extra_cuda_cflags=["-O3"], verbose=False,
    )


def cuda_block_sums(x: torch.Tensor) -> torch.Tensor:
    """One launch of the CUDA kernel: the float32 sum of each run of 256 elements, ⌈n/256⌉ values."""
    _check_vector(x)
    if x.numel() == 0:
        raise ValueError("x must have at least one element")
    return _cuda_module().block_sums(x)


# --8<-- [start:cuda_sum]
def cuda_sum(x: torch.Tensor) -> torch.Tensor:
    """Σ x_i as a float32 scalar with the CUDA kernel, relaunched on its partial sums until one is left."""
    _check_vector(x)
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    values = _cuda_module().block_sums(x)  # n → ⌈n/256⌉ partial sums
    while values.numel() > 1:
        values = _cuda_module().block_sums(values)
    return values.reshape(())
# --8<-- [end:cuda_sum]


# --- what decides how many programs share an SM ------------------------------------------------

# cuDeviceGetAttribute numbers from CUDA's cuda.h (CUdevice_attribute); torch does not expose all of them.
_CU_ATTRIBUTES = {
    "max_threads_per_block": 1,
    "warp_size": 10,
    "max_registers_per_block": 12,
    "sm_clock_khz": 13,
    "sm_count": 16,
    "memory_clock_khz": 36,
    "memory_bus_width_bits": 37,
    "l2_cache_bytes": 38,
    "max_threads_per_sm": 39,
    "compute_capability_major": 75,
    "compute_capability_minor": 76,
    "shared_memory_per_sm_bytes": 81,
    "registers_per_sm": 82,
    "shared_memory_per_block_optin_bytes": 97,
    "max_blocks_per_sm": 106,
    "reserved_shared_memory_per_block_bytes": 111,
}


def device_properties(device: int = 0) -> dict:
    """The limits of one GPU, read off the device through the CUDA driver (`cuDeviceGetAttribute`).

    Also the two derived numbers chapter 1 uses: warps per SM, and the HBM bandwidth implied by the
    memory clock and bus width (2 transfers per clock · bus width), a datasheet figure, not a measurement.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("device_properties reads a CUDA GPU; none is visible here")
    torch.cuda.init()
    libcuda = ctypes.CDLL("libcuda.so.1")
    libcuda.cuInit(0)  # idempotent; the driver API needs it before any other call
    handle = ctypes.c_int()
    if libcuda.cuDeviceGet(ctypes.byref(handle), device) != 0:
        raise RuntimeError(f"cuDeviceGet({device}) failed")
    props: dict = {"name": torch.cuda.get_device_name(device)}
    for key, attribute in _CU_ATTRIBUTES.items():
        value = ctypes.c_int()
        status = libcuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, handle)
        props[key] = value.value if status == 0 else None
    torch_props = torch.cuda.get_device_properties(device)
    props["total_memory_bytes"] = torch_props.total_memory
    props["warps_per_sm"] = props["max_threads_per_sm"] // props["warp_size"]
    props["hbm_bandwidth_from_clock_tb_per_s"] = (
        2 * props["memory_clock_khz"] * 1e3 * props["memory_bus_width_bits"] / 8 / 1e12
    )
    return props


# --8<-- [start:occupancy]
def resident_programs_per_sm(num_warps: int, shared_bytes: int, regs_per_thread: int, device: dict) -> dict:
    """How many programs (thread blocks) of one kernel an SM can hold at once, and which resource says so.

    Each resident program takes, for as long as it runs: num_warps of the SM's warp slots, its
    registers (regs_per_thread · 32 per warp, allocated in units of 256), its shared memory plus what
    the driver reserves per block, and one of the SM's block slots. The SM takes the most that fit.
    """
    warp_size = device["warp_size"]
    limits = {
        "warps": device["warps_per_sm"] // num_warps,
        "blocks": device["max_blocks_per_sm"],
    }
    if regs_per_thread > 0:
        regs_per_warp = math.ceil(regs_per_thread * warp_size / 256) * 256
        limits["registers"] = (device["registers_per_sm"] // regs_per_warp) // num_warps
    per_block_shared = shared_bytes + device["reserved_shared_memory_per_block_bytes"]
    limits["shared memory"] = device["shared_memory_per_sm_bytes"] // per_block_shared
    resident = min(limits.values())
    return {
        "programs_per_sm": resident,
        "limited_by": [name for name, value in limits.items() if value == resident],
        "limits": limits,
        "warps_per_sm": resident * num_warps,
        "occupancy": resident * num_warps / device["warps_per_sm"],
    }
# --8<-- [end:occupancy]


def waves(grid: int, programs_per_sm: int, sm_count: int) -> int:
    """Rounds of programs a grid needs when every program takes the same time: ⌈grid / (SMs · per SM)⌉."""
    return math.ceil(grid / (sm_count * programs_per_sm))


# --- where programs run: a probe whose footprint we choose ---------------------------------------

PROBE_BLOCK = 64  # the probe's tiles are 64 × 64 float16: 8 KiB each


# --8<-- [start:probe_kernel]
@triton.jit
def _residency_probe_kernel(
    trace_ptr, a_ptr, b_ptr, c_ptr, x_ptr, K, spin_ns,
    STAGES: tl.constexpr, HELD: tl.constexpr, BLOCK: tl.constexpr,
):
    """A program that busy-waits spin_ns after it starts, after claiming a chosen footprint.

    STAGES > 0: a pipelined tile loop C += A_k B_k keeps STAGES (A, B) tile pairs in flight in shared
    memory, ≈ STAGES · 16 KiB. HELD > 0: HELD float32 values stay in registers across the wait.
    The footprint is fixed when the kernel is compiled and reserved for the program's whole life.
    """
    start = recorder.program_start()
    if STAGES > 0:
        r = tl.arange(0, BLOCK)
        a_tile = a_ptr + r[:, None] * K + r[None, :]  # (BLOCK, BLOCK) window of A (BLOCK × K), moving right
        b_tile = b_ptr + r[:, None] * BLOCK + r[None, :]  # (BLOCK, BLOCK) window of B (K × BLOCK), moving down
        acc = tl.zeros([BLOCK, BLOCK], tl.float32)
        for _ in tl.range(0, K, BLOCK, num_stages=STAGES):
            acc = tl.dot(tl.load(a_tile), tl.load(b_tile), acc)
            a_tile += BLOCK
            b_tile += BLOCK * BLOCK
        tl.store(c_ptr + r[:, None] * BLOCK + r[None, :], acc, mask=K < 0)  # never stored; keeps the loop
    if HELD > 0:
        h = tl.arange(0, HELD)
        held = tl.load(x_ptr + h)  # live until after the wait: HELD / (32 · num_warps) registers per thread
    now = recorder.global_time()
    while now - start < spin_ns:  # the "work": every program lasts spin_ns, wherever it runs
        now = recorder.global_time()
    if HELD > 0:
        tl.store(x_ptr + h, held + 1.0, mask=K < 0)
    recorder.program_end(trace_ptr, start)
# --8<-- [end:probe_kernel]


# (label, num_warps, STAGES, HELD): the footprints chapter 1 compares
RESIDENCY_SCENARIOS = {
    "light": ("4 warps, nothing else", 4, 0, 0),
    "shared-64k": ("4 warps + a 4-stage tile pipeline (shared memory)", 4, 4, 0),
    "shared-128k": ("4 warps + an 8-stage tile pipeline (shared memory)", 4, 8, 0),
    "warps-32": ("32 warps (1024 threads), nothing else", 32, 0, 0),
    "registers": ("4 warps holding 16384 floats in registers", 4, 0, 16384),
}
PROBE_SPIN_NS = 20_000


def record_probe(grid: int, scenario: str, spin_ns: int = PROBE_SPIN_NS, device: dict | None = None) -> recorder.Timeline:
    """Launch the probe with `grid` programs and one of RESIDENCY_SCENARIOS' footprints; return its timeline.

    The timeline's meta holds what the compiler gave the kernel (registers per thread, shared memory),
    the occupancy `resident_programs_per_sm` predicts from them, and the most programs seen at once on an SM.
    """
    recorder.require_recording()
    if scenario not in RESIDENCY_SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(RESIDENCY_SCENARIOS)}, got {scenario!r}")
    if grid < 1:
        raise ValueError(f"grid must be at least 1, got {grid}")
    label, num_warps, stages, held = RESIDENCY_SCENARIOS[scenario]
    device = device or device_properties()
    k = 2 * max(stages, 1) * PROBE_BLOCK
    a = torch.randn(PROBE_BLOCK, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, PROBE_BLOCK, device="cuda", dtype=torch.float16)
    c = torch.empty(PROBE_BLOCK, PROBE_BLOCK, device="cuda", dtype=torch.float32)
    x = torch.randn(max(held, 1), device="cuda", dtype=torch.float32)
    trace = recorder.new_trace(grid)
    kernel = _residency_probe_kernel[(grid,)](
        trace, a, b, c, x, k, spin_ns, STAGES=stages, HELD=held, BLOCK=PROBE_BLOCK,
        num_warps=num_warps, num_stages=max(stages, 1),
    )
    torch.cuda.synchronize()
    shared, regs = int(kernel.metadata.shared), int(kernel.n_regs)
    predicted = resident_programs_per_sm(num_warps, shared, regs, device)
    run = recorder.Timeline.from_trace(
        trace, f"{grid} programs · {label}", device["sm_count"], scenario=scenario, grid=grid,
        num_warps=num_warps, shared_bytes=shared, regs_per_thread=regs, spin_ns=spin_ns,
        predicted_per_sm=predicted["programs_per_sm"], limited_by=predicted["limited_by"],
        limits=predicted["limits"],
    )
    run.meta["measured_per_sm"] = run.max_resident_per_sm()
    run.meta["predicted_waves"] = waves(grid, predicted["programs_per_sm"], device["sm_count"])
    run.meta["measured_waves"] = max(run.waves())
    return run


__all__ = ["triton_sum", "reduction_passes", "reduction_error", "cuda_sum", "cuda_block_sums",
           "cuda_extension_unavailable_reason", "device_properties", "resident_programs_per_sm", "waves",
           "record_probe", "partial_sums_kernel", "RESIDENCY_SCENARIOS", "PROBE_SPIN_NS", "REDUCTION_BLOCK",
           "REDUCTION_WARPS"]
