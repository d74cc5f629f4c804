"""GRPO (Shao et al. 2024, arXiv:2402.03300, "DeepSeekMath"), as implemented here.

Patch over PPO: no critic. The baseline for a completion is the mean reward of the K completions
sampled for the same prompt; the advantage is that difference, optionally divided by the group's
std, and every token of the completion gets it. The policy loss is PPO's clipped surrogate (ppo.py);
the KL anchor to the frozen reference is a separate term in the loss (k3 estimator), not a
penalty folded into the reward.

Deviations and choices, each a config key:
1. ``scale_by_std`` (default true, as in the paper). False gives Dr. GRPO's plain r - mean, which
   does not up-weight prompts whose group rewards barely differ. ``std_scope='batch'`` divides by
   the std of the whole batch instead of the group's (the hybrid: group mean, batch std).
2. ``clip_eps_low`` / ``clip_eps_high`` may differ (DAPO's clip-higher); equal by default.
3. ``loss_agg`` picks the aggregator function (algorithms/core.py). Default 'token_mean' (DAPO,
   verl); the paper's is 'seq_mean_token_mean'.
4. KL only when ``kl_coef > 0``; then the reference model is loaded, otherwise it never is.
5. ``dual_clip_c`` (off by default): dual-clip PPO, shared by every PPO-clip method here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from rlpost.algorithms import core, offpolicy
from rlpost.algorithms.ppo import clipped_policy_loss
from rlpost.sections import AlgoConfig
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Traits


def grpo_advantages(reward: Tensor, group_size: int, scale_by_std: bool, eps: float = 1e-6,
                    batch_std: bool = False) -> Tensor:
    """Sequence-level GRPO advantage, Eq. in Sec. 4.1.2: (r_i - mean(r_group)) / std(r_group).
    batch_std: divide by the std of every reward in the batch instead (group mean, batch std: the
    normalisation Liu et al. 2025, 'Tricks or Traps?' arXiv:2508.08221, find the most robust; a
    near-unanimous group is not blown up by its own tiny std)."""
    wide = reward.double()  # a finite float32 reward near its max (3e38) squares to inf in float32's std
    if scale_by_std and batch_std:
        return core.group_mean_batch_std(wide, group_size, eps).to(reward.dtype)  # (B,)
    adv_seq = core.group_centred(wide, group_size)  # (B,)
    if scale_by_std:
        adv_seq = adv_seq / (core.group_std(wide, group_size) + eps)  # (B,)
    return adv_seq.to(reward.dtype)


def group_advantages(reward: Tensor, adv_seq: Tensor, mask: Tensor, group_size: int) -> Advantages:
    """What every group method's advantages() returns: its sequence advantage adv_seq (B,) on each
    completion token (B, T), and one metric set, so the report's group reward spread is drawn for
    every one of them. reward (B,): the rewards the advantage came from, K = group_size rows a group."""
    std = core.group_std(reward.double(), group_size).view(-1, group_size)[:, 0]  # (n_prompts,)
    metrics = {
        "critic/advantages/mean": adv_seq.mean().item(),
        "critic/advantages/max": adv_seq.max().item(),
        "critic/advantages/min": adv_seq.min().item(),
        "reward/group_std": std.mean().item(),
        "reward/zero_std_frac": (std == 0).float().mean().item(),  # groups with no signal
    }
    return Advantages(core.to_tokens(adv_seq, mask), metrics)  # (B, T)


@dataclass
class GRPO:
    name: ClassVar[str] = "grpo"
    traits: ClassVar[Traits] = Traits(group_baseline=True, kl="loss", token_clip=True)
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    reads: ClassVar[tuple[str, ...]] = ("scale_by_std", "std_scope", "clip_eps_low", "clip_eps_high",
                                        "dual_clip_c", "kl_coef", "kl_estimator", "kl_importance_ratio", "loss_agg")
    group_size: int
    scale_by_std: bool = True
    batch_std: bool = False
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    aggregate: core.Aggregator = core.token_mean
    kl_estimator: core.KLEstimator = core.kl_k3
    dual_clip_c: float | None = None
    kl_importance: bool = False  # the KL term times pi / pi_sampler (algorithms/offpolicy.py)

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "GRPO":
        return cls(group_size=group_size, scale_by_std=algo.scale_by_std, batch_std=algo.std_scope == "batch",
                   clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, kl_coef=algo.kl_coef,
                   aggregate=core.aggregator(algo.loss_agg, max_new_tokens),
                   kl_estimator=core.kl_estimator(algo.kl_estimator, cls.traits.kl), dual_clip_c=algo.dual_clip_c,
                   kl_importance=algo.kl_importance_ratio)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Rollouts) -> Advantages:
        adv_seq = grpo_advantages(batch.reward, self.group_size, self.scale_by_std, batch_std=self.batch_std)  # (B,)
        return group_advantages(batch.reward, adv_seq, batch.completion_mask, self.group_size)

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        """Scalar loss for this (micro-)batch, already normalised by mini-batch totals."""
        return clipped_loss_with_kl(logp, batch, self.clip_eps_low, self.clip_eps_high, self.kl_coef, self.aggregate,
                                    self.kl_estimator, self.dual_clip_c, self.kl_importance)


def clipped_loss_with_kl(
    logp: Tensor, batch: Rollouts, eps_low: float, eps_high: float, kl_coef: float, aggregate: core.Aggregator,
    kl_estimator: core.KLEstimator = core.kl_k3, dual_clip: float | None = None, kl_importance: bool = False,
) -> tuple[Tensor, dict]:
    """GRPO's loss: PPO's clipped surrogate on batch.advantages, plus kl_coef * KL to the reference
    (k3 by default; kl_importance: times pi / pi_sampler, offpolicy.kl_importance). RLOO and the other
    group-baseline methods reuse it with their own advantages."""
    loss, metrics = clipped_policy_loss(logp, batch, eps_low, eps_high, aggregate, dual_clip)
    if kl_coef > 0:
        kl_loss, kl_metrics = kl_in_loss(logp, batch, aggregate, kl_estimator, kl_importance)
        loss, metrics = loss + kl_coef * kl_loss, {**metrics, **kl_metrics}  # ()
    return loss, metrics


def kl_in_loss(logp: Tensor, batch: Rollouts, aggregate: core.Aggregator,
               estimator: core.KLEstimator = core.kl_k3, importance: bool = False) -> tuple[Tensor, dict]:
    """GRPO's KL anchor: KL(pi || pi_ref) per token (k3 in the paper), aggregated like the policy loss;
    importance: each token's estimate times pi / pi_sampler (DeepSeek-V3.2's unbiased KL,
    offpolicy.kl_importance). Returns (the term to scale by kl_coef, metrics: its token mean actor/kl
    and actor/kl_bound_frac, the share of tokens held at core.KL_BOUND)."""
    mask = batch.completion_mask
    kl_tok = estimator(logp, batch.ref_logp)  # (B, T)
    if importance:
        kl_tok = offpolicy.kl_importance(kl_tok, logp, batch.sampler_logp)  # (B, T)
    term = aggregate(kl_tok, mask, n_tokens=batch.loss_tokens, n_seqs=batch.loss_seqs)  # ()
    return term, {"actor/kl": core.masked_mean(kl_tok.detach(), mask).item(),
                  "actor/kl_bound_frac": core.kl_bound_frac(kl_tok, mask)}
