"""KL estimators against the exact KL(pi || pi_ref) of known categorical distributions."""

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
