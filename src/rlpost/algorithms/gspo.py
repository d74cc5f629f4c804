"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).

Patch over GRPO: the importance ratio and its clipping move from tokens to sequences. The reward
is given per sequence, so the ratio is too:

    s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|) = exp(mean_t (log pi - log pi_old))

the geometric mean of the token ratios (length-normalised, so long and short answers have
comparable ratios). The loss is -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), averaged
over sequences. A whole sequence is kept or clipped; token-level ratios, whose noise grows with
length and with sampler/trainer mismatch, never clip single tokens. The clip range is therefore
far narrower than PPO's (the paper: 3e-4 / 4e-4). Advantages are GRPO's group-normalised ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from rlpost.algorithms import core
from rlpost.algorithms.grpo import group_advantages, grpo_advantages, kl_in_loss
from rlpost.sections import AlgoConfig
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Traits


def sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """(B,) geometric mean of the token ratios of each sequence."""
    return core.masked_mean(logp - old_logp, mask, dim=-1).exp()  # (B,)


@dataclass
class GSPO:
    name: ClassVar[str] = "gspo"
    traits: ClassVar[Traits] = Traits(group_baseline=True, kl="loss", fixed_aggregator="sequence")
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    # loss_agg: the sequence mean, fixed
    reads: ClassVar[tuple[str, ...]] = ("scale_by_std", "std_scope", "seq_clip_eps_low", "seq_clip_eps_high",
                                        "kl_coef", "kl_estimator", "kl_importance_ratio")
    group_size: int
    clip_eps_low: float = 3e-4
    clip_eps_high: float = 4e-4
    kl_coef: float = 0.0
    kl_estimator: core.KLEstimator = core.kl_k3
    scale_by_std: bool = True
    batch_std: bool = False
    kl_importance: bool = False  # the KL term times pi / pi_sampler (algorithms/offpolicy.py)

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "GSPO":
        return cls(group_size=group_size, clip_eps_low=algo.seq_clip_eps_low, clip_eps_high=algo.seq_clip_eps_high,
                   kl_coef=algo.kl_coef, kl_estimator=core.kl_estimator(algo.kl_estimator, cls.traits.kl),
                   scale_by_std=algo.scale_by_std, batch_std=algo.std_scope == "batch",
                   kl_importance=algo.kl_importance_ratio)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Rollouts) -> Advantages:
        adv_seq = grpo_advantages(batch.reward, self.group_size, self.scale_by_std, batch_std=self.batch_std)  # (B,)
        return group_advantages(batch.reward, adv_seq, batch.completion_mask, self.group_size)

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        adv_seq = batch.advantages.sum(-1) / mask.sum(-1).clamp(min=1)  # (B,) back from the token broadcast
        s = sequence_ratio(logp, batch.old_logp, mask)  # (B,)
        clipped = s.clamp(1 - self.clip_eps_low, 1 + self.clip_eps_high) * adv_seq  # (B,)
        per_seq = -torch.min(s * adv_seq, clipped)  # (B,)
        loss = per_seq.sum() / batch.loss_seqs  # () mean over the mini-batch's sequences
        metrics = {"actor/pg_loss": per_seq.detach().mean().item(),
                   "actor/pg_clipfrac": (clipped < s * adv_seq).float().mean().item(),
                   "actor/seq_ratio_max": s.detach().max().item()}
        if self.kl_coef > 0:  # per sequence, like its policy loss
            kl_loss, kl_metrics = kl_in_loss(logp, batch, core.seq_mean_token_mean, self.kl_estimator,
                                               self.kl_importance)
            metrics.update(kl_metrics)
            loss = loss + self.kl_coef * kl_loss
        return loss, metrics
