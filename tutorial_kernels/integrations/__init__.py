"""The kernels inside models: registered with Hugging Face transformers (`hf_attention`), timed in
LLM prefill (`prefill`), and trained in a small GPT (`gpt`)."""
