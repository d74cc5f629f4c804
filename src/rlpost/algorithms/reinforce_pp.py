"""REINFORCE++ (Hu 2025, arXiv:2501.03262).

Patch over REINFORCE: PPO's clipped surrogate (so a batch may be reused for several optimizer
steps), and advantages normalised across the *whole batch* instead of per prompt: every loss
token's advantage A = r of its sequence, then A <- (A - mean) / std over all loss tokens of the
batch. No per-group baseline and no critic, so no bias from small groups.

KL, as in the paper, is a per-token penalty in the reward (k1 by default): each token's reward
is -kl_coef * KL_t, plus the score on the last token; a token's advantage is then its return to
go (the sum of the rewards from it on), whitened over the batch. So KL is not in the loss. A
process reward model's step rewards (task.process_reward_model) join those token rewards the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from rlpost.algorithms import core
from rlpost.algorithms.ppo import clipped_policy_loss
from rlpost.sections import AlgoConfig
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Traits


def global_token_whitened(reward: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """(B, T): each token gets its sequence's reward, whitened over all loss tokens of the batch."""
    return core.masked_whiten(core.to_tokens(reward, mask), mask, eps)  # (B, T)


@dataclass
class ReinforcePP:
    name: ClassVar[str] = "reinforce_pp"
    traits: ClassVar[Traits] = Traits(kl="reward", token_clip=True, token_rewards=True)
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    reads: ClassVar[tuple[str, ...]] = ("clip_eps_low", "clip_eps_high", "dual_clip_c", "kl_coef", "kl_estimator",
                                        "loss_agg")
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    aggregate: core.Aggregator = core.token_mean
    kl_estimator: core.KLEstimator = core.kl_k1
    dual_clip_c: float | None = None

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "ReinforcePP":
        return cls(clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, kl_coef=algo.kl_coef,
                   aggregate=core.aggregator(algo.loss_agg, max_new_tokens),
                   kl_estimator=core.kl_estimator(algo.kl_estimator, cls.traits.kl), dual_clip_c=algo.dual_clip_c)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Rollouts) -> Advantages:
        mask = batch.completion_mask
        if self.kl_coef == 0 and batch.step_reward is None:
            adv_tok = global_token_whitened(batch.reward, mask)  # (B, T)
            return Advantages(adv_tok, {"critic/advantages/max": adv_tok.max().item()})
        kl_tok = self.kl_estimator(batch.old_logp, batch.ref_logp) * mask if self.kl_coef > 0 else None  # (B, T)
        rewards = core.token_rewards(batch.reward, mask, kl_tok, self.kl_coef, batch.step_reward)  # (B, T)
        adv_tok = core.masked_whiten(core.returns_to_go(rewards, mask), mask)  # (B, T)
        metrics = {"critic/advantages/max": adv_tok.max().item()}
        if kl_tok is not None:
            metrics.update({"critic/kl": core.masked_mean(kl_tok, mask).item(),
                            "critic/kl_bound_frac": core.kl_bound_frac(kl_tok, mask), "critic/kl_coef": self.kl_coef})
        return Advantages(adv_tok, metrics)

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        # No KL term: the KL is already in the advantages.
        return clipped_policy_loss(logp, batch, self.clip_eps_low, self.clip_eps_high, self.aggregate, self.dual_clip_c)
