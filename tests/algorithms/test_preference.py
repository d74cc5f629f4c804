"""Hand-worked numbers for the preference losses: the arithmetic is in each comment.

Numbers used throughout: σ(0.5) = 0.622459, -log σ(0.5) = log(1 + e^-0.5) = 0.474077,
-log σ(-0.5) = 0.474077 + 0.5 = 0.974077, -log σ(1.5) = log(1 + e^-1.5) = 0.201413,
-log σ(1) = 0.313262, -log σ(-1) = 1.313262."""

import math

import pytest
import torch

from rlpost.algorithms.preference import (
    bradley_terry_loss,
    dpo_loss,
    ipo_loss,
    kto_kl_ref_point,
    kto_loss,
    log1mexp,
    orpo_loss,
    sequence_logps,
    simpo_loss,
)

t = torch.tensor


def close(a, b, tol=1e-5):
    return math.isclose(float(torch.as_tensor(a).detach()), b, rel_tol=tol, abs_tol=tol)


# --- sequence_logps ------------------------------------------------------------------------------


def test_sequence_logps_masks_padding_even_when_it_holds_inf_or_nan():
    token_logp = t([[-1.0, -2.0, -math.inf], [-0.5, math.nan, 7.0], [3.0, 3.0, 3.0]], requires_grad=True)
    mask = t([[True, True, False], [True, False, False], [False, False, False]])
    total, count, mean = sequence_logps(token_logp, mask)
    # row 0: -1 + -2 = -3 over 2 tokens -> mean -1.5; row 1: -0.5 over 1; row 2: empty -> 0, 0, mean 0
    assert total.tolist() == [-3.0, -0.5, 0.0]
    assert count.tolist() == [2.0, 1.0, 0.0] and count.dtype == torch.float32
    assert mean.tolist() == [-1.5, -0.5, 0.0]
    total.sum().backward()
    # d(sum)/d(token) = 1 on the mask, 0 on padding, and no nan leaks from the -inf / nan pads
    assert token_logp.grad.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


# --- DPO -----------------------------------------------------------------------------------------


def test_dpo_by_hand():
    # pair 0: pc=-1, pr=-2, rc=rr=-1.5 -> chosen logratio 0.5, rejected -0.5, margin m = 1, βm = 0.5
    #         loss -log σ(0.5) = 0.474077
    # pair 1: chosen and rejected swapped -> m = -1, βm = -0.5, loss -log σ(-0.5) = 0.974077
    # mean (0.474077 + 0.974077) / 2 = 0.724077
    loss, m = dpo_loss(t([-1.0, -2.0]), t([-2.0, -1.0]), t([-1.5, -1.5]), t([-1.5, -1.5]), beta=0.5)
    assert close(loss, 0.724077)
    # implicit rewards β * logratio: chosen [0.25, -0.25], rejected [-0.25, 0.25]
    assert close(m["rewards/chosen"], 0.0) and close(m["rewards/rejected"], 0.0)
    assert close(m["rewards/margin"], 0.0)  # margins [0.5, -0.5]
    assert m["rewards/accuracy"] == 0.5  # pair 0 right, pair 1 wrong
    assert close(m["logps/chosen"], -1.5) and close(m["logps/rejected"], -1.5)


def test_dpo_equals_minus_logsigmoid_of_beta_margin():
    pc, pr, rc, rr, beta = t([-3.2]), t([-4.1]), t([-3.0]), t([-3.7]), 0.3
    margin = (-3.2 - -3.0) - (-4.1 - -3.7)  # (-0.2) - (-0.4) = 0.2
    expected = -math.log(1 / (1 + math.exp(-beta * margin)))  # -log σ(0.06) = log(1 + e^-0.06) = 0.663597
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=beta)
    assert close(loss, expected) and close(expected, 0.663597)


def test_dpo_label_smoothing():
    args = (t([-1.0]), t([-2.0]), t([-1.5]), t([-1.5]))  # βm = 0.5 with β = 0.5
    plain, _ = dpo_loss(*args, beta=0.5)
    zero, _ = dpo_loss(*args, beta=0.5, label_smoothing=0.0)
    assert torch.equal(plain, zero) and close(plain, 0.474077)
    # cDPO eps = 0.2: 0.8 * 0.474077 + 0.2 * 0.974077 = 0.379262 + 0.194815 = 0.574077
    smoothed, _ = dpo_loss(*args, beta=0.5, label_smoothing=0.2)
    assert close(smoothed, 0.574077)
    with pytest.raises(ValueError):
        dpo_loss(*args, label_smoothing=0.7)


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    pc, pr = t([-1.0], requires_grad=True), t([-2.0], requires_grad=True)
    loss, _ = dpo_loss(pc, pr, t([-1.5]), t([-1.5]), beta=0.5)
    loss.backward()
    # dL/dpc = -β σ(-βm) = -0.5 * σ(-0.5) = -0.5 * 0.377541 = -0.188771; dL/dpr = +0.188771.
    # Gradient descent therefore moves pc up and pr down.
    assert close(pc.grad, -0.188771) and close(pr.grad, 0.188771)


def test_dpo_is_finite_for_huge_margins():
    loss, _ = dpo_loss(t([0.0, -1e4]), t([-1e4, 0.0]), t([0.0, 0.0]), t([0.0, 0.0]), beta=1.0)
    # βm = ±1e4: -log σ(1e4) ≈ 0 and -log σ(-1e4) = 1e4; mean 5000, no inf from log(0)
    assert close(loss, 5000.0)


# --- IPO -----------------------------------------------------------------------------------------


def test_ipo_by_hand_and_minimum_at_half_inverse_beta():
    # β = 0.5 -> target 1 / (2β) = 1. pc=-1, pr=-2, rc=rr=-1.5: h = 0.5 - (-0.5) = 1 -> loss 0
    pc = t([-1.0], requires_grad=True)
    loss, m = ipo_loss(pc, t([-2.0]), t([-1.5]), t([-1.5]), beta=0.5)
    assert close(loss, 0.0) and close(m["ipo/h"], 1.0)
    loss.backward()
    assert close(pc.grad, 0.0)  # dL/dh = 2 (h - 1) = 0: the minimum
    # all equal: h = 0 -> (0 - 1)^2 = 1, and dL/dpc = 2 (0 - 1) = -2 pushes h up towards 1
    pc = t([-1.0], requires_grad=True)
    loss, _ = ipo_loss(pc, t([-1.0]), t([-1.0]), t([-1.0]), beta=0.5)
    loss.backward()
    assert close(loss, 1.0) and close(pc.grad, -2.0)
    # β = 0.1 -> target 5; h = 1 -> (1 - 5)^2 = 16
    loss, _ = ipo_loss(t([-1.0]), t([-2.0]), t([-1.5]), t([-1.5]), beta=0.1)
    assert close(loss, 16.0)


def test_ipo_per_token_average_when_lengths_are_given():
    pc, pr, rc, rr = t([-4.0]), t([-3.0]), t([-6.0]), t([-1.0])
    # sums: h = (-4 + 6) - (-3 + 1) = 2 + 2 = 4 -> (4 - 1)^2 = 9 with β = 0.5
    loss, _ = ipo_loss(pc, pr, rc, rr, beta=0.5)
    assert close(loss, 9.0)
    # per token, |y_w| = 4, |y_l| = 2: h = 2/4 - (-2/2) = 0.5 + 1 = 1.5 -> (1.5 - 1)^2 = 0.25
    loss, m = ipo_loss(pc, pr, rc, rr, beta=0.5, chosen_len=t([4]), rejected_len=t([2]))
    assert close(loss, 0.25)
    assert close(m["rewards/chosen"], 0.25) and close(m["rewards/rejected"], -0.5)  # 0.5 * 0.5, 0.5 * -1
    with pytest.raises(ValueError):
        ipo_loss(pc, pr, rc, rr, chosen_len=t([4]))


# --- KTO -----------------------------------------------------------------------------------------


def test_kto_desirable_and_undesirable_sides():
    # Both rows have r = policy - ref = 1.2; z0 = 0.2, β = 0.5.
    # desirable:   1 - σ(β(r - z0)) = 1 - σ(0.5)  = 0.377541
    # undesirable: 1 - σ(β(z0 - r)) = 1 - σ(-0.5) = σ(0.5) = 0.622459 (it sits on the wrong side of z0)
    pol, ref, des = t([-1.0, -1.0]), t([-2.2, -2.2]), t([True, False])
    loss, m = kto_loss(pol, ref, des, 0.2, beta=0.5)
    assert close(loss, 0.5)  # (0.377541 + 0.622459) / 2
    # weights λ_D = 2, λ_U = 1: (2 * 0.377541 + 0.622459) / 2 = (0.755082 + 0.622459) / 2 = 0.688771
    loss, _ = kto_loss(pol, ref, des, 0.2, beta=0.5, desirable_weight=2.0)
    assert close(loss, 0.688771)
    # λ_U = 3 instead: (0.377541 + 3 * 0.622459) / 2 = (0.377541 + 1.867377) / 2 = 1.122459
    loss, _ = kto_loss(pol, ref, des, t(0.2), beta=0.5, undesirable_weight=3.0)
    assert close(loss, 1.122459)
    # implicit reward β r = 0.6 on both sides; only the desirable row is on its side of z0
    assert close(m["rewards/chosen"], 0.6) and close(m["rewards/rejected"], 0.6)
    assert m["rewards/accuracy"] == 0.5 and m["count/chosen"] == 1.0 and close(m["kl"], 0.2)


def test_kto_reference_point_is_clamped_and_detached():
    pol = t([-1.0], requires_grad=True)
    z0 = t(-5.0, requires_grad=True)
    # z0 = -5 is clamped to 0: desirable r = 1 -> 1 - σ(0.5 * 1) = 0.377541
    loss, m = kto_loss(pol, t([-2.0]), t([True]), z0, beta=0.5)
    assert close(loss, 0.377541) and m["kl"] == 0.0
    assert math.isnan(m["rewards/rejected"]) and m["count/rejected"] == 0.0  # no undesirable rows
    loss.backward()
    assert z0.grad is None  # no gradient through z0
    # dL/dpol = -β σ(x)(1 - σ(x)) at x = 0.5: -0.5 * 0.622459 * 0.377541 = -0.117502 (raises a desirable r)
    assert close(pol.grad, -0.117502)


def test_kto_number_inputs_take_the_log_probs_dtype():
    # float64 log-probs with z0 given as the number 0.1: z0 is made a float64 0.1, not float32's
    # 0.10000000149; r = 0.5 - 0 = 0.5, desirable: σ(0.1 * (0.1 - 0.5)) = σ(-0.04) = 0.490001
    loss, m = kto_loss(t([0.5], dtype=torch.float64), t([0.0], dtype=torch.float64), t([True]), 0.1)
    assert m["kl"] == 0.1 and loss.dtype == torch.float64 and close(loss, 0.490001)


def test_kto_kl_ref_point():
    # diffs [0.5, 1.0] -> mean 0.75
    z0 = kto_kl_ref_point(t([-1.0, -2.0], requires_grad=True), t([-1.5, -3.0]))
    assert close(z0, 0.75) and z0.shape == () and not z0.requires_grad
    # diffs [0.5, -1.0] -> mean -0.25 -> clamped to 0
    assert kto_kl_ref_point(t([-1.0, -2.0]), t([-1.5, -1.0])).item() == 0.0


# --- ORPO ----------------------------------------------------------------------------------------


def test_orpo_by_hand():
    # chosen mean logp log 0.5: odds 0.5 / 0.5 = 1, log odds 0
    # rejected mean logp log 0.2: odds 0.2 / 0.8 = 0.25, log odds -1.386294
    # log OR = 0 - (-1.386294) = log 4; σ(log 4) = 4 / 5; -log 0.8 = 0.223144
    # L = NLL 0.693147 + λ 0.1 * 0.223144 = 0.715461
    loss, m = orpo_loss(t([math.log(0.5)]), t([math.log(0.2)]), t(0.693147), lam=0.1)
    assert close(loss, 0.715461)
    assert close(m["log_odds_ratio"], math.log(4.0)) and close(m["or_loss"], 0.223144)
    assert close(m["nll_loss"], 0.693147) and m["rewards/accuracy"] == 1.0
    # a (B,) NLL is averaged: mean(0.5, 0.886294) = 0.693147 gives the same loss
    loss_b, _ = orpo_loss(t([math.log(0.5)]), t([math.log(0.2)]), t([0.5, 0.886294]), lam=0.1)
    assert close(loss_b, 0.715461)


def test_orpo_log_odds_stay_finite_and_accurate_near_zero():
    # logp = -1e-6: 1 - e^-1e-6 = 1e-6 - 5e-13, so log odds = -1e-6 - log(1e-6 - 5e-13) = 13.815510.
    # Naive float32 log1p(-exp(-1e-6)) loses ~3% of 1e-6 to rounding near 1 (~0.03 in the log).
    pc = t([-1e-6, 0.0], requires_grad=True)
    pr = t([math.log(0.5), math.log(0.5)])  # log odds 0
    loss, m = orpo_loss(pc, pr, t(0.0), lam=1.0)
    lo = pc.detach()[:1] - log1mexp(pc.detach()[:1])
    assert close(lo, 13.815510, tol=1e-4)
    # logp exactly 0 (p = 1) is capped at -1e-7: log odds = -1e-7 - log(1e-7) = 16.118096
    assert close(m["log_odds_ratio"], (13.815510 + 16.118096) / 2, tol=1e-4)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(pc.grad).all()
    # log1mexp across the branch point -ln 2, against float64: log(1 - e^x)
    x = t([-1e-6, -0.5, -math.log(2.0), -1.0, -20.0])
    ref = torch.log1p(-torch.exp(x.double()))
    assert torch.allclose(log1mexp(x).double(), ref, rtol=1e-5)


def test_log1mexp_gradient_is_finite_where_exp_rounds_to_one():
    # f(x) = log(1 - e^x), f'(x) = -1 / (e^-x - 1). At x = -1e-9, float32 e^x rounds to 1, so a branch
    # computing log1p(-e^x) there is -inf, and its zero-weighted gradient inside torch.where is nan;
    # each branch therefore only sees inputs clamped to its own side of -ln 2.
    # f'(-1e-9) = -1e9, f'(-0.5) = -1 / (e^0.5 - 1) = -1.541494, f'(-2) = -1 / (e^2 - 1) = -0.156518
    x = t([-1e-9, -0.5, -2.0], requires_grad=True)
    log1mexp(x).sum().backward()
    assert torch.allclose(x.grad, t([-1e9, -1.541494, -0.156518]), rtol=1e-4)


# --- SimPO ---------------------------------------------------------------------------------------


def test_simpo_by_hand():
    # β = 2, γ = 0.5: chosen 2 * -4/4 = -2, rejected 2 * -6/3 = -4; -2 - (-4) - 0.5 = 1.5
    # loss -log σ(1.5) = 0.201413
    loss, m = simpo_loss(t([-4.0]), t([-6.0]), t([4]), t([3]), beta=2.0, gamma=0.5)
    assert close(loss, 0.201413)
    assert close(m["rewards/chosen"], -2.0) and close(m["rewards/rejected"], -4.0)
    assert close(m["rewards/margin"], 2.0) and m["rewards/accuracy"] == 1.0


def test_simpo_doubling_lengths_halves_effective_beta():
    # lengths 8 and 6: 2 * -4/8 = -1, 2 * -6/6 = -2; -1 + 2 - 0.5 = 0.5 -> -log σ(0.5) = 0.474077
    doubled, _ = simpo_loss(t([-4.0]), t([-6.0]), t([8]), t([6]), beta=2.0, gamma=0.5)
    half_beta, _ = simpo_loss(t([-4.0]), t([-6.0]), t([4]), t([3]), beta=1.0, gamma=0.5)
    assert close(doubled, 0.474077) and close(half_beta, 0.474077)
    # γ is the margin itself (not γ/β): γ = 1.5 at β = 2 -> 2 - 1.5 = 0.5 -> 0.474077
    loss, _ = simpo_loss(t([-4.0]), t([-6.0]), t([4]), t([3]), beta=2.0, gamma=1.5)
    assert close(loss, 0.474077)


# --- Bradley-Terry -------------------------------------------------------------------------------


def test_bradley_terry_with_and_without_margin():
    sc, sr = t([2.0, 0.0]), t([1.0, 1.0])
    # diffs [1, -1]: -log σ(1) = 0.313262, -log σ(-1) = 1.313262; mean 0.813262
    loss, m = bradley_terry_loss(sc, sr)
    assert close(loss, 0.813262)
    assert m["rm/accuracy"] == 0.5 and close(m["rm/margin_mean"], 0.0)
    # margins [1, 0]: [1 - 1, -1 - 0] = [0, -1]: log 2 = 0.693147, 1.313262; mean 1.003205
    loss, m = bradley_terry_loss(sc, sr, margin=t([1.0, 0.0]))
    assert close(loss, 1.003205)
    assert m["rm/accuracy"] == 0.5  # accuracy ignores the margin
    # a scalar margin 1 for both: [0, -2]: 0.693147, -log σ(-2) = 2.126928; mean 1.410038
    loss, _ = bradley_terry_loss(sc, sr, margin=1.0)
    assert close(loss, 1.410038)


def test_bradley_terry_gradient_separates_scores():
    sc, sr = t([0.0], requires_grad=True), t([0.0], requires_grad=True)
    loss, _ = bradley_terry_loss(sc, sr)
    loss.backward()
    # dL/ds_c = -σ(-(s_c - s_r)) = -σ(0) = -0.5; dL/ds_r = +0.5
    assert close(sc.grad, -0.5) and close(sr.grad, 0.5)


def test_every_loss_reports_the_four_reward_metrics_as_floats():
    # The offline trainer reads these keys from whichever loss it runs.
    a, b, n = t([-1.0, -2.0]), t([-2.0, -1.0]), t([2.0, 3.0])
    outs = [dpo_loss(a, b, b, a), ipo_loss(a, b, b, a), simpo_loss(a, b, n, n), orpo_loss(a / 4, b / 4, t(1.0)),
            kto_loss(a, b, t([True, False]), 0.0), bradley_terry_loss(a, b)]
    for loss, m in outs:
        assert loss.shape == ()
        for key in ("rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy"):
            assert type(m[key]) is float, key


# --- documented defaults, every metric, ties (each value below tells a mutant from the loss) ------


def test_dpo_default_beta_and_every_metric():
    # β defaults to 0.1 (the paper's and TRL's). chosen logratio -1 - -3 = 2, rejected -2.5 - -2 = -0.5
    # m = 2.5, βm = 0.25, loss -log σ(0.25) = log(1 + e^-0.25) = 0.575939
    # rewards β * logratio: chosen 0.2, rejected -0.05, margin 0.25 (asymmetric, so β / x would show)
    loss, m = dpo_loss(t([-1.0]), t([-2.5]), t([-3.0]), t([-2.0]))
    assert close(loss, 0.575939)
    assert m == pytest.approx({"rewards/chosen": 0.2, "rewards/rejected": -0.05, "rewards/margin": 0.25,
                               "rewards/accuracy": 1.0, "logps/chosen": -1.0, "logps/rejected": -2.5})
    # label_smoothing may be 0.5 (the closed end of [0, 0.5]): 0.5 * -log σ(0.25) + 0.5 * -log σ(-0.25)
    # = 0.5 * 0.575939 + 0.5 * (0.575939 + 0.25) = 0.700939
    loss, _ = dpo_loss(t([-1.0]), t([-2.5]), t([-3.0]), t([-2.0]), label_smoothing=0.5)
    assert close(loss, 0.700939)


def test_ipo_default_beta_and_every_metric():
    # β = 0.1 -> target 1 / (2 * 0.1) = 5; logratios 2 and -0.5 as above: h = 2.5, loss (2.5 - 5)^2 = 6.25
    loss, m = ipo_loss(t([-1.0]), t([-2.5]), t([-3.0]), t([-2.0]))
    assert close(loss, 6.25)
    assert m == pytest.approx({"rewards/chosen": 0.2, "rewards/rejected": -0.05, "rewards/margin": 0.25,
                               "rewards/accuracy": 1.0, "ipo/h": 2.5})


def test_kto_default_beta_every_metric_and_ties_at_the_reference_point():
    # β = 0.1, z0 = 0.5, reference 0 so r = policy: desirable r = [0.5, 2.5], undesirable r = [0.5, -1.5].
    # desirable   σ(β(z0 - r)): σ(0) = 0.5, σ(0.1 * -2) = σ(-0.2) = 0.450166
    # undesirable σ(β(r - z0)): σ(0) = 0.5, σ(0.1 * -2) = 0.450166;  mean (1 + 2 * 0.450166) / 4 = 0.475083
    pol, des = t([0.5, 2.5, 0.5, -1.5]), t([True, True, False, False])
    loss, m = kto_loss(pol, torch.zeros(4), des, 0.5)
    assert close(loss, 0.475083)
    # rewards β r: desirable [0.05, 0.25] sum 0.3 mean 0.15; undesirable [0.05, -0.15] sum -0.1 mean -0.05
    # margin 0.15 - -0.05 = 0.2. Accuracy: a row exactly at z0 is on neither side (a tie counts
    # half), rows 1 and 3 are right: (1 + 1 + 0.5 + 0.5) / 4.
    assert m == pytest.approx({"rewards/chosen": 0.15, "rewards/rejected": -0.05, "rewards/margin": 0.2,
                               "rewards/accuracy": 0.75, "rewards/chosen_sum": 0.3, "rewards/rejected_sum": -0.1,
                               "count/chosen": 2.0, "count/rejected": 2.0, "kl": 0.5})
    # no desirable row: its mean is nan (no 0 / 0), its sum 0; the undesirable side r = 0 = z0: σ(0) = 0.5
    loss, m = kto_loss(t([0.0]), t([0.0]), t([False]), 0.0)
    assert close(loss, 0.5) and math.isnan(m["rewards/chosen"]) and m["rewards/chosen_sum"] == 0.0
    assert m["rewards/rejected"] == 0.0 and m["count/chosen"] == 0.0


def test_orpo_default_lambda_and_every_metric():
    # λ defaults to 0.1 (the paper's): the loss of test_orpo_by_hand, 0.693147 + 0.1 * 0.223144 = 0.715461.
    # rewards λ * mean logp: chosen 0.1 * log 0.5 = -0.069315, rejected 0.1 * log 0.2 = -0.160944,
    # margin 0.1 * log 2.5 = 0.091629
    loss, m = orpo_loss(t([math.log(0.5)]), t([math.log(0.2)]), t(0.693147))
    assert close(loss, 0.715461)
    assert m == pytest.approx({"rewards/chosen": -0.069315, "rewards/rejected": -0.160944, "rewards/margin": 0.091629,
                               "rewards/accuracy": 1.0, "logps/chosen": -0.693147, "logps/rejected": -1.609438,
                               "nll_loss": 0.693147, "log_odds_ratio": math.log(4.0), "or_loss": 0.223144}, abs=1e-5)


def test_simpo_default_beta_gamma_and_every_metric():
    # β = 2, γ = 0.5 by default (the paper's): the numbers of test_simpo_by_hand, loss 0.201413
    loss, m = simpo_loss(t([-4.0]), t([-6.0]), t([4]), t([3]))
    assert close(loss, 0.201413)
    assert m == pytest.approx({"rewards/chosen": -2.0, "rewards/rejected": -4.0, "rewards/margin": 2.0,
                               "rewards/accuracy": 1.0, "logps/chosen": -4.0, "logps/rejected": -6.0})


def test_bradley_terry_tie_counts_half():
    # diffs [0, 2]: -log σ(0) = log 2 = 0.693147, -log σ(2) = 0.126928; mean 0.410038
    loss, m = bradley_terry_loss(t([1.0, 2.0]), t([1.0, 0.0]))
    assert close(loss, 0.410038)
    assert m["rm/accuracy"] == 0.75 and m["rewards/accuracy"] == 0.75  # the tie is a coin's chance: (0.5 + 1) / 2


def test_dpo_before_training_scores_chance_not_zero():
    """Before training the policy is the reference: every implicit margin is 0, and a pipeline's
    'before' accuracy read 0 (TRL's rule, a tie is wrong) as if the model preferred every rejected answer."""
    logp = t([-3.0, -5.0, -2.0])
    _, m = dpo_loss(logp, logp - 1.0, logp, logp - 1.0)
    assert m["rewards/margin"] == 0.0 and m["rewards/accuracy"] == 0.5


def test_nll_anchor_divides_by_each_length_and_clamps_only_zero():
    from rlpost.algorithms.preference import nll_anchor

    # chosen sums [-3, -4, 0] over [1, 2, 0] tokens: per token [-3, -2, 0] (an empty one: 0 / max(0, 1))
    # nll = -mean = 5 / 3 = 1.666667; coef 0.6 -> loss 0 + 1.0
    loss, m = nll_anchor(t(0.0), {"x": 1.0}, t([-3.0, -4.0, 0.0]), t([1, 2, 0]), 0.6)
    assert close(loss, 1.0) and m == pytest.approx({"x": 1.0, "nll_loss": 5 / 3})


# --- the micro-batch losses of the offline recipes (rows 2i, 2i + 1 are a pair: chosen, rejected) ---

MB_MASK = t([[True, True, False], [True, False, False], [True, True, True], [True, True, False]])
MB_LOGP = t([[-1.0, -2.0, 9.0], [-0.5, 9.0, 9.0], [-1.0, -1.0, -1.0], [-0.2, -0.4, 9.0]])  # 9: padding
MB_REF = t([[-1.5, -1.0, 9.0], [-0.25, 9.0, 9.0], [-2.0, -0.5, -1.0], [-0.3, -0.5, 9.0]])
# per-row sums and lengths: policy [-3, -0.5, -3, -0.6], reference [-2.5, -0.25, -3.5, -0.8], lengths [2, 1, 3, 2]
SUMS, REFS, LENS = t([-3.0, -0.5, -3.0, -0.6]), t([-2.5, -0.25, -3.5, -0.8]), t([2.0, 1.0, 3.0, 2.0])


def mb(**fields):
    from helpers import rl_batch

    return rl_batch(MB_MASK, ref_logp=MB_REF, **fields)


def test_pair_sums_and_rm_scores():
    from rlpost.algorithms.preference import pair_sums, rm_scores

    s, n = pair_sums(MB_LOGP, MB_MASK)
    assert torch.equal(s, SUMS.view(2, 2)) and torch.equal(n, LENS.view(2, 2))
    # the value at each row's last loss token: columns 1, 0, 2, 1
    assert torch.allclose(rm_scores(MB_LOGP, MB_MASK), t([-2.0, -0.5, -1.0, -0.4]))


@pytest.mark.parametrize("kind", ["dpo", "ipo", "kto", "orpo", "simpo"])
def test_dpo_family_micro_batch_loss_is_the_pure_loss_and_splits_exactly(kind):
    from rlpost.algorithms.preference import make_dpo_loss
    from rlpost.sections import PrefConfig

    p = PrefConfig(loss=kind, beta=0.3, label_smoothing=0.1, simpo_gamma=0.7, orpo_lambda=0.2)
    c, r = SUMS[0::2], SUMS[1::2]  # chosen, rejected sums per pair
    rc, rr = REFS[0::2], REFS[1::2]
    want = {"dpo": lambda: dpo_loss(c, r, rc, rr, beta=0.3, label_smoothing=0.1),
            "ipo": lambda: ipo_loss(c, r, rc, rr, beta=0.3, chosen_len=LENS[0::2], rejected_len=LENS[1::2]),
            "simpo": lambda: simpo_loss(c, r, LENS[0::2], LENS[1::2], beta=0.3, gamma=0.7),
            "orpo": lambda: orpo_loss(c / LENS[0::2], r / LENS[1::2], -(c / LENS[0::2]), lam=0.2),
            "kto": lambda: kto_loss(SUMS, REFS, t([True, False, True, False]),
                                    kto_kl_ref_point(SUMS, REFS), beta=0.3)}[kind]()
    logp = MB_LOGP.clone().requires_grad_()
    loss, m = make_dpo_loss(p)(logp, mb())
    assert close(loss, want[0].item()) and m == pytest.approx(want[1], nan_ok=True)
    loss.backward()
    # two micro-batches of one pair each, normalised by the mini-batch's 4 rows: the same loss and gradient
    parts, logp2 = 0.0, MB_LOGP.clone().requires_grad_()
    for rows in (slice(0, 2), slice(2, 4)):
        part = mb().select(rows)
        part.norm_seqs = 4
        out, _ = make_dpo_loss(p)(logp2[rows], part)
        out.backward()
        parts += out.item()
    if kind != "kto":  # KTO's reference point z0 is a mean over the micro-batch it sees
        assert close(parts, loss.item()) and torch.allclose(logp2.grad, logp.grad, atol=1e-6)
    assert (logp.grad[~MB_MASK] == 0).all()


def test_reward_model_loss_reads_the_last_token_and_splits_exactly():
    from rlpost.algorithms.preference import make_rm_loss
    from rlpost.sections import PrefConfig

    values = MB_LOGP.clone().requires_grad_()  # scores at the last tokens: [-2, -0.5 | -1, -0.4]
    loss, m = make_rm_loss(PrefConfig(rm_margin=0.5))(None, mb(), values=values)
    # diffs [-1.5, -0.6] - margin 0.5 = [-2, -1.1]: -log σ(-2) = 2.126928, -log σ(-1.1) = 1.387335; mean 1.757132
    assert close(loss, 1.757132) and m["rm/accuracy"] == 0.0 and close(m["rm/margin_mean"], -1.05)
    loss.backward()
    assert values.grad[0, 1] < 0 < values.grad[1, 0] and values.grad[0, 0] == 0  # only the last tokens
    part = mb().select(slice(0, 2))
    part.norm_seqs = 4
    half, _ = make_rm_loss(PrefConfig(rm_margin=0.5))(None, part, values=MB_LOGP[:2])
    assert close(half, 2.126928 / 2)  # one pair of the mini-batch's two
    plain, _ = make_rm_loss(PrefConfig())(None, mb(), values=MB_LOGP)
    assert close(plain, (math.log1p(math.exp(1.5)) + math.log1p(math.exp(0.6))) / 2)  # no margin


def test_sft_loss_is_the_token_mean_nll():
    from rlpost.algorithms.preference import sft_loss

    logp = MB_LOGP.clone().requires_grad_()
    loss, m = sft_loss(logp, mb())
    # NLL over 8 loss tokens: 3 + 0.5 + 3 + 0.6 = 7.1 -> 0.8875
    assert close(loss, 0.8875) and close(m["sft/nll"], 0.8875)
    loss.backward()
    assert torch.allclose(logp.grad, -MB_MASK.float() / 8)
    part = mb().select(slice(1, 2))
    part.norm_tokens = 8.0
    assert close(sft_loss(MB_LOGP[1:2], part)[0], 0.5 / 8)  # its share of the mini-batch


def test_bce_at_positions_by_hand():
    from rlpost.algorithms.preference import bce_at_positions

    logits = t([[0.0, 2.0, 5.0], [-1.0, 0.0, 0.0]])
    labels = t([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = t([[True, True, False], [True, False, False]])
    from helpers import rl_batch

    loss, m = bce_at_positions(logits, rl_batch(mask, returns=labels))
    # BCE: log 2 = .693147 (p .5 vs 1), log(1 + e^2) = 2.126928 (p .881 vs 0), log(1 + e^-1) = .313262
    # mean over 3 labelled positions: 1.044446; agreement (p > .5) == (label > .5): F, F, T -> 1/3
    assert close(loss, 1.044446) and close(m["prm/bce"], 1.044446) and close(m["prm/acc@0.5"], 1 / 3)
    assert close(m["prm/prob_mean"], (0.5 + 0.880797 + 0.268941) / 3)


def test_rpo_adds_the_chosen_length_normalised_nll_by_hand():
    # one pair: chosen tokens log-probs [-1, -3] (sum -4, 2 tokens), rejected [-2] (sum -2), reference 0.
    # DPO, beta 0.1: x = 0.1 * (-4 - -2) = -0.2, loss = -log sigma(-0.2) = log(1 + e^0.2) = 0.79814.
    # RPO anchor: -(-4 / 2) = 2 per pair; pref.nll_coef = 0.5 -> loss 0.79814 + 1.0 = 1.79814.
    # d loss / d logp of a chosen token: DPO -0.1 * (1 - sigma(-0.2)) = -0.054983, anchor -0.5 / 2 = -0.25.
    from helpers import loss_batch

    from rlpost.algorithms.preference import make_dpo_loss
    from rlpost.sections import PrefConfig
    mask = t([[True, True], [True, False]])
    b = loss_batch(torch.zeros(2, 2), None, mask, ref=torch.zeros(2, 2))
    dpo_only = math.log(1 + math.exp(0.2))
    for coef, want in ((0.0, dpo_only), (0.5, dpo_only + 1.0)):
        logp = t([[-1.0, -3.0], [-2.0, 0.0]], requires_grad=True)
        loss, m = make_dpo_loss(PrefConfig(loss="dpo", beta=0.1, nll_coef=coef))(logp, b)
        loss.backward()
        assert close(loss, want), coef
        dpo_grad = -0.1 * (1 - 1 / (1 + math.exp(0.2)))
        assert close(logp.grad[0, 0], dpo_grad - coef / 2) and close(logp.grad[0, 1], dpo_grad - coef / 2)
        assert ("nll_loss" in m) == (coef > 0) and (coef == 0 or close(m["nll_loss"], 2.0))


def test_rpo_is_refused_with_orpo():
    from rlpost import config
    with pytest.raises(config.ConfigError, match="pref.nll_coef: ORPO already has its NLL"):
        config.load(None, ["pref.loss=orpo", "pref.nll_coef=1"])


def test_bce_at_positions_passes_both_totals_and_a_half_label_is_negative():
    from helpers import rl_batch

    from rlpost.algorithms import core
    from rlpost.algorithms.preference import bce_at_positions

    logits, labels = t([[1.0, -1.0], [2.0, 0.0]]), t([[0.5, 0.0], [0.0, 0.0]])
    mask = t([[True, True], [True, False]])
    loss, m = bce_at_positions(logits, rl_batch(mask, returns=labels), aggregate=core.seq_mean_token_sum)
    # BCE = softplus(x) - x y: 1.313262 - 0.5 = 0.813262, softplus(-1) = 0.313262, softplus(2) = 2.126928
    # seq_mean_token_sum: sum 3.253452 / 2 sequences = 1.626726; masked mean over 3 labels 1.084484
    assert close(loss, 1.626726) and close(m["prm/bce"], 1.084484)
    # agreement (p > .5) == (label > .5): a soft label of exactly 0.5 is not positive, so p = .731
    # disagrees with it; (p .269, label 0) agrees; (p .881, label 0) disagrees -> 1 / 3
    assert close(m["prm/acc@0.5"], 1 / 3)


@pytest.mark.parametrize("kind", ["simpo", "orpo"])
def test_reference_free_losses_need_no_reference_log_probs(kind):
    from helpers import rl_batch

    from rlpost.algorithms.preference import make_dpo_loss
    from rlpost.sections import PrefConfig

    # A batch without ref_logp (the offline recipe loads no reference for these) gives the same loss
    # as one with it: the reference is never read. SimPO, β 0.3, γ 0.7, sums [-3, -0.5 | -3, -0.6] over
    # [2, 1 | 3, 2]: x = 0.3 * (-1.5 - -0.5) - 0.7 = -1.0 and 0.3 * (-1 - -0.3) - 0.7 = -0.91;
    # mean(softplus(1.0), softplus(0.91)) = (1.313262 + 1.248274) / 2 = 1.280768
    p = PrefConfig(loss=kind, beta=0.3, simpo_gamma=0.7, orpo_lambda=0.2)
    loss, m = make_dpo_loss(p)(MB_LOGP, rl_batch(MB_MASK))
    with_ref, m_ref = make_dpo_loss(p)(MB_LOGP, mb())
    assert close(loss, with_ref.item()) and m == pytest.approx(m_ref)
    assert kind != "simpo" or close(loss, 1.280768)
