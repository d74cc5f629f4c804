"""Dr. GRPO, GSPO, CISPO and REINFORCE++, worked by hand."""

import math

import torch
from helpers import loss_batch as _batch

from rlpost.algorithms.cispo import CISPO
from rlpost.algorithms.dr_grpo import DrGRPO
from rlpost.algorithms.grpo import GRPO
from rlpost.algorithms.gspo import GSPO, sequence_ratio
from rlpost.algorithms.reinforce_pp import global_token_whitened

t = torch.tensor


def test_dr_grpo_constant_normaliser_by_hand():
    # rows of 2 and 1 loss tokens, ratio 1, advantage 1 on each: token losses -1, -1, -1, sum -3;
    # / (2 sequences * max_new_tokens 4) = -0.375 (token_mean would give -1, seq_mean_token_mean -1)
    mask = t([[True, True], [True, False]])
    adv = t([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = DrGRPO(group_size=2, max_new_tokens=4).loss(torch.zeros(2, 2), _batch(torch.zeros(2, 2), adv, mask))
    assert math.isclose(loss.item(), -3 / 8)
    # and its advantages are not divided by the std: group [3, 1] -> [1, -1]
    b = _batch(torch.zeros(2, 2), None, mask)
    b.reward = t([3.0, 1.0])
    adv_tok = DrGRPO(group_size=2, max_new_tokens=4).advantages(b).tokens
    assert torch.allclose(adv_tok, t([[1.0, 1.0], [-1.0, 0.0]]))


def test_gspo_ratio_is_the_geometric_mean_of_token_ratios():
    # token ratios 2 and 8 -> geometric mean sqrt(16) = 4; the masked third token is ignored
    logp = t([[math.log(2), math.log(8), 5.0]])
    ratio = sequence_ratio(logp, torch.zeros(1, 3), t([[True, True, False]]))
    assert torch.allclose(ratio, t([4.0]))


def test_gspo_clips_whole_sequences_by_hand():
    mask = t([[True, True], [True, True]])
    # row 0: s = exp(0.5 * (0.001 + 0.001)) = 1.001 > 1 + 4e-4 with A = +1 -> clipped to 1.0004
    # row 1: s = 1 exactly, A = -1 -> -(1 * -1) = 1
    logp = t([[0.001, 0.001], [0.0, 0.0]])
    adv = t([[1.0, 1.0], [-1.0, -1.0]])
    loss, m = GSPO(group_size=2).loss(logp, _batch(torch.zeros(2, 2), adv, mask))
    assert math.isclose(loss.item(), (-1.0004 + 1.0) / 2, abs_tol=1e-7)  # float32: 1 + 4e-4 is inexact
    assert m["actor/pg_clipfrac"] == 0.5


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # ratio e^1 = 2.72 > 1.2 with A = +1: PPO's clipped branch has zero gradient, CISPO's does not:
    # loss = -sg(1.2) * 1 * logp over 1 token -> d loss / d logp = -1.2
    mask = t([[True]])
    for algo, expected in ((GRPO(group_size=2), 0.0), (CISPO(group_size=2), -1.2)):
        logp = t([[1.0]], requires_grad=True)
        loss, _ = algo.loss(logp, _batch(t([[0.0]]), t([[1.0]]), mask))
        loss.backward()
        assert math.isclose(logp.grad.item(), expected, abs_tol=1e-6), type(algo).__name__


def test_reinforce_pp_whitens_over_all_tokens_by_hand():
    # rewards [1, 0], lengths 2 and 1 -> tokens [1, 1, 0]: mean 2/3, var (2 (1/3)^2 + (2/3)^2) / 3 = 2/9
    # std 0.4714 -> (1 - 2/3) / 0.4714 = 0.7071, (0 - 2/3) / 0.4714 = -1.4142
    adv = global_token_whitened(t([1.0, 0.0]), t([[True, True], [True, False]]))
    assert torch.allclose(adv, t([[0.7071, 0.7071], [-1.4142, 0.0]]), atol=1e-4)


def test_cispo_has_no_lower_bound_on_the_weight_by_default():
    # ratio e^-1 = .3679, A = -1, log pi = -1. The paper's CISPO (no floor): weight .3679,
    # loss = -.3679 * -1 * -1 = -.3679, d loss / d logp = -w * A = +.3679.
    # With algo.cispo_eps_low=0.2 the floor 0.8 bites: loss -0.8, gradient +0.8.
    from helpers import algorithm, tiny_cfg
    mask, adv = t([[True]]), t([[-1.0]])
    for overrides, w in (((), math.exp(-1)), (("algo.cispo_eps_low=0.2",), 0.8),
                         (("algo.cispo_eps_low=none",), math.exp(-1))):
        cispo = algorithm(tiny_cfg("algo.name=cispo", *overrides))
        logp = t([[-1.0]], requires_grad=True)
        loss, m = cispo.loss(logp, _batch(t([[0.0]]), adv, mask))
        loss.backward()
        assert math.isclose(loss.item(), -w, rel_tol=1e-6), overrides
        assert math.isclose(logp.grad.item(), w, rel_tol=1e-6), overrides
        assert m["actor/is_weight_clipfrac"] == (1.0 if w == 0.8 else 0.0)
