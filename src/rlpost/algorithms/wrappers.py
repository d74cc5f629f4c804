"""The shared knobs, as wrappers any algorithm can wear. Each patches one thing and says which.

Loss side, ``loss_fn -> loss_fn`` (the trainer calls the outer one; the algorithm's own loss is the
inner one, under ``with_named_inputs``). Each takes the trainer's named
inputs (types/roles.py: LossFn) and hands them all on, so a wrapper names in its signature the one
it reads and the order they are worn in does not matter:
  with_named_inputs    the algorithm's loss, given values= only where it reads them (Traits.needs_values)
  with_entropy_bonus   loss - coef * aggregated entropy                        (algo.entropy_coef)
  with_tis             advantages scaled by min(pi_old / pi_sampler, cap)      (algo.tis_cap)
  with_clip_cov        no gradient on a few high-covariance tokens              (algo.cov_control=clip_cov)
  with_kl_cov          + coef |log pi - log pi_old| on the top-covariance tokens (algo.cov_control=kl_cov)
  with_entropy_advantage  A + min(alpha H, |A| / kappa), H detached             (algo.entropy_adv_coef)
  (offpolicy.py: with_offpolicy_mask and with_icepop, the off-policy stabilisers, are worn the same way)

Advantage side, ``Advantages -> Advantages`` (after the algorithm's own advantages):
  with_prime           + PRIME's implicit process reward, RLOO-centred         (algo.prime_coef)
  with_process_reward  + a PRM's step rewards, group-normalised, summed to go (task.process_reward_model)
  with_overlong_filter truncated completions drop out of the loss              (algo.overlong_filter)

Adaptive KL (algo.kl_target) moves the algorithm's kl_coef after each update; it is state, so it
lives on the ``Objective`` that wears these (algorithms/objective.py), with its controller in
``core.AdaptiveKLController``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from rlpost.algorithms import core
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, LossFn


def with_named_inputs(algo_loss, reads_values: bool) -> LossFn:
    """An algorithm's own loss under the trainer's convention (types/roles.py: LossFn). rlpost's own
    take both named inputs already; an algorithm of yours may name only ``values``, where its traits
    say it needs them, or neither (``loss(self, logp, batch)``): what it does not name stops here."""

    def loss(logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        return algo_loss(logp, batch, values=values) if reads_values else algo_loss(logp, batch)

    return loss


def with_entropy_bonus(loss_fn: LossFn, coef: float, aggregate: core.Aggregator) -> LossFn:
    """loss - coef * aggregated entropy: the trainer passes ``entropy`` (B, T) with grad."""

    def loss(logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        base, metrics = loss_fn(logp, batch, values=values, entropy=entropy)
        ent = aggregate(entropy, batch.completion_mask, n_tokens=batch.loss_tokens, n_seqs=batch.loss_seqs)  # ()
        return base - coef * ent, metrics

    return loss


def with_tis(loss_fn: LossFn, cap: float, level: str) -> LossFn:
    """Truncated importance sampling (TIS) inside the loss: the advantages are scaled by
    w = min(pi_old / pi_sampler, cap) (``core.truncated_is_weight``) before ``loss_fn`` sees them.

    Folding the (gradient-free, non-negative) weight into the advantage is exact for the token-level
    losses: min(r wA, clip(r) wA) = w min(rA, clip(r)A). GSPO reads a sequence's mean weight (use
    algo.tis_level=sequence there). It runs here, not before the advantages, because pi_old is
    the trainer's own log-prob under the sampling step's weights: when the batch is one optimizer
    step the trainer takes it from its first forward (``old_logp = logp.detach()``), so TIS costs
    no extra pass over the batch (it used to cost a full no-grad forward)."""

    def loss(logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        w = core.truncated_is_weight(batch.old_logp, batch.sampler_logp, mask, cap, level)  # (B, T)
        base, metrics = loss_fn(logp, replace(batch, advantages=batch.advantages * w), values=values, entropy=entropy)
        raw = (batch.old_logp - batch.sampler_logp).exp()
        return base, {**metrics, "actor/tis_weight_mean": core.masked_mean(w, mask).item(),
                      "actor/tis_capped_frac": core.masked_mean((raw > cap).float(), mask).item()}

    return loss


# --- entropy control by covariance (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
# Learning for Reasoning Language Models", arXiv:2505.22617) ------------------------------------
# Under a softmax policy the entropy changes by about -Cov(log pi(y), A) per step (their Eq. 5),
# and a few tokens with a high covariance between their log-prob and their advantage carry most of
# that collapse. Clip-Cov and KL-Cov restrain just those tokens, as in verl's compute_policy_loss
# clip_cov / kl_cov. The covariance is taken over the loss tokens of the (micro-)batch in hand, as
# verl does.


def token_covariance(adv_tok: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """(A_t - mean A) (log pi_t - mean log pi) per token (B, T), means over the mask; no gradient."""
    a, lp = adv_tok.detach(), logp.detach()
    return (a - core.masked_mean(a, mask)) * (lp - core.masked_mean(lp, mask))  # (B, T)


def with_clip_cov(loss_fn: LossFn, ratio: float, lb: float, ub: float) -> LossFn:
    """Clip-Cov (Cui et al. 2025, Sec. 4.2): of the tokens with covariance strictly between lb and
    ub, max(1, ratio * tokens) chosen at random lose their gradient (their log-prob is detached;
    verl also zeroes their loss value, same gradient). The algorithm's PPO clip stays on, as in the
    paper and verl's clip_cov. It acts from the first forward of a batch (the covariance needs no
    policy change), so with one optimizer step per batch too. Deviation: verl skips tokens the PPO
    clip already zeroed; here the choice may fall on one (none are, in the first step on a batch)."""

    def loss(logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        cov = token_covariance(batch.advantages, logp, mask)  # (B, T)
        candidates = (mask & (cov > lb) & (cov < ub)).flatten().nonzero().squeeze(1)  # (n,)
        n = max(int(ratio * int(mask.sum())), 1)
        chosen = candidates[torch.randperm(len(candidates))[:n]]  # (<= n,)
        # (B, T)
        detach = (torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device).index_fill_(0, chosen, True)
                  .view_as(mask))
        base, metrics = loss_fn(torch.where(detach, logp.detach(), logp), batch, values=values, entropy=entropy)
        return base, {**metrics, "actor/clip_cov_frac": core.masked_mean(detach.float(), mask).item()}

    return loss


def with_kl_cov(loss_fn: LossFn, ratio: float, coef: float, aggregate: core.Aggregator) -> LossFn:
    """KL-Cov (Cui et al. 2025, Sec. 4.2): the max(1, ratio * tokens) tokens with the largest
    covariance get + coef * |log pi - log pi_old|, aggregated like the policy loss (verl's kl_cov,
    whose ppo_kl_coef default is 0.1).

    Two choices differ from Clip-Cov's, both the paper's and verl's: the surrogate under the
    penalty is the unclipped ratio * A (``algorithms.build`` opens the algorithm's PPO clip when
    kl_cov is on: the penalty is the trust region; the two differ once the policy has moved off
    the sampling one), and it needs that move: on the first forward of a batch log pi = log pi_old,
    so the penalty and its gradient are 0. With one optimizer step per batch it would never act,
    so ``build.check_algorithm`` refuses that combination in one line (verl does nothing there, silently)."""

    def loss(logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        cov = token_covariance(batch.advantages, logp, mask).masked_fill(~mask, float("-inf"))  # (B, T)
        k = min(max(int(ratio * int(mask.sum())), 1), int(mask.sum()))
        top = (torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
               .index_fill_(0, cov.flatten().topk(k).indices, True).view_as(mask))
        penalty = (logp - batch.old_logp).abs() * top  # (B, T), 0 off the chosen tokens
        base, metrics = loss_fn(logp, batch, values=values, entropy=entropy)
        extra = aggregate(penalty, mask, n_tokens=batch.loss_tokens, n_seqs=batch.loss_seqs)  # ()
        return base + coef * extra, {**metrics, "actor/kl_cov_frac": core.masked_mean(top.float(), mask).item()}

    return loss


def with_entropy_advantage(loss_fn: LossFn, alpha: float, kappa: float) -> LossFn:
    """Entropy-shaped advantage (Cheng et al. 2025, "Reasoning with Exploration: An Entropy
    Perspective", arXiv:2506.14758): A_t + min(alpha * H_t, |A_t| / kappa), H_t the policy's entropy
    at token t without gradient. Unlike the entropy bonus it pushes no token towards uncertainty; it
    raises the advantage of tokens chosen where the policy was uncertain (pivotal, reflective ones),
    and the clip at |A| / kappa keeps the sign of every advantage. The trainer passes ``entropy``;
    it is handed on, as every input is, to the entropy bonus inside when there is one."""

    def loss(logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        shaping = torch.minimum(alpha * entropy.detach(), batch.advantages.abs() / kappa) * mask  # (B, T), >= 0
        base, metrics = loss_fn(logp, replace(batch, advantages=batch.advantages + shaping), values=values,
                                entropy=entropy)
        return base, {**metrics, "actor/entropy_adv_mean": core.masked_mean(shaping, mask).item()}

    return loss


def with_prime(adv: Advantages, batch: Rollouts, coef: float, group_size: int) -> Advantages:
    """PRIME (Cui et al. 2025, arXiv:2502.01456): a dense token reward beta * log(pi / pi_ref),
    RLOO-centred within the group and summed to go (``core.prime_advantages``), added to the
    outcome advantage. pi is the trainer's log-prob under the sampling weights when the loop has
    it (old_logp), else the sampler's own."""
    policy_logp = batch.old_logp if batch.old_logp is not None else batch.sampler_logp  # (B, T)
    implicit = coef * (policy_logp - batch.ref_logp) * batch.completion_mask  # (B, T)
    dense = core.prime_advantages(implicit, batch.completion_mask, group_size)  # (B, T)
    metrics = {**adv.metrics, "reward/implicit_prm_mean": implicit.sum(1).mean().item()}
    return replace(adv, tokens=adv.tokens + dense, metrics=metrics)


def with_process_reward(adv: Advantages, batch: Rollouts, group_size: int, in_rewards: bool) -> Advantages:
    """A process reward model's step rewards (``batch.step_reward``, on each step's last token) in the
    advantages. An algorithm whose advantages come from token rewards (``Traits.token_rewards``: PPO's
    GAE, REINFORCE++'s returns-to-go) has already added them to its rewards (Math-Shepherd's
    step-by-step PPO, Wang et al. 2023); here only their metrics are added. For the rest, DeepSeekMath's
    process supervision (``core.process_advantages``): step rewards normalised within the group,
    summed to go, added to the outcome advantage."""
    mask = batch.completion_mask
    ends = batch.step_end & mask  # (B, T)
    metrics = {**adv.metrics, "reward/process_per_seq": (batch.step_reward * ends).sum(1).mean().item(),
               "reward/steps_per_seq": ends.sum(1).float().mean().item()}
    if in_rewards:
        return replace(adv, metrics=metrics)
    dense = core.process_advantages(batch.step_reward, batch.step_end, mask, group_size)  # (B, T)
    metrics["critic/process_advantages/mean"] = core.masked_mean(dense, mask).item()
    return replace(adv, tokens=adv.tokens + dense, metrics=metrics)


def with_overlong_filter(adv: Advantages, batch: Rollouts) -> Advantages:
    """DAPO's overlong filtering: a truncated completion gets no loss. Applied after the advantages,
    so truncated rows still count in their group's baseline; the loss mask drops their tokens."""
    mask = batch.completion_mask & ~batch.truncated[:, None]  # (B, T)
    return replace(adv, tokens=adv.tokens * mask, loss_mask=mask)
