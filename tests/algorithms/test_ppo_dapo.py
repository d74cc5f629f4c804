"""Hand-worked numbers for PPO's and DAPO's pieces, and for the shared knobs wired in with them
(entropy bonus, truncated importance sampling). The arithmetic is in the comments."""

import math

import torch

from rlpost.algorithms import core
from rlpost.algorithms.dapo import keep_groups, overlong_penalty
from rlpost.algorithms.ppo import PPO, clipped_value_loss, explained_variance
from rlpost.algorithms.wrappers import with_entropy_bonus, with_tis
from rlpost.types.batch import Rollouts

t = torch.tensor


def _batch(mask, reward=None, **fields):
    B, T = mask.shape
    b = Rollouts(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.bool),
                 completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=mask,
                 sampler_logp=torch.zeros(B, T), truncated=torch.zeros(B, dtype=torch.bool),
                 group_ids=torch.arange(B), rows=[{}] * B, completions=[""] * B, reward=reward)
    for k, v in fields.items():
        setattr(b, k, v)
    return b


def test_value_loss_takes_the_worse_of_clipped_and_unclipped():
    # t0: V=1, V_old=.5, R=0: unclipped (1-0)^2 = 1; clipped V = .5+.2 = .7, .49 -> max 1 -> 0.5, not clipped.
    # t1: V=.9, V_old=0, R=1: unclipped .01; clipped V = .2, (.2-1)^2 = .64 -> 0.5 * .64 = .32, clipped.
    values = t([[1.0, 0.9]], requires_grad=True)
    loss, clipped = clipped_value_loss(values, t([[0.5, 0.0]]), t([[0.0, 1.0]]), clip=0.2)
    assert torch.allclose(loss, t([[0.5, 0.32]]))
    assert clipped.tolist() == [[False, True]]
    loss.sum().backward()
    # d/dV 0.5 (V - R)^2 = V - R = 1 at t0; the clipped branch is constant in V at t1.
    assert torch.allclose(values.grad, t([[1.0, 0.0]]))
    plain, _ = clipped_value_loss(values.detach(), t([[0.5, 0.0]]), t([[0.0, 1.0]]), clip=0.0)
    assert torch.allclose(plain, t([[0.5, 0.005]]))  # 0.5 * 1, 0.5 * .01


def test_token_rewards_put_the_score_last_and_the_kl_on_every_token():
    mask = t([[True, True, True], [True, True, False]])
    kl = t([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    r = core.token_rewards(t([1.0, 0.0]), mask, kl, kl_coef=0.5)
    # row 0: -.05, -.1, 1 - .15 ; row 1: -.2, 0 - .25, pad 0
    assert torch.allclose(r, t([[-0.05, -0.1, 0.85], [-0.2, -0.25, 0.0]]))
    assert core.last_token(t([[False, False]])).tolist() == [[False, False]]  # an emptied row has no last token


def test_ppo_advantages_are_gae_on_kl_penalised_token_rewards():
    mask = t([[True, True]])
    b = _batch(mask, reward=t([1.0]), old_logp=t([[-1.0, -2.0]]), ref_logp=t([[-1.5, -1.0]]),
               old_values=t([[0.2, 0.5]]))
    ppo = PPO(gamma=1.0, lam=1.0, kl_coef=0.1, whiten_advantages=False)
    out = ppo.advantages(b)
    # k1 = old - ref = [.5, -1]; rewards = [-.05, 1 + .1] = [-.05, 1.1]
    # lam = 1: returns = [1.05, 1.1]; advantages = returns - V = [.85, .6]
    assert torch.allclose(out.returns, t([[1.05, 1.1]]))
    assert torch.allclose(out.tokens, t([[0.85, 0.6]]))
    assert math.isclose(out.metrics["critic/kl"], -0.25, abs_tol=1e-6)
    # lam = 0: TD errors. delta_0 = -.05 + .5 - .2 = .25 ; delta_1 = 1.1 - .5 = .6
    adv0 = PPO(gamma=1.0, lam=0.0, kl_coef=0.1, whiten_advantages=False).advantages(b).tokens
    assert torch.allclose(adv0, t([[0.25, 0.6]]))


def test_ppo_loss_is_policy_plus_weighted_value_loss():
    mask = t([[True, True]])
    b = _batch(mask, reward=t([1.0]), old_logp=t([[-1.0, -2.0]]), advantages=t([[0.85, 0.6]]),
               old_values=t([[0.2, 0.5]]), returns=t([[1.05, 1.1]]))
    logp = t([[-1.0, -2.0]], requires_grad=True)
    loss, m = PPO(vf_coef=0.5).loss(logp, b, values=t([[0.2, 0.5]], requires_grad=True))
    # ratio 1: pg = -(.85 + .6) / 2 = -.725 ; vf = (.5 * .85^2 + .5 * .6^2) / 2 = (.36125 + .18) / 2 = .270625
    # total = -.725 + .5 * .270625 = -.5896875
    assert math.isclose(loss.item(), -0.5896875, rel_tol=1e-6)
    assert math.isclose(m["critic/vf_loss"], 0.270625, rel_tol=1e-6)


def test_explained_variance():
    mask = t([[True, True, True, True]])
    R = t([[0.0, 1.0, 0.0, 1.0]])
    assert explained_variance(R, R, mask) == 1.0  # a perfect critic
    assert abs(explained_variance(torch.full_like(R, 0.5), R, mask)) < 1e-6  # a constant one


def test_dapo_keeps_only_groups_with_signal_inside_the_band():
    reward = t([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.2])  # K = 2: all-pass, mixed, all-fail, varied partial
    # pass rates (reward >= 1): 1, .5, 0, 0; varied: F, T, F, T
    assert keep_groups(reward, 2).tolist() == [False, True, False, True]
    assert keep_groups(reward, 2, min_pass=0.1).tolist() == [False, True, False, False]


def test_overlong_soft_penalty():
    # max_len 10, buffer 4: free up to 6 tokens, then -1/4 per token, -1 at 10.
    assert overlong_penalty(t([5, 6, 8, 10]), 10, 4).tolist() == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty(t([8, 10]), 10, 4, factor=0.5).tolist() == [-0.25, -0.5]
    assert overlong_penalty(t([10]), 10, 0).tolist() == [0.0]  # off


def test_keep_groups_bounds_are_closed():
    # K = 2: [1, 1.5] all pass (p = 1) yet varied, so its advantages are not all 0: kept under the
    # default max_pass 1; [1, 0] has p = 0.5, kept when max_pass is exactly 0.5
    reward = t([1.0, 1.5, 1.0, 0.0])
    assert keep_groups(reward, 2).tolist() == [True, True]
    assert keep_groups(reward, 2, max_pass=0.5).tolist() == [False, True]


def test_overlong_penalty_edges():
    # buffer 1, max_len 10: free up to 9 tokens, -1 at 10
    assert overlong_penalty(t([9, 10]), 10, 1).tolist() == [0.0, -1.0]
    # off (buffer 0) it is still a float reward term, not int zeros
    assert overlong_penalty(t([10]), 10, 0).dtype == torch.float32
    # a length past max_len (the sampler never makes one) costs no more than -factor: (12 - 6) / 4 = 1.5 -> 1
    assert overlong_penalty(t([12]), 10, 4).tolist() == [-1.0]


def test_entropy_bonus_subtracts_aggregated_entropy():
    loss_fn = with_entropy_bonus(lambda logp, batch, **named: (torch.tensor(0.0), {}), coef=0.1,
                                 aggregate=core.token_mean)
    b = _batch(t([[True, True, False]]))
    loss, _ = loss_fn(None, b, entropy=t([[1.0, 3.0, 100.0]]))
    assert math.isclose(loss.item(), -0.2, rel_tol=1e-6)  # -0.1 * (1 + 3) / 2; the pad's 100 is ignored


def test_truncated_importance_weight_scales_advantages():
    seen = {}

    def inner(logp, batch, **named):  # records the advantages the wrapped loss is given
        seen["adv"] = batch.advantages
        return torch.tensor(0.0), {}

    b = _batch(t([[True, True]]), old_logp=t([[0.0, math.log(2.0)]]), advantages=t([[1.0, 1.0]]))
    _, m = with_tis(inner, cap=1.5, level="token")(None, b)
    # pi_old / pi_sampler = [1, 2] -> capped at 1.5
    assert torch.allclose(seen["adv"], t([[1.0, 1.5]]))
    assert m["actor/tis_capped_frac"] == 0.5 and math.isclose(m["actor/tis_weight_mean"], 1.25)
    assert torch.equal(b.advantages, t([[1.0, 1.0]]))  # the batch itself is left alone
    b = _batch(t([[True, True]]), old_logp=t([[math.log(1.1), math.log(1.2)]]), advantages=t([[1.0, 1.0]]))
    with_tis(inner, cap=5.0, level="sequence")(None, b)  # one weight per sequence: 1.1 * 1.2 = 1.32
    assert torch.allclose(seen["adv"], t([[1.32, 1.32]]))

def test_tis_counts_only_weights_strictly_past_the_cap():
    # pi_old / pi_sampler = e^0 = 1 = cap: min(1, 1) = 1, the cap changes nothing, so nothing is "capped"
    b = _batch(t([[True]]), old_logp=t([[0.0]]), advantages=t([[1.0]]))
    _, m = with_tis(lambda logp, batch, **named: (torch.tensor(0.0), {}), cap=1.0, level="token")(None, b)
    assert m["actor/tis_capped_frac"] == 0.0 and m["actor/tis_weight_mean"] == 1.0
