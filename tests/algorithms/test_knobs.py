"""The shared knobs around an algorithm (wrappers.py, objective.py), worked by hand: PRIME's
implicit process reward, overlong filtering, and when the loop needs the trainer's old log-probs
before the advantages."""

import math

import pytest
import torch
from helpers import objective, rl_batch, tiny_cfg

from rlpost import algorithms, build
from rlpost.algorithms import ALGORITHMS, core
from rlpost.algorithms.objective import old_logp_first
from rlpost.algorithms.wrappers import with_overlong_filter, with_prime
from rlpost.types.roles import Advantages

t = torch.tensor


@pytest.mark.parametrize("trainer_logp", [True, False])
def test_prime_adds_the_rloo_centred_implicit_reward_to_go(trainer_logp):
    # K = 2, one token each; implicit r = coef * (log pi - log pi_ref) = 0.5 * [0.4, -0.2] = [0.2, -0.1].
    # Leave-one-out baselines: row 0 gets row 1's -0.1, row 1 gets row 0's 0.2 -> dense [0.3, -0.3]
    mask = t([[True], [True]])
    policy = t([[0.4], [-0.2]])
    b = rl_batch(mask, ref_logp=torch.zeros(2, 1), sampler_logp=policy if not trainer_logp else torch.full((2, 1), 5.0),
                 old_logp=policy if trainer_logp else None)
    out = with_prime(Advantages(t([[1.0], [-1.0]]), {"x": 1.0}), b, coef=0.5, group_size=2)
    assert torch.allclose(out.tokens, t([[1.3], [-1.3]]))
    assert out.metrics["x"] == 1.0 and math.isclose(out.metrics["reward/implicit_prm_mean"], 0.05, rel_tol=1e-6)


def test_prime_reads_the_reference_and_leaves_padding_out():
    # coef 0.5, K = 2; row 0 has one loss token and a pad (whose log-probs 7 and 3 must not count).
    # implicit 0.5 * (log pi - log pi_ref) on the mask: row 0 [0.5 * 0.2, 0] = [0.1, 0],
    # row 1 [0.5 * -0.2, 0.5 * -0.4] = [-0.1, -0.2]. Per-token means 0.1 and -0.15; leave-one-out
    # baselines: row 0 gets -0.15, row 1 gets 0.1. r - b: row 0 [0.25, pad], row 1 [-0.2, -0.3]
    # -> to go: row 0 [0.25, 0], row 1 [-0.5, -0.3]; plus the outcome advantages [[1, 0], [-1, -1]].
    mask = t([[True, False], [True, True]])
    b = rl_batch(mask, old_logp=t([[0.4, 7.0], [0.1, -0.3]]), ref_logp=t([[0.2, 3.0], [0.3, 0.1]]))
    out = with_prime(Advantages(t([[1.0, 0.0], [-1.0, -1.0]]), {}), b, coef=0.5, group_size=2)
    assert torch.allclose(out.tokens, t([[1.25, 0.0], [-1.5, -1.3]]))
    # mean over rows of the summed implicit reward: (0.1 + -0.3) / 2 = -0.1
    assert math.isclose(out.metrics["reward/implicit_prm_mean"], -0.1, rel_tol=1e-6)


def test_overlong_filter_drops_truncated_rows_from_the_loss():
    b = rl_batch(t([[True, True], [True, False]]), truncated=t([True, False]))
    out = with_overlong_filter(Advantages(t([[1.0, 1.0], [2.0, 0.0]]), {"m": 1.0}), b)
    assert out.tokens.tolist() == [[0.0, 0.0], [2.0, 0.0]] and out.metrics == {"m": 1.0}
    assert out.loss_mask.tolist() == [[False, False], [True, False]]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_when_the_old_log_probs_come_first(name):
    # Needed before the advantages: a critic's values (GAE), a KL in the reward (measured under the
    # sampling weights), adaptive KL (it tracks the measured KL), or a teacher's token advantages
    # (distill: -(log pi_old - log pi_teacher)). Otherwise the update's own first forward gives them for free.
    t_ = ALGORITHMS[name].traits
    for kl_coef, adaptive in ((0.0, False), (0.1, False), (0.1, True)):
        want = t_.needs_values or (t_.kl == "reward" and kl_coef > 0) or adaptive or t_.teacher
        assert old_logp_first(t_, kl_coef, adaptive) == want
    teacher = ["algo.teacher=tiny"] if t_.teacher else []
    if t_.kl != "none":
        cfg = tiny_cfg(f"algo.name={name}", "algo.kl_coef=0.1", "algo.kl_target=0.5")
        assert algorithms.needs_old_logp_first(cfg.algo) and objective(cfg).old_logp_first
    cfg = tiny_cfg(f"algo.name={name}", *teacher)
    assert algorithms.needs_old_logp_first(cfg.algo) == (t_.needs_values or t_.teacher) == objective(cfg).old_logp_first


def test_build_wires_the_loss_side_knobs():
    # entropy bonus aggregated like the loss (seq_mean_token_mean), then TIS: by hand on one batch.
    cfg = tiny_cfg("algo.entropy_coef=0.1", "algo.loss_agg=seq_mean_token_mean", "algo.tis_cap=1.5",
                   "rollout.group_size=2")
    obj = objective(cfg)
    mask = t([[True, True], [True, False]])
    b = rl_batch(mask, old_logp=torch.zeros(2, 2), sampler_logp=t([[math.log(0.5), 0.0], [0.0, 0.0]]),
                 advantages=t([[1.0, 1.0], [-1.0, 0.0]]))
    loss, m = obj.loss(torch.zeros(2, 2), b, entropy=t([[1.0, 3.0], [2.0, 9.0]]))
    # TIS weights [[min(2, 1.5), 1], [1, -]]: pg per token -[1.5, 1], +1 -> row means -1.25, 1 -> mean -0.125
    # entropy row means 2 and 2 -> 2; loss = -0.125 - 0.1 * 2 = -0.325
    assert math.isclose(loss.item(), -0.325, rel_tol=1e-6)
    assert (math.isclose(m["actor/tis_weight_mean"], 3.5 / 3, rel_tol=1e-6)
            and math.isclose(m["actor/tis_capped_frac"], 1 / 3, rel_tol=1e-6))
    bare = objective(tiny_cfg())
    assert bare.loss == bare.algo.loss  # no knob: the algorithm's own loss


def test_adaptive_kl_moves_the_algorithms_coefficient():
    obj = objective(tiny_cfg("algo.kl_coef=0.1", "algo.kl_target=0.5", "algo.kl_horizon=100"))
    # KL 1.0 vs target 0.5: error +1 -> clipped 0.2; 10 samples -> 0.1 * (1 + 0.2 * 10 / 100) = 0.102
    assert obj.end_step({"actor/kl": 1.0}, {}, 10) == {"actor/kl_coef": pytest.approx(0.102)}
    assert obj.algo.kl_coef == pytest.approx(0.102) and obj.state_dict()["kl_coef"] == pytest.approx(0.102)
    # in the reward (PPO): the advantages' measured KL; 0.25 vs 0.5 -> -0.2 -> 0.1 * (1 - 0.02) = 0.098
    ppo = objective(tiny_cfg("algo.name=ppo", "algo.kl_coef=0.1", "algo.kl_target=0.5", "algo.kl_horizon=100"))
    assert ppo.end_step({}, {"critic/kl": 0.25}, 10)["actor/kl_coef"] == pytest.approx(0.098)
    assert objective(tiny_cfg()).end_step({"actor/kl": 1.0}, {}, 10) == {}  # off
    assert isinstance(obj.kl_control, core.AdaptiveKLController)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_the_entropy_bonus_is_aggregated_like_the_loss(name):
    # loss_agg=seq_mean_token_sum, which only the algorithms without a fixed aggregation follow.
    # Rows of 2 and 1 loss tokens, entropy [1, 3 | 2]:
    want = {"token_mean": (1 + 3 + 2) / 3, "const_norm": (1 + 3 + 2) / (2 * 4),
            "sequence": ((1 + 3) / 2 + 2) / 2, "": (1 + 3 + 2) / 2}[ALGORITHMS[name].traits.fixed_aggregator]
    teacher = ["algo.teacher=tiny"] if ALGORITHMS[name].traits.teacher else []
    # train refuses algo.loss_agg where the aggregation is fixed
    agg = [] if ALGORITHMS[name].traits.fixed_aggregator else ["algo.loss_agg=seq_mean_token_sum"]
    cfg = lambda *x: tiny_cfg(f"algo.name={name}", *agg, "rollout.max_new_tokens=4", "rollout.group_size=2",
                              *teacher, *x)
    mask = t([[True, True], [True, False]])
    b = rl_batch(mask, reward=t([1.0, 0.0]), old_logp=torch.zeros(2, 2), old_values=torch.zeros(2, 2),
                 ref_logp=t([[-1.0, 0.5], [0.2, 0.0]]))
    plain, bonus = objective(cfg()), objective(cfg("algo.entropy_coef=0.5"))
    out = plain.advantages(b)
    b.advantages, b.returns = out.tokens, out.returns
    extra = {"values": torch.zeros(2, 2)} if ALGORITHMS[name].traits.needs_values else {}
    base, _ = plain.loss(torch.zeros(2, 2), b, **extra)
    with_ent, _ = bonus.loss(torch.zeros(2, 2), b, entropy=t([[1.0, 3.0], [2.0, 7.0]]), **extra)
    assert math.isclose(with_ent.item(), base.item() - 0.5 * want, rel_tol=1e-6, abs_tol=1e-7)


# --- Clip-Cov and KL-Cov (Cui et al. 2025) ---------------------------------------------------------
# One row of 4 loss tokens, A = [1, 1, -1, -1] (mean 0), log pi = [0, -4, -1, -3] (mean -2):
# cov = (A - 0) (log pi + 2) = [2, -2, -1, 1]. Only token 0 lies strictly inside Clip-Cov's (1, 5),
# and token 0 has the largest covariance (KL-Cov's top-1). max(1, 2e-4 * 4) = 1 token is restrained.
COV_ADV = t([[1.0, 1.0, -1.0, -1.0]])
COV_LOGP = [[0.0, -4.0, -1.0, -3.0]]


def test_token_covariance_by_hand():
    from rlpost.algorithms.wrappers import token_covariance
    cov = token_covariance(COV_ADV, t(COV_LOGP), t([[True] * 4]))
    assert torch.allclose(cov, t([[2.0, -2.0, -1.0, 1.0]]))


def test_token_covariance_centres_both_factors_on_the_mask():
    from rlpost.algorithms.wrappers import token_covariance
    # means over the 2 loss tokens: A (2 + 0) / 2 = 1, log pi (0 - 2) / 2 = -1
    # -> [(2 - 1)(0 + 1), (0 - 1)(-2 + 1)] = [1, 1]; the pad (not a loss token) gets (9 - 1)(5 + 1) = 48
    cov = token_covariance(t([[2.0, 0.0, 9.0]]), t([[0.0, -2.0, 5.0]]), t([[True, True, False]]))
    assert cov.tolist() == [[1.0, 1.0, 48.0]]


def test_clip_cov_detaches_the_gradient_of_the_high_covariance_token():
    # GRPO, ratio 1 everywhere (old = log pi): per-token loss -A, token mean over 4:
    # d loss / d log pi = -A / 4 = [-.25, -.25, .25, .25]; Clip-Cov takes token 0's away -> [0, -.25, .25, .25].
    # The loss value stays -(1 + 1 - 1 - 1) / 4 = 0 (the paper detaches; the value is not changed).
    for control, grad0 in (("none", -0.25), ("clip_cov", 0.0)):
        obj = objective(tiny_cfg("rollout.group_size=2", f"algo.cov_control={control}"))
        logp = t(COV_LOGP, requires_grad=True)
        loss, m = obj.loss(logp, rl_batch(t([[True] * 4]), old_logp=t(COV_LOGP), advantages=COV_ADV))
        loss.backward()
        assert torch.allclose(logp.grad, t([[grad0, -0.25, 0.25, 0.25]])), control
        assert math.isclose(loss.item(), 0.0, abs_tol=1e-7)
        assert m.get("actor/clip_cov_frac", 0.0) == (0.25 if control == "clip_cov" else 0.0)


# KL-Cov's surrogate is unclipped (the paper's and verl's): with kl_cov the PPO clip is open. Token 0 has the
# largest covariance (2) and is the one chosen; 2 optimizer steps per batch (mini-batch 4 of 8), else it is refused.
KL_COV = ("rollout.group_size=2", "trainer.mini_batch_size=4")


@pytest.mark.parametrize("old0, control, loss_want, grad0", [
    # log pi_old of token 0 is 0.5 lower (its log-prob rose): ratio e^.5 = 1.6487 > 1.2 with A = +1.
    # none: PPO clips it (loss -1.2, no gradient); tokens 1-3 at ratio 1 give -A each: (-1.2 - 1 + 1 + 1) / 4.
    (-0.5, "none", (-1.2 - 1.0 + 1.0 + 1.0) / 4, 0.0),
    # kl_cov: unclipped -A r = -1.6487 (gradient -A r / 4 = -.41218) + .1 |0 - (-.5)| / 4 = + .0125 to the loss
    # and + .1 / 4 = + .025 to the gradient (the sign of log pi - log pi_old is +).
    (-0.5, "kl_cov", (-math.exp(0.5) - 1.0 + 1.0 + 1.0) / 4 + 0.0125, -math.exp(0.5) / 4 + 0.025),
    # log pi_old is 0.5 higher (its log-prob fell): ratio e^-.5 = .6065, inside no clip for A = +1 (min picks r A).
    (0.5, "none", (-math.exp(-0.5) - 1.0 + 1.0 + 1.0) / 4, -math.exp(-0.5) / 4),
    # kl_cov: the penalty .1 |0 - .5| / 4 = + .0125 still adds to the loss, and its gradient is - .1 / 4: the
    # sign of log pi - log pi_old is - here. A penalty without its |.|, or subtracted, fails this row.
    (0.5, "kl_cov", (-math.exp(-0.5) - 1.0 + 1.0 + 1.0) / 4 + 0.0125, -math.exp(-0.5) / 4 - 0.025),
])
def test_kl_cov_penalises_the_top_covariance_token_by_hand_on_the_unclipped_surrogate(old0, control, loss_want, grad0):
    obj = objective(tiny_cfg(*KL_COV, f"algo.cov_control={control}"))
    logp = t(COV_LOGP, requires_grad=True)
    loss, m = obj.loss(logp, rl_batch(t([[True] * 4]), old_logp=t([[old0, -4.0, -1.0, -3.0]]), advantages=COV_ADV))
    loss.backward()
    assert math.isclose(loss.item(), loss_want, rel_tol=1e-6), control
    assert torch.allclose(logp.grad, t([[grad0, -0.25, 0.25, 0.25]]), atol=1e-7), control
    assert m.get("actor/kl_cov_frac", 0.0) == (0.25 if control == "kl_cov" else 0.0)
    assert m["actor/pg_clipfrac"] == (0.25 if (old0, control) == (-0.5, "none") else 0.0)


def test_kl_cov_is_refused_with_one_optimizer_step_per_batch():
    from rlpost.types.errors import ConfigError
    with pytest.raises(ConfigError, match="algo.cov_control=kl_cov: with one optimizer step per rollout batch"):
        build.check_algorithm(tiny_cfg("rollout.group_size=2", "algo.cov_control=kl_cov"))
    # acts from epoch 2
    build.check_algorithm(tiny_cfg("rollout.group_size=2", "algo.cov_control=kl_cov", "trainer.epochs=2"))
    build.check_algorithm(tiny_cfg("rollout.group_size=2", "algo.cov_control=clip_cov"))  # acts on the first forward


# The wrappers alone, around a loss that needs a keyword (the trainer passes values= or entropy=
# through them): one row of 4 loss tokens with the covariances [2, -2, -1, 1] above, and a pad.
COV_MASK = t([[True, True, True, True, False]])


def _cov_batch(old=None):
    logp = t([COV_LOGP[0] + [0.0]], requires_grad=True)
    adv = t([[1.0, 1.0, -1.0, -1.0, 0.0]])
    return logp, rl_batch(COV_MASK, advantages=adv, old_logp=logp.detach() if old is None else old)


def _kw_loss(logp, batch, *, values=None, entropy=None):  # the wrappers hand the named inputs on
    return (logp * batch.advantages).sum() * values, {}


def test_clip_cov_takes_candidates_strictly_inside_and_max_1_ratio_tokens():
    from rlpost.algorithms.wrappers import with_clip_cov

    # (lb, ub) = (-3, 1): tokens 1 (cov -2) and 2 (-1) lie inside; token 3's cov 1 = ub does not.
    # ratio 1: up to 1 * 4 = 4 tokens, so both candidates lose their gradient: d/d logp = 2 A on the others
    logp, b = _cov_batch()
    loss, m = with_clip_cov(_kw_loss, ratio=1.0, lb=-3.0, ub=1.0)(logp, b, values=2.0)
    loss.backward()
    assert logp.grad.tolist() == [[2.0, 0.0, 0.0, -2.0, 0.0]] and m["actor/clip_cov_frac"] == 0.5
    # ratio 1e-4: max(1, int(1e-4 * 4)) = 1 of the 2 candidates (either one, at random): 1 / 4 tokens
    logp, b = _cov_batch()
    loss, m = with_clip_cov(_kw_loss, ratio=1e-4, lb=-3.0, ub=1.0)(logp, b, values=2.0)
    loss.backward()
    assert m["actor/clip_cov_frac"] == 0.25 and (logp.grad == 0).sum() == 2  # the pad's and one token's


def test_kl_cov_penalises_ratio_tokens_aggregated_with_both_totals():
    from rlpost.algorithms import core
    from rlpost.algorithms.wrappers import with_kl_cov

    # ratio 0.5: int(0.5 * 4) = 2 tokens with the largest covariance, tokens 0 (2) and 3 (1).
    # |log pi - log pi_old| = [0.5, 0.2, 0.3, 0.4]: penalty [0.5, 0, 0, 0.4]; seq_mean_token_sum over
    # 1 sequence: 0.9; coef 0.1 -> + 0.09. Base: sum(A log pi) * 2 = (0 - 4 + 1 + 3) * 2 = 0.
    old = t([[-0.5, -4.2, -1.3, -3.4, 0.0]])
    logp, b = _cov_batch(old)
    loss, m = with_kl_cov(_kw_loss, ratio=0.5, coef=0.1, aggregate=core.seq_mean_token_sum)(logp, b, values=2.0)
    assert math.isclose(loss.item(), 0.09, rel_tol=1e-5) and m["actor/kl_cov_frac"] == 0.5


def test_entropy_advantage_leaves_padding_alone_and_passes_keywords():
    from rlpost.algorithms.wrappers import with_entropy_advantage

    # A = [1, -1 | pad 0.5], H = [.4, 3 | 2], alpha .5, kappa 2: shaping min(.5 H, |A| / 2) on the mask
    # = min([.2, 1.5], [.5, .5]) = [.2, .5], 0 on the pad -> A' = [1.2, -.5, .5]; the loss below is
    # sum(A') * values = 1.2 * 2 = 2.4, and the mean shaping over the 2 loss tokens is .35; both named inputs
    # are handed on to the loss inside (an entropy bonus there reads the same entropy)
    b = rl_batch(t([[True, True, False]]), advantages=t([[1.0, -1.0, 0.5]]))
    inner = lambda logp, batch, *, values=None, entropy=None: (batch.advantages.sum() * values, {"inner": entropy})
    ent = t([[0.4, 3.0, 2.0]])
    loss, m = with_entropy_advantage(inner, 0.5, 2.0)(None, b, values=2.0, entropy=ent)
    assert (math.isclose(loss.item(), 2.4, rel_tol=1e-6) and m["inner"] is ent
            and math.isclose(m["actor/entropy_adv_mean"], 0.35, rel_tol=1e-6))


def test_loss_takes_entropy_for_either_knob():
    # any positive coefficient, however small, needs the trainer's entropy
    assert algorithms.loss_takes_entropy(tiny_cfg("algo.entropy_coef=0.5").algo)
    assert algorithms.loss_takes_entropy(tiny_cfg("algo.entropy_adv_coef=0.5").algo)
    assert not algorithms.loss_takes_entropy(tiny_cfg().algo)


def test_cov_control_is_refused_without_a_token_clip():
    from rlpost.types.errors import ConfigError
    with pytest.raises(ConfigError,
                       match="algo.cov_control: Clip-Cov and KL-Cov act on PPO's token-level loss, which GSPO"):
        build.check_algorithm(tiny_cfg("algo.name=gspo", "algo.cov_control=kl_cov"))


def test_entropy_shaped_advantage_by_hand():
    # A = [1, -1, .2], H = [.4, 3, 1], alpha .5, kappa 2: shaping = min(.5 H, |A| / 2)
    #   = min([.2, 1.5, .5], [.5, .5, .1]) = [.2, .5, .1] -> A' = [1.2, -.5, .3] (no sign flips).
    # GRPO at ratio 1: loss = -mean(A') = -(1.2 - .5 + .3) / 3 = -1/3, d loss / d log pi = -A' / 3.
    # With the entropy bonus on too (coef .1) the entropy is handed on: loss - .1 * mean(H) = -1/3 - .44/3.
    mask = t([[True, True, True]])
    adv, ent = t([[1.0, -1.0, 0.2]]), t([[0.4, 3.0, 1.0]])
    for bonus, want in ((0.0, -1 / 3), (0.1, -1 / 3 - 0.1 * 4.4 / 3)):
        obj = objective(tiny_cfg("rollout.group_size=2", "algo.entropy_adv_coef=0.5", f"algo.entropy_coef={bonus}"))
        logp, entropy = torch.zeros(1, 3, requires_grad=True), ent.clone().requires_grad_(True)
        loss, m = obj.loss(logp, rl_batch(mask, old_logp=torch.zeros(1, 3), advantages=adv), entropy=entropy)
        loss.backward()
        assert math.isclose(loss.item(), want, rel_tol=1e-6), bonus
        assert torch.allclose(logp.grad, -t([[1.2, -0.5, 0.3]]) / 3)
        # no gradient through the shaping: only the bonus's -.1 / 3 per token, and none without it
        assert torch.allclose(entropy.grad, torch.full((1, 3), -bonus / 3)) if bonus else entropy.grad is None
        assert math.isclose(m["actor/entropy_adv_mean"], 0.8 / 3, rel_tol=1e-6)
    assert (algorithms.loss_takes_entropy(tiny_cfg("algo.entropy_adv_coef=0.5").algo)
            and not algorithms.loss_takes_entropy(tiny_cfg().algo))
