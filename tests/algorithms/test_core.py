"""Hand-worked numbers for the shared maths (STYLE R11): the arithmetic is in each comment."""

import math

import torch

from rlpost.algorithms import core

t = torch.tensor


def test_aggregators_by_hand():
    # x = [[1, 2, 3], [4, 0, 0]], mask keeps 3 tokens of row 0 and 1 token of row 1
    x = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = t([[True, True, True], [True, False, False]])
    # token_mean: (1 + 2 + 3 + 4) / 4 tokens = 2.5
    assert torch.isclose(core.token_mean(x, mask, n_tokens=4.0, n_seqs=2), t(2.5))
    # seq_mean_token_mean: row means 2 and 4, their mean = 3
    assert torch.isclose(core.seq_mean_token_mean(x, mask, n_tokens=4.0, n_seqs=2), t(3.0))
    # seq_mean_token_sum: row sums 6 and 4, mean over 2 sequences = 5
    assert torch.isclose(core.seq_mean_token_sum(x, mask, n_tokens=4.0, n_seqs=2), t(5.0))
    # const_norm: total 10 / (2 sequences * max_len 5) = 1
    assert torch.isclose(core.const_norm(x, mask, n_tokens=4.0, n_seqs=2, max_len=5), t(1.0))


def test_aggregators_sum_over_micro_batches():
    # Split the same 2 rows into 2 micro-batches with the mini-batch totals: the shares add up.
    x = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = t([[True, True, True], [True, False, False]])
    for agg in (core.token_mean, core.seq_mean_token_mean, core.seq_mean_token_sum):
        whole = agg(x, mask, n_tokens=4.0, n_seqs=2)
        parts = agg(x[:1], mask[:1], n_tokens=4.0, n_seqs=2) + agg(x[1:], mask[1:], n_tokens=4.0, n_seqs=2)
        assert torch.isclose(whole, parts)


def test_kl_estimators_by_hand():
    # logp = log 0.5, ref = log 0.25: log ratio pi/ref = log 2 = 0.6931
    logp, ref = t([math.log(0.5)]), t([math.log(0.25)])
    assert torch.isclose(core.kl_k1(logp, ref), t([math.log(2)]))
    # k2 = 0.5 * (log 2)^2 = 0.2402
    assert torch.isclose(core.kl_k2(logp, ref), t([0.5 * math.log(2) ** 2]))
    # k3: r = ref/pi = 0.5, r - 1 - log r = 0.5 - 1 + 0.6931 = 0.1931
    assert torch.isclose(core.kl_k3(logp, ref), t([0.5 - 1 + math.log(2)]))
    # identical policies: every estimator is 0
    assert core.kl_k3(logp, logp).item() == 0.0


def test_group_baseline_by_hand():
    # two groups of 3: [1, 0, 0] mean 1/3 and [1, 1, 1] mean 1
    r = t([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert torch.allclose(core.group_centred(r, 3), t([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]))
    # unbiased std of [1, 0, 0]: var = ((2/3)^2 + 2 (1/3)^2) / 2 = (4/9 + 2/9) / 2 = 1/3
    assert torch.allclose(core.group_std(r, 3), t([3 ** -0.5] * 3 + [0.0] * 3))


def test_to_tokens_masks():
    adv = t([2.0, -1.0])
    mask = t([[True, True, False], [True, False, False]])
    assert torch.equal(core.to_tokens(adv, mask), t([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))
