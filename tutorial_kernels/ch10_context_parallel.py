"""Chapter 10 — one sequence across several GPUs: ring attention and all-to-all (Ulysses) context parallelism.

Each of P ranks holds a slice of the sequence (`shard_sequence`). Two ways to attend over all of it:

* **Ring** (Liu et al., 2023): the key/value slices travel around the ring of ranks; at each of P steps a
  rank attends its queries to the slice it holds with the front door's kernel, keeping each row's
  log-sum-exp, and merges the partial result into its running one as chapter 3 merges tiles:

      lse = log(e^{lse_a} + e^{lse_b}),   O = e^{lse_a − lse} O_a + e^{lse_b − lse} O_b

  The next slice is sent and received while the current one is computed (asynchronous point-to-point).
  With a causal mask the slices are cut zig-zag — 2P chunks, rank r holding chunks r and 2P − 1 − r — so
  that every rank has the same work at every step; the backward runs the same ring, the gradients of
  each key/value slice travelling with it and arriving home after P steps.
* **All-to-all** (DeepSpeed-Ulysses, Jacobs et al., 2023): one exchange turns "all heads, N/P of the
  sequence" into "H/P heads, all of the sequence"; each rank runs ordinary attention on its heads; a
  second exchange turns the result back. Needs the heads (and key/value heads) divisible by P.

Both take and return the same layout, (B, H, n_local, d) shards in zig-zag order, and are differentiable.
The process group is torch.distributed's (NCCL on GPUs, gloo on the CPU); every rank calls with its shard.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from tutorial_kernels.attention import flash_attention, flash_attention_backward, flash_attention_forward


# --8<-- [start:zigzag]
def zigzag_chunks(seq_len: int, world: int) -> list[tuple[int, int]]:
    """The 2·world chunks (start, stop) of a sequence of `seq_len` positions, as even as can be (the first
    seq_len mod 2·world chunks one position longer, as torch.tensor_split cuts)."""
    base, extra = divmod(seq_len, 2 * world)
    bounds = [0]
    for c in range(2 * world):
        bounds.append(bounds[-1] + base + (c < extra))
    return list(zip(bounds[:-1], bounds[1:]))


def zigzag_positions(seq_len: int, world: int, rank: int) -> torch.Tensor:
    """The positions rank `rank` holds, in its shard's order: chunk `rank`, then chunk 2·world − 1 − rank.
    Rank 0 takes the first and the last chunk; under a causal mask the early chunk has little to
    attend to and the late one much, so every rank's pair costs the same."""
    chunks = zigzag_chunks(seq_len, world)
    first, second = chunks[rank], chunks[2 * world - 1 - rank]
    return torch.cat([torch.arange(*first), torch.arange(*second)])
# --8<-- [end:zigzag]


def _group_info(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def shard_sequence(x: torch.Tensor, *, dim: int = 2, group=None) -> torch.Tensor:
    """This rank's zig-zag shard of `x` along `dim` (the sequence of a (B, H, N, d) tensor by default),
    a new contiguous tensor. Without an initialised process group: `x` itself (one rank)."""
    world, rank = _group_info(group)
    if world == 1:
        return x
    return x.index_select(dim, zigzag_positions(x.shape[dim], world, rank).to(x.device)).contiguous()


def unshard_sequence(local: torch.Tensor, seq_len: int, *, dim: int = 2, group=None) -> torch.Tensor:
    """The whole sequence from every rank's shard (all ranks call it; each gets the whole tensor)."""
    world, rank = _group_info(group)
    if world == 1:
        return local
    lengths = [len(zigzag_positions(seq_len, world, r)) for r in range(world)]
    longest = max(lengths)
    padded = torch.nn.functional.pad(local.movedim(dim, -1), (0, longest - local.shape[dim])).movedim(-1, dim)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded.contiguous(), group=group)
    whole = local.new_empty(local.shape[:dim] + (seq_len,) + local.shape[dim + 1:])
    for r in range(world):
        index = zigzag_positions(seq_len, world, r).to(local.device)
        whole.index_copy_(dim, index, gathered[r].narrow(dim, 0, lengths[r]))
    return whole


def _local_lengths(n_local: int, seq_len: int | None, world: int, rank: int) -> list[int]:
    """Every rank's shard length; checks this rank's against `seq_len` (default: all shards alike)."""
    if seq_len is None:
        return [n_local] * world
    if not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be the whole sequence's length, an int ≥ 0, got {seq_len!r}")
    lengths = [len(zigzag_positions(seq_len, world, r)) for r in range(world)]
    if lengths[rank] != n_local:
        raise ValueError(f"q: rank {rank} of {world} holds {lengths[rank]} of seq_len={seq_len} positions "
                         f"(`shard_sequence`), got a shard of {n_local}")
    return lengths


# --8<-- [start:merge]
def merge_partials(o: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor, lse_part: torch.Tensor) -> None:
    """Fold a partial result (O_b, lse_b) over other keys into the running (O_a, lse_a), in place: chapter
    3's merge. o: (…, n, d) float32; lse: (…, n) float32, −∞ where no key has been seen yet."""
    new = torch.logaddexp(lse, lse_part)
    # e^{−∞ − (−∞)} is NaN: a row that has seen no key on either side keeps weight 0
    seen = new > -math.inf
    w_old = torch.where(seen, torch.exp(lse - new), 0.0).unsqueeze(-1)
    w_part = torch.where(seen, torch.exp(lse_part - new), 0.0).unsqueeze(-1)
    o.mul_(w_old).addcmul_(w_part, o_part)  # two in-place passes over O, no temporary of O's size
    lse.copy_(new)
# --8<-- [end:merge]


# --8<-- [start:blocks]
def ring_blocks(rank: int, source: int, causal: bool, q_chunks: tuple[int, int],
                kv_chunks: tuple[int, int]) -> list[tuple[slice, slice, bool]]:
    """Which part of a ring step's problem is computed: (query rows, key rows, causal) of this rank's
    shard against `source`'s key/value shard, each shard two zig-zag chunks of the given lengths.
    Chunk a attends to chunk b fully when a comes later in the sequence, not at all when earlier, and
    causally when it is the same chunk."""
    n_q, n_k = sum(q_chunks), sum(kv_chunks)
    if not causal:
        return [(slice(0, n_q), slice(0, n_k), False)]
    if source == rank:  # the shard's own keys: its two chunks in sequence order, a causal square
        return [(slice(0, n_q), slice(0, n_k), True)]
    if source < rank:  # source's first chunk is earlier than both of ours; its second later than both
        return [(slice(0, n_q), slice(0, kv_chunks[0]), False)]
    return [(slice(q_chunks[0], n_q), slice(0, n_k), False)]  # only our late chunk sees any of source's keys
# --8<-- [end:blocks]


def _chunk_lengths(seq_len: int, world: int, rank: int) -> tuple[int, int]:
    chunks = zigzag_chunks(seq_len, world)
    first, second = chunks[rank], chunks[2 * world - 1 - rank]
    return first[1] - first[0], second[1] - second[0]


class _Ring:
    """Point-to-point exchange with the ring's neighbours: send to rank + 1, receive from rank − 1."""

    def __init__(self, group, world: int, rank: int):
        self.group, self.world, self.rank = group, world, rank
        self.next = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
        self.prev = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world

    def start(self, send: list[torch.Tensor], receive: list[torch.Tensor]):
        """Begin sending `send` on and receiving into `receive`; returns the requests to wait for."""
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in send]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in receive]
        return dist.batch_isend_irecv(ops)


def _sizes(seq_len: int | None, n_local: int, world: int) -> int:
    return seq_len if seq_len is not None else n_local * world


def _buffers(k: torch.Tensor, v: torch.Tensor, length: int, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Room to receive a K/V shard of `length` positions (or, with dtype, its float32 gradient sums)."""
    return [torch.empty(t.shape[:2] + (length,) + t.shape[3:], dtype=dtype or t.dtype, device=t.device) for t in (k, v)]


# --8<-- [start:ring_forward]
def _ring_forward(q, k, v, causal, sm_scale, group, seq_len, merge=merge_partials):
    """Ring attention's forward on this rank's shards: (O in q's dtype, lse float32 (B, H, n_local)).
    `merge` folds a block's partial result in (chapter 10's lab runs the ring with the learner's)."""
    world, rank = _group_info(group)
    lengths = _local_lengths(q.shape[2], seq_len, world, rank)
    n = _sizes(seq_len, q.shape[2], world)
    ring = _Ring(group, world, rank) if world > 1 else None
    o = lse = None  # the running result: float32 O and the rows' log-sum-exp
    held = (k, v)
    for step in range(world):
        source = (rank - step) % world  # whose keys and values this rank holds at this step
        pending = None
        if step + 1 < world:  # the next slice travels while this one is computed
            incoming = _buffers(k, v, lengths[(rank - step - 1) % world])
            pending = ring.start(list(held), incoming)
        for rows, keys, block_causal in ring_blocks(rank, source, causal, _chunk_lengths(n, world, rank),
                                                    _chunk_lengths(n, world, source)):
            if rows.stop == rows.start or keys.stop == keys.start:
                continue
            o_part, lse_part = flash_attention_forward(q[:, :, rows], held[0][:, :, keys], held[1][:, :, keys],
                                                       block_causal, sm_scale)
            if o is None:  # step 0, the shard's own keys, covers every row: the running result starts as it
                o, lse = o_part.float(), lse_part
            else:
                merge(o[:, :, rows], lse[:, :, rows], o_part, lse_part)
        if pending is not None:
            for request in pending:
                request.wait()
            held = tuple(incoming)
    if o is None:  # an empty shard
        return q.new_zeros(q.shape), torch.full(q.shape[:3], -math.inf, dtype=torch.float32, device=q.device)
    return o.to(q.dtype), lse
# --8<-- [end:ring_forward]


# --8<-- [start:ring_backward]
def _ring_backward(do, q, k, v, o, lse, causal, sm_scale, group, seq_len):
    """The ring again: each key/value slice travels with the running sum of its gradients (float32), to
    which every rank adds its share; after the last step the sums go one hop further, home."""
    world, rank = _group_info(group)
    lengths = _local_lengths(q.shape[2], seq_len, world, rank)
    n = _sizes(seq_len, q.shape[2], world)
    ring = _Ring(group, world, rank) if world > 1 else None
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    held = (k, v)
    dkv = dkv_pending = None
    for step in range(world):
        source = (rank - step) % world
        kv_pending = None
        if step + 1 < world:
            incoming = _buffers(k, v, lengths[(rank - step - 1) % world])
            kv_pending = ring.start(list(held), incoming)
        dk_part = torch.zeros(held[0].shape, dtype=torch.float32, device=k.device)
        dv_part = torch.zeros(held[1].shape, dtype=torch.float32, device=v.device)
        for rows, keys, block_causal in ring_blocks(rank, source, causal, _chunk_lengths(n, world, rank),
                                                    _chunk_lengths(n, world, source)):
            if rows.stop == rows.start or keys.stop == keys.start:
                continue
            dq_b, dk_b, dv_b = flash_attention_backward(
                do[:, :, rows], q[:, :, rows], held[0][:, :, keys], held[1][:, :, keys], o[:, :, rows],
                lse[:, :, rows], block_causal, sm_scale)
            dq[:, :, rows] += dq_b
            dk_part[:, :, keys] += dk_b
            dv_part[:, :, keys] += dv_b
        if dkv_pending is not None:  # the sums for this slice, from the rank before us
            for request in dkv_pending:
                request.wait()
            dk_part += dkv[0]
            dv_part += dkv[1]
            dkv = None  # free before the next pair of buffers is allocated
        if world > 1:  # on to the next rank; at the last step that is the slice's home
            dkv = _buffers(k, v, lengths[(source - 1) % world], torch.float32)
            dkv_pending = ring.start([dk_part, dv_part], dkv)
        else:
            dkv = (dk_part, dv_part)
        if kv_pending is not None:
            for request in kv_pending:
                request.wait()
            held = tuple(incoming)
    if world > 1:
        for request in dkv_pending:
            request.wait()
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
# --8<-- [end:ring_backward]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, group, seq_len):
        o, lse = _ring_forward(q, k, v, causal, sm_scale, group, seq_len)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (causal, sm_scale, group, seq_len)
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        causal, sm_scale, group, seq_len = ctx.args
        dq, dk, dv = _ring_backward(do.contiguous(), q, k, v, o, lse, causal, sm_scale, group, seq_len)
        return dq, dk, dv, None, None, None, None


def _check(q, k, v, sm_scale, group) -> float:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a (B, H, n_local, d) tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k.shape[2] != q.shape[2] or v.shape[2] != q.shape[2]:
        raise ValueError(f"k and v must hold the same positions as q (one sequence, self-attention), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if group is not None and not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: torch.distributed is not initialised (dist.init_process_group)")
    return 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)


# --8<-- [start:ring_attention]
def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None, *, group=None, seq_len: int | None = None) -> torch.Tensor:
    """Attention over a sequence sharded across the ranks of `group` (default: the whole world), by the
    ring: softmax(sm_scale · Q Kᵀ) V for this rank's queries over every rank's keys. Differentiable.

    q: (B, H, n_local, d); k, v: (B, H_kv, n_local, d), H_kv dividing H — this rank's `shard_sequence`
    of the whole sequence (zig-zag order). seq_len: the whole length, needed only when the ranks' shards
    differ in length (a length not divisible by 2·ranks). Kernels, dtypes and head sizes: the front
    door's. Returns this rank's shard of O. Raises ValueError naming the argument."""
    scale = _check(q, k, v, sm_scale, group)
    return _RingAttention.apply(q, k, v, bool(causal), scale, group, seq_len)
# --8<-- [end:ring_attention]


class _AllToAll(torch.autograd.Function):
    """dist.all_to_all_single on flat tensors with split sizes; its gradient is the exchange reversed."""

    @staticmethod
    def forward(ctx, x, send_sizes, receive_sizes, group):
        ctx.sizes, ctx.group = (send_sizes, receive_sizes), group
        out = x.new_empty(sum(receive_sizes))
        dist.all_to_all_single(out, x.contiguous(), receive_sizes, send_sizes, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_sizes, receive_sizes = ctx.sizes
        back = grad.new_empty(sum(send_sizes))
        dist.all_to_all_single(back, grad.contiguous(), send_sizes, receive_sizes, group=ctx.group)
        return back, None, None, None


# --8<-- [start:ulysses]
def _heads_to_sequence(x: torch.Tensor, lengths: list[int], group) -> torch.Tensor:
    """(B, H, n_local, d) on each rank → (B, H / P, N, d): rank p receives head group p of every shard;
    the shards are joined in rank order (zig-zag order of the whole sequence)."""
    batch, heads, n_local, d = x.shape
    world = len(lengths)
    per = heads // world
    send = x.reshape(batch, world, per, n_local, d).transpose(0, 1).reshape(-1)  # head group p → rank p
    got = _AllToAll.apply(send, [batch * per * n_local * d] * world, [batch * per * n * d for n in lengths], group)
    pieces = torch.split(got, [batch * per * n * d for n in lengths])
    return torch.cat([p.view(batch, per, n, d) for p, n in zip(pieces, lengths)], dim=2)


def _sequence_to_heads(y: torch.Tensor, lengths: list[int], rank: int, group) -> torch.Tensor:
    """The inverse: (B, H / P, N, d) in rank order → this rank's (B, H, n_local, d)."""
    batch, per, _, d = y.shape
    world = len(lengths)
    send = torch.cat([p.reshape(-1) for p in torch.split(y, lengths, dim=2)])  # shard p's positions → rank p
    got = _AllToAll.apply(send, [batch * per * n * d for n in lengths], [batch * per * lengths[rank] * d] * world,
                          group)
    return got.view(world, batch, per, lengths[rank], d).transpose(0, 1).reshape(batch, world * per, lengths[rank], d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      sm_scale: float | None = None, *, group=None, seq_len: int | None = None) -> torch.Tensor:
    """`ring_attention`'s contract by the all-to-all exchange: heads for sequence, attention on H / P
    heads over the whole sequence, and back. H and H_kv must be divisible by the number of ranks."""
    scale = _check(q, k, v, sm_scale, group)
    world, rank = _group_info(group)
    if world == 1:
        return flash_attention(q, k, v, causal, scale)
    for name, t in (("q", q), ("k", k)):
        if t.shape[1] % world:
            raise ValueError(f"{name}: ulysses_attention needs heads divisible by the {world} ranks, got "
                             f"{t.shape[1]} heads ({name} {tuple(t.shape)}); use ring_attention")
    lengths = _local_lengths(q.shape[2], seq_len, world, rank)
    n = sum(lengths)
    # the joined shards are in zig-zag order; the causal mask needs sequence order
    order = torch.cat([zigzag_positions(n, world, r) for r in range(world)]).to(q.device)
    to_sequence = torch.argsort(order)
    whole = [_heads_to_sequence(t, lengths, group).index_select(2, to_sequence) for t in (q, k, v)]
    o = flash_attention(*whole, causal, scale)
    return _sequence_to_heads(o.index_select(2, order), lengths, rank, group)
# --8<-- [end:ulysses]


# --8<-- [start:rule]
def prefers_all_to_all(heads: int, kv_heads: int, world: int) -> bool:
    """Whether the all-to-all beats the ring: its heads must divide among the ranks, and it must move less.
    Per rank the ring sends K and V on P − 1 times, 2 (P − 1) H_kv values per position; the all-to-all
    exchanges Q, K, V and O once, (2 H + 2 H_kv)(P − 1) / P. At equal volume the ring wins: its hops hide
    behind its kernels, the all-to-all's exchanges do not."""
    divides = heads % world == 0 and kv_heads % world == 0
    return world > 1 and divides and world * kv_heads > heads + kv_heads
# --8<-- [end:rule]


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                               sm_scale: float | None = None, *, group=None, seq_len: int | None = None,
                               method: str = "auto") -> torch.Tensor:
    """`ring_attention` or `ulysses_attention`: method "ring", "ulysses", or "auto" (`prefers_all_to_all`)."""
    world, _ = _group_info(group)
    if method not in ("auto", "ring", "ulysses"):
        raise ValueError(f"method must be 'auto', 'ring' or 'ulysses', got {method!r}")
    if method == "auto":
        fits = isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4 and k.dim() == 4
        method = "ulysses" if fits and prefers_all_to_all(q.shape[1], k.shape[1], world) else "ring"
    call = ulysses_attention if method == "ulysses" else ring_attention
    return call(q, k, v, causal, sm_scale, group=group, seq_len=seq_len)


def sharded_versus_whole(rank: int, world: int, seq_len: int, heads: int = 4, kv_heads: int = 2, head_dim: int = 32,
                         causal: bool = True, method: str = "ring", seed: int = 0,
                         dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Run on every rank of a group (`ranks.run_ranks`): draws the same whole (1, heads, seq_len, head_dim)
    inputs everywhere, runs `method` on this rank's shards forward and backward, gathers the results and
    returns the largest |difference| of O, dQ, dK, dV from the one-device front door's on the whole sequence."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(1, h, seq_len, head_dim, generator=g).to(device, dtype)
                   for h in (heads, kv_heads, kv_heads, heads))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = flash_attention(*whole, causal)
    expected.backward(do)
    local = [shard_sequence(t).requires_grad_() for t in (q, k, v)]
    out = context_parallel_attention(*local, causal, seq_len=seq_len, method=method)
    out.backward(shard_sequence(do))
    got = [unshard_sequence(t.detach(), seq_len) for t in (out, *(x.grad for x in local))]
    return {name: (a.double() - b.double()).abs().max().item()
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, (expected.detach(), *(t.grad for t in whole)))}


__all__ = ["ring_attention", "ulysses_attention", "context_parallel_attention", "shard_sequence", "unshard_sequence",
           "zigzag_chunks", "zigzag_positions", "merge_partials", "ring_blocks", "sharded_versus_whole", "prefers_all_to_all"]
