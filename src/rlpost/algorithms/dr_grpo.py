"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

Patch over GRPO, two removals:
1. no division by the group's reward std: A_i = r_i - mean(r_group). Dividing by std up-weights
   prompts that are nearly always or never solved (their std is small): a difficulty bias.
2. no division by each completion's own length: the loss is sum over tokens / (sequences *
   max_new_tokens), a constant. Dividing by |o_i| makes a long wrong answer's tokens cheap
   (so wrong answers drift longer) and a short right answer's tokens dear: a length bias.
The clipped surrogate and the optional k3 KL term are GRPO's, reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from torch import Tensor

from rlpost.algorithms import core
from rlpost.algorithms.grpo import clipped_loss_with_kl, group_advantages, grpo_advantages
from rlpost.sections import AlgoConfig
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Traits


@dataclass
class DrGRPO:
    name: ClassVar[str] = "dr_grpo"
    traits: ClassVar[Traits] = Traits(group_baseline=True, kl="loss", fixed_aggregator="const_norm", token_clip=True)
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    # loss_agg: the constant normaliser, fixed
    reads: ClassVar[tuple[str, ...]] = ("clip_eps_low", "clip_eps_high", "dual_clip_c", "kl_coef", "kl_estimator",
                                        "kl_importance_ratio")
    group_size: int
    max_new_tokens: int
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: core.KLEstimator = core.kl_k3
    dual_clip_c: float | None = None
    kl_importance: bool = False  # the KL term times pi / pi_sampler (algorithms/offpolicy.py)

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "DrGRPO":
        return cls(group_size=group_size, max_new_tokens=max_new_tokens, clip_eps_low=algo.clip_eps_low,
                   clip_eps_high=algo.clip_eps_high, kl_coef=algo.kl_coef,
                   kl_estimator=core.kl_estimator(algo.kl_estimator, cls.traits.kl), dual_clip_c=algo.dual_clip_c,
                   kl_importance=algo.kl_importance_ratio)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Rollouts) -> Advantages:
        adv_seq = grpo_advantages(batch.reward, self.group_size, scale_by_std=False)  # (B,)
        return group_advantages(batch.reward, adv_seq, batch.completion_mask, self.group_size)

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        const = partial(core.const_norm, max_len=self.max_new_tokens)  # sum / (B * max_new_tokens)
        return clipped_loss_with_kl(logp, batch, self.clip_eps_low, self.clip_eps_high, self.kl_coef, const,
                                    self.kl_estimator, self.dual_clip_c, self.kl_importance)
