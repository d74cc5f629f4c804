"""Per-token log-probs of completions under a model: the one forward shared by the trainer,
the reference, and the trainer's re-computation of old log-probs.

The policy being trained is softmax(logits / temperature), the same distribution the sampler
drew from, so the temperature divides the logits here as it does in the sampler (TRL and verl
do the same). Position ids are rebuilt from the attention mask exactly as `generate` builds them
for left-padded prompts; without that the trainer would see shifted positions and its log-probs
would not match the sampler's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlpost.batch import Rollouts


def position_ids(attention_mask: Tensor) -> Tensor:  # (B, L) int64
    pos = attention_mask.long().cumsum(-1) - 1  # first real token at 0
    return pos.clamp(min=0)  # left pads get 0; they are masked out of attention anyway


def completion_logprobs(
    model: torch.nn.Module, batch: Rollouts, temperature: float, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """log pi(completion token | prefix) for every completion position.

    Returns logp (B, T) float32 (differentiable if grad is on) and, if asked, the policy's
    per-token entropy (B, T) float32 without grad (a diagnostic, not a loss term here)."""
    T = batch.completion_ids.shape[1]
    ids, attn = batch.input_ids(), batch.attention_mask()  # (B, P+T) each
    # Only the last T+1 positions' logits are needed: position P-1+t predicts completion token t.
    # logits_to_keep skips the lm_head (a 576 x 49152 matmul per token) on the prompt.
    out = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn), logits_to_keep=T + 1, use_cache=False)
    logits = out.logits[:, :-1, :].float() / temperature  # (B, T, V)
    logp_all = logits.log_softmax(dim=-1)  # (B, T, V)
    logp = logp_all.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T)
    return logp, entropy
