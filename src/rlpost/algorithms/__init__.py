"""Algorithms: each is an object with ``advantages(batch) -> ((B, T), metrics)``,
``loss(logp, batch) -> (loss, metrics)`` and ``needs_reference``. ``build(cfg)`` picks one.

Optional flags the controller reads (absent = False): ``needs_old_logp`` (the advantages use the
trainer's log-probs under the sampling weights: KL in the reward), ``needs_values`` (a critic:
the trainer then passes ``values=`` to ``loss``), ``filters_groups`` (DAPO's dynamic sampling)."""

from __future__ import annotations

from dataclasses import replace
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


def flag(algo: Algorithm, name: str) -> bool:
    """An optional capability flag of an algorithm (see the module docstring)."""
    return bool(getattr(algo, name, False))


def kl_estimator(name: str, in_reward: bool) -> core.KLEstimator:
    if name == "auto":
        name = "k1" if in_reward else "k3"
    return core.KL_ESTIMATORS[name]


def with_entropy_bonus(loss_fn, coef: float, aggregate: core.Aggregator):
    """loss - coef * aggregated entropy: the trainer passes ``entropy`` (B, T) with grad."""

    def loss(logp: Tensor, batch: Rollouts, entropy: Tensor, **kw) -> tuple[Tensor, dict]:
        base, metrics = loss_fn(logp, batch, **kw)
        ent = aggregate(entropy, batch.completion_mask, n_tokens=batch.loss_tokens, n_seqs=batch.loss_seqs)  # ()
        return base - coef * ent, metrics

    return loss


def with_tis(loss_fn, cap: float, level: str):
    """Truncated importance sampling (TIS) inside the loss: the advantages are scaled by
    w = min(pi_old / pi_sampler, cap) (``core.truncated_is_weight``) before ``loss_fn`` sees them.

    Folding the (gradient-free, non-negative) weight into the advantage is exact for the token-level
    losses: min(r wA, clip(r) wA) = w min(rA, clip(r)A). GSPO reads a sequence's mean weight (use
    algo.tis_level=sequence there). It runs here, not before the advantages, because pi_old is
    the trainer's own log-prob under the sampling step's weights: when the batch is one optimizer
    step the trainer takes it from its first forward (``old_logp = logp.detach()``), so TIS costs
    no extra pass over the batch (it used to cost a full no-grad forward)."""

    def loss(logp: Tensor, batch: Rollouts, **kw) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        w = core.truncated_is_weight(batch.old_logp, batch.sampler_logp, mask, cap, level)  # (B, T)
        base, metrics = loss_fn(logp, replace(batch, advantages=batch.advantages * w), **kw)
        raw = (batch.old_logp - batch.sampler_logp).exp()
        return base, {**metrics, "actor/tis_weight_mean": core.masked_mean(w, mask).item(),
                      "actor/tis_capped_frac": core.masked_mean((raw > cap).float(), mask).item()}

    return loss


def build(cfg) -> Algorithm:
    """The algorithm named by cfg.algo.name, with its knobs from the config."""
    from rlpost.algorithms.cispo import CISPO
    from rlpost.algorithms.dapo import DAPO
    from rlpost.algorithms.dr_grpo import DrGRPO
    from rlpost.algorithms.grpo import GRPO
    from rlpost.algorithms.gspo import GSPO
    from rlpost.algorithms.ppo import PPO
    from rlpost.algorithms.reinforce import Reinforce
    from rlpost.algorithms.reinforce_pp import ReinforcePP
    from rlpost.algorithms.rloo import RLOO

    a, K = cfg.algo, cfg.rollout.group_size
    agg = aggregator(a.loss_agg, cfg.rollout.max_new_tokens)
    clip = {"clip_eps_low": a.clip_eps_low, "clip_eps_high": a.clip_eps_high}
    kl = {"kl_coef": a.kl_coef, "kl_estimator": kl_estimator(a.kl_estimator, in_reward=a.name in ("ppo", "reinforce_pp"))}
    if a.name == "grpo":
        return GRPO(group_size=K, scale_by_std=a.scale_by_std, aggregate=agg, **clip, **kl)
    if a.name == "ppo":
        return PPO(gamma=a.gamma, lam=a.lam, value_clip=a.value_clip, vf_coef=a.vf_coef,
                   whiten_advantages=a.whiten_advantages, aggregate=agg, **clip, **kl)
    if a.name == "rloo":
        return RLOO(group_size=K, aggregate=agg, **clip, **kl)
    if a.name == "reinforce":
        return Reinforce(baseline=a.baseline, baseline_decay=a.baseline_decay, aggregate=agg)
    if a.name == "reinforce_pp":
        return ReinforcePP(aggregate=agg, **clip, **kl)
    if a.name == "dapo":  # token-mean by definition: loss_agg is not read
        return DAPO(group_size=K, scale_by_std=a.scale_by_std, clip_eps_low=a.clip_eps_low,
                    clip_eps_high=a.dapo_clip_eps_high, **kl)
    if a.name == "dr_grpo":  # its aggregator is the constant normaliser by definition: loss_agg is not read
        return DrGRPO(group_size=K, max_new_tokens=cfg.rollout.max_new_tokens, **clip, **kl)
    if a.name == "gspo":
        return GSPO(group_size=K, clip_eps_low=a.seq_clip_eps_low, clip_eps_high=a.seq_clip_eps_high,
                    scale_by_std=a.scale_by_std, **kl)
    if a.name == "cispo":
        return CISPO(group_size=K, scale_by_std=a.scale_by_std, aggregate=agg, **clip, **kl)
    raise ValueError(f"unknown algorithm {a.name!r}")
