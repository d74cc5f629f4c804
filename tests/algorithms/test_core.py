"""Hand-worked numbers for the shared maths: the arithmetic is in each comment."""

import math

import torch

from rlpost.algorithms import core, dapo

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


def test_hybrid_normalisation_by_hand():
    # groups [1, 0] and [1, 1]: centred [0.5, -0.5, 0, 0]; batch std of [1, 0, 1, 1] = 0.5
    # -> [1, -1, 0, 0] (a plain GRPO std would make the unanimous group 0/0 and the first +-0.707)
    r = t([1.0, 0.0, 1.0, 1.0])
    assert torch.allclose(core.group_mean_batch_std(r, 2), t([1.0, -1.0, 0.0, 0.0]), atol=1e-4)


def test_hybrid_normalisation_adds_eps_to_a_tiny_std():
    # groups [2e-6, 0] and [0, 0]: centred [1e-6, -1e-6, 0, 0]; batch mean 0.5e-6, squared deviations
    # 2.25e-12 + 3 * 0.25e-12 = 3e-12, unbiased / 3 -> std 1e-6; + eps 1e-6 -> [0.5, -0.5, 0, 0]
    out = core.group_mean_batch_std(t([2e-6, 0.0, 0.0, 0.0]), 2)
    assert torch.allclose(out, t([0.5, -0.5, 0.0, 0.0]), atol=1e-4)


def test_adaptive_kl_controller_by_hand():
    ctl = core.AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10_000)
    # KL 12 vs target 6: error = 12/6 - 1 = 1 -> clipped to 0.2; n = 1000 -> 0.1 * (1 + 0.2 * 0.1) = 0.102
    assert math.isclose(ctl.update(kl=12.0, n_samples=1000), 0.102)
    # KL 3: error -0.5 -> -0.2 -> 0.102 * (1 - 0.02) = 0.09996
    assert math.isclose(ctl.update(kl=3.0, n_samples=1000), 0.102 * 0.98)


def test_truncated_is_weight_by_hand():
    mask = t([[True, True, False]])
    old = t([[0.0, 0.0, 5.0]])
    samp = t([[math.log(0.5), math.log(2.0), 0.0]])
    # token: ratios 1/0.5 = 2 -> capped at 1.5; 1/2 = 0.5; masked -> 0
    assert torch.allclose(core.truncated_is_weight(old, samp, mask, cap=1.5), t([[1.5, 0.5, 0.0]]))
    # sequence: log-ratios log 2 + log 0.5 = 0 -> weight 1 on every real token
    assert torch.allclose(core.truncated_is_weight(old, samp, mask, cap=1.5, level="sequence"), t([[1.0, 1.0, 0.0]]))


def test_pass_rate_and_learnable_band():
    # groups of 3: [1,1,1] all pass, [0,1,0] p = 1/3, [0,0,0] all fail
    r = t([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert torch.allclose(core.pass_rate(r, 3), t([1.0, 1 / 3, 0.0]))
    assert dapo.keep_groups(r, 3).tolist() == [False, True, False]  # DAPO keeps only the varied group


def test_gae_lambda_1_is_monte_carlo_return_minus_value():
    # rewards [0, 0, 1], gamma 0.9: returns G = [0.81, 0.9, 1]; V = [0.5, 0.2, 0.4]
    r, v, m = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.2, 0.4]]), t([[True, True, True]])
    adv, ret = core.gae(r, v, m, gamma=0.9, lam=1.0)
    assert torch.allclose(adv, t([[0.81 - 0.5, 0.9 - 0.2, 1.0 - 0.4]]))
    assert torch.allclose(ret, t([[0.81, 0.9, 1.0]]))


def test_gae_lambda_0_is_the_td_error():
    # delta_t = r_t + 0.9 V_{t+1} - V_t: [0 + 0.18 - 0.5, 0 + 0.36 - 0.2, 1 + 0 - 0.4] = [-0.32, 0.16, 0.6]
    r, v, m = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.2, 0.4]]), t([[True, True, True]])
    adv, _ = core.gae(r, v, m, gamma=0.9, lam=0.0)
    assert torch.allclose(adv, t([[-0.32, 0.16, 0.6]]))


def test_gae_ignores_padding_after_the_last_token():
    # the same sequence with two pads appended (value garbage there) gives the same advantages
    r, v = t([[0.0, 0.0, 1.0, 0.0, 0.0]]), t([[0.5, 0.2, 0.4, 7.0, 7.0]])
    m = t([[True, True, True, False, False]])
    adv, _ = core.gae(r, v, m, gamma=0.9, lam=0.95)
    ref, _ = core.gae(r[:, :3], v[:, :3], m[:, :3], gamma=0.9, lam=0.95)
    assert torch.allclose(adv[:, :3], ref) and (adv[:, 3:] == 0).all()
