"""GRPO advantages and loss, worked by hand."""

import math

import pytest
import torch
from helpers import loss_batch

from rlpost.algorithms import core
from rlpost.algorithms.grpo import GRPO, grpo_advantages
from rlpost.algorithms.ppo import clipped_pg_loss

t = torch.tensor


def test_advantages_with_std():
    # group [1, 0, 0, 1]: mean 0.5, centred +-0.5; unbiased std = sqrt(4 * 0.25 / 3) = 0.57735
    # -> advantages +-0.5 / 0.57735 = +-0.86603
    adv = grpo_advantages(t([1.0, 0.0, 0.0, 1.0]), group_size=4, scale_by_std=True)
    assert torch.allclose(adv, t([0.86603, -0.86603, -0.86603, 0.86603]), atol=1e-4)


def test_advantages_without_std_and_zero_variance_group():
    # group 1 [3, 1]: mean 2 -> [1, -1]; group 2 [5, 5]: no signal -> [0, 0] (std 0 does not blow up)
    r = t([3.0, 1.0, 5.0, 5.0])
    assert torch.allclose(grpo_advantages(r, 2, scale_by_std=False), t([1.0, -1.0, 0.0, 0.0]))
    assert torch.allclose(grpo_advantages(r, 2, scale_by_std=True)[2:], t([0.0, 0.0]))


def test_clipped_loss_by_hand():
    mask = t([[True, True, True]])
    adv = t([[1.0, 1.0, -1.0]])
    # token 0: ratio e^0 = 1, A = 1 -> loss -1
    # token 1: ratio e^1 = 2.718 > 1.2, A = 1 -> min(2.718, 1.2) = 1.2 -> loss -1.2, clipped
    # token 2: ratio e^-1 = 0.368 < 0.8, A = -1 -> min(-0.368, -0.8) = -0.8 -> loss 0.8, clipped
    logp, old = t([[0.0, 1.0, -1.0]]), t([[0.0, 0.0, 0.0]])
    per_tok, clipped, ratio = clipped_pg_loss(logp, old, adv, mask, 0.2, 0.2)
    assert torch.allclose(per_tok, t([[-1.0, -1.2, 0.8]]))
    assert clipped.tolist() == [[False, True, True]]
    # ratio below 1 - eps with a POSITIVE advantage is not clipped (the min keeps the smaller, unclipped)
    per_tok, clipped, _ = clipped_pg_loss(t([[-1.0]]), t([[0.0]]), t([[1.0]]), t([[True]]), 0.2, 0.2)
    assert math.isclose(per_tok.item(), -math.exp(-1), rel_tol=1e-6) and not clipped.item()


def test_clip_higher_uses_eps_high():
    # ratio e^0.25 = 1.284 lies inside [1 - 0.2, 1 + 0.3] = [0.8, 1.3]: not clipped, loss = -1.284
    per_tok, clipped, _ = clipped_pg_loss(t([[0.25]]), t([[0.0]]), t([[1.0]]), t([[True]]), 0.2, 0.3)
    assert math.isclose(per_tok.item(), -math.exp(0.25), rel_tol=1e-6) and not clipped.item()


def test_grpo_loss_token_mean_with_kl_by_hand():
    # 2 sequences; row 0 has 2 tokens, row 1 has 1 token (3 loss tokens).
    mask = t([[True, True], [True, False]])
    old = torch.zeros(2, 2)
    logp = torch.zeros(2, 2, requires_grad=True)  # ratio 1 everywhere
    adv = t([[1.0, 1.0], [-2.0, 0.0]])
    ref = t([[math.log(0.5), 0.0], [0.0, 0.0]])  # token (0,0): pi = 1, ref = 0.5
    algo = GRPO(group_size=2, kl_coef=0.1, aggregate=core.token_mean)
    loss, m = algo.loss(logp, loss_batch(old, adv, mask, ref))
    # pg per token: -1, -1, +2 -> token mean (-1 - 1 + 2) / 3 = 0
    # k3 at (0,0): r = 0.5 -> 0.5 - 1 - log 0.5 = 0.19315; others 0 -> mean 0.19315 / 3 = 0.064382
    # loss = 0 + 0.1 * 0.064382 = 0.0064382
    assert math.isclose(loss.item(), 0.1 * (0.5 - 1 + math.log(2)) / 3, rel_tol=1e-5)
    assert math.isclose(m["actor/pg_loss"], 0.0, abs_tol=1e-7)
    # gradient of the pg part w.r.t. logp is -A / 3 per token (ratio = 1): row 1 token 0 -> +2/3,
    # plus KL: d k3 / d logp = 1 - r = 0.5 at (0,0), times 0.1 / 3
    loss.backward()
    assert torch.allclose(logp.grad, t([[-1 / 3 + 0.1 * 0.5 / 3, -1 / 3], [2 / 3, 0.0]]), atol=1e-6)


def test_grpo_loss_seq_mean_token_mean_by_hand():
    mask = t([[True, True], [True, False]])
    logp = torch.zeros(2, 2)
    adv = t([[1.0, 1.0], [-2.0, 0.0]])
    algo = GRPO(group_size=2, aggregate=core.seq_mean_token_mean)
    loss, _ = algo.loss(logp, loss_batch(torch.zeros(2, 2), adv, mask))
    # row 0: mean(-1, -1) = -1; row 1: +2; mean over sequences (-1 + 2) / 2 = 0.5
    assert math.isclose(loss.item(), 0.5, rel_tol=1e-6)


def test_advantages_role_fills_tokens_and_metrics():
    mask = t([[True, False], [True, True], [True, True], [True, True]])
    b = loss_batch(torch.zeros(4, 2), None, mask)
    b.reward = t([1.0, 0.0, 1.0, 1.0])  # group 1 has signal, group 2 does not
    out = GRPO(group_size=2, scale_by_std=False).advantages(b)
    adv_tok, m = out.tokens, out.metrics
    assert torch.allclose(adv_tok, t([[0.5, 0.0], [-0.5, -0.5], [0.0, 0.0], [0.0, 0.0]]))
    assert m["reward/zero_std_frac"] == 0.5


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo", "cispo"])
def test_group_mean_batch_std_is_a_config_choice(name):
    # rewards [2, 0 | 1, 1], K = 2: group means 1 and 1 -> centred [1, -1, 0, 0].
    # std_scope=group: group stds sqrt(2) and 0 -> [.7071, -.7071, 0, 0]
    # std_scope=batch: batch std of [2, 0, 1, 1] = sqrt((1 + 1 + 0 + 0) / 3) = .8165 -> [1.2247, -1.2247, 0, 0]
    from helpers import algorithm, tiny_cfg
    b = loss_batch(torch.zeros(4, 1), None, t([[True]] * 4))
    b.reward = t([2.0, 0.0, 1.0, 1.0])
    for scope, a in (("group", 1 / math.sqrt(2)), ("batch", math.sqrt(1.5))):
        algo = algorithm(tiny_cfg(f"algo.name={name}", "rollout.group_size=2", f"algo.std_scope={scope}"))
        assert torch.allclose(algo.advantages(b).tokens[:, 0], t([a, -a, 0.0, 0.0]), atol=1e-5), scope


def test_dual_clip_caps_the_loss_of_negative_advantages_by_hand():
    # three tokens, eps 0.2, c = 3:
    #   ratio e^2 = 7.389, A = -1: PPO's loss max(7.389, 1.2) = 7.389 (gradient 7.389 per unit logp);
    #       dual clip: min(7.389, 3 * 1) = 3, a constant: gradient 0
    #   ratio 2, A = -1: 2 < 3, dual clip leaves it: loss 2, gradient 2
    #   ratio e^2, A = +1: min(7.389, 1.2) = 1.2 -> loss -1.2 with or without dual clip, gradient 0
    logp_old, mask = torch.zeros(1, 3), t([[True, True, True]])
    adv = t([[-1.0, -1.0, 1.0]])
    for c, want, grad in ((None, [math.exp(2), 2.0, -1.2], [math.exp(2), 2.0, 0.0]),
                          (3.0, [3.0, 2.0, -1.2], [0.0, 2.0, 0.0])):
        logp = t([[2.0, math.log(2), 2.0]], requires_grad=True)
        per_tok, _, _ = clipped_pg_loss(logp, logp_old, adv, mask, 0.2, 0.2, dual_clip=c)
        per_tok.sum().backward()
        assert torch.allclose(per_tok, t([want]), atol=1e-5), c
        assert torch.allclose(logp.grad, t([grad]), atol=1e-5), c


def test_dual_clip_frac_counts_negative_advantages_strictly_past_c():
    from rlpost.algorithms.ppo import dual_clip_frac

    # c = 3. (A, ratio): (-1, 4) counts; (-1, 3) sits at c, where the cap changes nothing; (0.5, 5) and
    # (2, 5) have A > 0, which dual-clip leaves alone; the pad (-1, 9) is no loss token -> 1 / 4
    ratio, adv = t([[4.0, 3.0, 5.0, 5.0, 9.0]]), t([[-1.0, -1.0, 0.5, 2.0, -1.0]])
    assert dual_clip_frac(ratio, adv, t([[True, True, True, True, False]]), 3.0) == 0.25


@pytest.mark.parametrize("name", ["ppo", "reinforce_pp", "grpo", "rloo", "dapo", "dr_grpo"])
def test_dual_clip_from_config_reaches_every_ppo_clip_method(name):
    # one token, ratio e^2, A = -1: the loss per token is 3 with algo.dual_clip_c=3 (7.389 without), and
    # actor/pg_clipfrac_lower = 1. The aggregators all give the per-token value for one token of one
    # sequence, except dr_grpo's const_norm: / max_new_tokens.
    from helpers import algorithm, tiny_cfg
    b = loss_batch(t([[0.0]]), t([[-1.0]]), t([[True]]), ref=t([[2.0]]))
    b.old_values = b.returns = torch.zeros(1, 1)
    extra = {"values": torch.zeros(1, 1)} if name == "ppo" else {}
    scale = 1 / 6 if name == "dr_grpo" else 1.0  # tiny_cfg: max_new_tokens 6
    for c, want in (("none", math.exp(2)), ("3", 3.0)):
        algo = algorithm(tiny_cfg(f"algo.name={name}", "rollout.group_size=2", f"algo.dual_clip_c={c}"))
        loss, m = algo.loss(t([[2.0]]), b, **extra)
        assert math.isclose(loss.item(), want * scale, rel_tol=1e-5), c
        assert m.get("actor/pg_clipfrac_lower", 0.0) == (1.0 if c == "3" else 0.0)


def test_dual_clip_is_refused_where_there_is_no_token_clip():
    from helpers import tiny_cfg

    from rlpost import build
    from rlpost.types.errors import ConfigError
    with pytest.raises(ConfigError, match="algo.dual_clip_c: GSPO has no PPO token clip"):
        build.check_algorithm(tiny_cfg("algo.name=gspo", "algo.dual_clip_c=3"))
