"""DAPO: Decoupled clip and Dynamic sAmpling Policy Optimization (Yu et al. 2025, arXiv:2503.14476).

Patches over GRPO (Sec. 3 of the paper), each its own switch here:
1. Clip-higher: eps_high > eps_low (0.28 vs 0.2), so low-probability tokens with a positive
   advantage can still grow; a symmetric clip caps them early and entropy collapses.
   ``algo.dapo_clip_eps_high``.
2. Dynamic sampling: a group whose rewards are all equal (all right or all wrong) has advantage 0
   on every token: it costs compute and shrinks the effective batch. Such groups are dropped and
   more prompts are sampled until the batch is full again, with a cap on extra rounds.
   ``keep_groups`` below decides; the sampling stage (recipes/sampling_stage.py) refills. Any group algorithm
   can use it with ``rollout.filter_groups=true``; for DAPO it is always on.
3. Token-level loss: every token of the mini-batch weighs the same (core.token_mean), so long
   answers are not down-weighted per token. For DAPO ``loss_agg`` is not read.
4. Overlong reward shaping: a soft penalty over the last ``overlong_buffer`` tokens before the
   length cap (``overlong_penalty`` below, added to the reward), and/or overlong filtering (a
   truncated completion gets no loss). Both are shared knobs (``algo.overlong_*``), off by default;
   recipes/dapo_arith.yaml turns the soft penalty on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from torch import Tensor

from rlpost.algorithms import core
from rlpost.algorithms.grpo import GRPO
from rlpost.sections import AlgoConfig
from rlpost.types.roles import Traits


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
class DAPO(GRPO):
    """GRPO's advantages and clipped loss with clip-higher (algo.dapo_clip_eps_high) and the token
    mean fixed; dynamic sampling and overlong shaping happen before the advantages, in the sampling stage
    (recipes/sampling_stage.py)."""

    name: ClassVar[str] = "dapo"
    traits: ClassVar[Traits] = Traits(group_baseline=True, kl="loss", filters_groups=True,
                                      fixed_aggregator="token_mean", token_clip=True)
    # the algo keys it reads, and no other: config_check.py refuses a key another algorithm reads and this one
    # does not (tests/algorithms/test_declared_keys.py holds this to what from_config reads)
    # clip_eps_high: read by GRPO's from_config, then dapo_clip_eps_high's; loss_agg: token mean, fixed
    reads: ClassVar[tuple[str, ...]] = ("scale_by_std", "std_scope", "clip_eps_low", "clip_eps_high",
                                        "dual_clip_c", "dapo_clip_eps_high", "kl_coef", "kl_estimator",
                                        "kl_importance_ratio")

    @classmethod
    def from_config(cls, algo: AlgoConfig, group_size: int, max_new_tokens: int) -> "DAPO":
        return replace(super().from_config(algo, group_size, max_new_tokens), clip_eps_high=algo.dapo_clip_eps_high,
                       aggregate=core.token_mean)
