"""Chapter 6 end to end: a tiny GPT trains with this tutorial's attention kernels."""

import pytest
import torch

from tutorial_kernels.gpt import GPT, CharCorpus, GPTConfig, train

TEXT = "attention is all you need, and memory is all attention needs. " * 40


def test_loss_falls_with_the_tutorial_kernels():
    # A few steps under the interpreter: the loss must fall, and track the same model with torch's attention.
    corpus = CharCorpus(TEXT)
    config = GPTConfig(vocab_size=corpus.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32)
    ours = train("tutorial", 12, config=config, batch_size=4, corpus=corpus, seed=3)
    reference = train("torch", 12, config=config, batch_size=4, corpus=corpus, seed=3)
    assert ours[-1] < 0.8 * ours[0], f"loss did not fall: {ours}"
    # same seed, same data: the curves agree up to float32 rounding of different (exact) algorithms
    assert max(abs(a - b) for a, b in zip(ours, reference)) < 1e-3, (ours, reference)


def test_gradients_match_torch_attention():
    corpus = CharCorpus(TEXT)
    config = GPTConfig(vocab_size=corpus.vocab_size, block_size=24, n_layer=1, n_head=2, n_embd=32)
    x, y = corpus.batch(2, config.block_size, torch.Generator().manual_seed(1))
    grads = {}
    for attention in ("tutorial", "torch"):
        torch.manual_seed(0)
        model = GPT(config, attention)
        model(x, y)[1].backward()
        grads[attention] = torch.cat([p.grad.flatten() for p in model.parameters()])
    diff = (grads["tutorial"] - grads["torch"]).norm() / grads["torch"].norm()
    assert diff < 1e-4, f"relative gradient difference {diff:.2e}"


def test_rejects_heads_too_small_for_the_kernels():
    with pytest.raises(ValueError, match=r"n_embd \(32\) must split into n_head \(4\) heads of at least 16 dims"):
        GPT(GPTConfig(vocab_size=10, n_embd=32, n_head=4))
    with pytest.raises(ValueError, match=r"attention must be one of \['torch', 'tutorial'\], got 'flash'"):
        GPT(GPTConfig(vocab_size=10), attention="flash")


def test_the_default_corpus_is_the_repositorys_own_prose():
    corpus = CharCorpus()
    assert corpus.vocab_size > 50 and len(corpus.data) > 100_000
