"""REINFORCE (Williams 1992), the root of the family: loss = -A * log pi(token), with
A = reward - baseline for every token of the completion.

Baseline (``algo.baseline``): 'none' (A = r: unbiased, highest variance) or 'moving_average'
(b <- decay * b + (1 - decay) * mean(batch reward), updated *after* the batch's advantages are
formed, so b never depends on the samples it scores). No ratio and no clipping: REINFORCE is
on-policy, so use it with trainer.epochs = 1 and one mini-batch. The moving-average baseline is
state: it is saved in checkpoints (``Traits.state``) for exact resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from rlpost.algorithms import core
from rlpost.sections import AlgoConfig
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Traits


def reinforce_advantages(reward: Tensor, baseline: float) -> Tensor:
    return reward - baseline  # (B,)


@dataclass
class Reinforce:
    name: ClassVar[str] = "reinforce"
    traits: ClassVar[Traits] = Traits(kl="none", on_policy_only=True, state=("b",))
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    reads: ClassVar[tuple[str, ...]] = ("baseline", "baseline_decay", "loss_agg")
    baseline: str = "moving_average"  # 'none' | 'moving_average'
    baseline_decay: float = 0.9
    aggregate: core.Aggregator = core.token_mean
    needs_reference: bool = False
    kl_coef: float = 0.0  # no KL term (traits.kl = 'none'); present so every algorithm has one
    b: float | None = None  # the moving average; None until the first batch

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "Reinforce":
        return cls(baseline=algo.baseline, baseline_decay=algo.baseline_decay,
                   aggregate=core.aggregator(algo.loss_agg, max_new_tokens))

    def advantages(self, batch: Rollouts) -> Advantages:
        b = 0.0 if self.baseline == "none" or self.b is None else self.b
        adv_seq = reinforce_advantages(batch.reward, b)  # (B,)
        if self.baseline == "moving_average":
            mean = batch.reward.mean().item()
            self.b = mean if self.b is None else self.baseline_decay * self.b + (1 - self.baseline_decay) * mean
        return Advantages(core.to_tokens(adv_seq, batch.completion_mask), {"critic/baseline": b})

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        per_tok = -batch.advantages * logp  # (B, T): the score-function estimator, nothing else
        loss = self.aggregate(per_tok, mask, n_tokens=batch.loss_tokens, n_seqs=batch.loss_seqs)  # ()
        return loss, {"actor/pg_loss": core.masked_mean(per_tok.detach(), mask).item()}
