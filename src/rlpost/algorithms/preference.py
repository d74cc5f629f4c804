"""Offline preference losses as pure functions of per-sequence log-probs (no model, no state).

Inputs are (B,) float tensors with one value per completion. ``*_logp`` is the SUM over the
completion's tokens of log pi(token) (``sequence_logps`` makes it from (B, T) token log-probs),
``ref_*`` is the same under the frozen reference, and ``*_len`` is the completion's token count.
Every loss is a mean over the batch and returns ``(loss (), metrics)``, with python-float metrics.

Every loss reports ``rewards/chosen`` and ``rewards/rejected`` (mean implicit rewards),
``rewards/margin`` (mean of chosen - rejected) and ``rewards/accuracy`` (share of pairs where
chosen > rejected, a tie counting half: ``core.wins``). TRL's DPOTrainer metrics, except that TRL
counts a tie as wrong and spells the last two ``rewards/margins`` and ``rewards/accuracies``; the
singular names are the ones the offline trainer and its tests read. Other names are TRL's
(``logps/chosen``, ``logps/rejected``, ``nll_loss``, ``kl``, ``count/chosen``).

Variants and deviations, all in one place:
- dpo_loss: sums of log-probs, the paper's form. label_smoothing > 0 gives cDPO.
- ipo_loss: sums by default (the paper's h). With lengths it uses per-token means, as TRL does.
- kto_loss: the KL reference point z0 is an input; kto_kl_ref_point estimates it from mismatched
  pairs, as TRL does. Its "accuracy" is the share of examples on their label's side of z0.
- orpo_loss: ``log_odds_ratio`` is the mean log odds ratio. TRL's metric of that name is the mean
  of log sigma(log odds ratio), which is our ``-or_loss``; TRL's ``log_odds_chosen`` is our
  ``log_odds_ratio``.
- simpo_loss: gamma is the paper's target reward margin itself, not the reference code's
  ``gamma_beta_ratio`` (= gamma / beta).
- nll_anchor (``pref.nll_coef``): RPO, arXiv:2404.19733; per-completion token-mean NLL (TRL's: over all tokens).

The second half turns these into micro-batch losses over a ``Rollouts`` batch for the offline
recipes (``recipes/offline.py``: SFT, the reward model, the DPO family; ``recipes/prm.py``: the
process reward model), normalised by mini-batch totals like every RL loss, so micro-batch x
accumulation is exact here too.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from rlpost.algorithms import core
from rlpost.sections import PrefConfig
from rlpost.types.batch import Rollouts

# pref.loss values that need no reference model: they compare the policy with itself.
REFERENCE_FREE = ("orpo", "simpo")


def _like(x, ref: Tensor) -> Tensor:
    """x (a number or a tensor) as a tensor with ref's dtype and device."""
    return torch.as_tensor(x, dtype=ref.dtype, device=ref.device)


def sequence_logps(token_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence (sum, count, mean) of token log-probs over the mask; padding never enters."""
    # where(), not a multiply: a pad position may hold -inf or nan, and -inf * 0 = nan.
    kept = torch.where(mask, token_logp, torch.zeros_like(token_logp))  # (B, T)
    total = kept.sum(-1)  # (B,)
    count = mask.sum(-1).to(token_logp.dtype)  # (B,) float, ready to divide by
    return total, count, total / count.clamp(min=1)  # (B,) x3; an empty row's mean is 0


def _pair_metrics(chosen_reward: Tensor, rejected_reward: Tensor) -> dict:
    """The four reward metrics from (B,) implicit rewards of the chosen and rejected completions."""
    margin = chosen_reward - rejected_reward  # (B,)
    return {
        "rewards/chosen": chosen_reward.mean().item(),
        "rewards/rejected": rejected_reward.mean().item(),
        "rewards/margin": margin.mean().item(),
        "rewards/accuracy": core.wins(margin).mean().item(),
    }


def dpo_loss(policy_chosen_logp: Tensor, policy_rejected_logp: Tensor, ref_chosen_logp: Tensor,
             ref_rejected_logp: Tensor, beta: float = 0.1, label_smoothing: float = 0.0) -> tuple[Tensor, dict]:
    """DPO, Rafailov et al. 2023 Eq. 7, with cDPO label smoothing: -(1-eps) log σ(βm) - eps log σ(-βm)."""
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5], got {label_smoothing}")
    chosen_logratio = policy_chosen_logp - ref_chosen_logp  # (B,)
    rejected_logratio = policy_rejected_logp - ref_rejected_logp  # (B,)
    logits = beta * (chosen_logratio - rejected_logratio)  # (B,) beta * m
    # cDPO: each label is taken to be flipped with probability eps, so the target is the
    # eps-mixture of both orders. logsigmoid keeps a large |beta * m| finite.
    losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)  # (B,)
    # The implicit reward is beta * log(pi / pi_ref) (Sec. 5), and it is what TRL logs.
    metrics = _pair_metrics(beta * chosen_logratio, beta * rejected_logratio)
    metrics["logps/chosen"] = policy_chosen_logp.mean().item()
    metrics["logps/rejected"] = policy_rejected_logp.mean().item()
    return losses.mean(), metrics


def ipo_loss(policy_chosen_logp: Tensor, policy_rejected_logp: Tensor, ref_chosen_logp: Tensor,
             ref_rejected_logp: Tensor, beta: float = 0.1, chosen_len: Tensor | None = None,
             rejected_len: Tensor | None = None) -> tuple[Tensor, dict]:
    """IPO, Azar et al. 2023 Eq. 17: (h - 1/(2β))², h the log-ratio margin; per-token h if lengths given."""
    if (chosen_len is None) != (rejected_len is None):
        raise ValueError("ipo_loss: pass both chosen_len and rejected_len, or neither")
    chosen_logratio = policy_chosen_logp - ref_chosen_logp  # (B,)
    rejected_logratio = policy_rejected_logp - ref_rejected_logp  # (B,)
    if chosen_len is not None:
        # TRL's IPO averages log-probs per token. A summed h grows with length, so one fixed
        # target 1/(2 beta) would ask a long pair for a smaller per-token change than a short one.
        chosen_logratio = chosen_logratio / _like(chosen_len, chosen_logratio)  # (B,)
        rejected_logratio = rejected_logratio / _like(rejected_len, rejected_logratio)  # (B,)
    h = chosen_logratio - rejected_logratio  # (B,)
    # A squared loss regresses h onto the target instead of pushing it to infinity as DPO's
    # log-sigmoid does once preferences are deterministic. That is IPO's point (Sec. 5).
    losses = (h - 1.0 / (2.0 * beta)) ** 2  # (B,)
    metrics = _pair_metrics(beta * chosen_logratio, beta * rejected_logratio)
    metrics["ipo/h"] = h.mean().item()  # compare with the target 1 / (2 beta)
    return losses.mean(), metrics


def kto_kl_ref_point(policy_logp_mismatched: Tensor, ref_logp_mismatched: Tensor) -> Tensor:
    """KTO's reference point z0 (Ethayarajh et al. 2024, Eq. 8): mean log-ratio, clamped ≥ 0, no gradient."""
    # z0 estimates KL(pi || pi_ref) over the data. As TRL does, estimate it from mismatched pairs:
    # each completion is scored after another row's prompt (y' drawn for a different x), so the
    # estimate is not the log-ratio of the very examples being scored. A KL cannot be negative,
    # so a noisy negative estimate is clamped to 0. The paper passes no gradient through z0. With
    # several ranks, average the estimate across them before passing it to kto_loss.
    z0 = (policy_logp_mismatched - ref_logp_mismatched).mean()  # ()
    return z0.clamp(min=0).detach()  # ()


def kto_loss(policy_logp: Tensor, ref_logp: Tensor, desirable: Tensor, kl_ref_point: float | Tensor,
             beta: float = 0.1, desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> tuple[Tensor, dict]:
    """KTO, Ethayarajh et al. 2024 Eq. 8, unpaired: λ_D(1 - σ(β(r - z0))) or λ_U(1 - σ(β(z0 - r)))."""
    logratio = policy_logp - ref_logp  # (B,) r = log(pi / pi_ref)
    desirable = desirable.bool()  # (B,)
    z0 = _like(kl_ref_point, logratio).detach().clamp(min=0)  # () constant, whatever the caller passed
    # 1 - σ(x) is written as σ(-x), which keeps its digits when σ(x) is near 1. The value is bounded
    # on both sides: an example already far on its label's side of z0 stops pulling.
    loss_d = desirable_weight * torch.sigmoid(beta * (z0 - logratio))  # (B,) = λ_D (1 - σ(β(r - z0)))
    loss_u = undesirable_weight * torch.sigmoid(beta * (logratio - z0))  # (B,) = λ_U (1 - σ(β(z0 - r)))
    losses = torch.where(desirable, loss_d, loss_u)  # (B,)

    # Unpaired data: the metrics are per side. A side that is absent from the batch has a nan mean,
    # so the sums and counts (TRL's names) are given too, for exact aggregation over micro-batches.
    reward = beta * logratio.detach()  # (B,) implicit reward; TRL does not subtract z0
    n_d, n_u = int(desirable.sum()), int((~desirable).sum())
    sum_d, sum_u = reward[desirable].sum().item(), reward[~desirable].sum().item()
    mean_d = sum_d / n_d if n_d else math.nan
    mean_u = sum_u / n_u if n_u else math.nan
    right_side = core.wins(torch.where(desirable, logratio - z0, z0 - logratio))  # (B,) 1, 1/2 on z0, 0
    metrics = {
        "rewards/chosen": mean_d, "rewards/rejected": mean_u, "rewards/margin": mean_d - mean_u,
        "rewards/accuracy": right_side.mean().item(),
        "rewards/chosen_sum": sum_d, "rewards/rejected_sum": sum_u,
        "count/chosen": float(n_d), "count/rejected": float(n_u), "kl": z0.item(),
    }
    return losses.mean(), metrics


_LN2 = math.log(2.0)
# A mean log-prob of exactly 0 (p = 1, which float32 log_softmax can return) has infinite odds.
# Capping it just below 0 caps log odds near 16.1 and keeps the loss finite.
_MAX_MEAN_LOGP = -1e-7


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x < 0, accurate at both ends (Mächler 2012, "Accurately computing log(1 - exp(-|a|))")."""
    # Near 0, 1 - exp(x) cancels, and -expm1(x) keeps the digits. Far from 0, exp(x) is tiny and
    # log1p keeps them. Each branch sees only inputs from its own side, so neither makes an inf
    # whose zero-weighted gradient would become nan inside torch.where.
    near = torch.log(-torch.expm1(x.clamp(min=-_LN2)))  # same shape as x
    far = torch.log1p(-torch.exp(x.clamp(max=-_LN2)))  # same shape as x
    return torch.where(x > -_LN2, near, far)


def orpo_loss(policy_chosen_mean_logp: Tensor, policy_rejected_mean_logp: Tensor, nll_chosen: Tensor,
              lam: float = 0.1) -> tuple[Tensor, dict]:
    """ORPO, Hong et al. 2024 Eq. 6-7: NLL(y_w) - λ log σ(log odds(y_w) - log odds(y_l)), no reference model."""
    # The paper's likelihood is length-normalised, p = exp(mean token log-prob), and its
    # odds(y) = p / (1 - p), so log odds = log p - log(1 - exp(log p)).
    chosen = policy_chosen_mean_logp.clamp(max=_MAX_MEAN_LOGP)  # (B,)
    rejected = policy_rejected_mean_logp.clamp(max=_MAX_MEAN_LOGP)  # (B,)
    log_odds_ratio = (chosen - log1mexp(chosen)) - (rejected - log1mexp(rejected))  # (B,)
    or_term = F.logsigmoid(log_odds_ratio)  # (B,) log σ(log OR), which is <= 0
    nll = _like(nll_chosen, chosen).mean()  # () a scalar NLL passes through unchanged
    loss = nll - lam * or_term.mean()  # ()
    # TRL logs lambda * mean log-prob as the "reward". Log odds rise with p, so its accuracy is
    # the share of pairs with log OR > 0.
    metrics = _pair_metrics(lam * policy_chosen_mean_logp, lam * policy_rejected_mean_logp)
    metrics.update({
        "logps/chosen": policy_chosen_mean_logp.mean().item(),
        "logps/rejected": policy_rejected_mean_logp.mean().item(),
        "nll_loss": nll.item(),
        "log_odds_ratio": log_odds_ratio.mean().item(),
        "or_loss": -or_term.mean().item(),
    })
    return loss, metrics


def simpo_loss(policy_chosen_logp: Tensor, policy_rejected_logp: Tensor, chosen_len: Tensor, rejected_len: Tensor,
               beta: float = 2.0, gamma: float = 0.5) -> tuple[Tensor, dict]:
    """SimPO, Meng et al. 2024 Eq. 6: -log σ(β/|y_w| log π(y_w) - β/|y_l| log π(y_l) - γ), no reference model."""
    # The reward is the mean token log-prob times beta. It is what generation ranks by, so it
    # needs no reference model and gives no reward for length. gamma is the target margin.
    chosen_reward = beta * policy_chosen_logp / _like(chosen_len, policy_chosen_logp)  # (B,)
    rejected_reward = beta * policy_rejected_logp / _like(rejected_len, policy_rejected_logp)  # (B,)
    losses = -F.logsigmoid(chosen_reward - rejected_reward - gamma)  # (B,)
    metrics = _pair_metrics(chosen_reward, rejected_reward)
    metrics["logps/chosen"] = policy_chosen_logp.mean().item()
    metrics["logps/rejected"] = policy_rejected_logp.mean().item()
    return losses.mean(), metrics


def nll_anchor(loss: Tensor, metrics: dict, policy_chosen_logp: Tensor, chosen_len: Tensor,
               coef: float) -> tuple[Tensor, dict]:
    """RPO (Pang et al. 2024 Eq. 1): loss + coef * mean -log pi(y_w) / |y_w| (DPO alone may lower both log-probs)."""
    nll = -(policy_chosen_logp / _like(chosen_len, policy_chosen_logp).clamp(min=1)).mean()  # ()
    return loss + coef * nll, {**metrics, "nll_loss": nll.item()}


def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor,
                       margin: float | Tensor | None = None) -> tuple[Tensor, dict]:
    """Reward-model loss, Ouyang et al. 2022 Eq. 1: -log σ(s_c - s_r - m); margin m: Touvron et al. 2023 Eq. 2."""
    # One pair per row. InstructGPT's 1 / C(K, 2) over the K responses to one prompt is this
    # batch mean when every pair of a prompt is a row.
    diff = chosen_scores - rejected_scores  # (B,)
    # Llama 2: a pair rated "significantly better" must be separated by at least its margin.
    shifted = diff if margin is None else diff - _like(margin, diff)  # (B,)
    losses = -F.logsigmoid(shifted)  # (B,)
    metrics = _pair_metrics(chosen_scores, rejected_scores)
    # The reward model's own names. Accuracy ignores the margin: is the chosen one scored higher?
    metrics["rm/accuracy"] = core.wins(diff).mean().item()
    metrics["rm/margin_mean"] = diff.mean().item()
    return losses.mean(), metrics


# --- micro-batch losses over a Rollouts batch (the offline recipes) ------------------------------


def sft_loss(logp: Tensor, batch: Rollouts, *, values: None = None, entropy: None = None) -> tuple[Tensor, dict]:
    nll = core.token_mean(-logp, batch.completion_mask, batch.loss_tokens, batch.loss_seqs)  # ()
    return nll, {"sft/nll": core.masked_mean(-logp.detach(), batch.completion_mask).item()}


def rm_scores(values: Tensor, mask: Tensor) -> Tensor:
    """(B,) the value head's output at each row's last completion token (its EOS)."""
    return (values * core.last_token(mask)).sum(1)


def make_rm_loss(pref: PrefConfig):
    def loss_fn(logp: Tensor, batch: Rollouts, *, values: Tensor, entropy: None = None) -> tuple[Tensor, dict]:
        s = rm_scores(values, batch.completion_mask).view(-1, 2)  # (pairs, 2)
        margin = torch.full((len(s),), pref.rm_margin, device=s.device) if pref.rm_margin > 0 else None
        loss, m = bradley_terry_loss(s[:, 0], s[:, 1], margin=margin)
        return loss * len(s) / (batch.loss_seqs / 2), m

    return loss_fn


def pair_sums(token_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B,) per-row sums -> (pairs, 2) sums and (pairs, 2) lengths; rows 2i, 2i+1 are a pair."""
    total, count, _ = sequence_logps(token_logp, mask)  # (B,) each
    return total.view(-1, 2), count.view(-1, 2)  # (pairs, 2) each


def make_dpo_loss(pref: PrefConfig):
    """The micro-batch loss for pref.loss; scaled by this micro-batch's share of the mini-batch's pairs."""

    def loss_fn(logp: Tensor, batch: Rollouts, *, values: None = None, entropy: None = None) -> tuple[Tensor, dict]:
        mask = batch.completion_mask
        s, n = pair_sums(logp, mask)  # (pairs, 2) each
        r, _ = pair_sums(batch.ref_logp, mask) if batch.ref_logp is not None else (None, None)
        if pref.loss == "dpo":
            loss, m = dpo_loss(s[:, 0], s[:, 1], r[:, 0], r[:, 1], beta=pref.beta, label_smoothing=pref.label_smoothing)
        elif pref.loss == "ipo":
            loss, m = ipo_loss(s[:, 0], s[:, 1], r[:, 0], r[:, 1], beta=pref.beta, chosen_len=n[:, 0],
                               rejected_len=n[:, 1])
        elif pref.loss == "simpo":
            loss, m = simpo_loss(s[:, 0], s[:, 1], n[:, 0], n[:, 1], beta=pref.beta, gamma=pref.simpo_gamma)
        elif pref.loss == "orpo":
            mean = s / n.clamp(min=1)  # (pairs, 2) per-token mean log-probs
            loss, m = orpo_loss(mean[:, 0], mean[:, 1], -mean[:, 0], lam=pref.orpo_lambda)
        else:  # kto: the pairs give one desirable and one undesirable example each
            pol, ref = s.reshape(-1), r.reshape(-1)  # (B,)
            desirable = torch.tensor([True, False], device=s.device).repeat(len(s))
            z0 = kto_kl_ref_point(pol.detach(), ref)
            loss, m = kto_loss(pol, ref, desirable, z0, beta=pref.beta)
        if pref.nll_coef > 0:  # RPO: plus an NLL anchor on the chosen completion
            loss, m = nll_anchor(loss, m, s[:, 0], n[:, 0], pref.nll_coef)
        share = len(s) / (batch.loss_seqs / 2)  # pairs here / pairs in the mini-batch
        return loss * share, m

    return loss_fn


def bce_at_positions(values: Tensor, batch: Rollouts, aggregate=core.token_mean) -> tuple[Tensor, dict]:
    """BCE-with-logits of the head's logits ``values`` (B, T) against ``batch.returns`` (B, T), on
    ``batch.completion_mask`` only; ``aggregate`` divides by the mini-batch's label count by default."""
    mask = batch.completion_mask  # (B, T) bool, the labelled positions
    per_pos = F.binary_cross_entropy_with_logits(values, batch.returns, reduction="none")  # (B, T)
    loss = aggregate(per_pos, mask, batch.loss_tokens, batch.loss_seqs)  # ()
    with torch.no_grad():
        prob = values.sigmoid()  # (B, T)
        agree = ((prob > 0.5) == (batch.returns > 0.5)).float()  # (B, T) thresholded agreement
        metrics = {"prm/bce": core.masked_mean(per_pos, mask).item(),
                   "prm/acc@0.5": core.masked_mean(agree, mask).item(),
                   "prm/prob_mean": core.masked_mean(prob, mask).item()}
    return loss, metrics
