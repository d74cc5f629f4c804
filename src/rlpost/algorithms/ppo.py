"""PPO for language models (Schulman et al. 2017, arXiv:1707.06347; the RLHF form of Ziegler et al.
2019 and Ouyang et al. 2022 "InstructGPT").

Patch over REINFORCE: a learned baseline and a trust region.
1. A critic V(prefix) predicts the return from every prefix. It is a scalar head on a copy of the
   policy's trunk (``algo.critic=separate``) or on the policy's own trunk (``shared``: one forward,
   one model in memory, but policy and value gradients meet in the trunk). The trainer owns it
   (roles/critic.py) and hands its values to ``loss``.
2. Token-level rewards: the verifier's score sits on the last completion token; every token pays
   kl_coef * KL(pi_old || pi_ref) (k1 by default) to the frozen reference: the KL lives in the
   reward, not in the loss.
3. GAE(gamma, lambda) turns rewards and the rollout-time values into per-token advantages and
   returns (core.gae); advantages are whitened over the batch's loss tokens.
4. The clipped surrogate (``clipped_pg_loss``, which every PPO-clip method here takes from this
   file) lets one rollout batch feed several epochs x mini-batches of updates; the value loss is
   clipped the same way around the rollout-time values.

PPO needs old log-probs and old values *before* its advantages (for the KL reward and for GAE):
its traits say so (a KL in the reward, a critic), and the loop asks the trainer for both first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
from torch import Tensor

from rlpost.algorithms import core
from rlpost.sections import AlgoConfig
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Traits


def clipped_pg_loss(
    logp: Tensor, old_logp: Tensor, adv_tok: Tensor, mask: Tensor, eps_low: float, eps_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate per token (Schulman et al. 2017, Eq. 7), negated for descent.

    dual_clip = c > 1: dual-clip PPO (Ye et al. 2020, arXiv:1912.09729, Eq. 5), as verl's
    compute_policy_loss: where A < 0 the token's loss is at most -c A. PPO's min() leaves the
    ratio unbounded above for a negative advantage (the clip only bounds it below), so one token
    whose probability rose far since sampling can carry an arbitrarily large loss and gradient.

    Returns (per-token loss (B, T), per-token 'was clipped' (B, T) bool, ratio (B, T))."""
    ratio = (logp - old_logp).exp()  # (B, T)
    unclipped = ratio * adv_tok  # (B, T)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv_tok  # (B, T)
    per_tok = -torch.min(unclipped, clipped)  # (B, T)
    was_clipped = (clipped < unclipped) & mask  # the min picked the clipped branch: no gradient
    if dual_clip is not None:
        capped = torch.minimum(per_tok, -dual_clip * adv_tok)  # (B, T): at most c |A|
        per_tok = torch.where(adv_tok < 0, capped, per_tok)  # (B, T)
    return per_tok, was_clipped, ratio


def dual_clip_frac(ratio: Tensor, adv_tok: Tensor, mask: Tensor, dual_clip: float) -> float:
    """Share of loss tokens where dual-clip's cap acts (A < 0 and ratio > c): verl's actor/pg_clipfrac_lower."""
    return core.masked_mean(((adv_tok < 0) & (ratio.detach() > dual_clip)).float(), mask).item()

def clipped_policy_loss(logp: Tensor, batch: Rollouts, eps_low: float, eps_high: float, aggregate: core.Aggregator,
                        dual_clip: float | None = None) -> tuple[Tensor, dict]:
    """PPO's policy term on batch.advantages, aggregated by mini-batch totals, and its metrics: the
    loss of the methods that add nothing to the clipped surrogate (REINFORCE++, distill) and the
    policy part of GRPO's (grpo.clipped_loss_with_kl)."""
    mask = batch.completion_mask
    per_tok, was_clipped, ratio = clipped_pg_loss(logp, batch.old_logp, batch.advantages, mask, eps_low, eps_high,
                                                  dual_clip)
    loss = aggregate(per_tok, mask, n_tokens=batch.loss_tokens, n_seqs=batch.loss_seqs)  # ()
    # Metrics are intensive (token means of this micro-batch) so the trainer can average them by
    # token share; the aggregated loss itself is reported by the trainer as actor/loss.
    metrics = {
        "actor/pg_loss": core.masked_mean(per_tok.detach(), mask).item(),
        "actor/pg_clipfrac": core.masked_mean(was_clipped.float(), mask).item(),
        "actor/ppo_kl": core.masked_mean(batch.old_logp - logp.detach(), mask).item(),
        "actor/ratio_max": ratio.detach()[mask].max().item() if mask.any() else 1.0,
    }
    if dual_clip is not None:
        metrics["actor/pg_clipfrac_lower"] = dual_clip_frac(ratio, batch.advantages, mask, dual_clip)
    return loss, metrics


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Per-token 0.5 * max((V - R)^2, (V_clipped - R)^2) with V_clipped = V_old + clip(V - V_old, +-clip)
    (the PPO2 baselines form; clip = 0 gives the plain squared error). Returns (loss (B, T), clipped (B, T))."""
    unclipped = (values - returns) ** 2  # (B, T)
    if clip <= 0:
        return 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
    clipped = (v_clipped - returns) ** 2  # (B, T)
    return 0.5 * torch.max(unclipped, clipped), clipped > unclipped


@dataclass
class PPO:
    name: ClassVar[str] = "ppo"
    traits: ClassVar[Traits] = Traits(kl="reward", needs_values=True, token_clip=True, token_rewards=True)
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    # critic, critic_lr: its critic's (roles/critic.py)
    reads: ClassVar[tuple[str, ...]] = ("clip_eps_low", "clip_eps_high", "dual_clip_c", "kl_coef", "kl_estimator",
                                        "gamma", "lam", "vf_coef", "value_clip", "whiten_advantages", "loss_agg",
                                        "critic", "critic_lr")
    gamma: float = 1.0
    lam: float = 1.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    value_clip: float = 0.2
    vf_coef: float = 0.5
    kl_coef: float = 0.0
    kl_estimator: core.KLEstimator = core.kl_k1
    whiten_advantages: bool = True
    aggregate: core.Aggregator = core.token_mean
    dual_clip_c: float | None = None

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "PPO":
        return cls(gamma=algo.gamma, lam=algo.lam, clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high,
                   value_clip=algo.value_clip, vf_coef=algo.vf_coef, kl_coef=algo.kl_coef,
                   kl_estimator=core.kl_estimator(algo.kl_estimator, cls.traits.kl),
                   whiten_advantages=algo.whiten_advantages, aggregate=core.aggregator(algo.loss_agg, max_new_tokens),
                   dual_clip_c=algo.dual_clip_c)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Rollouts) -> Advantages:
        """GAE advantages (B, T), and the returns the critic regresses on."""
        mask = batch.completion_mask
        kl_tok = self.kl_estimator(batch.old_logp, batch.ref_logp) * mask if self.kl_coef > 0 else None  # (B, T)
        rewards = core.token_rewards(batch.reward, mask, kl_tok, self.kl_coef, batch.step_reward)  # (B, T)
        adv, returns = core.gae(rewards, batch.old_values, mask, self.gamma, self.lam)  # (B, T) each
        if self.whiten_advantages:
            adv = core.masked_whiten(adv, mask)
        metrics = {
            "critic/advantages/mean": core.masked_mean(adv, mask).item(),
            "critic/returns/mean": core.masked_mean(returns, mask).item(),
            "critic/values/mean": core.masked_mean(batch.old_values, mask).item(),
            "critic/explained_variance": explained_variance(batch.old_values, returns, mask),
        }
        if kl_tok is not None:
            metrics["critic/kl"] = core.masked_mean(kl_tok, mask).item()  # per token, in the reward
            metrics["critic/kl_bound_frac"] = core.kl_bound_frac(kl_tok, mask)
            metrics["critic/kl_coef"] = self.kl_coef
        return Advantages(adv, metrics, returns=returns)

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        agg = partial(self.aggregate, n_tokens=batch.loss_tokens, n_seqs=batch.loss_seqs)
        pg_tok, was_clipped, ratio = clipped_pg_loss(logp, batch.old_logp, batch.advantages, mask,
                                                     self.clip_eps_low, self.clip_eps_high,
                                                     self.dual_clip_c)  # (B, T) each
        vf_tok, v_clipped = clipped_value_loss(values, batch.old_values, batch.returns, self.value_clip)  # (B, T)
        loss = agg(pg_tok, mask) + self.vf_coef * agg(vf_tok, mask)  # ()
        metrics = {
            "actor/pg_loss": core.masked_mean(pg_tok.detach(), mask).item(),
            "actor/pg_clipfrac": core.masked_mean(was_clipped.float(), mask).item(),
            "actor/ppo_kl": core.masked_mean(batch.old_logp - logp.detach(), mask).item(),
            "critic/vf_loss": core.masked_mean(vf_tok.detach(), mask).item(),
            "critic/vf_clipfrac": core.masked_mean(v_clipped.float(), mask).item(),
            "critic/vpred_mean": core.masked_mean(values.detach(), mask).item(),
        }
        if self.dual_clip_c is not None:
            metrics["actor/pg_clipfrac_lower"] = dual_clip_frac(ratio, batch.advantages, mask, self.dual_clip_c)
        return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over loss tokens: 1 = perfect critic, 0 = no better than a constant."""
    var_r = core.masked_mean((returns - core.masked_mean(returns, mask)) ** 2, mask)
    resid = returns - values
    var_resid = core.masked_mean((resid - core.masked_mean(resid, mask)) ** 2, mask)
    return (1.0 - var_resid / var_r).item() if var_r > 0 else 0.0
