"""REINFORCE++ (Hu 2025, arXiv:2501.03262).

Patch over REINFORCE: PPO's clipped surrogate (so a batch may be reused for several optimizer
steps), and advantages normalised across the *whole batch* instead of per prompt: every loss
token's advantage A = r of its sequence, then A <- (A - mean) / std over all loss tokens of the
batch. No per-group baseline and no critic, so no bias from small groups. The optional k3 KL
term is GRPO's, reused (the paper also allows KL in the reward; that lands with PPO).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlpost.algorithms import core
from rlpost.algorithms.grpo import clipped_loss_with_kl
from rlpost.batch import Rollouts


def global_token_whitened(reward: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """(B, T): each token gets its sequence's reward, whitened over all loss tokens of the batch."""
    adv_tok = core.to_tokens(reward, mask)  # (B, T)
    mean = core.masked_mean(adv_tok, mask)  # ()
    var = core.masked_mean((adv_tok - mean) ** 2, mask)  # ()
    return (adv_tok - mean) / (var.sqrt() + eps) * mask  # (B, T)


@dataclass
class ReinforcePP:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    aggregate: core.Aggregator = core.token_mean

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Rollouts) -> tuple[Tensor, dict]:
        adv_tok = global_token_whitened(batch.reward, batch.completion_mask)  # (B, T)
        return adv_tok, {"critic/advantages/max": adv_tok.max().item()}

    def loss(self, logp: Tensor, batch: Rollouts) -> tuple[Tensor, dict]:
        return clipped_loss_with_kl(logp, batch, self.clip_eps_low, self.clip_eps_high, self.kl_coef, self.aggregate)
