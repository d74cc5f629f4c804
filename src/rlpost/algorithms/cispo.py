"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585, Sec. 3.1).

Patch over GRPO/PPO: clip the importance weight, not the update. PPO's min(r A, clip(r) A) sets
the gradient of a token to zero once its ratio leaves the clip range, and the tokens that leave
first are often rare, decisive ones ("However", "Wait"). CISPO instead uses

    loss_t = - sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A * log pi(y_t)

so every token keeps a REINFORCE gradient, weighted by its (bounded, stop-gradient) importance
weight. Token-mean aggregation, as in the paper. Advantages are GRPO's.

The lower bound. The paper writes clip(r, 1 - eps_low, 1 + eps_high) but runs with no lower bound
("we did not impose a lower bound on the IS weight by setting eps_low to a large value; instead,
we only tuned eps_high"), so ``algo.cispo_eps_low`` defaults to none: a token whose probability
fell keeps its small weight. A number restores a floor of 1 - cispo_eps_low. The upper bound is
``algo.clip_eps_high``, shared with the PPO-clip methods.
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


def cispo_per_token(logp: Tensor, old_logp: Tensor, adv_tok: Tensor, eps_low: float | None, eps_high: float) -> Tensor:
    """-sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi per token (B, T); eps_low None = no floor."""
    floor = None if eps_low is None else 1 - eps_low
    weight = (logp - old_logp).exp().clamp(floor, 1 + eps_high).detach()  # (B, T), no gradient
    return -weight * adv_tok * logp  # (B, T): gradient flows through log pi on every token


@dataclass
class CISPO:
    name: ClassVar[str] = "cispo"
    traits: ClassVar[Traits] = Traits(group_baseline=True, kl="loss")
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    reads: ClassVar[tuple[str, ...]] = ("scale_by_std", "std_scope", "cispo_eps_low", "clip_eps_high", "kl_coef",
                                        "kl_estimator", "kl_importance_ratio", "loss_agg")
    group_size: int
    clip_eps_low: float | None = None  # no lower bound on the IS weight (the paper)
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: core.KLEstimator = core.kl_k3
    scale_by_std: bool = True
    batch_std: bool = False
    aggregate: core.Aggregator = core.token_mean
    kl_importance: bool = False  # the KL term times pi / pi_sampler (algorithms/offpolicy.py)

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "CISPO":
        return cls(group_size=group_size, clip_eps_low=algo.cispo_eps_low, clip_eps_high=algo.clip_eps_high,
                   kl_coef=algo.kl_coef, kl_estimator=core.kl_estimator(algo.kl_estimator, cls.traits.kl),
                   scale_by_std=algo.scale_by_std, batch_std=algo.std_scope == "batch",
                   aggregate=core.aggregator(algo.loss_agg, max_new_tokens), kl_importance=algo.kl_importance_ratio)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Rollouts) -> Advantages:
        adv_seq = grpo_advantages(batch.reward, self.group_size, self.scale_by_std, batch_std=self.batch_std)  # (B,)
        return group_advantages(batch.reward, adv_seq, batch.completion_mask, self.group_size)

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        per_tok = cispo_per_token(logp, batch.old_logp, batch.advantages, self.clip_eps_low, self.clip_eps_high)
        loss = self.aggregate(per_tok, mask, n_tokens=batch.loss_tokens, n_seqs=batch.loss_seqs)  # ()
        ratio = (logp - batch.old_logp).detach().exp()
        below = ratio < 1 - self.clip_eps_low if self.clip_eps_low is not None else torch.zeros_like(mask)
        out_of_range = (below | (ratio > 1 + self.clip_eps_high)).float()
        metrics = {"actor/pg_loss": core.masked_mean(per_tok.detach(), mask).item(),
                   "actor/is_weight_clipfrac": core.masked_mean(out_of_range, mask).item()}
        if self.kl_coef > 0:
            kl_loss, kl_metrics = kl_in_loss(logp, batch, self.aggregate, self.kl_estimator, self.kl_importance)
            metrics.update(kl_metrics)
            loss = loss + self.kl_coef * kl_loss
        return loss, metrics
