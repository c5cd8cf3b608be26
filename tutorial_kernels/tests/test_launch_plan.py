"""Launches repeated without Triton's dispatch (`tutorial_kernels.perf.launch_plan`).

A remembered launch must compute exactly what the full launch computes, with any new tensors of
the same signature; a call that differs in anything the key does not cover must not reach it; and a
bad argument must still get the full checks' error. The relaunch itself needs compiled kernels (a
GPU); the keys and the interpreter's behaviour are checked everywhere."""

import pytest
import torch
import triton

from tutorial_kernels import ch05_flash_v2 as ch05
from tutorial_kernels.perf.launch_plan import LaunchPlans, attention_call_key
from tutorial_kernels.reference import reference_attention, reference_log_sum_exp, reference_scores
from tutorial_kernels.testing import ON_GPU, assert_close, poisoned, random_qkv

# A remembered launch replays a compiled kernel: GPU only (Triton's interpreter compiles nothing, so
# nothing is remembered there). Not collected without a GPU (conftest.py).
needs_gpu = pytest.mark.gpu("remembered launches")
ON_HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9


def _inputs(batch, heads, n, head_dim, dtype, layout="bhnd"):
    x = random_qkv(batch, heads, n, n, head_dim, dtype, layout=layout)
    return x.q, x.k, x.v, x.seed


def test_keys_separate_what_the_checks_and_the_specialisation_tell_apart():
    q, k, v, _ = _inputs(1, 2, 40, 32, torch.float32)
    key = attention_call_key(q, k, v, None, True, None)
    fresh = _inputs(1, 2, 40, 32, torch.float32)  # other tensors, same signature: same key
    assert attention_call_key(*fresh[:3], None, True, None) == key
    assert attention_call_key(q, k, v, None, False, None) != key
    assert attention_call_key(q, k, v, None, True, 0.5) != key
    assert attention_call_key(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, None, True, None) != key
    unaligned = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)  # 4 bytes off
    assert attention_call_key(unaligned, k, v, None, True, None) != key
    out = torch.empty_like(q)
    assert attention_call_key(q, k, v, out, True, None) not in (key, None)
    # arguments whose errors only the full checks give: no key, so never a remembered launch
    assert attention_call_key(q, k, v, None, 1, None) is None  # causal must be a bool
    assert attention_call_key(q, k, v, None, True, 1) is None  # an int scale goes through the checks
    assert attention_call_key(q, k, v, None, True, True) is None
    assert attention_call_key(q.tolist(), k, v, None, True, None) is None
    assert attention_call_key(q, k, v, "out", True, None) is None


@pytest.mark.cpu("the interpreter's behaviour")
def test_nothing_is_remembered_under_the_interpreter():
    q, k, v, seed = _inputs(1, 2, 40, 32, torch.float32)
    for _ in range(3):
        out = ch05.flash_attn_v2_tuned(q, k, v, True)
    assert_close(out, reference_attention(q, k, v, True), torch.float32, seed=seed)
    assert len(ch05.TUNED.plans) == 0


def test_a_plan_keeps_the_argument_order_and_no_tensor(monkeypatch):
    # A stand-in for a jitted kernel and its compiled kernel, so that the bookkeeping runs on any machine:
    # positional, keyword and default arguments in the kernel's parameter order, tensors swapped in.
    import inspect
    from types import SimpleNamespace

    from tutorial_kernels.perf import launch_plan

    def make_params(*names_and_defaults):
        return [SimpleNamespace(name=n, has_default=d is not inspect.Parameter.empty, default=d)
                for n, d in names_and_defaults]

    runs = []
    compiled = SimpleNamespace(packed_metadata="meta", function="fn",
                               launch_metadata=lambda grid, stream, *args: None,
                               run=lambda *args: runs.append(args))
    monkeypatch.setattr(launch_plan, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: "stream")))

    class Jitted:  # kernel(x, n, out, scale=2.0, BLOCK: constexpr = 16)
        params = make_params(("x", inspect.Parameter.empty), ("n", inspect.Parameter.empty),
                        ("out", inspect.Parameter.empty), ("scale", 2.0), ("BLOCK", 16))

        def __getitem__(self, grid):
            return lambda *args, **kwargs: compiled

    plans = LaunchPlans(Jitted())
    x, out = torch.randn(3), torch.empty(3)
    plans.launch("key", (4,), x, 7, out=out, BLOCK=32)
    assert "key" in plans and len(plans) == 1
    assert not any(isinstance(a, torch.Tensor) for a in plans._plans["key"].arguments), "a plan keeps no tensor"
    x2, out2 = torch.randn(3), torch.empty(3)
    assert plans.relaunch("key", x2, out2)
    assert runs[-1] == (4, 1, 1, "stream", "fn", "meta", None, launch_plan.knobs.runtime.launch_enter_hook,
                        launch_plan.knobs.runtime.launch_exit_hook, x2, 7, out2, 2.0, 32)
    assert not plans.relaunch("other key", x2, out2)
    with pytest.raises(ValueError):  # one tensor too few: never a launch with a stale argument
        plans.relaunch("key", x2)
    plans.clear()
    assert "key" not in plans


def test_a_relaunch_puts_the_remembered_descriptor_over_a_new_tensor(monkeypatch):
    # A host-side TMA descriptor argument: the plan keeps its block and layout without its tensor, and
    # a relaunch given a tensor in its place gets that descriptor over the new tensor.
    import inspect
    from types import SimpleNamespace

    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tutorial_kernels.perf import launch_plan

    runs = []
    compiled = SimpleNamespace(packed_metadata="meta", function="fn", launch_metadata=lambda grid, stream, *args: None,
                               run=lambda *args: runs.append(args))
    monkeypatch.setattr(launch_plan, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: "stream")))

    class Jitted:  # kernel(x_desc, out)
        params = [SimpleNamespace(name=n, has_default=False, default=inspect.Parameter.empty) for n in ("x_desc", "out")]

        def __getitem__(self, grid):
            return lambda *args, **kwargs: compiled

    layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)
    x, out = torch.randn(128, 64, dtype=torch.float16), torch.empty(3)
    plans = LaunchPlans(Jitted())
    plans.launch("key", (2,), TensorDescriptor.from_tensor(x, [64, 64], layout), out)
    assert plans._plans["key"].templates[0].base is None, "a plan keeps no tensor"
    x2, out2 = torch.randn(128, 64, dtype=torch.float16), torch.empty(3)
    assert plans.relaunch("key", x2, out2)
    descriptor = runs[-1][-2]
    assert isinstance(descriptor, TensorDescriptor) and descriptor.base is x2 and descriptor.layout == layout
    assert (list(descriptor.shape), list(descriptor.strides), descriptor.block_shape) == ([128, 64], [64, 1], [64, 64])
    given = TensorDescriptor.from_tensor(x2, [64, 64], layout)
    assert plans.relaunch("key", given, out2) and runs[-1][-2] is given  # a descriptor goes in as it is


def _full_launch_only(monkeypatch, owner, name="plans"):
    """Give `owner.name` an empty LaunchPlans: every call then launches the full way."""
    monkeypatch.setattr(owner, name, LaunchPlans(getattr(owner, name).kernel))


def _choose_config(monkeypatch, *, descriptors: bool) -> None:
    """For the causal float16 calls at 100 keys and d = 64 of these tests, have chapter 5's tuned launcher
    take a configuration that loads K and V through descriptors (or pointers), as if the autotuner chose it."""
    block_d, _ = ch05._head_dim_blocks(64)
    tuning_key = (triton.next_power_of_2(100), 64, True, block_d, ch05.EITHER, torch.float16, False)
    config = next(c for c in ch05.TUNED.configs if c.kwargs["USE_DESCRIPTORS"] == descriptors
                  and c.kwargs["BLOCK_M"] <= 64 and c.kwargs["BLOCK_N"] <= 64)
    monkeypatch.setitem(ch05.TUNED.choices, tuning_key, config)


def _forbid_triton_dispatch(monkeypatch, kernel):
    def refuse(*args, **kwargs):
        raise AssertionError("the remembered launch went through Triton's dispatch")
    monkeypatch.setattr(type(kernel), "run", refuse)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", [(1, 3, 1, 64, "bhnd", False), (2, 4, 100, 80, "bnhd", True),
                                  (1, 8, 300, 128, "bhnd", True), (2, 2, 257, 256, "bnhd", False)],
                         ids=lambda c: "b{}h{}n{}d{}-{}-{}".format(*c[:5], "out" if c[5] else "new"))
def test_a_remembered_launch_computes_what_the_full_launch_computes(monkeypatch, case, dtype, matmul_precision):
    # float32 is tuned (and remembered) only on the tensor cores, in TF32: full float32 runs the
    # configuration of `precision.full_float32_tiles` (`precision.autotunes`)
    batch, heads, n, head_dim, layout, with_out = case
    matmul_precision("high")
    _full_launch_only(monkeypatch, ch05.TUNED)
    outputs = []
    for call in range(3):  # the autotuner's call, the call that is remembered, the repeat
        q, k, v, seed = _inputs(batch, heads, n, head_dim, dtype, layout)
        out = poisoned((batch, n, heads, head_dim), dtype, "cuda").transpose(1, 2) if with_out else None
        if call == 2:
            assert len(ch05.TUNED.plans) == 1
            _forbid_triton_dispatch(monkeypatch, ch05.TUNED.kernel)
        o = ch05.flash_attn_v2_tuned(q, k, v, True, out=out)
        assert out is None or o is out
        assert_close(o, reference_attention(q, k, v, True), dtype, seed=seed)
        outputs.append((q, k, v, o.clone()))
    monkeypatch.undo()  # the full launch again, for the same inputs: the same bits
    q, k, v, o = outputs[-1]
    _full_launch_only(monkeypatch, ch05.TUNED)
    torch.testing.assert_close(ch05.flash_attn_v2_tuned(q, k, v, True), o, rtol=0, atol=0)


@needs_gpu
def test_another_alignment_or_lse_is_another_launch(monkeypatch):
    _full_launch_only(monkeypatch, ch05.TUNED)
    q, k, v, seed = _inputs(1, 2, 100, 64, torch.float16)
    for _ in range(2):
        ch05.flash_attn_v2_tuned(q, k, v)
    # the same shapes and strides, but an address 2 bytes past a 16-byte boundary: Triton compiled
    # the remembered kernel for aligned addresses, so this call must not reach it
    q2 = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")[1:].view(q.shape).copy_(q)
    for _ in range(2):
        assert_close(ch05.flash_attn_v2_tuned(q2, k, v), reference_attention(q, k, v), torch.float16, seed=seed)
    for _ in range(2):  # the log-sum-exp is a fifth tensor argument: another key, another launch
        ch05.flash_attn_v2_with_lse(q, k, v, tuned=True)
    assert len(ch05.TUNED.plans) == 3
    _forbid_triton_dispatch(monkeypatch, ch05.TUNED.kernel)
    q, k, v, seed = _inputs(1, 2, 100, 64, torch.float16)  # the remembered launch, on new tensors
    o, lse = ch05.flash_attn_v2_with_lse(q, k, v, tuned=True)
    assert_close(o, reference_attention(q, k, v), torch.float16, seed=seed)
    assert_close(lse.double(), reference_log_sum_exp(reference_scores(q, k, False)), torch.float16, seed=seed,
                 what="lse")


@needs_gpu
def test_a_remembered_launch_with_descriptors_runs_in_another_thread(monkeypatch):
    # Kernels that make TMA descriptors need Triton's allocator, which is set per thread: a relaunch
    # from a thread that never made the full call (a generate() in a worker thread) must set it too.
    import threading

    _full_launch_only(monkeypatch, ch05.TUNED)
    q, k, v, seed = _inputs(1, 2, 100, 64, torch.float16)
    _choose_config(monkeypatch, descriptors=True)
    ch05.flash_attn_v2_tuned(q, k, v, True)  # remembered, in this thread
    _forbid_triton_dispatch(monkeypatch, ch05.TUNED.kernel)
    result = {}

    def worker():
        try:
            result["out"] = ch05.flash_attn_v2_tuned(q, k, v, True)
        except Exception as err:  # noqa: BLE001 (reported below, in the test's thread)
            result["error"] = err
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert "error" not in result, result.get("error")
    assert_close(result["out"], reference_attention(q, k, v, True), torch.float16, seed=seed)


@needs_gpu
def test_a_remembered_launch_keeps_no_memory_alive(monkeypatch):
    _full_launch_only(monkeypatch, ch05.TUNED)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(3):  # tuned, remembered, relaunched
        q, k, v, _ = _inputs(1, 4, 4096, 64, torch.float16)
        o = ch05.flash_attn_v2_tuned(q, k, v, True)
        del q, k, v, o
    assert len(ch05.TUNED.plans) == 1
    assert torch.cuda.memory_allocated() <= before, "a remembered launch holds on to a call's tensors"


@needs_gpu
def test_bad_arguments_still_get_the_full_checks_errors_after_a_remembered_launch():
    q, k, v, _ = _inputs(1, 2, 64, 64, torch.float16)
    for _ in range(3):
        ch05.flash_attn_v2_tuned(q, k, v, True)
    with pytest.raises(TypeError, match="causal must be a bool"):
        ch05.flash_attn_v2_tuned(q, k, v, 1)
    with pytest.raises(TypeError, match="sm_scale must be a float or None"):
        ch05.flash_attn_v2_tuned(q, k, v, True, True)
    with pytest.raises(TypeError, match="k.dtype must equal q.dtype"):
        ch05.flash_attn_v2_tuned(q, k.float(), v, True)
    with pytest.raises(ValueError, match="out must have shape"):
        ch05.flash_attn_v2_tuned(q, k, v, True, out=torch.empty(1, 2, 63, 64, dtype=q.dtype, device="cuda"))


@needs_gpu
def test_a_launch_hook_sees_remembered_launches(monkeypatch):
    from triton import knobs

    q, k, v, seed = _inputs(1, 2, 64, 64, torch.float16)
    for _ in range(2):
        ch05.flash_attn_v2_tuned(q, k, v, True)
    seen = []
    hook = seen.append  # a profiler's launch hook (Proton's) receives each launch's metadata
    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "calls"):  # recent Triton keeps a chain of hooks
        monkeypatch.setattr(chain, "calls", [*chain.calls, hook])
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    _forbid_triton_dispatch(monkeypatch, ch05.TUNED.kernel)
    assert_close(ch05.flash_attn_v2_tuned(q, k, v, True), reference_attention(q, k, v, True), torch.float16,
                 seed=seed)
    assert len(seen) == 1, "a profiler's hook must see every launch, remembered ones too"


@pytest.mark.gpu("the Gluon kernel")
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a GPU of compute capability 9.x (H100/H200)")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [(1, 4, 2, 300, 300), (1, 32, 8, 1024, 1024), (2, 2, 2, 1, 700),
                                   (1, 9, 9, 64, "beyond")],
                         ids=lambda s: "b{}h{}kv{}-nq{}-nk{}".format(*s))
def test_the_hopper_kernel_remembers_its_launch_and_not_forced_schedules(monkeypatch, shape, causal):
    from tutorial_kernels import ch07_hopper

    batch, heads, kv_heads, n_q, n_k = shape
    if n_k == "beyond":  # one head's K and V beyond an eighth of the L2, all of them beyond the L2
        n_k = torch.cuda.get_device_properties(0).L2_cache_size // 8 // (2 * 128 * 2) + 64
    kv_bytes = batch * kv_heads * 2 * n_k * 128 * 2
    one_program_per_item = not ch07_hopper.runs_persistent(kv_bytes, batch * kv_heads, causal,
                                                           torch.cuda.get_device_properties(0).L2_cache_size)
    assert one_program_per_item == (shape[4] == "beyond"), "the shapes cover both kinds of launch"
    _full_launch_only(monkeypatch, ch07_hopper, "_launches")
    for call in range(3):
        x = random_qkv(batch, heads, n_q, n_k, 128, torch.bfloat16, "cuda", layout="bnhd")
        k, v = x.k[:, :kv_heads], x.v[:, :kv_heads]
        out = poisoned((batch, n_q, heads, 128), torch.bfloat16, "cuda").transpose(1, 2)
        if call == 2:
            assert len(ch07_hopper._launches) == 1
            _forbid_triton_dispatch(monkeypatch, ch07_hopper._flash_hopper_fwd)
        assert ch07_hopper.flash_attn_hopper(x.q, k, v, causal, out=out) is out
        group = heads // kv_heads
        ref = reference_attention(x.q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal)
        assert_close(out, ref, torch.bfloat16, seed=x.seed)
    monkeypatch.undo()
    _full_launch_only(monkeypatch, ch07_hopper, "_launches")
    ch07_hopper._launch(x.q, k, v, causal, 0.1, out, programs=1, plan="a key")  # a forced schedule
    assert len(ch07_hopper._launches) == 0



@pytest.mark.gpu("the Gluon kernel")
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a GPU of compute capability 9.x (H100/H200)")
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("with_out", [True, False], ids=["out", "no-out"])
def test_the_front_door_relaunches_the_hopper_kernel_under_its_own_key(monkeypatch, head_dim, with_out):
    # The front door remembers the Hopper kernel's launch key with its decision and relaunches from
    # the second call on, with each call's own tensors, neither recomputing that key nor dispatching.
    from tutorial_kernels import attention, ch07_hopper

    _full_launch_only(monkeypatch, ch07_hopper, "_launches")
    monkeypatch.setattr(attention, "_DECISIONS", {})
    batch, heads, kv_heads, n = 1, 8, 2, 2100
    for call in range(3):
        x = random_qkv(batch, heads, n, n, head_dim, torch.bfloat16, "cuda", layout="bnhd")
        k, v = x.k[:, :kv_heads], x.v[:, :kv_heads]
        out = poisoned((batch, n, heads, head_dim), torch.bfloat16, "cuda").transpose(1, 2) if with_out else None
        if call == 2:
            (kernel, _, _, plan), = attention._DECISIONS.values()
            assert kernel == "hopper" and plan in ch07_hopper._launches
            _forbid_triton_dispatch(monkeypatch, ch07_hopper._flash_hopper_fwd)
            monkeypatch.setattr(ch07_hopper, "attention_call_key", None)  # flash_attn_hopper is not called
        with torch.no_grad():
            got = attention.flash_attention(x.q, k, v, True, out=out)
        assert out is None or got is out
        group = heads // kv_heads
        ref = reference_attention(x.q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), True)
        assert_close(got, ref, torch.bfloat16, seed=x.seed)


def _stand_in_launcher(c_launch, descriptor_meta=None, descriptor_indices=(), scratch=0):
    """An object laid out as Triton 3.6's `CudaLauncher`: its `launch` is the C launcher itself, or
    with descriptor arguments a Python wrapper whose closure holds the C launcher and their metadata."""
    from types import new_class

    if descriptor_meta is None:
        launch = c_launch
    else:
        def make(launcher, tensordesc_meta, tensordesc_indices):
            def inner(*args):
                return launcher, tensordesc_meta, tensordesc_indices
            return inner
        launch = make(c_launch, descriptor_meta, set(descriptor_indices))
    cls = new_class("CudaLauncher")
    run = cls()
    run.launch, run.global_scratch_size, run.profile_scratch_size = launch, scratch, 0
    run.launch_cooperative_grid, run.launch_pdl = False, True
    return run


def test_a_direct_launch_gives_the_c_launcher_the_arguments_triton_would(monkeypatch):
    # Triton 3.6's wrapper expands each descriptor into [its encoded map, *shape, *strides] and calls the
    # C launcher after 13 leading arguments; a direct launch must make exactly that call, with each
    # descriptor encoded at the new tensor's address, and refuse any launcher laid out otherwise.
    from types import SimpleNamespace

    from tutorial_kernels.perf import direct_launch as dl

    encoded = []

    def encode(address, *encoding):
        encoded.append((address, encoding))
        return ("map", address)
    monkeypatch.setattr(dl, "_known_launcher", lambda: (encode, {5: 6}))  # as Triton 3.6's driver gives them
    calls = []

    class CLaunch:  # stands in for the compiled module's launch: a callable that is no Python function
        def __call__(self, *args):
            calls.append(args)
    c_launch = CLaunch()
    desc = SimpleNamespace(base=torch.empty(0), shape=[128, 64], strides=[64, 1], padding="zero")
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 5, "block_size": [64, 64], "fp4_padded": False}
    arguments = [desc, 7, torch.empty(3), 0.5, 16]  # kernel(x_desc, n, out, scale, BLOCK: constexpr)
    compiled = SimpleNamespace(run=_stand_in_launcher(c_launch, [meta], [0]), function=11,
                               packed_metadata="meta")
    direct = dl.direct_launch(compiled, (4, 2, 1), arguments, (0, 2), lambda a: a is desc)
    assert direct is not None
    assert not any(isinstance(a, torch.Tensor) for a in direct.expanded), "a direct launch keeps no tensor"
    x, out = torch.randn(128, 64), torch.empty(3)
    direct(99, (x, out))
    assert encoded == [(x.data_ptr(), (3, 2, 6, [64, 64], [128, 64], [64, 1], 0))]
    assert calls == [(4, 2, 1, 99, 11, False, True, None, None, "meta", None, None, None,
                      ("map", x.data_ptr()), 128, 64, 64, 1, 7, out, 0.5, 16)]
    direct(98, (x, out))  # the same address: its map is reused, not encoded again
    assert len(encoded) == 1 and calls[-1] == (*calls[0][:3], 98, *calls[0][4:])
    x2 = torch.randn(128, 64)
    direct(99, (x2, out))
    assert encoded[-1][0] == x2.data_ptr() and calls[-1][13] == ("map", x2.data_ptr())
    with pytest.raises(ValueError):  # one tensor too few: never a launch with a stale argument
        direct(99, (x,))
    monkeypatch.setattr(dl, "MAX_ENCODED", 2)  # beyond it the remembered maps are dropped, then re-encoded
    direct(99, (torch.randn(128, 64), out))
    assert len(direct.encoded) == 1 and len(encoded) == 3
    nan_padded = SimpleNamespace(base=torch.empty(0), shape=[128, 64], strides=[64, 1], padding="nan")
    padded = dl.direct_launch(compiled, (4, 2, 1), [nan_padded, *arguments[1:]], (0, 2), lambda a: a is nan_padded)
    assert padded.encodings[0][-1] == 1  # out-of-bounds elements read as NaN: the encoding's last flag
    # launchers laid out otherwise: Triton's path is kept
    for run in (_stand_in_launcher(c_launch, [meta], [0], scratch=128),  # scratch from Python's allocator
                _stand_in_launcher(c_launch, [meta], [1]),  # descriptors somewhere else
                _stand_in_launcher(c_launch, [None], [0]),  # descriptors without metadata
                _stand_in_launcher(c_launch, [{**meta, "fp4_padded": True}], [0]),  # a descriptor kind not known
                _stand_in_launcher(lambda *a: None, [meta], [0]),  # Python where the C launcher goes
                SimpleNamespace(launch=c_launch, global_scratch_size=0, profile_scratch_size=0)):  # another class
        other = SimpleNamespace(run=run, function=11, packed_metadata="meta")
        assert dl.direct_launch(other, (4, 2, 1), arguments, (0, 2), lambda a: a is desc) is None
    plain = SimpleNamespace(run=_stand_in_launcher(c_launch), function=11, packed_metadata="meta")
    assert dl.direct_launch(plain, (4, 1, 1), [torch.empty(3), 7], (0,), lambda a: False) is not None
    wrapped = SimpleNamespace(run=_stand_in_launcher(lambda *a: None), function=11, packed_metadata="meta")
    assert dl.direct_launch(wrapped, (4, 1, 1), [torch.empty(3), 7], (0,), lambda a: False) is None
    tupled = [desc, (torch.empty(3), 1), torch.empty(3), 0.5, 16]  # a tensor inside a tuple: not replaced
    assert dl.direct_launch(compiled, (4, 2, 1), tupled, (0, 2), lambda a: a is desc) is None
    monkeypatch.setattr(dl, "_known_launcher", lambda: None)  # another Triton: with descriptors or without
    assert dl.direct_launch(compiled, (4, 2, 1), arguments, (0, 2), lambda a: a is desc) is None
    assert dl.direct_launch(plain, (4, 1, 1), [torch.empty(3), 7], (0,), lambda a: False) is None


def test_the_direct_launch_knows_only_its_tritons_launcher():
    # This machine's Triton: on 3.6 (the GPU machine's) the driver's leading C-launcher arguments are
    # the ones direct_launch.py passes; any other version's driver must be refused, not guessed at.
    import triton.backends.nvidia.driver as nvidia

    from tutorial_kernels.perf import direct_launch as dl

    known = getattr(nvidia, "_BASE_ARGS_FORMAT", None) == dl._BASE_ARGS_FORMAT
    if triton.__version__.startswith("3.6"):
        assert known, getattr(nvidia, "_BASE_ARGS_FORMAT", None)
    if not known:
        assert dl._known_launcher() is None


def test_launch_hooks_that_call_nothing_allow_a_direct_launch():
    from types import SimpleNamespace

    from tutorial_kernels.perf.direct_launch import no_launch_hooks

    empty, set_ = SimpleNamespace(calls=[]), SimpleNamespace(calls=[print])
    assert no_launch_hooks(None, None) and no_launch_hooks(empty, empty) and no_launch_hooks(None, empty)
    assert not no_launch_hooks(set_, empty) and not no_launch_hooks(empty, set_) and not no_launch_hooks(print, None)


def _refuse(*args, **kwargs):
    raise AssertionError("the relaunch went through Triton's launcher, not the C launcher directly")


@pytest.mark.gpu("the Gluon kernel")
@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a GPU of compute capability 9.x (H100/H200)")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_a_direct_relaunch_writes_the_bits_tritons_launcher_writes(monkeypatch, head_dim):
    # The Hopper kernel's three TMA descriptors, encoded at the new tensors' addresses by the direct
    # launch, against Triton's own launcher (taken while a launch hook is set) on the same inputs.
    from triton import knobs

    from tutorial_kernels import ch07_hopper

    _full_launch_only(monkeypatch, ch07_hopper, "_launches")
    x = random_qkv(1, 6, 333, 517, head_dim, torch.bfloat16, "cuda", layout="bnhd")
    q, k, v = x.q, x.k[:, :2], x.v[:, :2]
    outputs = []
    for call in range(3):  # the full launch, the direct relaunch, Triton's launcher under a hook
        out = poisoned((1, 333, 6, head_dim), torch.bfloat16, "cuda").transpose(1, 2)
        if call == 1:
            (plan,) = ch07_hopper._launches._plans.values()
            assert plan.direct is not None, (f"Triton {triton.__version__}'s launcher is not laid out as "
                                             "perf/direct_launch.py knows: relaunches take its slower path")
            _forbid_triton_dispatch(monkeypatch, ch07_hopper._flash_hopper_fwd)
            launcher = type(plan.compiled.run)  # Triton's launcher class; `run` is a read-only property
            tritons_call = launcher.__call__
            monkeypatch.setattr(launcher, "__call__", _refuse)
        if call == 2:
            monkeypatch.setattr(launcher, "__call__", tritons_call)
            chain = knobs.runtime.launch_enter_hook
            seen = []
            if hasattr(chain, "calls"):
                monkeypatch.setattr(chain, "calls", [*chain.calls, seen.append])
            else:
                monkeypatch.setattr(knobs.runtime, "launch_enter_hook", seen.append)
        assert ch07_hopper.flash_attn_hopper(q, k, v, True, out=out) is out
        outputs.append(out)
    assert len(seen) == 1, "under a launch hook the relaunch takes Triton's launcher, which calls it"
    group = 3
    ref = reference_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), True)
    assert_close(outputs[1], ref, torch.bfloat16, seed=x.seed)
    for other in (outputs[0], outputs[2]):
        torch.testing.assert_close(outputs[1], other, rtol=0, atol=0)


@needs_gpu
def test_a_tuned_triton_kernel_relaunches_directly(monkeypatch):
    # Chapter 5's kernel with pointer arguments (no descriptors, so no scratch memory): its relaunch
    # goes to the C launcher too, and computes what the full launch computes.
    _full_launch_only(monkeypatch, ch05.TUNED)
    q, k, v, seed = _inputs(1, 2, 100, 64, torch.float16)
    _choose_config(monkeypatch, descriptors=False)
    first = ch05.flash_attn_v2_tuned(q, k, v, True)
    (plan,) = ch05.TUNED.plans._plans.values()
    assert plan.direct is not None, f"Triton {triton.__version__}'s launcher is not the one direct_launch knows"
    _forbid_triton_dispatch(monkeypatch, ch05.TUNED.kernel)
    monkeypatch.setattr(type(plan.compiled.run), "__call__", _refuse)
    again = ch05.flash_attn_v2_tuned(q, k, v, True)
    assert_close(again, reference_attention(q, k, v, True), torch.float16, seed=seed)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_the_front_door_relaunches_the_tuned_triton_kernel_under_its_own_key(monkeypatch, dtype):
    # At d = 80 the front door runs chapter 5's tuned kernel; from the third call on (the first is the
    # autotuner's, which remembers nothing) it relaunches that kernel's launch without calling chapter 5.
    # float32 follows torch's matmul precision, which the front door's key does not see: never relaunched.
    from tutorial_kernels import attention

    _full_launch_only(monkeypatch, ch05.TUNED)
    monkeypatch.setattr(attention, "_DECISIONS", {})
    for call in range(4):
        x = random_qkv(1, 4, 300, 333, 80, dtype, "cuda", layout="bnhd")
        out = poisoned((1, 300, 4, 80), dtype, "cuda").transpose(1, 2)
        if call == 3 and dtype != torch.float32:
            (kernel, _, _, plan), = attention._DECISIONS.values()
            assert kernel == "triton-tuned" and plan in ch05.TUNED.plans
            _forbid_triton_dispatch(monkeypatch, ch05.TUNED.kernel)
            monkeypatch.setattr(ch05, "_launch_tuned", _refuse)  # flash_attn_v2_tuned is not called
        with torch.no_grad():
            assert attention.flash_attention(x.q, x.k, x.v, True, out=out) is out
        assert_close(out, reference_attention(x.q, x.k, x.v, True), dtype, seed=x.seed)
    if dtype == torch.float32:
        (kernel, _, _, plan), = attention._DECISIONS.values()
        assert plan is None
