"""Pure tensor maths shared by every algorithm: masked reductions, loss aggregators, KL
estimators, group baselines. No model, no config, no state: each function is unit-tested with
hand-worked numbers in tests/algorithms/test_core.py.

Loss aggregators take the *mini-batch* totals from the batch (``loss_tokens``, ``loss_seqs``)
rather than the totals of the tensor in hand. A micro-batch therefore returns its exact share
of the mini-batch loss, and gradient accumulation over micro-batches equals one big batch.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

# An aggregator turns per-token values (B, T) into the scalar loss, given the mask and the
# mini-batch totals. It is passed to the loss as a function (STYLE R3), never chosen by a string
# inside the loss.
Aggregator = Callable[[Tensor, Tensor, float, int], Tensor]


def masked_mean(x: Tensor, mask: Tensor, dim=None) -> Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask.to(x.dtype)).sum()


# --- loss aggregators ------------------------------------------------------------------------


def token_mean(x: Tensor, mask: Tensor, n_tokens: float, n_seqs: int) -> Tensor:
    """Every loss token of the mini-batch weighs the same (DAPO, verl's default 'token-mean')."""
    return masked_sum(x, mask) / max(n_tokens, 1.0)  # ()


def seq_mean_token_mean(x: Tensor, mask: Tensor, n_tokens: float, n_seqs: int) -> Tensor:
    """Mean over each sequence's tokens, then over sequences (the original GRPO paper).
    A long sequence's tokens each weigh less than a short one's: the length bias Dr. GRPO removes."""
    per_seq = masked_mean(x, mask, dim=-1)  # (B,)
    return per_seq.sum() / n_seqs  # ()


def seq_mean_token_sum(x: Tensor, mask: Tensor, n_tokens: float, n_seqs: int) -> Tensor:
    """Sum over each sequence's tokens, mean over sequences."""
    return masked_sum(x, mask) / n_seqs  # ()


def const_norm(x: Tensor, mask: Tensor, n_tokens: float, n_seqs: int, max_len: int) -> Tensor:
    """Sum over tokens / (sequences * max_new_tokens) (Dr. GRPO): a constant normaliser, so no
    sequence's tokens are up- or down-weighted by its own length."""
    return masked_sum(x, mask) / (n_seqs * max_len)  # ()


# --- KL estimators (Schulman, "Approximating KL divergence", 2020) ---------------------------
# All take per-token log-probs of the sampled tokens under pi (the policy) and pi_ref, with the
# tokens sampled from pi, and estimate KL(pi || pi_ref) per token.


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """log(pi/pi_ref): unbiased, high variance, can be negative."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """0.5 * log(pi/pi_ref)^2: biased, low variance, matches KL to second order."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """r - 1 - log r with r = pi_ref/pi: unbiased and always >= 0 (GRPO's choice)."""
    log_r = (ref_logp - logp).clamp(-20.0, 20.0)  # keep exp finite on far-off tokens
    return log_r.exp() - 1.0 - log_r


# --- group baselines (sequence level: one value per completion) ------------------------------


def group_centred(reward: Tensor, group_size: int) -> Tensor:
    """r_i - mean of its group (the group's own rows, including r_i). Rows of a group are contiguous."""
    grouped = reward.view(-1, group_size)  # (n_prompts, K)
    return (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)  # (B,)


def group_std(reward: Tensor, group_size: int) -> Tensor:
    """Unbiased std of each row's group, repeated per row (as in TRL and verl)."""
    grouped = reward.view(-1, group_size)  # (n_prompts, K)
    return grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1)  # (B,)


def to_tokens(adv_seq: Tensor, mask: Tensor) -> Tensor:
    """Broadcast a sequence-level advantage (B,) to its completion tokens (B, T)."""
    return adv_seq[:, None] * mask.to(adv_seq.dtype)  # (B, T)
