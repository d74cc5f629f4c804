"""On-policy distillation: the student samples, a teacher scores every token (Agarwal et al. 2024,
"On-Policy Distillation of Language Models", arXiv:2306.13649, with the reverse KL; Qwen3's and
Thinking Machines' 2025 recipe).

Patch over REINFORCE/PPO: the reward is dense and comes from a teacher, not a verifier. For each
token the student sampled, the per-token sample of the reverse KL, log pi_student(y_t) -
log pi_teacher(y_t) (k1), is a cost; its negative is the token's advantage,

    A_t = -(log pi_old(y_t) - log pi_teacher(y_t))       (no gradient; no discount, no baseline)

and the loss is PPO's clipped surrogate on it (ppo.clipped_policy_loss, no KL term). Its
expected gradient is the gradient of KL(pi || pi_teacher) on the student's own samples, so the
student learns where it actually goes, mode-seeking. The teacher (``algo.teacher``: any model
folder with the student's tokenizer, a larger checkpoint or an RL-trained run) sits in the
reference role; the verifier's reward is logged but not used.
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


def reverse_kl_advantages(old_logp: Tensor, teacher_logp: Tensor, mask: Tensor) -> Tensor:
    """(B, T): -(log pi_old - log pi_teacher) on the loss tokens, 0 elsewhere."""
    return -(old_logp - teacher_logp).detach() * mask.to(old_logp.dtype)  # (B, T)


@dataclass
class Distill:
    name: ClassVar[str] = "distill"
    traits: ClassVar[Traits] = Traits(kl="none", token_clip=True, teacher=True)
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    reads: ClassVar[tuple[str, ...]] = ("clip_eps_low", "clip_eps_high", "dual_clip_c", "loss_agg")
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    aggregate: core.Aggregator = core.token_mean
    dual_clip_c: float | None = None
    kl_coef: float = 0.0  # no KL term of its own: the teacher's is the advantage

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "Distill":
        return cls(clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, dual_clip_c=algo.dual_clip_c,
                   aggregate=core.aggregator(algo.loss_agg, max_new_tokens))

    @property
    def needs_reference(self) -> bool:  # the teacher, in the reference role
        return True

    def advantages(self, batch: Rollouts) -> Advantages:
        mask = batch.completion_mask
        adv_tok = reverse_kl_advantages(batch.old_logp, batch.ref_logp, mask)  # (B, T)
        return Advantages(adv_tok, {"distill/reverse_kl": core.masked_mean(-adv_tok, mask).item(),
                                    "critic/advantages/mean": core.masked_mean(adv_tok, mask).item()})

    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        return clipped_policy_loss(logp, batch, self.clip_eps_low, self.clip_eps_high, self.aggregate, self.dual_clip_c)
