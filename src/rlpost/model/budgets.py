"""Sizes the GPU levers take, in one light module: the trainer's and the planner's readers import it
without torch or transformers (``rlpost plan`` loads neither model nor tokenizer).

* ``ChunkedLogp``'s chunk (model/logprobs.py: ``chunk_tokens``): on a CPU 128 tokens, whose
  128 x 49152 float32 logits (25 MB) stay in cache (0.36 s for 976 tokens at 128 against 0.49 s at
  1024, forward with the lm_head). On a GPU a chunk's cost is its ~30 kernel launches, not cache:
  128-token chunks made a 32k-token micro-batch 256 chunks of small kernels. There a chunk holds up
  to GPU_CHUNK_BYTES of float32 logits (1365 tokens of a 49152 vocabulary; its float32 temporaries
  together ~1 GB).
* ``HeadGrad`` (model/logprobs.py) holds each micro-batch's (tokens, V) bf16 logit gradient until it
  forms the lm_head's gradient in one matmul. On a CPU that saved a cast and an add of the (V, H)
  gradient per micro-batch (first-touch page faults, ~60 ms a micro-batch of the demo), and the trainer
  flushes it once it holds HEAD_GRAD_CPU_BYTES. On a GPU the cast and add take a millisecond and the
  held gradients were gigabytes at the H100 0.5B row's peak (4 micro-batches of 8k tokens: 0.8 GB
  each), so there it flushes after every micro-batch (budget 0).
* The own engine's graphs on a GPU (roles/rollout_static.py): its arena, graphs and sampler weights
  stay through the trainer's update while together they take at most KEEP_FRACTION of the GPU's
  memory. Re-capturing costs a few eager steps per bucket each time, whatever the model's size; the
  memory kept grows with it.
"""

from __future__ import annotations

CPU_CHUNK_TOKENS = 128
GPU_CHUNK_BYTES = 256 * 2**20
KEEP_FRACTION = 0.1
HEAD_GRAD_CPU_BYTES = 2**30


def head_grad_bytes(on_gpu: bool) -> int:
    """What ``HeadGrad`` may hold before the trainer flushes it (see above)."""
    return 0 if on_gpu else HEAD_GRAD_CPU_BYTES


def gpu_chunk_tokens(vocab: int) -> int:
    """Tokens per ChunkedLogp chunk on a GPU: GPU_CHUNK_BYTES of float32 logits, never below the CPU's."""
    return max(CPU_CHUNK_TOKENS, GPU_CHUNK_BYTES // (4 * vocab))
