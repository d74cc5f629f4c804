"""Off-policy stabilisers: what the loss does with tokens a policy other than the trained one drew.

The tokens of a batch come from the sampler (pi_sampler: a bf16 or vLLM copy, and in the async
topology weights some updates old, or, with partial rollouts, several versions within one row);
the loss trains pi (its value at the batch's first forward is pi_old). TIS (wrappers.with_tis)
reweights by min(pi_old / pi_sampler, cap). These three are the other answers, each an option
of the algo section, each worn by any algorithm (``algorithms.build``), each checked against its
paper's equations by hand-worked numbers in tests/algorithms/test_offpolicy.py:

  with_offpolicy_mask   DeepSeek-V3.2 (arXiv:2512.02556, Sec. 3.1, "Off-Policy Sequence Masking"):
                        M_i = 0 where A_i < 0 and (1/|o_i|) sum_t log(pi_sampler / pi) > delta,
                        else 1; the surrogate of every token is multiplied by M_i. A sequence the
                        policy has already moved away from, with a negative advantage, is the one
                        whose gradient mostly adds noise; a positive one still teaches.
                                                                   (algo.offpolicy_mask_delta)
  with_icepop           IcePop (Ling team, "Every Step Evolves", arXiv:2510.18855, Sec. 3):
                        the advantage times M(k), k = pi_old / pi_sampler per token, M(k) = k for
                        k in [1/c, c] (their [alpha, beta] with alpha = 1/beta) and 0 outside: TIS
                        inside the band, no gradient at all from a token whose two probabilities
                        disagree beyond it, where TIS would still push at the cap.  (algo.icepop_c)
  kl_importance         DeepSeek-V3.2 (Sec. 3.1, "Unbiased KL Estimate"): the KL term's per-token
                        k3 times pi / pi_sampler, the ratio with its gradient. Its gradient is then
                        r grad log pi * log(pi / pi_ref), whose expectation under pi_sampler is the
                        exact gradient of KL(pi || pi_ref); plain k3 on tokens pi did not draw is
                        biased.                                        (algo.kl_importance_ratio)

Folding a mask or a non-negative weight into the advantage is exact for every surrogate here:
min(r wA, clip(r) wA) = w min(rA, clip(r)A) for w >= 0 (as with_tis argues), and CISPO's and
GSPO's losses are linear in A. The KL term is left out of both masks, as in the papers.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from rlpost.algorithms import core
from rlpost.types.batch import Rollouts
from rlpost.types.roles import LossFn


def sequence_divergence(sampler_logp: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """(B,) (1/|o_i|) sum_t log(pi_sampler(o_t) / pi(o_t)) over each row's loss tokens, without
    gradient: V3.2's estimate of KL(pi_sampler || pi) on the row it drew (0 for an empty row)."""
    return core.masked_mean((sampler_logp - logp).detach(), mask, dim=-1)  # (B,)


def offpolicy_keep(advantages: Tensor, sampler_logp: Tensor, logp: Tensor, mask: Tensor, delta: float) -> Tensor:
    """(B, T) bool, V3.2's M: False on a token whose advantage is negative in a row whose divergence
    (``sequence_divergence``) exceeds delta; True elsewhere. Token advantages (PPO's GAE) are judged
    one by one; a group method's are the same along a row, so its whole row goes."""
    far = sequence_divergence(sampler_logp, logp, mask) > delta  # (B,)
    return ~((advantages < 0) & far[:, None])  # (B, T)


def icepop_weight(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, c: float) -> Tensor:
    """(B, T) IcePop's M(k): k = pi_old / pi_sampler where 1/c <= k <= c, else 0; 0 off the mask;
    no gradient."""
    k = (old_logp - sampler_logp).detach().exp()  # (B, T)
    inside = (k >= 1.0 / c) & (k <= c) & mask  # (B, T)
    return torch.where(inside, k, torch.zeros_like(k))  # (B, T)


def kl_importance(kl_tok: Tensor, logp: Tensor, sampler_logp: Tensor) -> Tensor:
    """(B, T) r * kl_tok, r = pi / pi_sampler with its gradient through ``logp`` (V3.2's unbiased KL
    estimate; the log-ratio is bounded at +-20, as k3's own, so a far-off token cannot overflow)."""
    ratio = (logp - sampler_logp.detach()).clamp(-20.0, 20.0).exp()  # (B, T)
    return ratio * kl_tok


def with_offpolicy_mask(loss_fn: LossFn, delta: float) -> LossFn:
    """V3.2's off-policy sequence masking inside the loss: advantages x M (``offpolicy_keep``), with pi
    the trainer's log-prob of this forward (the current policy, as the paper's pi_theta). Metric
    actor/offpolicy_masked_frac: the share of rows (with a loss token) masked."""

    def loss(logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        keep = offpolicy_keep(batch.advantages, batch.sampler_logp, logp, mask, delta)  # (B, T)
        base, metrics = loss_fn(logp, replace(batch, advantages=batch.advantages * keep), values=values,
                                entropy=entropy)
        rows = mask.any(-1)  # (B,)
        dropped = ((~keep) & mask).any(-1)  # (B,)
        return base, {**metrics, "actor/offpolicy_masked_frac": core.masked_mean(dropped.float(), rows).item()}

    return loss


def with_icepop(loss_fn: LossFn, c: float) -> LossFn:
    """IcePop inside the loss: advantages x M(pi_old / pi_sampler) (``icepop_weight``); it runs where
    TIS would (wrappers.with_tis: pi_old is the trainer's first forward). Metrics
    actor/icepop_masked_frac (share of loss tokens outside [1/c, c]) and actor/icepop_weight_mean."""

    def loss(logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        w = icepop_weight(batch.old_logp, batch.sampler_logp, mask, c)  # (B, T)
        base, metrics = loss_fn(logp, replace(batch, advantages=batch.advantages * w), values=values, entropy=entropy)
        outside = mask & (w == 0)  # (B, T); k itself is never 0 (an exp), so 0 means masked
        return base, {**metrics, "actor/icepop_masked_frac": core.masked_mean(outside.float(), mask).item(),
                      "actor/icepop_weight_mean": core.masked_mean(w, mask).item()}

    return loss
