"""The algorithm role as the loop sees it: one algorithm (a file of this package) with the shared
knobs around it. Built from a config by ``algorithms.build``; every knob is optional and off by
default, so ``Objective(GRPO(...), GRPO(...).loss)`` is plain GRPO.

  advantages(batch)   the algorithm's own (for episodes, by the turn credit rule: turns.py), then a PRM's
                      step rewards, PRIME and the overlong filter (wrappers.py)
  loss                the algorithm's loss inside the entropy bonus and TIS (wrappers.py)
  end_step(...)       after each update: adaptive KL moves kl_coef (core.AdaptiveKLController)
  state_dict()        what a checkpoint keeps: the fields the algorithm's traits name as state
                      (REINFORCE's moving baseline) and the adapted KL coefficient
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.algorithms import core, turns
from rlpost.algorithms.wrappers import (
    with_overlong_filter,
    with_prime,
    with_process_reward,
)
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Algorithm, LossFn, Traits


def old_logp_first(traits: Traits, kl_coef: float, adaptive_kl: bool) -> bool:
    """Whether the trainer's old log-probs (and a critic's values) must be computed before the
    advantages: for GAE's values, for a KL in the reward (measured under the sampling weights),
    to measure the KL that adaptive control tracks, and for a teacher's token advantages (distill). Otherwise the
    trainer takes old_logp from its own first forward, at no extra cost (roles/trainer.py)."""
    return traits.needs_values or (traits.kl == "reward" and kl_coef > 0) or adaptive_kl or traits.teacher


@dataclass
class Objective:
    algo: Algorithm
    loss: LossFn  # algo.loss, wrapped by the loss-side knobs
    prime_coef: float = 0.0  # > 0: PRIME's implicit process reward joins the advantages
    group_size: int = 1  # K, for PRIME's leave-one-out centring
    overlong_filter: bool = False
    kl_control: core.AdaptiveKLController | None = None  # adaptive KL (algo.kl_target > 0)
    turn_credit: str = "episode"  # environment episodes: which tokens a turn's reward reaches (algorithms/turns.py)
    turn_discount: float = 1.0

    @property
    def traits(self) -> Traits:
        return self.algo.traits

    @property
    def needs_reference(self) -> bool:  # the KL term, or PRIME's log(pi / pi_ref)
        return self.algo.needs_reference or self.prime_coef > 0

    @property
    def old_logp_first(self) -> bool:
        return old_logp_first(self.traits, self.algo.kl_coef, self.kl_control is not None)

    def advantages(self, batch: Rollouts) -> Advantages:
        if batch.turn_end is not None:  # environment episodes: the credit rule (task.turn_credit)
            adv = turns.advantages(self.algo, batch, self.turn_credit, self.turn_discount)
        else:
            adv = self.algo.advantages(batch)
        if batch.step_reward is not None:  # a process reward model scored the steps (task.process_reward_model)
            adv = with_process_reward(adv, batch, self.group_size, self.traits.token_rewards)
        if self.prime_coef > 0:
            adv = with_prime(adv, batch, self.prime_coef, self.group_size)
        if self.overlong_filter:  # after PRIME: the filtered rows get no loss at all
            adv = with_overlong_filter(adv, batch)
        return adv

    def end_step(self, update_metrics: dict, adv_metrics: dict, n_samples: int) -> dict:
        """Adaptive KL: move kl_coef toward the target from the KL measured this step (in the loss,
        or in the reward for PPO / REINFORCE++). Returns the metrics to log."""
        if self.kl_control is None:
            return {}
        measured = update_metrics.get("actor/kl", adv_metrics.get("critic/kl"))
        self.algo.kl_coef = self.kl_control.update(measured, n_samples)
        return {"actor/kl_coef": self.algo.kl_coef}

    def state_dict(self) -> dict:
        return {"algo": {name: getattr(self.algo, name) for name in self.traits.state},
                "kl_coef": self.kl_control.coef if self.kl_control else None}

    def load_state_dict(self, state: dict) -> None:
        for name, value in (state.get("algo") or {}).items():
            setattr(self.algo, name, value)
        if self.kl_control is not None and state.get("kl_coef") is not None:  # continue from the adapted value
            self.kl_control.coef = self.algo.kl_coef = state["kl_coef"]
