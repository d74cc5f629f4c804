"""KL estimators against the exact KL(pi || pi_ref) of known categorical distributions."""

import math

import torch

from rlpost.algorithms import core

PI = torch.tensor([0.5, 0.3, 0.2])
REF = torch.tensor([0.2, 0.5, 0.3])
EXACT = (PI * (PI / REF).log()).sum()  # 0.5 ln 2.5 + 0.3 ln 0.6 + 0.2 ln(2/3) = 0.2238


def samples(n=200_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.multinomial(PI, n, replacement=True, generator=g)  # tokens drawn from pi
    return PI.log()[x], REF.log()[x]


def test_k1_and_k3_are_unbiased():
    logp, ref = samples()
    # mean of n i.i.d. samples: standard error ~ std / sqrt(n) ~ 0.6 / 447 = 0.0013; 5 SE = 0.007
    for est in (core.kl_k1, core.kl_k3):
        assert abs(est(logp, ref).mean() - EXACT) < 0.007, est.__name__


def test_k2_is_biased_upward_here_and_never_negative():
    logp, ref = samples()
    # E[k2] = 0.5 E[(log pi/ref)^2] = 0.5 (0.5 ln^2 2.5 + 0.3 ln^2 0.6 + 0.2 ln^2 (2/3)) = 0.2655 > KL = 0.2238
    est = core.kl_k2(logp, ref)
    assert (est >= 0).all() and abs(est.mean() - 0.2655) < 0.004 and est.mean() > EXACT + 0.01


def test_k3_is_never_negative_and_k1_can_be():
    logp, ref = samples(10_000)
    assert (core.kl_k3(logp, ref) >= 0).all()
    assert (core.kl_k1(logp, ref) < 0).any()  # the reason k3 exists: k1 is unbiased but noisy and signed


def test_k2_matches_kl_to_second_order():
    # For pi close to ref, E[k2] - KL = O(delta^3) while KL = O(delta^2): the relative error shrinks with delta.
    errors = []
    for delta in (0.1, 0.02):
        pi = torch.tensor([0.5 + delta, 0.5 - delta])
        ref = torch.tensor([0.5, 0.5])
        exact = (pi * (pi / ref).log()).sum()
        k2 = (pi * core.kl_k2(pi.log(), ref.log())).sum()  # exact expectation of the k2 estimator under pi
        errors.append(abs(k2 - exact) / exact)
    assert errors[1] < errors[0] / 4 and errors[1] < 0.03


def test_k3_is_bounded_like_verl_and_the_metric_counts_the_bound():
    # logp = -16, ref = -1: log r = 15, k3 = e^15 - 1 - 15 = 3.27e6 unbounded; verl clamps to 10.
    # logp = -1, ref = -2: log r = -1, k3 = e^-1 - 1 + 1 = .3679, far below the bound.
    logp = torch.tensor([[-16.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -2.0]])
    kl = core.kl_k3(logp, ref)
    assert torch.allclose(kl, torch.tensor([[10.0, math.exp(-1)]]))
    # the bounded token gets no gradient from the KL; the other d k3 / d logp = 1 - r = 1 - e^-1
    kl.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 1 - math.exp(-1)]]))
    # one of the two loss tokens sits at the bound: 0.5; masking it away: 0
    assert core.kl_bound_frac(kl, torch.tensor([[True, True]])) == 0.5
    assert core.kl_bound_frac(kl, torch.tensor([[False, True]])) == 0.0


def test_the_loss_reports_how_often_the_kl_bound_bites():
    # GRPO with kl_coef: three loss tokens, one of them (log r = 15) held at the bound -> 1/3;
    # the KL term is token_mean(10, 0, 0) = 10/3, not 3.27e6 / 3.
    from helpers import loss_batch
    from rlpost.algorithms.grpo import GRPO
    mask = torch.tensor([[True, True, True]])
    logp = torch.tensor([[-16.0, -1.0, -1.0]])
    b = loss_batch(logp, torch.zeros(1, 3), mask, ref=torch.tensor([[-1.0, -1.0, -1.0]]))
    loss, m = GRPO(group_size=2, kl_coef=1.0).loss(logp, b)
    assert math.isclose(m["actor/kl_bound_frac"], 1 / 3, rel_tol=1e-6)
    assert math.isclose(loss.item(), 10 / 3, rel_tol=1e-5)
