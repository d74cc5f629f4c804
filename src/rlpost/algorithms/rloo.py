"""RLOO: REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

Patch over GRPO: the baseline for completion i is the mean reward of the *other* K-1 completions
of its prompt, not the mean of all K. Because the baseline no longer contains r_i, it is
independent of the sample it scores, and the gradient estimate is unbiased; GRPO's own-inclusive
mean shrinks every advantage by (K-1)/K (tests/algorithms/test_bandit.py shows both). No division
by the group std. Everything else (clipped surrogate, optional k3 KL in the loss, aggregator) is
GRPO's, reused from grpo.py.

    A_i = r_i - (sum_j r_j - r_i) / (K - 1) = K / (K - 1) * (r_i - mean(r))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from rlpost.algorithms import core
from rlpost.algorithms.grpo import clipped_loss_with_kl, group_advantages
from rlpost.sections import AlgoConfig
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Traits


def rloo_advantages(reward: Tensor, group_size: int) -> Tensor:
    """Sequence-level leave-one-out advantage (B,)."""
    K = group_size
    return (core.group_centred(reward.double(), K) * K / (K - 1)).to(reward.dtype)  # (B,); float64 as grpo's


@dataclass
class RLOO:
    name: ClassVar[str] = "rloo"
    traits: ClassVar[Traits] = Traits(group_baseline=True, kl="loss", token_clip=True)
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    reads: ClassVar[tuple[str, ...]] = ("clip_eps_low", "clip_eps_high", "dual_clip_c", "kl_coef", "kl_estimator",
                                        "kl_importance_ratio", "loss_agg")
    group_size: int
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: core.KLEstimator = core.kl_k3
    aggregate: core.Aggregator = core.token_mean
    dual_clip_c: float | None = None
    kl_importance: bool = False  # the KL term times pi / pi_sampler (algorithms/offpolicy.py)

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "RLOO":
        return cls(group_size=group_size, clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high,
                   kl_coef=algo.kl_coef, kl_estimator=core.kl_estimator(algo.kl_estimator, cls.traits.kl),
                   aggregate=core.aggregator(algo.loss_agg, max_new_tokens), dual_clip_c=algo.dual_clip_c,
                   kl_importance=algo.kl_importance_ratio)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch: Rollouts) -> Advantages:
        adv_seq = rloo_advantages(batch.reward, self.group_size)  # (B,)
        return group_advantages(batch.reward, adv_seq, batch.completion_mask, self.group_size)

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        return clipped_loss_with_kl(logp, batch, self.clip_eps_low, self.clip_eps_high, self.kl_coef, self.aggregate,
                                    self.kl_estimator, self.dual_clip_c, self.kl_importance)
