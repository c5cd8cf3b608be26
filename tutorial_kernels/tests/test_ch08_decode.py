"""Chapter 8's decode attention against a KV cache: per-sequence lengths (0 and 1 included), keys
appended in place, contiguous and paged caches (blocks partly filled, shuffled in the pool), GQA and
MQA packing, any number of splits (some with no key), n_q > 1 with the bottom-right causal mask, odd
head dims; every buffer poisoned with NaN; outputs within the peers' rule (2 × PyTorch's own error in
the same dtype, elementwise, against float64)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tutorial_kernels import ch08_decode
from tutorial_kernels.ch08_decode import MAX_SPLITS, choose_num_splits, flash_attention_with_kvcache, resident_programs
from tutorial_kernels.inputs import fresh_seed
from tutorial_kernels.reference import cached_keys, reference_kvcache_attention
from tutorial_kernels.testing import (KERNEL_DTYPES, ON_GPU, PEER_OUTPUT_FACTOR, assert_within_peer_rule,
                                      torch_attention_same_dtype)
from tutorial_kernels.runtime import default_device

DEVICE = default_device()


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    heads: int
    kv_heads: int
    n_q: int
    head_dim: int
    lengths: tuple[int, ...]  # cached keys per sequence, before the append
    n_new: int  # keys and values appended
    block_size: int | None  # None: a contiguous cache
    num_splits: int | None
    causal: bool = True
    int64: bool = False  # cache_seqlens and block_table as int64
    layout: str = "bhnd"  # "bnhd": q and the cache as flash-attn lays them out, (…, tokens, heads, d) transposed

    @property
    def id(self) -> str:
        cache = f"paged{self.block_size}" if self.block_size else "contiguous"
        return (f"b{self.batch}h{self.heads}kv{self.kv_heads}-nq{self.n_q}-d{self.head_dim}-len"
                f"{'_'.join(map(str, self.lengths))}-new{self.n_new}-{cache}-splits{self.num_splits}-"
                f"{'causal' if self.causal else 'full'}{'-int64' if self.int64 else ''}-{self.layout}")


CASES = [
    DecodeCase(2, 4, 2, 1, 64, (37, 5), 0, None, None),  # decode, GQA, the rule's splits
    DecodeCase(3, 4, 1, 1, 59, (0, 1, 50), 1, None, 3),  # MQA; an empty cache and one key, one appended
    DecodeCase(2, 6, 2, 3, 80, (20, 0), 2, 16, 4),  # speculative tokens; paged, partly filled blocks
    DecodeCase(1, 2, 2, 1, 16, (3,), 0, 16, 5),  # MHA; splits that see no key
    DecodeCase(2, 8, 2, 5, 32, (9, 40), 0, 16, 2, causal=False),
    DecodeCase(2, 4, 4, 17, 16, (4, 30), 0, None, 1),  # a prompt chunk longer than some caches: blind rows
    DecodeCase(2, 4, 2, 3, 32, (3, 22), 5, 5, 3, int64=True),  # blocks of 5 (< BLOCK_N): appends cross 2 blocks
    DecodeCase(2, 6, 3, 2, 16, (20, 47), 7, 24, None, layout="bnhd"),  # blocks of 24, flash-attn's layout
    DecodeCase(2, 4, 2, 1, 16, (9, 30), 2, None, 2, int64=True, layout="bnhd"),
]
if ON_GPU:
    CASES += [
        DecodeCase(8, 32, 8, 1, 128, (4096, 1, 3000, 0, 4095, 17, 2048, 1000), 1, None, None),
        DecodeCase(4, 32, 8, 1, 128, (5000, 100, 0, 4097), 1, 256, None),
        DecodeCase(4, 32, 32, 2, 64, (777, 1025, 1, 64), 2, 16, None),
        DecodeCase(2, 16, 2, 64, 256, (300, 2000), 64, None, 7),
    ]


def _capacity(case: DecodeCase) -> int:
    longest = max(case.lengths) + case.n_new
    block = case.block_size or 16
    return (longest // block + 2) * block  # room past the longest sequence: keys there must not be read


def _draw(case: DecodeCase, dtype: torch.dtype, seed: int):
    """q, the cache (random everywhere, also past each sequence's end), new k and v, the lengths and
    the block table (blocks of the pool in a random order, never shared)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)  # noqa: E731
    capacity = _capacity(case)
    if case.layout == "bnhd":  # drawn (…, tokens, heads, d), seen as (…, heads, tokens, d)
        randn4 = lambda a, h, n, d: randn(a, n, h, d).transpose(1, 2)  # noqa: E731
    else:
        randn4 = randn
    q = randn4(case.batch, case.heads, case.n_q, case.head_dim)
    if case.block_size is None:
        shape, table = (case.batch, case.kv_heads, capacity, case.head_dim), None
    else:
        per_sequence = capacity // case.block_size
        pool = case.batch * per_sequence + 3  # spare blocks nobody owns
        shape = (pool, case.kv_heads, case.block_size, case.head_dim)
        table = torch.randperm(pool, generator=gen)[:case.batch * per_sequence].view(case.batch, per_sequence)
        table = table.to(torch.int64 if case.int64 else torch.int32).to(DEVICE)
    k_cache, v_cache = randn4(*shape), randn4(*shape)
    k = v = None
    if case.n_new:
        k, v = (randn4(case.batch, case.kv_heads, case.n_new, case.head_dim) for _ in "kv")
    lengths = torch.tensor(case.lengths, dtype=torch.int64 if case.int64 else torch.int32, device=DEVICE)
    return q, k_cache, v_cache, k, v, lengths, table


def _pytorch_same_dtype(q, k_cache, v_cache, n_keys, table, causal):
    """PyTorch's attention in q's dtype, one sequence at a time over its cached keys (zeros without keys)."""
    outs = []
    for b in range(q.shape[0]):
        n = int(n_keys[b])
        k, v = cached_keys(k_cache, b, n, table), cached_keys(v_cache, b, n, table)
        outs.append(torch_attention_same_dtype(q[b:b + 1], k, v, causal) if n else torch.zeros_like(q[b:b + 1]))
    return torch.cat(outs)


@pytest.fixture
def poisoned_buffers(monkeypatch):
    """Every buffer the launcher allocates starts as NaN: an element no kernel writes stays NaN."""
    def empty(*shape, dtype, device):
        return torch.full(*shape, float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(ch08_decode, "_empty", empty)


def _call_and_check(case: DecodeCase, dtype: torch.dtype, seed: int, call=flash_attention_with_kvcache,
                    misaligned: bool = False) -> None:
    """One call on fresh inputs drawn from `seed`, checked: the output and lse against float64 within the
    peers' rule, and the cache after the append. `misaligned`: q starts one element past a 16-byte boundary."""
    q, k_cache, v_cache, k, v, lengths, table = _draw(case, dtype, seed)
    if misaligned:
        q = torch.cat([q.new_zeros(1), q.reshape(-1)])[1:].view(q.shape)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out, lse = call(q, k_cache, v_cache, k, v, cache_seqlens=lengths, block_table=table,
                    causal=case.causal, num_splits=case.num_splits, return_lse=True)
    n_keys = lengths + case.n_new
    want, want_lse = reference_kvcache_attention(q, k_cache, v_cache, n_keys, table, case.causal)
    baseline = _pytorch_same_dtype(q, k_cache, v_cache, n_keys, table, case.causal)
    assert_within_peer_rule(out, want, baseline, factor=PEER_OUTPUT_FACTOR, seed=seed)
    blind = torch.isinf(want_lse)
    assert torch.equal(torch.isneginf(lse), blind), f"lse is −∞ exactly where a row sees no key; seed={seed}"
    assert (lse[~blind].double() - want_lse[~blind]).abs().max().item() <= 1e-3 if (~blind).any() else True, \
        f"lse: {(lse[~blind].double() - want_lse[~blind]).abs().max().item():.2e}; seed={seed}"
    # the append wrote the new rows, and only them: the expected cache written one (sequence, token) at a time
    expected_k, expected_v = before_k.clone(), before_v.clone()
    for b in range(case.batch):
        for t in range(case.n_new):
            position = int(lengths[b]) + t
            if table is None:
                where = (b, slice(None), position)
            else:
                where = (int(table[b, position // case.block_size]), slice(None), position % case.block_size)
            expected_k[where], expected_v[where] = k[b, :, t], v[b, :, t]
    assert torch.equal(k_cache, expected_k), f"the keys cached after the append; seed={seed}"
    assert torch.equal(v_cache, expected_v), f"the values cached after the append; seed={seed}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_decode_matches_float64_within_the_peer_rule(case: DecodeCase, dtype: torch.dtype, poisoned_buffers):
    _call_and_check(case, dtype, fresh_seed())


@pytest.mark.parametrize("case", CASES[:3] + CASES[-4:], ids=lambda c: c.id)
def test_the_front_door_repeats_a_call_on_new_values(case: DecodeCase, poisoned_buffers):
    """The front door's second call like the first (shapes, strides, dtypes, flags) relaunches the first's
    kernels without checks (on a GPU): new values and lengths in the same shapes must come out right, and
    a q at an address of another alignment must not take the first call's kernels."""
    import tutorial_kernels

    dtype = torch.float16 if ON_GPU else torch.float32
    _call_and_check(case, dtype, fresh_seed(), tutorial_kernels.flash_attention_with_kvcache)
    shuffled = DecodeCase(**{**case.__dict__, "lengths": case.lengths[::-1]})  # the same shapes, other lengths
    _call_and_check(shuffled, dtype, fresh_seed(), tutorial_kernels.flash_attention_with_kvcache)
    _call_and_check(shuffled, dtype, fresh_seed(), tutorial_kernels.flash_attention_with_kvcache, misaligned=True)


def test_the_splits_merge_to_the_one_pass_answer():
    """Any number of splits gives the one-split output, to rounding (the merge is exact in real numbers)."""
    case = DecodeCase(2, 4, 2, 2, 32, (150, 12), 0, None, None)  # 150 keys: up to 10 key tiles of 16
    q, k_cache, v_cache, _, _, lengths, _ = _draw(case, torch.float32, fresh_seed())
    one = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=1)
    for splits in (2, 3, 7, 10, 40):
        many = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=splits)
        assert (many - one).abs().max().item() < 1e-5, splits


def test_an_int_length_means_every_sequence():
    case = DecodeCase(2, 2, 1, 1, 16, (20, 20), 0, None, 1)
    q, k_cache, v_cache, _, _, lengths, _ = _draw(case, torch.float32, fresh_seed())
    by_tensor = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert torch.equal(flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=20), by_tensor)


def test_num_splits_keeps_the_memory_busy_without_a_partial_wave_and_keeps_splits_long():
    # 8 programs: 49 splits make 392, the most that one wave of 3 programs per SM (396) holds
    assert choose_num_splits(1, 8, 1, 32768, 132, 64, resident=3) == 49
    assert choose_num_splits(64, 8, 1, 32768, 132, 64, resident=4) == 1  # 512 programs: one wave of 528 holds them
    # with 3 per SM, 512 programs would leave a second wave of 116 (too few to keep the memory busy): 3 splits
    # make 1536 programs, 3.9 waves
    assert choose_num_splits(64, 8, 1, 32768, 132, 64, resident=3) == 3
    assert choose_num_splits(1, 8, 1, 1000, 132, 64) == 3  # no split shorter than 256 keys
    assert choose_num_splits(1, 1, 1, 100, 132, 64) == 1
    for batch, kv_heads, keys in ((1, 1, 10**6), (3, 5, 777), (128, 32, 4096), (2, 8, 300)):
        splits = choose_num_splits(batch, kv_heads, 1, keys, 132, 64)
        assert 1 <= splits <= min(MAX_SPLITS, max(1, keys // 256)), (batch, kv_heads, keys, splits)


def test_resident_programs_counts_shared_memory_and_registers():
    tiles = dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=3)  # the GPU's decode tile
    assert resident_programs(tiles, 128, 2) == 3  # (2 · 2 · 64 + 16) · 128 · 2 B + 1 KiB = 69 KiB of 227
    assert resident_programs(tiles, 64, 2) == 4  # 35 KiB: 6 by shared memory, 4 by 128 registers × 128 threads


def _valid():
    q = torch.randn(2, 4, 1, 16, device=DEVICE)
    cache = torch.randn(2, 2, 32, 16, device=DEVICE)
    return q, cache, cache.clone()


@pytest.mark.parametrize("change, error, match", [
    (lambda a: {**a, "q": a["q"].double()}, TypeError, r"q\.dtype"),
    (lambda a: {**a, "k_cache": a["k_cache"].half()}, TypeError, r"k_cache\.dtype"),
    (lambda a: {**a, "q": a["q"][0]}, ValueError, r"q must have 4 dimensions"),
    (lambda a: {**a, "k_cache": torch.randn(2, 3, 32, 16, device=DEVICE), "v_cache": torch.randn(2, 3, 32, 16,
                                                                                        device=DEVICE)},
     ValueError, r"k_cache's heads \(3\) must divide q's \(4\)"),
    (lambda a: {**a, "v_cache": a["v_cache"][:, :, :16]}, ValueError, r"k_cache and v_cache must have one shape"),
    (lambda a: {**a, "cache_seqlens": torch.tensor([3], dtype=torch.int32, device=DEVICE)}, ValueError,
     r"cache_seqlens must be \(2,\)"),
    (lambda a: {**a, "cache_seqlens": torch.tensor([3.0, 1.0], device=DEVICE)}, TypeError, r"cache_seqlens\.dtype"),
    (lambda a: {**a, "k": torch.randn(2, 2, 1, 16, device=DEVICE)}, ValueError, r"k and v must be given together"),
    (lambda a: {**a, "block_table": torch.zeros(2, 2, dtype=torch.float32, device=DEVICE)}, TypeError,
     r"block_table\.dtype"),
    (lambda a: {**a, "num_splits": 0}, ValueError, r"num_splits"),
    (lambda a: {**a, "num_splits": True}, ValueError, r"num_splits"),
    (lambda a: {**a, "cache_seqlens": True}, TypeError, r"cache_seqlens must be an int"),
    (lambda a: {**a, "sm_scale": "x"}, TypeError, r"sm_scale must be None or a number"),
    (lambda a: {**a, "q": a["q"].requires_grad_()}, ValueError, r"computes no gradients"),
    (lambda a: {**a, "causal": 1}, TypeError, r"causal must be a bool"),
])
def test_bad_input_names_the_argument(change, error, match):
    q, k_cache, v_cache = _valid()
    args = change(dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=torch.tensor([3, 5], dtype=torch.int32,
                                                                                         device=DEVICE)))
    with pytest.raises(error, match=match):
        flash_attention_with_kvcache(**args)


@pytest.mark.cpu("bfloat16, which the interpreter computes wrongly")
def test_bfloat16_is_refused_in_the_interpreter():
    q, k_cache, v_cache = (t.bfloat16() for t in _valid())
    with pytest.raises(TypeError, match=r"q: dtype torch.bfloat16 is not supported under Triton's interpreter"):
        flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=3)


@pytest.mark.cpu("a length past the capacity, checked where checking is free")
def test_a_length_past_the_cache_is_refused_on_the_cpu():
    q, k_cache, v_cache = _valid()
    with pytest.raises(ValueError, match=r"cache_seqlens \+ n_new must be within 0 … 32"):
        flash_attention_with_kvcache(q, k_cache, v_cache, torch.randn(2, 2, 2, 16), torch.randn(2, 2, 2, 16),
                                     cache_seqlens=torch.tensor([31, 3], dtype=torch.int32))


def test_the_front_door_compiles_without_a_graph_break_and_appends_in_place():
    """`tutorial_kernels.flash_attention_with_kvcache` under torch.compile(fullgraph=True): one operator in
    the graph, the same output and the same cache as eagerly (aot_eager on the CPU, inductor on a GPU)."""
    import tutorial_kernels

    case = DecodeCase(2, 4, 2, 1, 32, (7, 20), 1, 16, None)
    q, k_cache, v_cache, k, v, lengths, table = _draw(case, torch.float32, fresh_seed())
    eager_k, eager_v = k_cache.clone(), v_cache.clone()

    def step(q, k_cache, v_cache, k, v, lengths, table):
        return tutorial_kernels.flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths,
                                                             block_table=table, return_lse=True)

    want, want_lse = step(q, eager_k, eager_v, k, v, lengths, table)
    compiled = torch.compile(step, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    got, got_lse = compiled(q, k_cache, v_cache, k, v, lengths, table)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v)


def test_the_operator_passes_opcheck():
    from tutorial_kernels.attention import _attention_kvcache

    case = DecodeCase(2, 4, 2, 2, 16, (5, 9), 1, None, 2)
    q, k_cache, v_cache, k, v, lengths, _ = _draw(case, torch.float32, fresh_seed())
    torch.library.opcheck(_attention_kvcache, (q, k_cache, v_cache, k, v, lengths, None, True, 0.25, 2))


@pytest.mark.gpu("remembered launches")
def test_a_remembered_call_follows_the_float32_matmul_precision():
    """tl.dot's float32 precision is a setting, not a tensor: it must be part of the call's key."""
    from tutorial_kernels.ch08_decode import kvcache_call_key

    q, k_cache, v_cache = (torch.randn(2, 4, 1, 32, device="cuda"), torch.randn(2, 2, 64, 32, device="cuda"),
                           torch.randn(2, 2, 64, 32, device="cuda"))
    lengths = torch.full((2,), 64, dtype=torch.int32, device="cuda")
    before = torch.get_float32_matmul_precision()
    keys = []
    try:
        for precision in ("highest", "high"):
            torch.set_float32_matmul_precision(precision)
            keys.append(kvcache_call_key(q, k_cache, v_cache, None, None, lengths, None, True, None, None))
    finally:
        torch.set_float32_matmul_precision(before)
    assert keys[0] is not None and keys[0] != keys[1]


@pytest.mark.gpu("remembered launches")
def test_an_int_length_is_remembered_with_its_value(monkeypatch):
    """A growing cache hands one int length to every layer of a step: the second call with that int
    (and the same shapes) repeats the first one's launches, without the checks; another int is another
    call. Each answer equals the same call with the lengths as a tensor."""
    import tutorial_kernels.attention as front
    from tutorial_kernels.attention import flash_attention_with_kvcache

    checked = []
    check = front.check_kvcache_inputs
    monkeypatch.setattr(front, "check_kvcache_inputs", lambda *a: (checked.append(a[5]), check(*a))[1])
    g = torch.Generator(device="cuda").manual_seed(fresh_seed())
    q = torch.randn(2, 8, 1, 64, device="cuda", generator=g).bfloat16()
    k_cache, v_cache = (torch.randn(2, 2, 300, 64, device="cuda", generator=g).bfloat16() for _ in "kv")
    for n in (41, 41, 300, 41, 300):
        got = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=n)
        lengths = torch.full((2,), n, dtype=torch.int32, device="cuda")
        want = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
        assert torch.equal(got, want), f"cache_seqlens={n}"
    assert [n for n in checked if isinstance(n, int)] == [41, 300], f"checked the int lengths {checked}"
