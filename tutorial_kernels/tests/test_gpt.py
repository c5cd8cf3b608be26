"""Chapter 6 end to end: a tiny GPT trains with this tutorial's attention kernels."""

import pytest
import torch

from tutorial_kernels.integrations.gpt import GPT, CharCorpus, GPTConfig, train
from tutorial_kernels.runtime import default_device, interpreter_active
from tutorial_kernels.testing import grad_tolerance

DEVICE = default_device()

TEXT = "attention is all you need, and memory is all attention needs. " * 40


def test_loss_falls_with_the_tutorial_kernels():
    # A few steps under the interpreter: the loss must fall, and track the same model with torch's attention.
    corpus = CharCorpus(TEXT)
    config = GPTConfig(vocab_size=corpus.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32)
    ours = train("tutorial", 12, config=config, batch_size=4, corpus=corpus, seed=3, device=DEVICE)
    reference = train("torch", 12, config=config, batch_size=4, corpus=corpus, seed=3, device=DEVICE)
    assert ours[-1] < 0.8 * ours[0], f"loss did not fall: {ours}"
    # same seed, same data: the curves agree up to float32 rounding of different (exact) algorithms
    # (on a GPU our float32 products run in TF32)
    bound = 1e-3 if interpreter_active() else 2e-2
    assert max(abs(a - b) for a, b in zip(ours, reference)) < bound, (ours, reference)


def test_gradients_match_torch_attention():
    corpus = CharCorpus(TEXT)
    config = GPTConfig(vocab_size=corpus.vocab_size, block_size=24, n_layer=1, n_head=2, n_embd=32)
    x, y = corpus.batch(2, config.block_size, torch.Generator().manual_seed(1))
    grads = {}
    for attention in ("tutorial", "torch"):
        torch.manual_seed(0)
        model = GPT(config, attention).to(DEVICE)
        model(x.to(DEVICE), y.to(DEVICE))[1].backward()
        grads[attention] = torch.cat([p.grad.flatten() for p in model.parameters()])
    diff = (grads["tutorial"] - grads["torch"]).norm() / grads["torch"].norm()
    bound = 1e-4 if interpreter_active() else grad_tolerance(torch.float32)  # TF32 on a GPU
    assert diff < bound, f"relative gradient difference {diff:.2e}"


def test_rejects_heads_too_small_for_the_kernels():
    with pytest.raises(ValueError, match=r"n_embd \(32\) must split into n_head \(4\) heads of at least 16 dims"):
        GPT(GPTConfig(vocab_size=10, n_embd=32, n_head=4))
    with pytest.raises(ValueError, match=r"attention must be one of \['torch', 'tutorial'\] or a callable, got 'flash'"):
        GPT(GPTConfig(vocab_size=10), attention="flash")


def test_the_default_corpus_is_the_repositorys_own_prose():
    corpus = CharCorpus()
    assert corpus.vocab_size > 50 and len(corpus.data) > 100_000


@pytest.mark.cpu("the message shown without a GPU")
def test_training_comparison_refuses_to_run_without_a_gpu():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "tutorial_kernels.integrations.gpt"], capture_output=True, text=True)
    assert run.returncode == 2 and "runs on a CUDA GPU" in run.stderr
