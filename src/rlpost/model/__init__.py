"""The model layer: loading (the embedded GGUF, any transformers folder, the tiny test model),
per-token log-probs (``logprobs.py``, the chunked log-softmax), LoRA adapters, FSDP2 sharding,
atomic checkpoints, turning rows into batches (``encode.py``), and the heap trim."""
