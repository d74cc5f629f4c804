"""PRIME-style implicit process rewards, worked by hand (the loop's run: tests/recipes/test_rl.py)."""

import torch

from rlpost.algorithms import core


def test_prime_advantages_by_hand():
    implicit = torch.tensor([[0.3, 0.1, 0.2], [0.4, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    # per-token means: 0.2 and 0.3; leave-one-out baselines (K = 2): 0.3 for row 0, 0.2 for row 1
    # row 0: r - b = [0.0, -0.2, -0.1] -> returns-to-go [-0.3, -0.3, -0.1]
    # row 1: r - b = [0.2, 0.0, (pad)] -> returns-to-go [0.2, 0.0, 0]
    out = core.prime_advantages(implicit, mask, 2)
    assert torch.allclose(out, torch.tensor([[-0.3, -0.3, -0.1], [0.2, 0.0, 0.0]]), atol=1e-6)


def test_prime_baselines_stay_inside_each_group_of_three():
    # Two groups of K = 3, one token per row, so per-token means = the rewards themselves.
    # group 0 [0.3, 0.6, 0.9], sum 1.8: leave-one-out means (1.8 - r) / (K - 1) = [0.75, 0.6, 0.45]
    #   -> r - b = [-0.45, 0.0, 0.45]
    # group 1 [0.0, -0.3, 0.6], sum 0.3: baselines [0.15, 0.3, -0.15] -> r - b = [-0.15, -0.6, 0.75]
    implicit = torch.tensor([[0.3], [0.6], [0.9], [0.0], [-0.3], [0.6]])
    out = core.prime_advantages(implicit, torch.ones(6, 1, dtype=torch.bool), 3)
    assert torch.allclose(out, torch.tensor([[-0.45], [0.0], [0.45], [-0.15], [-0.6], [0.75]]), atol=1e-6)
