"""Chapter 1: the Triton and CUDA sum reductions, the occupancy calculation, and the program timeline."""

import json

import pytest
import torch

from tutorial_kernels import recorder
from tutorial_kernels.paths import data_dir
from tutorial_kernels.ch01_gpu_hierarchy import (
    CUDA_THREADS,
    REDUCTION_BLOCK,
    RESIDENCY_SCENARIOS,
    cuda_block_sums,
    cuda_extension_unavailable_reason,
    cuda_sum,
    device_properties,
    record_probe,
    reduction_error,
    reduction_passes,
    resident_programs_per_sm,
    triton_sum,
    waves,
)
from tutorial_kernels.runtime import default_device
from tutorial_kernels.testing import KERNEL_DTYPES, ON_GPU, fresh_seed, poisoned

DEVICE = default_device()
# A float32 sum is off by at most (longest chain of additions) · 2⁻²⁴ · Σ|x|. Our trees have chains of
# a few hundred additions at most (the atomic variant adds its partial sums one after another), so
# 1e-5 leaves room; a wrong kernel (a lost tile, a doubled element) is off by ~1 / (number of tiles).
SUM_BOUND = 1e-5
LENGTHS = [1, 17, 255, 256, 257, REDUCTION_BLOCK - 1, REDUCTION_BLOCK + 1, 100_003]
if ON_GPU:
    LENGTHS += [1_000_003, 2**26]
CUDA_REASON = cuda_extension_unavailable_reason()


def randn(n: int, dtype: torch.dtype, seed: int, mean: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) + mean).to(DEVICE, dtype)


def assert_sum_close(total: torch.Tensor, x: torch.Tensor, seed: int, what: str) -> None:
    assert total.dtype == torch.float32 and total.shape == (), f"{what}: got {total.dtype} {tuple(total.shape)}"
    assert torch.isfinite(total), f"{what}: {total.item()}; seed={seed}"
    err = reduction_error(total, x)
    assert err <= SUM_BOUND, f"{what}: |s − Σx| / Σ|x| = {err:.2e} > {SUM_BOUND:.0e}; seed={seed}"


# --- the Triton reduction --------------------------------------------------------------------

@pytest.mark.parametrize("method", ["two-pass", "atomic"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("n", LENGTHS, ids=lambda n: f"n{n}")
def test_triton_sum_matches_float64(n, dtype, method):
    seed = fresh_seed()
    x = randn(n, dtype, seed)
    assert_sum_close(triton_sum(x, method=method), x, seed, f"triton_sum(n={n}, {dtype}, {method})")


@pytest.mark.parametrize("method", ["two-pass", "atomic"])
def test_triton_sum_of_positive_numbers_is_relatively_exact(method):
    # With all terms positive, Σ|x| = Σx, so the same bound holds relative to the sum itself.
    seed = fresh_seed()
    x = randn(300_001, torch.float32, seed).abs()
    total = triton_sum(x, method=method)
    exact = x.double().sum().item()
    assert abs(total.item() - exact) / exact <= SUM_BOUND, f"seed={seed}"


@pytest.mark.parametrize("method", ["two-pass", "atomic"])
def test_triton_sum_accumulates_float16_in_float32(method):
    # 4096 float16 copies of 100 sum to 409600, past float16's largest finite value (65504): a float16
    # accumulator would overflow to inf; the float32 one is exact.
    x = torch.full((4096,), 100.0, dtype=torch.float16, device=DEVICE)
    assert triton_sum(x, method=method).item() == 409600.0


def test_triton_sum_takes_any_shape_and_the_empty_tensor():
    seed = fresh_seed()
    x = randn(3 * 5 * 7, torch.float32, seed).reshape(3, 5, 7)
    assert_sum_close(triton_sum(x), x, seed, "3-D input")
    empty = triton_sum(torch.empty(0, device=DEVICE))
    assert empty.item() == 0.0 and empty.dtype == torch.float32


def test_two_pass_is_deterministic():
    seed = fresh_seed()
    x = randn(REDUCTION_BLOCK * 37 + 5, torch.float32, seed)
    first = triton_sum(x)
    assert all(torch.equal(first, triton_sum(x)) for _ in range(5)), f"seed={seed}"


def test_reduction_passes_count():
    assert reduction_passes(1) == [1]
    assert reduction_passes(REDUCTION_BLOCK) == [1]
    assert reduction_passes(REDUCTION_BLOCK + 1) == [2, 1]
    assert reduction_passes(2**26) == [2**26 // REDUCTION_BLOCK, 4, 1]


def test_reduction_error_is_scaled_by_the_sum_of_magnitudes():
    x = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    assert reduction_error(torch.tensor(2.5), x) == pytest.approx(0.5 / 4.0)


def test_triton_sum_rejects_bad_input():
    x = randn(64, torch.float32, 0).reshape(8, 8)
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        triton_sum([1.0, 2.0])
    with pytest.raises(TypeError, match=r"x.dtype must be .* got torch.int64"):
        triton_sum(x.long())
    with pytest.raises(ValueError, match=r"x must be contiguous \(call .contiguous\(\) first\)"):
        triton_sum(x.t())
    with pytest.raises(ValueError, match=r"method must be 'two-pass' or 'atomic', got 'tree'"):
        triton_sum(x, method="tree")
    with pytest.raises(ValueError, match=r"n must be at least 1, got 0"):
        reduction_passes(0)


# --- the CUDA C reduction (GPU only) ------------------------------------------------------------

def needs_cuda_extension(test):
    """Not collected without a GPU; on a GPU, skipped with the reason when nvcc or ninja is missing."""
    test = pytest.mark.skipif(CUDA_REASON is not None, reason=str(CUDA_REASON))(test)
    return pytest.mark.gpu("the CUDA C reduction")(test)


@needs_cuda_extension
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", LENGTHS, ids=lambda n: f"n{n}")
def test_cuda_sum_matches_float64(n, dtype):
    seed = fresh_seed()
    x = randn(n, dtype, seed)
    assert_sum_close(cuda_sum(x), x, seed, f"cuda_sum(n={n}, {dtype})")


@needs_cuda_extension
@pytest.mark.parametrize("n", [1, 31, 255, 256, 257, 1000], ids=lambda n: f"n{n}")
def test_cuda_block_sums_cover_every_element_once(n):
    # Each block of 256 threads writes the sum of its own 256 elements; the ragged last block adds
    # only what exists. A block that read past the end or double-counted a warp would be off by O(1).
    seed = fresh_seed()
    x = randn(n, torch.float32, seed, mean=1.0)  # mean 1: a missing or extra element shows clearly
    partial = cuda_block_sums(x)
    padded = torch.zeros(-(-n // CUDA_THREADS) * CUDA_THREADS, dtype=torch.float64, device=DEVICE)
    padded[:n] = x.double()
    expected = padded.view(-1, CUDA_THREADS).sum(dim=1)
    assert partial.shape == expected.shape
    torch.testing.assert_close(partial.double(), expected, rtol=1e-6, atol=1e-4, msg=f"seed={seed}")


@needs_cuda_extension
def test_cuda_sum_leaves_its_input_alone():
    # The original kernel wrote its result over a[0]; this one writes a separate buffer.
    seed = fresh_seed()
    x = randn(1000, torch.float32, seed)
    before = x.clone()
    cuda_sum(x)
    assert torch.equal(x, before)


@pytest.mark.skipif(CUDA_REASON is None, reason="checks the message given where the CUDA kernel cannot run")
def test_cuda_sum_explains_why_it_cannot_run():
    with pytest.raises(RuntimeError, match=r"needs|nvcc|ninja"):
        cuda_sum(randn(10, torch.float32, 0))


# --- the occupancy calculation -------------------------------------------------------------------

# The H100 SXM's limits (CUDA C Programming Guide, compute capability 9.0; read off the device in
# data/ch01_timelines.json), so the calculation is checked on the CPU too.
H100 = {
    "warp_size": 32, "warps_per_sm": 64, "max_blocks_per_sm": 32, "registers_per_sm": 65536,
    "shared_memory_per_sm_bytes": 233472, "reserved_shared_memory_per_block_bytes": 1024, "sm_count": 132,
}


def test_occupancy_by_warps_registers_and_shared_memory():
    light = resident_programs_per_sm(4, 0, 12, H100)
    assert light["programs_per_sm"] == 16 and light["limited_by"] == ["warps"]
    assert resident_programs_per_sm(32, 0, 12, H100)["programs_per_sm"] == 2
    assert resident_programs_per_sm(1, 0, 8, H100)["limited_by"] == ["blocks"]  # 32 blocks of one warp
    smem = resident_programs_per_sm(4, 64 * 1024, 64, H100)
    assert smem["programs_per_sm"] == 3 and smem["limited_by"] == ["shared memory"]  # 3 · 65 KiB ≤ 228 KiB
    assert resident_programs_per_sm(4, 128 * 1024, 64, H100)["programs_per_sm"] == 1
    # 146 registers per thread → 4672 per warp, allocated as 19 · 256 = 4864 → 13 warps' worth → 3 programs of 4
    regs = resident_programs_per_sm(4, 0, 146, H100)
    assert regs["programs_per_sm"] == 3 and regs["limited_by"] == ["registers"]
    assert regs["occupancy"] == pytest.approx(12 / 64)


def test_waves():
    assert waves(132, 1, 132) == 1
    assert waves(3 * 132 + 17, 1, 132) == 4
    assert waves(3 * 132 + 17, 3, 132) == 2
    assert waves(3 * 132 + 17, 16, 132) == 1


# --- the timeline ----------------------------------------------------------------------------------

def synthetic(sm, start, end, sm_count=2):
    return recorder.Timeline("synthetic", sm, start, end, sm_count)


def test_timeline_lanes_waves_and_residency():
    # SM 0 runs programs 0 and 1 together, then program 2; SM 1 runs program 3 alone.
    run = synthetic([0, 0, 0, 1], [0, 5, 100, 2], [100, 105, 200, 102])
    assert run.lanes() == [0, 1, 0, 0]
    assert run.waves() == [1, 1, 2, 1]
    assert run.max_resident_per_sm() == 2
    assert run.makespan_us == pytest.approx(0.2)
    assert run.sms_used == 2
    back = recorder.Timeline.from_dict(json.loads(json.dumps(run.to_dict())))
    assert back == run


def test_timeline_counts_back_to_back_programs_once():
    run = synthetic([0, 0], [0, 100], [100, 200])  # the second starts exactly when the first ends
    assert run.max_resident_per_sm() == 1 and run.waves() == [1, 2]


def test_timeline_from_trace_rejects_missing_rows():
    trace = recorder.new_trace(3, "cpu")
    trace[0] = torch.tensor([5, 1000, 2000])
    trace[2] = torch.tensor([7, 1500, 2500])
    with pytest.raises(ValueError, match=r"1 of 3 programs wrote no trace row"):
        recorder.Timeline.from_trace(trace, "partial", sm_count=8)
    trace[1] = torch.tensor([5, 1100, 2100])
    run = recorder.Timeline.from_trace(trace, "full", sm_count=8, grid=3)
    assert run.start_ns == [0, 100, 500] and run.end_ns == [1000, 1100, 1500] and run.meta == {"grid": 3}


@pytest.mark.cpu("the message shown without a GPU")
def test_recording_degrades_gracefully_without_a_gpu():
    assert "interpreter" in recorder.unavailable_reason()
    with pytest.raises(recorder.TimelineUnavailable, match=r"needs a CUDA GPU"):
        record_probe(132, "light")


def test_recorded_h100_trace_is_complete():
    path = data_dir() / "ch01_timelines.json"
    if not path.exists():
        pytest.skip("data/ch01_timelines.json is not recorded yet: python -m tutorial_kernels.instruments.timeline ch01-residency")
    data = json.loads(path.read_text())
    sms = data["device"]["sm_count"]
    for raw in data["timelines"]:
        run = recorder.Timeline.from_dict(raw)
        assert run.n_programs == run.meta["grid"]
        assert all(0 <= s < sms for s in run.sm)
        assert all(e > s for s, e in zip(run.start_ns, run.end_ns))
        assert run.meta["measured_per_sm"] <= run.meta["predicted_per_sm"], run.label


# --- on the GPU: where programs really run -----------------------------------------------------------

# recording reads %smid and %globaltimer with inline PTX: a GPU only (`recorder.unavailable_reason`)
needs_timeline = pytest.mark.gpu("timelines")


@needs_timeline
@pytest.mark.parametrize("scenario", list(RESIDENCY_SCENARIOS))
def test_probe_never_exceeds_the_predicted_residency(scenario):
    device = device_properties()
    sms = device["sm_count"]
    run = record_probe(3 * sms + 17, scenario, device=device)
    assert run.n_programs == 3 * sms + 17
    assert all(0 <= s < sms for s in run.sm)
    assert run.meta["measured_per_sm"] <= run.meta["predicted_per_sm"], run.meta
    if run.meta["predicted_per_sm"] == 1:  # one program per SM: the first wave must use every SM
        assert run.sms_used == sms


@needs_timeline
def test_device_properties_are_read_off_the_device():
    props = device_properties()
    assert props["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
    assert props["warp_size"] == 32
    assert props["max_blocks_per_sm"] >= 16 and props["registers_per_sm"] >= 32768
    assert all(v is not None for v in props.values()), props


@needs_timeline
def test_triton_reduces_across_a_warp_with_shuffles():
    # Triton's tl.sum compiles to the same warp shuffles the CUDA kernel writes by hand.
    from tutorial_kernels.ch01_gpu_hierarchy import REDUCTION_WARPS, partial_sums_kernel

    x = torch.randn(REDUCTION_BLOCK, device="cuda")
    partial = poisoned((1,), torch.float32, "cuda")
    compiled = partial_sums_kernel[(1,)](x, partial, x.numel(), BLOCK=REDUCTION_BLOCK, num_warps=REDUCTION_WARPS)
    assert "shfl.sync" in compiled.asm["ptx"]
    assert torch.isfinite(partial).all()
