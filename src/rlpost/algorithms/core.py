"""Pure tensor maths shared by every algorithm: masked reductions, loss aggregators, KL
estimators, group baselines. No model, no config, no state: each function is unit-tested with
hand-worked numbers in tests/algorithms/test_core.py.

Loss aggregators take the *mini-batch* totals from the batch (``loss_tokens``, ``loss_seqs``)
rather than the totals of the tensor in hand. A micro-batch therefore returns its exact share
of the mini-batch loss, and gradient accumulation over micro-batches equals one big batch.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import Tensor

# An aggregator turns per-token values (B, T) into the scalar loss, given the mask and the
# mini-batch totals. It is passed to the loss as a function, never chosen by a string inside the
# loss: the loss then reads the same for every aggregator, and a new one needs no edit there.
Aggregator = Callable[[Tensor, Tensor, float, int], Tensor]


def masked_mean(x: Tensor, mask: Tensor, dim=None) -> Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask.to(x.dtype)).sum()


# --- loss aggregators ------------------------------------------------------------------------


def token_mean(x: Tensor, mask: Tensor, n_tokens: float, n_seqs: int) -> Tensor:
    """Every loss token of the mini-batch weighs the same (DAPO, verl's default 'token-mean')."""
    return masked_sum(x, mask) / max(n_tokens, 1.0)  # ()


def seq_mean_token_mean(x: Tensor, mask: Tensor, n_tokens: float, n_seqs: int) -> Tensor:
    """Mean over each sequence's tokens, then over sequences (the original GRPO paper).
    A long sequence's tokens each weigh less than a short one's: the length bias Dr. GRPO removes."""
    per_seq = masked_mean(x, mask, dim=-1)  # (B,)
    return per_seq.sum() / n_seqs  # ()


def seq_mean_token_sum(x: Tensor, mask: Tensor, n_tokens: float, n_seqs: int) -> Tensor:
    """Sum over each sequence's tokens, mean over sequences."""
    return masked_sum(x, mask) / n_seqs  # ()


def const_norm(x: Tensor, mask: Tensor, n_tokens: float, n_seqs: int, max_len: int) -> Tensor:
    """Sum over tokens / (sequences * max_new_tokens) (Dr. GRPO): a constant normaliser, so no
    sequence's tokens are up- or down-weighted by its own length."""
    return masked_sum(x, mask) / (n_seqs * max_len)  # ()


def aggregator(name: str, max_new_tokens: int) -> Aggregator:
    """The aggregator named by ``algo.loss_agg``."""
    table = {"token_mean": token_mean, "seq_mean_token_mean": seq_mean_token_mean,
             "seq_mean_token_sum": seq_mean_token_sum, "const_norm": partial(const_norm, max_len=max_new_tokens)}
    return table[name]


# --- KL estimators (Schulman, "Approximating KL divergence", 2020) ---------------------------
# All take per-token log-probs of the sampled tokens under pi (the policy) and pi_ref, with the
# tokens sampled from pi, and estimate KL(pi || pi_ref) per token.


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """log(pi/pi_ref): unbiased, high variance, can be negative."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """0.5 * log(pi/pi_ref)^2: biased, low variance, matches KL to second order."""
    return 0.5 * (logp - ref_logp) ** 2


# k3 grows like e^(log r): one token the reference likes e^15 times more than the policy gives
# 3.3e6 and swamps the loss. verl clamps the estimate to [-10, 10] (kl_penalty 'low_var_kl'); k3 is
# never negative, so only the top bites. ``kl_bound_frac`` reports how often it does.
KL_BOUND = 10.0


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """r - 1 - log r with r = pi_ref/pi: unbiased and always >= 0 (GRPO's choice), bounded above by
    KL_BOUND as verl bounds it; a bounded token gets no gradient from the KL term."""
    log_r = (ref_logp - logp).clamp(-20.0, 20.0)  # keep exp finite on far-off tokens
    return (log_r.exp() - 1.0 - log_r).clamp(max=KL_BOUND)


def kl_bound_frac(kl_tok: Tensor, mask: Tensor) -> float:
    """Share of loss tokens whose KL estimate is at (k3: clamped to) or past KL_BOUND."""
    return masked_mean((kl_tok.detach() >= KL_BOUND).float(), mask).item()


KLEstimator = Callable[[Tensor, Tensor], Tensor]  # (logp, ref_logp) -> per-token KL estimate (B, T)
KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimator(name: str, place: str) -> KLEstimator:
    """``algo.kl_estimator``; 'auto' = k1 for a KL in the reward (unbiased; its variance is
    averaged by the return), k3 for a KL in the loss (unbiased and never negative)."""
    if name == "auto":
        name = "k1" if place == "reward" else "k3"
    return KL_ESTIMATORS[name]


# --- token-level rewards (KL in the reward: InstructGPT, PPO, REINFORCE++) --------------------


def last_token(mask: Tensor) -> Tensor:
    """(B, T) bool: True on each row's last loss token (no True in an all-masked row)."""
    m = mask.long()
    idx = (m.cumsum(1) * m).argmax(1)  # (B,) column of the last 1 (0 for an empty row)
    return torch.zeros_like(mask).scatter_(1, idx[:, None], True) & mask


def token_rewards(score: Tensor, mask: Tensor, kl_tok: Tensor | None = None, kl_coef: float = 0.0,
                  dense: Tensor | None = None) -> Tensor:
    """(B, T): the sequence score on the last loss token, minus kl_coef * KL on every loss token
    (Ziegler et al. 2019; Ouyang et al. 2022, Eq. 2), plus ``dense`` (B, T) where given: a process
    reward model's step rewards on each step's last token (Math-Shepherd's step-by-step PPO)."""
    r = score[:, None] * last_token(mask).to(score.dtype)  # (B, T)
    if kl_tok is not None and kl_coef > 0:
        r = r - kl_coef * kl_tok.detach() * mask.to(score.dtype)
    if dense is not None:
        r = r + dense * mask.to(score.dtype)
    return r


def returns_to_go(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """(B, T) sum_{s >= t} gamma^(s-t) r_s over loss tokens: GAE with V = 0 and lambda = 1."""
    return gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)[0]


def prime_advantages(implicit: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """PRIME's process advantage from implicit token rewards r_t = beta * log(pi(y_t) / pi_ref(y_t)):
    A_t = sum_{s >= t} (r_s - b_i), b_i = the mean over the group's OTHER completions of their
    per-token mean implicit reward (PRIME eq. 6, gamma = 1). Added to the outcome advantage."""
    per_token = (implicit * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B,)
    grouped = per_token.view(-1, group_size)
    loo = (grouped.sum(1, keepdim=True) - grouped) / max(1, group_size - 1)  # (n_prompts, K)
    return returns_to_go((implicit - loo.view(-1, 1)) * mask, mask)


def process_advantages(step_reward: Tensor, step_end: Tensor, mask: Tensor, group_size: int,
                       eps: float = 1e-6) -> Tensor:
    """(B, T) advantage of a process reward model's step rewards in a group method: DeepSeekMath's
    process supervision (Shao et al. 2024, arXiv:2402.03300, Sec. 4.1.3). Each step reward is
    normalised by the mean and (unbiased) std of every step reward of its group's K completions,
    and a token's advantage is the sum of the normalised rewards of the steps ending at or after
    it. A group with a single step, or with equal step rewards, gives 0."""
    B, T = step_reward.shape
    ends = step_end & mask  # (B, T)
    r = step_reward.double().reshape(-1, group_size * T)  # (n_prompts, K*T): contiguous groups; float64 as grpo's
    m = ends.reshape(-1, group_size * T).to(r.dtype)  # (n_prompts, K*T)
    n = m.sum(1, keepdim=True)  # (n_prompts, 1) steps in the group
    mean = (r * m).sum(1, keepdim=True) / n.clamp(min=1)
    var = (((r - mean) * m) ** 2).sum(1, keepdim=True) / (n - 1).clamp(min=1)
    normed = ((r - mean) / (var.sqrt() + eps) * m).view(B, T)  # (B, T), 0 off the step ends
    return returns_to_go(normed, mask).to(step_reward.dtype)  # sum over the steps ending at or after t


# --- group baselines (sequence level: one value per completion) ------------------------------


def group_centred(reward: Tensor, group_size: int) -> Tensor:
    """r_i - mean of its group (the group's own rows, including r_i). Rows of a group are contiguous."""
    grouped = reward.view(-1, group_size)  # (n_prompts, K)
    return (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)  # (B,)


def group_std(reward: Tensor, group_size: int) -> Tensor:
    """Unbiased std of each row's group, repeated per row (as in TRL and verl)."""
    grouped = reward.view(-1, group_size)  # (n_prompts, K)
    return grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1)  # (B,)


def to_tokens(adv_seq: Tensor, mask: Tensor) -> Tensor:
    """Broadcast a sequence-level advantage (B,) to its completion tokens (B, T)."""
    return adv_seq[:, None] * mask.to(adv_seq.dtype)  # (B, T)


# --- advantage normalisation -----------------------------------------------------------------


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """(x - mean) / std over the loss tokens only (B, T); 0 off the mask. PPO's advantage whitening."""
    wide = x.double()  # float64 inside: a large finite value's square must not overflow float32
    mean = masked_mean(wide, mask)  # ()
    var = masked_mean((wide - mean) ** 2, mask)  # ()
    return ((wide - mean) / (var.sqrt() + eps) * mask.to(wide.dtype)).to(x.dtype)  # (B, T)


def group_mean_batch_std(reward: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Hybrid: centre within each group, scale by the std of the whole batch. Keeps GRPO's
    per-prompt baseline without GRPO's up-weighting of near-unanimous groups."""
    centred = group_centred(reward, group_size)  # (B,)
    return centred / (reward.std() + eps)  # (B,)


# --- KL control ---------------------------------------------------------------------


class AdaptiveKLController:
    """Ziegler et al. 2019 (Eq. 2): beta <- beta * (1 + clip((KL - target) / target, -0.2, 0.2) * n / horizon).
    KL above target raises beta, below lowers it, at most 20% per horizon's worth of samples.
    Its state, ``coef``, is checkpointed by the ``Objective`` that holds it (objective.py)."""

    def __init__(self, init_coef: float, target: float, horizon: int):
        self.coef, self.target, self.horizon = init_coef, target, horizon

    def update(self, kl: float, n_samples: int) -> float:
        error = max(-0.2, min(0.2, kl / self.target - 1.0))
        self.coef *= 1.0 + error * n_samples / self.horizon
        return self.coef


# --- off-policy corrections against the sampler ----------------------------------------------


def truncated_is_weight(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float,
                        level: str = "token") -> Tensor:
    """min(pi_old / pi_sampler, cap), without gradient (TIS, Yao et al. 2025).

    When the sampler (bf16, vLLM) and the trainer disagree, the samples come from pi_sampler while
    the loss assumes pi_old; this weight corrects the mismatch, truncated so it cannot blow up.
    level='token': one weight per token (B, T). level='sequence': exp of the summed log-ratio per
    sequence, broadcast to its tokens (B, T)."""
    log_w = (old_logp - sampler_logp).detach() * mask  # (B, T)
    if level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)  # (B, T)
    return log_w.exp().clamp(max=cap) * mask  # (B, T)


# Bin edges of the importance-ratio histogram pi_trainer / pi_sampler (metric hist/sampler_ratio,
# one count per bin between consecutive edges): a healthy run has nearly all tokens in 0.99-1.01.
RATIO_EDGES = [0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.01, 1.05, 1.1, 1.25, 2.0, float("inf")]


def ratio_histogram(ratio: Tensor) -> list[int]:
    # (n,) bin of each ratio
    idx = torch.bucketize(ratio, torch.tensor(RATIO_EDGES[1:-1], device=ratio.device), right=True)
    return torch.bincount(idx, minlength=len(RATIO_EDGES) - 1).tolist()


# --- prompt filtering ------------------------------------------------------------------------


def pass_rate(reward: Tensor, group_size: int, threshold: float = 1.0) -> Tensor:
    """Fraction of each group's samples with reward >= threshold, per prompt (n_prompts,)."""
    return (reward.view(-1, group_size) >= threshold).float().mean(1)  # (n_prompts,)


# --- generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438) ---------------


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Token-level advantages and returns, (B, T) each.

    delta_t = r_t + gamma * V_{t+1} - V_t, with V after the last loss token = 0 (episode ends);
    A_t = delta_t + gamma * lam * A_{t+1} (Eq. 16), computed backwards; returns = A + V.
    lam = 1 gives the Monte-Carlo return minus V; lam = 0 gives the TD(0) error."""
    B, T = rewards.shape
    mask_f = mask.to(values.dtype)
    values = values * mask_f
    adv = torch.zeros_like(values)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)  # (B,)
    next_adv = torch.zeros(B, dtype=values.dtype, device=values.device)  # (B,)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        a = delta + gamma * lam * next_adv  # (B,)
        m = mask_f[:, t]
        adv[:, t] = a * m
        # padding after the last loss token leaves the running values untouched
        next_value = values[:, t] * m + next_value * (1 - m)
        next_adv = a * m + next_adv * (1 - m)
    return adv, adv + values


def wins(margin: Tensor) -> Tensor:
    """(B,) 1 where a pair's margin is positive, 1/2 on a tie (a coin's chance), else 0: the
    preference accuracies' count, where a tie counted as wrong made an untrained DPO policy (its
    own reference, every margin 0) read as accuracy 0."""
    return (margin > 0).float() + 0.5 * (margin == 0).float()
