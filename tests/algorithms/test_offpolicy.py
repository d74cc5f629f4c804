"""The off-policy stabilisers (algorithms/offpolicy.py) against their papers' equations, by hand:
DeepSeek-V3.2's off-policy sequence masking and unbiased KL estimate, IcePop's token mask. The
arithmetic is in the comments; each number is away from any threshold, so no rounding decides it."""

import math

import pytest
import torch
from helpers import loss_batch, objective

from rlpost import build, config
from rlpost.algorithms import core, offpolicy

t = torch.tensor
L = math.log


def recorder():
    """A loss that records the advantages it is given (what the wrappers hand on)."""
    seen = {}

    def inner(logp, batch, **named):
        seen["adv"] = batch.advantages.clone()
        return torch.tensor(0.0), {}

    return inner, seen


def test_sequence_masking_drops_only_negative_rows_past_delta():
    # V3.2: M_i = 0 iff A_i < 0 and (1/|o_i|) sum_t log(pi_sampler / pi) > delta.
    # rows 0, 1: log(.5/.25) = log 2 = .693 and 0 -> mean .347 > .3; row 0 has A = -1 (dropped), row 1 A = +1 (kept)
    # row 2: A = -1 but pi = pi_sampler: divergence 0 (kept)
    # row 3: A = -1, one loss token with divergence 0, a pad token 100 nats off that must not count (kept)
    mask = t([[True, True], [True, True], [True, True], [True, False]])
    sampler = t([[L(.5), L(.5)], [L(.5), L(.5)], [L(.5), L(.5)], [L(.5), 0.0]])
    logp = t([[L(.25), L(.5)], [L(.25), L(.5)], [L(.5), L(.5)], [L(.5), -100.0]])
    adv = t([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0], [-1.0, 0.0]])
    div = offpolicy.sequence_divergence(sampler, logp, mask)
    assert torch.allclose(div, t([L(2) / 2, L(2) / 2, 0.0, 0.0]))
    inner, seen = recorder()
    b = loss_batch(logp, adv, mask)
    b.sampler_logp = sampler
    _, m = offpolicy.with_offpolicy_mask(inner, delta=0.3)(logp, b)
    assert torch.equal(seen["adv"], t([[0.0, 0.0], [1.0, 1.0], [-1.0, -1.0], [-1.0, 0.0]]))
    assert m["actor/offpolicy_masked_frac"] == 0.25  # one row of four
    assert torch.equal(b.advantages, adv)  # the batch itself is left alone
    _, m = offpolicy.with_offpolicy_mask(inner, delta=0.4)(logp, b)  # .347 < .4: nothing dropped
    assert torch.equal(seen["adv"], adv) and m["actor/offpolicy_masked_frac"] == 0.0


def test_sequence_masking_in_grpo_leaves_the_masked_row_no_gradient_but_its_kl():
    # GRPO, token mean over 4 tokens, ratio 1 on the first forward: loss = -(sum A_t) / 4 + 0.1 * mean k3.
    # Row 0 (A = -1, divergence log(2)/2 = .347 > .3) is masked: its d loss / d logp is only the KL's.
    mask = torch.ones(2, 2, dtype=torch.bool)
    old = t([[L(.25), L(.5)], [L(.25), L(.5)]])
    sampler = t([[L(.5), L(.5)], [L(.5), L(.5)]])
    adv, ref = t([[-1.0, -1.0], [1.0, 1.0]]), old.clone()  # ref = pi: k3 = 0, its gradient 0 too
    obj = objective(config.load(None, ["rollout.group_size=2", "rollout.prompts_per_step=1", "algo.kl_coef=0.1",
                                       "algo.offpolicy_mask_delta=0.3"]))
    b = loss_batch(old, adv, mask, ref)
    b.sampler_logp, b.norm_tokens, b.norm_seqs = sampler, 4.0, 2
    logp = old.clone().requires_grad_(True)
    loss, m = obj.loss(logp, b)
    loss.backward()
    # unmasked: d/dlogp of -r A / 4 = -A / 4 = -.25 on row 1; row 0 is 0
    assert torch.allclose(logp.grad, t([[0.0, 0.0], [-0.25, -0.25]]), atol=1e-7)
    assert m["actor/offpolicy_masked_frac"] == 0.5


def test_icepop_keeps_k_inside_the_band_and_zeroes_outside():
    # k = pi_old / pi_sampler = .4, .6, 1.5, 3 with c = 2 ([.5, 2]): M(k) = 0, .6, 1.5, 0 (IcePop's M(k) = k inside)
    old = t([[L(.4), L(.6), L(1.5), L(3.0)]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    inner, seen = recorder()
    b = loss_batch(old, t([[2.0, 2.0, -2.0, 1.0]]), mask)
    b.sampler_logp = torch.zeros(1, 4)
    _, m = offpolicy.with_icepop(inner, c=2.0)(None, b)
    assert torch.allclose(seen["adv"], t([[0.0, 1.2, -3.0, 0.0]]))
    assert m["actor/icepop_masked_frac"] == 0.5
    assert m["actor/icepop_weight_mean"] == pytest.approx((0.6 + 1.5) / 4, rel=1e-6)
    # TIS at cap 2 would keep the k = 3 token at weight 2: the two differ exactly there
    w = core.truncated_is_weight(old, torch.zeros(1, 4), mask, 2.0)
    assert torch.allclose(w, t([[.4, .6, 1.5, 2.0]]))


def test_icepop_takes_the_place_of_tis_even_for_stale_samples():
    cfg = config.load(None, ["rollout.group_size=2", "rollout.prompts_per_step=1", "algo.icepop_c=2",
                             "dist.topology=async"])  # async: TIS at STALE_TIS_CAP unless told otherwise
    mask = torch.ones(1, 2, dtype=torch.bool)
    b = loss_batch(t([[L(3.0), 0.0]]), t([[1.0, 1.0]]), mask)
    b.sampler_logp = torch.zeros(1, 2)
    _, m = objective(cfg).loss(b.old_logp.clone(), b)
    assert m["actor/icepop_masked_frac"] == 0.5 and "actor/tis_weight_mean" not in m


def test_kl_importance_by_hand():
    # pi = .5, pi_ref = .25, pi_sampler = .4: r = 1.25; k3 = pi_ref/pi - log(pi_ref/pi) - 1 = .5 + log 2 - 1 = .19315
    # value r * k3 = .24143; gradient in log pi: r * log(pi / pi_ref) = 1.25 * log 2 = .86643 (V3.2's unbiased form)
    logp = t([[L(.5)]], requires_grad=True)
    est = offpolicy.kl_importance(core.kl_k3(logp, t([[L(.25)]])), logp, t([[L(.4)]]))
    est.sum().backward()
    assert est.item() == pytest.approx(1.25 * (0.5 + L(2) - 1), rel=1e-6)
    assert logp.grad.item() == pytest.approx(1.25 * L(2), rel=1e-6)


def test_kl_importance_gradient_is_the_exact_kl_gradient_in_expectation():
    # A softmax policy over 4 tokens, tokens drawn from another q: sum_x q(x) grad[r(x) k3(x)] equals the exact
    # grad KL(pi || pi_ref) (float64, summed over the support, no sampling); plain k3 on q's tokens does not.
    theta = t([0.3, -0.2, 1.1, 0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(t([0.0, 0.5, -0.4, 0.2], dtype=torch.float64), 0)
    q = torch.softmax(t([1.0, -1.0, 0.0, 0.4], dtype=torch.float64), 0)

    def grad(f):
        (g,) = torch.autograd.grad(f(torch.log_softmax(theta, 0)), theta)
        return g

    exact = grad(lambda lp: (lp.exp() * (lp - ref)).sum())
    corrected = grad(lambda lp: (q * offpolicy.kl_importance(core.kl_k3(lp, ref), lp, q.log())).sum())
    plain = grad(lambda lp: (q * core.kl_k3(lp, ref)).sum())
    assert torch.allclose(corrected, exact, atol=1e-12)
    assert (plain - exact).abs().max() > 1e-2  # the bias the ratio removes


def test_kl_importance_ratio_reaches_every_kl_in_loss_algorithm():
    # ratio pi / pi_sampler = 1.25 on both tokens: actor/kl is 1.25 x the plain k3 mean
    mask = torch.ones(1, 2, dtype=torch.bool)
    logp, ref, sampler = t([[L(.5), L(.5)]]), t([[L(.25), L(.25)]]), t([[L(.4), L(.4)]])
    for name in ("grpo", "rloo", "dapo", "dr_grpo", "gspo", "cispo"):
        obj = objective(config.load(None, ["rollout.group_size=2", "rollout.prompts_per_step=1", f"algo.name={name}",
                                           "algo.kl_coef=0.1", "algo.kl_importance_ratio=true"]))
        b = loss_batch(logp, torch.ones(1, 2), mask, ref)
        b.sampler_logp, b.norm_tokens, b.norm_seqs = sampler, 2.0, 1
        _, m = obj.loss(logp, b)
        assert m["actor/kl"] == pytest.approx(1.25 * (0.5 + L(2) - 1), rel=1e-5), name


@pytest.mark.parametrize("override,expected", [
    ("algo.icepop_c=2 algo.tis_cap=2", "algo.icepop_c: ICEPOP weights by pi_old / pi_sampler inside [1/c, c]"),
    ("algo.icepop_c=1", "algo.icepop_c: expected a number > 1"),
    ("algo.kl_importance_ratio=true", "algo.kl_importance_ratio: corrects the KL term in the loss"),
    ("algo.kl_importance_ratio=true algo.kl_coef=0.1 algo.kl_estimator=k2",
     "algo.kl_importance_ratio: the ratio makes k3's and k1's gradient unbiased"),
    ("algo.offpolicy_mask_delta=-1", "algo.offpolicy_mask_delta: expected a number >= 0"),
])
def test_bad_stabiliser_settings_are_one_line(override, expected):
    with pytest.raises(config.ConfigError) as e:
        build.check(config.load(None, override.split()))
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_ppo_refuses_the_kl_importance_ratio_its_kl_is_in_the_reward():
    from rlpost import config_check

    with pytest.raises(config.ConfigError, match="algo.kl_importance_ratio: algo.name=ppo does not read it"):
        config_check.load(None, ["algo.name=ppo", "algo.kl_coef=0.1", "algo.kl_importance_ratio=true"])
