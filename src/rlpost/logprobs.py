"""Per-token log-probs of completions under a model: the one forward shared by the trainer,
the reference, and the trainer's re-computation of old log-probs.

The policy being trained is softmax(logits / temperature), the same distribution the sampler
drew from, so the temperature divides the logits here as it does in the sampler (TRL and verl
do the same). Position ids are rebuilt from the attention mask exactly as `generate` builds them
for left-padded prompts; without that the trainer would see shifted positions and its log-probs
would not match the sampler's.

Shared prefix. The K completions of a group share one prompt, and in the demo the prompt is
three quarters of every sequence. So the prompt runs once per group, its KV cache is repeated
for the group's K rows, and only the completions run per row. Gradients flow back through the
repeated cache into the single prompt forward, so the result is the same function of the
weights as the plain forward (tests/test_logprobs.py checks values and gradients), at about a
third of the tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlpost.batch import Rollouts


def position_ids(attention_mask: Tensor) -> Tensor:  # (B, L) int64
    pos = attention_mask.long().cumsum(-1) - 1  # first real token at 0
    return pos.clamp(min=0)  # left pads get 0; they are masked out of attention anyway


def completion_logprobs(
    model: torch.nn.Module, batch: Rollouts, temperature: float, with_entropy: bool = False,
    share_prefix: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """log pi(completion token | prefix) for every completion position.

    Returns logp (B, T) float32 (differentiable if grad is on) and, if asked, the policy's
    per-token entropy (B, T) float32 without grad (a diagnostic, not a loss term here)."""
    first, row_to_group = prompt_groups(batch) if share_prefix else (None, None)
    # With activation checkpointing, transformers turns the KV cache off, so share nothing then.
    if first is not None and len(first) < len(batch) and not checkpointing(model):
        logits = _logits_shared_prefix(model, batch, first, row_to_group)  # (B, T, V)
    else:
        logits = _logits_full(model, batch)  # (B, T, V)
    logp_all = (logits.float() / temperature).log_softmax(dim=-1)  # (B, T, V)
    logp = logp_all.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T)
    return logp, entropy


def checkpointing(model) -> bool:
    """Whether activation (gradient) checkpointing is on; transformers v5 renamed the flag."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def prompt_groups(batch: Rollouts) -> tuple[Tensor | None, Tensor | None]:
    """(first row of each run of identical prompts (G,), row -> run index (B,)), or (None, None)."""
    _, row_to_group, counts = torch.unique_consecutive(batch.group_ids, return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts  # (G,)
    same = torch.equal(batch.prompt_ids, batch.prompt_ids[first][row_to_group])
    return (first, row_to_group) if same else (None, None)


def _logits_full(model, batch: Rollouts) -> Tensor:  # (B, T, V)
    T = batch.completion_ids.shape[1]
    ids, attn = batch.input_ids(), batch.attention_mask()  # (B, P+T) each
    # Only the last T+1 positions' logits are needed: position P-1+t predicts completion token t.
    # logits_to_keep skips the lm_head (a 576 x 49152 matmul per token) on the prompt.
    out = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn), logits_to_keep=T + 1, use_cache=False)
    return out.logits[:, :-1, :]


def _logits_shared_prefix(model, batch: Rollouts, first: Tensor, row_to_group: Tensor) -> Tensor:  # (B, T, V)
    T = batch.completion_ids.shape[1]
    p_ids, p_mask = batch.prompt_ids[first], batch.prompt_mask[first]  # (G, P) each
    # 1. Each distinct prompt once. Its last position's logits predict completion token 0.
    out_p = model(input_ids=p_ids, attention_mask=p_mask.long(), position_ids=position_ids(p_mask),
                  use_cache=True, logits_to_keep=1)
    cache = out_p.past_key_values
    cache.batch_select_indices(row_to_group)  # (G, ...) -> (B, ...) rows; differentiable indexing
    first_logits = out_p.logits[row_to_group]  # (B, 1, V)
    if T == 1:
        return first_logits
    # 2. The completions (all but the last token, which predicts nothing we score) on top of it.
    attn = batch.attention_mask()[:, :-1]  # (B, P+T-1)
    pos = position_ids(attn)[:, -(T - 1):]  # (B, T-1): positions continue after each prompt
    out_c = model(input_ids=batch.completion_ids[:, :-1], attention_mask=attn, position_ids=pos,
                  past_key_values=cache, use_cache=True)
    return torch.cat([first_logits, out_c.logits], dim=1)  # (B, T, V)
