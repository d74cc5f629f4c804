"""DAPO: Decoupled clip and Dynamic sAmpling Policy Optimization (Yu et al. 2025, arXiv:2503.14476).

Patches over GRPO (Sec. 3 of the paper), each its own switch here:
1. Clip-higher: eps_high > eps_low (0.28 vs 0.2), so low-probability tokens with a positive
   advantage can still grow; a symmetric clip caps them early and entropy collapses.
   ``algo.dapo_clip_eps_high``.
2. Dynamic sampling: a group whose rewards are all equal (all right or all wrong) has advantage 0
   on every token: it costs compute and shrinks the effective batch. Such groups are dropped and
   more prompts are sampled until the batch is full again, with a cap on extra rounds.
   ``keep_groups`` below decides; the loop's ``collect`` (recipes/rl.py) refills. Any group algorithm
   can use it with ``rollout.filter_groups=true``; for DAPO it is always on.
3. Token-level loss: every token of the mini-batch weighs the same (core.token_mean), so long
   answers are not down-weighted per token. For DAPO ``loss_agg`` is not read.
4. Overlong reward shaping: a soft penalty over the last ``overlong_buffer`` tokens before the
   length cap (``overlong_penalty`` below, added to the reward), and/or overlong filtering (a
   truncated completion gets no loss). Both are shared knobs (``algo.overlong_*``), off by default;
   recipes/dapo_arith.yaml turns the soft penalty on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from rlpost.algorithms import core
from rlpost.algorithms.grpo import GRPO
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Traits


def keep_groups(reward: Tensor, group_size: int, min_pass: float = 0.0, max_pass: float = 1.0) -> Tensor:
    """(n_prompts,) bool: the group's rewards are not all equal, and its pass rate p (reward >= 1)
    lies in [min_pass, max_pass]. Where p(1 - p) = 0 a group baseline gives every token zero advantage."""
    grouped = reward.view(-1, group_size)  # (n_prompts, K)
    varied = grouped.max(1).values > grouped.min(1).values  # (n_prompts,)
    p = core.pass_rate(reward, group_size)  # (n_prompts,)
    return varied & (p >= min_pass) & (p <= max_pass)


def overlong_penalty(length: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """(B,) DAPO Eq. 13, scaled by `factor`: 0 up to max_len - buffer tokens, then falling linearly
    to -factor at max_len (a completion cannot be longer than max_len here)."""
    if buffer <= 0:
        return torch.zeros_like(length, dtype=torch.float32)
    over = (length.float() - (max_len - buffer)).clamp(min=0)  # (B,) tokens into the buffer
    return -factor * (over / buffer).clamp(max=1.0)  # (B,)


@dataclass
class DAPO:
    """GRPO's advantages and clipped loss (it holds a GRPO), with clip-higher and token-mean fixed;
    dynamic sampling and overlong shaping happen before the advantages (recipes/rl.py: collect)."""

    name: ClassVar[str] = "dapo"
    traits: ClassVar[Traits] = Traits(group_baseline=True, kl="loss", filters_groups=True, fixed_aggregator="token_mean", token_clip=True)
    grpo: GRPO

    @classmethod
    def from_config(cls, cfg) -> "DAPO":
        a = cfg.algo
        return cls(GRPO(group_size=cfg.rollout.group_size, scale_by_std=a.scale_by_std, batch_std=a.std_scope == "batch",
                        clip_eps_low=a.clip_eps_low,
                        clip_eps_high=a.dapo_clip_eps_high, kl_coef=a.kl_coef, aggregate=core.token_mean,
                        kl_estimator=core.kl_estimator(a.kl_estimator, cls.traits.kl), dual_clip_c=a.dual_clip_c))

    @property
    def needs_reference(self) -> bool:
        return self.grpo.needs_reference

    @property
    def kl_coef(self) -> float:  # adaptive KL moves it (algorithms/objective.py)
        return self.grpo.kl_coef

    @kl_coef.setter
    def kl_coef(self, value: float) -> None:
        self.grpo.kl_coef = value

    def advantages(self, batch: Rollouts) -> Advantages:
        return self.grpo.advantages(batch)

    def loss(self, logp: Tensor, batch: Rollouts) -> tuple[Tensor, dict]:
        return self.grpo.loss(logp, batch)
