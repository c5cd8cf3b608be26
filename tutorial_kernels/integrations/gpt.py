"""A small GPT-style language model whose attention is pluggable: this tutorial's kernels or PyTorch's.

Chapter 6 trains it twice from the same seed on the same text, once with `flash_attention` (the
chapter's forward and backward kernels) and once with `F.scaled_dot_product_attention`, and compares
the loss curves. Characters are the tokens, so any text will do: the corpus is this repository's own
prose (`docs/`), which ships with every checkout.

The model is deliberately plain: token and position embeddings, pre-norm blocks of causal
self-attention and a GELU MLP, a tied output layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from tutorial_kernels.paths import docs_dir


AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def tutorial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention through the package's front door, `flash_attention` (in training: chapter 5's
    forward, chapter 6's backward)."""
    from tutorial_kernels.attention import flash_attention

    return flash_attention(q, k, v, causal=True)


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


ATTENTION: dict[str, AttentionFn] = {"tutorial": tutorial_attention, "torch": torch_attention}


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 64  # context length in characters
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64  # head_dim = n_embd / n_head, at least 16 for the kernels

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, attention: AttentionFn):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.attention = attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # each (B, N, C)
        # (B, N, H, d) viewed as (B, H, N, d): non-contiguous, as Hugging Face models pass them
        q, k, v = (t.view(B, N, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.attention(q, k, v)  # (B, H, N, d)
        return self.proj(y.transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, attention: AttentionFn):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, attention)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(), nn.Linear(4 * config.n_embd, config.n_embd)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, attention: str | AttentionFn = "tutorial"):
        """attention: a name of ATTENTION, or any causal attention (q, k, v) → O of (B, H, N, d) tensors
        (a learner's own, in lab 6's capstone)."""
        super().__init__()
        if not callable(attention) and attention not in ATTENTION:
            raise ValueError(f"attention must be one of {sorted(ATTENTION)} or a callable, got {attention!r}")
        if config.head_dim < 16 or config.n_embd % config.n_head:
            raise ValueError(
                f"n_embd ({config.n_embd}) must split into n_head ({config.n_head}) heads of at least 16 dims"
            )
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos = nn.Embedding(config.block_size, config.n_embd)
        attend = attention if callable(attention) else ATTENTION[attention]
        self.blocks = nn.ModuleList(Block(config, attend) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied input and output embeddings
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation: N(0, 0.02) weights, zero biases. PyTorch's default N(0, 1) embedding,
        # tied to the output layer, starts the logits at a scale of √n_embd and the loss in the hundreds.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, N = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(N, device=idx.device))  # (B, N, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, N, vocab)
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


class CharCorpus:
    """Characters of the repository's own prose, as integer tokens."""

    def __init__(self, text: str | None = None):
        if text is None:
            text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(docs_dir().rglob("*.md")))
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([self.index[c] for c in text], dtype=torch.long)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def batch(self, batch_size: int, block_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.data) - block_size - 1, (batch_size,), generator=generator)
        x = torch.stack([self.data[s:s + block_size] for s in starts])
        y = torch.stack([self.data[s + 1:s + 1 + block_size] for s in starts])
        return x, y


def train(
    attention: str | AttentionFn, steps: int, *, config: GPTConfig | None = None, batch_size: int = 8, lr: float = 3e-3,
    seed: int = 0, device: torch.device | str = "cpu", corpus: CharCorpus | None = None,
    autocast: torch.dtype | None = None, step_seconds: list[float] | None = None,
) -> list[float]:
    """Train from `seed` and return the loss of every step. Same seed and corpus ⇒ same data and init.

    autocast=torch.bfloat16 runs the model in mixed precision (attention then sees bf16 q, k, v);
    step_seconds, if given, receives each step's wall time (the loss's .item() synchronises)."""
    import time

    corpus = corpus or CharCorpus()
    config = config or GPTConfig(vocab_size=corpus.vocab_size)
    torch.manual_seed(seed)
    model = GPT(config, attention).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data_gen = torch.Generator().manual_seed(seed)
    device_type = torch.device(device).type
    losses = []
    for _ in range(steps):
        start = time.perf_counter()
        x, y = corpus.batch(batch_size, config.block_size, data_gen)
        with torch.autocast(device_type, dtype=autocast, enabled=autocast is not None):
            _, loss = model(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step_seconds is not None:
            step_seconds.append(time.perf_counter() - start)
    return losses


# The H100 run of chapter 6: 6 layers, 8 heads of 64 dims, 1024 characters of context, bf16 autocast.
GPU_CONFIG = dict(block_size=1024, n_layer=6, n_head=8, n_embd=512)
GPU_RUNS = [("torch", 0), ("torch", 1), ("tutorial", 0), ("tutorial", 1)]


def main(argv: list[str] | None = None) -> None:
    """`python -m tutorial_kernels.integrations.gpt [--steps N] [--out PATH]`: train with each attention from two
    seeds on a GPU and write the losses and step times, with provenance, to data/ch06_training.json.
    Two seeds per attention measure the run-to-run noise the two attentions' curves are judged by."""
    import argparse
    import json
    import statistics
    import sys

    from tutorial_kernels.paths import data_dir
    from tutorial_kernels.provenance import provenance

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tutorial_kernels.integrations.gpt", description=main.__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", type=Path, help="JSON file to write (default: data/ch06_training.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the training comparison runs on a CUDA GPU; none is visible here")
    out = args.out or data_dir() / "ch06_training.json"
    corpus = CharCorpus()
    config = GPTConfig(vocab_size=corpus.vocab_size, **GPU_CONFIG)
    result = {
        "description": "Chapter 6: a character-level GPT trained with this tutorial's attention and with "
        "F.scaled_dot_product_attention, same seeds and data",
        "provenance": provenance(" ".join(["python -m tutorial_kernels.integrations.gpt", *argv]))
        | {"suite": "gpt-training", "timing": "wall time of each training step (time.perf_counter; the loss's .item() synchronises)"},
        "config": {**config.__dict__, "batch_size": args.batch_size, "lr": args.lr, "steps": args.steps,
                   "autocast": "bfloat16", "optimizer": "AdamW", "corpus_chars": len(corpus.data)},
        "runs": [],
    }
    for attention, seed in GPU_RUNS:
        seconds: list[float] = []
        losses = train(attention, args.steps, config=config, batch_size=args.batch_size, lr=args.lr, seed=seed,
                       device="cuda", corpus=corpus, autocast=torch.bfloat16, step_seconds=seconds)
        steady = seconds[10:]  # the first steps compile and autotune
        result["runs"].append({"attention": attention, "seed": seed, "losses": losses, "step_seconds": seconds,
                               "median_step_ms": 1e3 * statistics.median(steady)})
        print(f"{attention:9} seed {seed}: loss {losses[0]:.3f} → {losses[-1]:.3f}, "
              f"median step {1e3 * statistics.median(steady):.1f} ms", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
