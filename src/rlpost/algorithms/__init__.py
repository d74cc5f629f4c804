"""Algorithms: each is an object with ``advantages(batch) -> ((B, T), metrics)``,
``loss(logp, batch) -> (loss, metrics)`` and ``needs_reference``. ``build(cfg)`` picks one."""

from __future__ import annotations

from functools import partial
from typing import Protocol

from torch import Tensor

from rlpost.algorithms import core
from rlpost.batch import Rollouts


class Algorithm(Protocol):
    needs_reference: bool

    def advantages(self, batch: Rollouts) -> tuple[Tensor, dict]: ...  # (B, T) token advantages

    def loss(self, logp: Tensor, batch: Rollouts) -> tuple[Tensor, dict]: ...  # scalar, metrics

    # Optional: an algorithm with state (a moving baseline, an adaptive KL coefficient) also has
    # state_dict() / load_state_dict(), which the controller saves in every checkpoint.


def aggregator(name: str, max_new_tokens: int) -> core.Aggregator:
    table = {
        "token_mean": core.token_mean,
        "seq_mean_token_mean": core.seq_mean_token_mean,
        "seq_mean_token_sum": core.seq_mean_token_sum,
        "const_norm": partial(core.const_norm, max_len=max_new_tokens),
    }
    return table[name]


def build(cfg) -> Algorithm:
    """The algorithm named by cfg.algo.name, with its knobs from the config."""
    from rlpost.algorithms.cispo import CISPO
    from rlpost.algorithms.dr_grpo import DrGRPO
    from rlpost.algorithms.grpo import GRPO
    from rlpost.algorithms.gspo import GSPO
    from rlpost.algorithms.reinforce import Reinforce
    from rlpost.algorithms.reinforce_pp import ReinforcePP
    from rlpost.algorithms.rloo import RLOO

    a, K = cfg.algo, cfg.rollout.group_size
    agg = aggregator(a.loss_agg, cfg.rollout.max_new_tokens)
    if a.name == "grpo":
        return GRPO(group_size=K, scale_by_std=a.scale_by_std, clip_eps_low=a.clip_eps_low,
                    clip_eps_high=a.clip_eps_high, kl_coef=a.kl_coef, aggregate=agg)
    if a.name == "rloo":
        return RLOO(group_size=K, clip_eps_low=a.clip_eps_low, clip_eps_high=a.clip_eps_high, kl_coef=a.kl_coef, aggregate=agg)
    if a.name == "reinforce":
        return Reinforce(baseline=a.baseline, baseline_decay=a.baseline_decay, aggregate=agg)
    if a.name == "reinforce_pp":
        return ReinforcePP(clip_eps_low=a.clip_eps_low, clip_eps_high=a.clip_eps_high, kl_coef=a.kl_coef, aggregate=agg)
    if a.name == "dr_grpo":  # its aggregator is the constant normaliser by definition: loss_agg is not read
        return DrGRPO(group_size=K, max_new_tokens=cfg.rollout.max_new_tokens, clip_eps_low=a.clip_eps_low,
                      clip_eps_high=a.clip_eps_high, kl_coef=a.kl_coef)
    if a.name == "gspo":
        return GSPO(group_size=K, clip_eps_low=a.seq_clip_eps_low, clip_eps_high=a.seq_clip_eps_high,
                    kl_coef=a.kl_coef, scale_by_std=a.scale_by_std)
    if a.name == "cispo":
        return CISPO(group_size=K, clip_eps_low=a.clip_eps_low, clip_eps_high=a.clip_eps_high, kl_coef=a.kl_coef,
                     scale_by_std=a.scale_by_std, aggregate=agg)
    raise ValueError(f"unknown algorithm {a.name!r}")
