"""Statistical tests on a softmax bandit whose true policy gradient is known in closed form.

Policy pi = softmax(theta) over 3 arms with fixed rewards r. J = E_pi[r] and
    dJ/dtheta = pi * (r - E_pi[r])                       (closed form)
A group-baseline estimator over K samples a_1..a_K is  g = (1/K) sum_i A_i (e_{a_i} - pi),
since d log pi(a) / d theta = e_a - pi. We average g over many groups.
"""

import torch

from rlpost.algorithms.grpo import grpo_advantages
from rlpost.algorithms.reinforce import reinforce_advantages
from rlpost.algorithms.rloo import rloo_advantages

THETA = torch.tensor([0.5, -0.2, 0.1])
REWARD = torch.tensor([1.0, 0.0, 0.3])
PI = THETA.softmax(0)
TRUE_GRAD = PI * (REWARD - (PI * REWARD).sum())
K, GROUPS = 4, 200_000


def estimates(advantage_fn):
    """Per-group gradient estimates (GROUPS, 3) for an advantage function of rewards (B,)."""
    g = torch.Generator().manual_seed(0)
    arms = torch.multinomial(PI, GROUPS * K, replacement=True, generator=g)  # (B,)
    adv = advantage_fn(REWARD[arms])  # (B,)
    score = torch.nn.functional.one_hot(arms, 3).float() - PI  # (B, 3): grad of log pi(a)
    return (adv[:, None] * score).view(GROUPS, K, 3).mean(1)  # (GROUPS, 3)


def close(a, b, est):
    # tolerance: 5 standard errors of the mean, per coordinate
    se = est.std(0) / GROUPS ** 0.5
    return bool(((a - b).abs() < 5 * se + 1e-9).all())


def test_rloo_is_unbiased():
    est = estimates(lambda r: rloo_advantages(r, K))
    assert close(est.mean(0), TRUE_GRAD, est)


def test_grpo_group_mean_shrinks_by_k_minus_1_over_k():
    est = estimates(lambda r: grpo_advantages(r, K, scale_by_std=False))
    assert close(est.mean(0), TRUE_GRAD * (K - 1) / K, est)
    assert not close(est.mean(0), TRUE_GRAD, est)  # the shrinkage is detectable, not noise


def test_reinforce_without_baseline_is_unbiased_but_noisier():
    plain = estimates(lambda r: reinforce_advantages(r, baseline=0.0))
    with_baseline = estimates(lambda r: reinforce_advantages(r, baseline=float((PI * REWARD).sum())))
    assert close(plain.mean(0), TRUE_GRAD, plain) and close(with_baseline.mean(0), TRUE_GRAD, with_baseline)
    assert plain.var(0).sum() > 1.5 * with_baseline.var(0).sum()
