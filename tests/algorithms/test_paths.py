"""Branches of the algorithms that mutation testing found no test reaching (tests/README.md), each
against numbers worked out here or the wrapper it must apply."""

import pytest
import torch
from helpers import loss_batch, objective, rl_batch

from rlpost import config
from rlpost.algorithms import core
from rlpost.algorithms.ppo import clipped_value_loss, dual_clip_frac, explained_variance
from rlpost.algorithms.wrappers import with_overlong_filter, with_prime
from rlpost.build import check_algorithm

t = torch.tensor


def prime_batch():
    """2 groups of 2, every field the objective's wrappers read; row 1 truncated."""
    g = torch.Generator().manual_seed(0)
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]).bool()
    logp = torch.randn(4, 3, generator=g) * mask
    return rl_batch(mask, sampler_logp=logp, old_logp=logp,
                    ref_logp=(logp + 0.3 * torch.randn(4, 3, generator=g)) * mask,
                    reward=t([1.0, 0.0, 0.5, 1.0]), group_ids=t([0, 0, 1, 1]), truncated=t([False, True, False, False]))


@pytest.mark.parametrize("keys", [["algo.prime_coef=0.5"], ["algo.overlong_filter=true"],
                                  ["algo.prime_coef=0.5", "algo.overlong_filter=true"]])
def test_the_objective_applies_prime_then_the_overlong_filter(keys):
    cfg = config.load(None, ["rollout.group_size=2", "rollout.prompts_per_step=2", *keys])
    plain = objective(config.load(None, ["rollout.group_size=2", "rollout.prompts_per_step=2"]))
    want = plain.advantages(prime_batch())
    if cfg.algo.prime_coef > 0:
        want = with_prime(want, prime_batch(), 0.5, 2)
    if cfg.algo.overlong_filter:
        want = with_overlong_filter(want, prime_batch())
    got = objective(cfg).advantages(prime_batch())
    assert torch.equal(got.tokens, want.tokens) and got.metrics == want.metrics
    assert not torch.equal(got.tokens, plain.advantages(prime_batch()).tokens)  # the knob did something


def test_a_fixed_kl_coef_is_the_configs_not_the_checkpoints():
    obj = objective(config.load(None, ["algo.kl_coef=0.1"]))  # no algo.kl_target: nothing adapts it
    obj.load_state_dict({"algo": {}, "kl_coef": 0.5})
    assert obj.algo.kl_coef == 0.1


def test_explained_variance_of_constant_returns_is_zero():
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert explained_variance(torch.randn(2, 3), torch.full((2, 3), 0.7), mask) == 0.0


def test_value_clipping_holds_a_value_that_moved_down():
    # V_old 0, V -1.5, clip 0.2 -> V_clipped -0.2; R -2: (-0.2 + 2)^2 = 3.24 beats (-1.5 + 2)^2 = 0.25
    loss, clipped = clipped_value_loss(t([[-1.5]]), t([[0.0]]), t([[-2.0]]), 0.2)
    assert loss.item() == pytest.approx(0.5 * 3.24) and clipped.item()


def test_gae_carries_the_next_value_across_a_hole():
    # mask [1, 0, 1] (a tool observation in the middle), gamma = lam = 1; hand-worked backwards:
    # t=2: delta = 1 - 0.25 = 0.75; t=1 is a hole (values there are not read; V(next) = 0.25 carries);
    # t=0: delta = 0 + 0.25 - 0.5 = -0.25, A = -0.25 + 0.75 = 0.5
    adv, ret = core.gae(t([[0.0, 0.0, 1.0]]), t([[0.5, 9.0, 0.25]]), t([[1, 0, 1]]).bool(), 1.0, 1.0)
    assert adv.tolist() == [[0.5, 0.0, 0.75]] and ret.tolist() == [[1.0, 0.0, 1.0]]


def test_sequence_level_tis_weights_each_row_by_its_own_log_ratio():
    # rows' summed log-ratios: ln 2 and -ln 2 over their masked tokens; cap 1.5
    ln2 = torch.log(t(2.0))
    old = t([[ln2 / 2, ln2 / 2, 5.0], [-ln2, 0.0, 0.0]])
    mask = t([[1, 1, 0], [1, 1, 1]]).bool()
    w = core.truncated_is_weight(old, torch.zeros(2, 3), mask, cap=1.5, level="sequence")
    assert torch.allclose(w, t([[1.5, 1.5, 0.0], [0.5, 0.5, 0.5]]))


def test_dual_clip_counts_only_negative_advantages():
    ratio, mask = t([[4.0, 4.0, 4.0]]), torch.ones(1, 3, dtype=torch.bool)
    # a zero advantage is not negative
    assert dual_clip_frac(ratio, t([[-1.0, 0.0, 1.0]]), mask, 3.0) == pytest.approx(1 / 3)


def test_ratio_histogram_by_hand():
    # bins [0,0.5) [0.5,0.8) [0.8,0.9) [0.9,0.95) [0.95,0.99) [0.99,1.01) [1.01,1.05) [1.05,1.1) [1.1,1.25) [1.25,2)
    # [2,inf)
    ratios = t([0.1, 0.5, 0.85, 0.92, 0.97, 1.0, 1.0, 1.01, 1.07, 1.2, 1.5, 2.0, 40.0])  # an edge goes up (right=True)
    assert core.ratio_histogram(ratios) == [1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2]
    assert core.ratio_histogram(torch.zeros(0)) == [0] * 11


def test_k3_of_a_far_off_token_is_bounded_with_a_finite_gradient():
    logp = t([-200.0, 0.0], requires_grad=True)  # log(pi_ref / pi) = 200: exp would overflow without the clamp
    kl = core.kl_k3(logp, t([0.0, -200.0]))
    kl.sum().backward()
    assert kl.tolist() == [core.KL_BOUND, core.KL_BOUND] and torch.isfinite(logp.grad).all()


@pytest.mark.parametrize("keys, key", [
    (["algo.name=reinforce", "trainer.epochs=2"], "trainer.epochs"),  # on-policy only: no second epoch
    (["algo.name=reinforce", "trainer.mini_batch_size=4"], "trainer.epochs"),  # nor a second mini-batch
    (["algo.name=reinforce", "rollout.filter_groups=true", "rollout.group_size=1"], "rollout.filter_groups"),
    (["algo.name=reinforce", "algo.kl_coef=0.5"], "algo.kl_coef"),  # a KL below 1 is still a KL
    (["algo.name=ppo", "dist.topology=disaggregated", "dist.trainer_ranks=2"], "dist.trainer_ranks"),
])
def test_what_an_algorithm_cannot_run_is_refused(keys, key):
    with pytest.raises(config.ConfigError, match=key.replace(".", r"\.")):
        objective(config.load(None, ["rollout.prompts_per_step=4", "rollout.group_size=4", *keys]))


# what a user switching algorithms leaves behind (train used to run without it)
@pytest.mark.parametrize("keys, key, hint", [
    (["algo.dapo_clip_eps_high=0.3"], "algo.dapo_clip_eps_high", "set algo.name=dapo"),
    (["algo.cispo_eps_low=0.1"], "algo.cispo_eps_low", "set algo.name=cispo"),
    (["algo.gamma=0.9"], "algo.gamma", "set algo.name=ppo"),
    (["algo.baseline=none"], "algo.baseline", "set algo.name=reinforce"),
    (["algo.name=dr_grpo", "algo.loss_agg=seq_mean_token_sum"], "algo.loss_agg", "remove it$"),  # fixed aggregation
    (["algo.name=gspo", "algo.clip_eps_high=0.3"], "algo.clip_eps_high", "remove it$"),  # GSPO clips sequences
    (["algo.critic=shared"], "algo.critic", "set algo.name=ppo"),
])
def test_keys_the_chosen_algorithm_does_not_read_are_refused(keys, key, hint):
    with pytest.raises(config.ConfigError,
                       match=rf"^{key.replace('.', '[.]')}: algo.name=\w+ does not read it.*{hint}"):
        check_algorithm(config.load(None, ["rollout.prompts_per_step=4", "rollout.group_size=4", *keys]))


def test_each_algorithm_takes_its_own_keys():
    for keys in (["algo.name=dapo", "algo.dapo_clip_eps_high=0.3"],
                 ["algo.name=ppo", "algo.gamma=0.9", "algo.critic=shared"],
                 ["algo.name=reinforce", "algo.baseline=none"], ["algo.name=cispo", "algo.cispo_eps_low=0.1"],
                 ["algo.name=gspo", "algo.seq_clip_eps_high=1e-3"], ["algo.name=grpo", "algo.std_scope=batch"]):
        check_algorithm(config.load(None, ["rollout.prompts_per_step=4", "rollout.group_size=4", *keys]))


def objective_loss(keys, logp, old, adv, mask, ref=None, sampler=None):
    """The built objective's loss (the algorithm's, wrapped by the loss-side knobs in ``keys``)."""
    obj = objective(config.load(None, ["rollout.group_size=2", "rollout.prompts_per_step=1", *keys]))
    b = loss_batch(old, adv, mask, ref)
    b.norm_tokens, b.norm_seqs = float(mask.sum()), len(mask)
    if sampler is not None:  # else the sampler's log-probs are the old ones (loss_batch)
        b.sampler_logp = sampler
    return obj.loss(logp, b)


@pytest.mark.parametrize("name", ["grpo", "cispo", "gspo"])
def test_the_kl_in_the_loss_is_the_configured_estimator(name):
    mask = torch.ones(2, 2, dtype=torch.bool)
    logp, ref = t([[-1.0, -2.0], [-0.5, -1.5]]), t([[-1.5, -1.0], [-0.5, -3.0]])
    _, m = objective_loss([f"algo.name={name}", "algo.kl_coef=0.1", "algo.kl_estimator=k2"], logp, logp,
                          torch.ones(2, 2), mask, ref)
    assert m["actor/kl"] == pytest.approx(core.masked_mean(core.kl_k2(logp, ref), mask).item(), rel=1e-6)


def test_dual_clip_caps_a_negative_advantage_at_c_times_its_size():
    # A = -2 at ratio e^2 (7.39): plain PPO loss -A * r = 14.8; dual clip c = 3 caps it at c|A| = 6.
    # A = +0.5 at ratio 1: untouched (0.5 * 1 = -0.5 as a loss)
    mask = torch.ones(1, 2, dtype=torch.bool)
    logp, old, adv = t([[2.0, 0.0]]), torch.zeros(1, 2), t([[-2.0, 0.5]])
    loss, _ = objective_loss(["algo.name=grpo", "algo.dual_clip_c=3", "algo.loss_agg=token_mean"], logp, old, adv, mask)
    assert loss.item() == pytest.approx((6.0 - 0.5) / 2, rel=1e-6)


def test_ratio_max_of_a_batch_without_loss_tokens_is_one():
    mask = torch.zeros(1, 2, dtype=torch.bool)
    _, m = objective_loss(["algo.name=grpo"], torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), mask)
    assert m["actor/ratio_max"] == 1.0


@pytest.mark.parametrize("cap, level", [(0.5, "token"), (0.5, "sequence")])
def test_a_tis_cap_below_one_is_applied_at_its_level(cap, level):
    mask = torch.ones(1, 2, dtype=torch.bool)
    old = t([[0.0, 0.0]])
    sampler = t([[-1.0, 1.0]])  # token weights e^1 and e^-1; sequence weight e^0 = 1
    _, m = objective_loss([f"algo.tis_cap={cap}", f"algo.tis_level={level}"], old, old, torch.ones(1, 2), mask,
                          sampler=sampler)
    want = [min(1.0, cap)] * 2 if level == "sequence" else [min(2.718281828, cap), min(0.3678794, cap)]
    assert m["actor/tis_weight_mean"] == pytest.approx(sum(want) / 2, rel=1e-5)


def test_reinforce_moving_average_baseline_by_hand():
    obj = objective(config.load(None, ["algo.name=reinforce", "algo.baseline_decay=0.9", "rollout.group_size=2",
                                   "rollout.prompts_per_step=1"]))
    mask = torch.ones(2, 1, dtype=torch.bool)
    first = obj.advantages(rl_batch(mask, reward=t([1.0, 0.0])))  # no baseline yet: b = 0, then b = 0.5
    second = obj.advantages(rl_batch(mask, reward=t([1.0, 0.0])))  # b = 0.5, then 0.9 * 0.5 + 0.1 * 0.5 = 0.5
    third = obj.advantages(rl_batch(mask, reward=t([1.0, 1.0])))  # b = 0.5, then 0.9 * 0.5 + 0.1 * 1 = 0.55
    assert first.metrics["critic/baseline"] == 0.0 and second.metrics["critic/baseline"] == 0.5
    assert third.tokens.flatten().tolist() == [0.5, 0.5] and obj.algo.b == pytest.approx(0.55)


def test_reinforce_pp_reports_the_largest_advantage():
    obj = objective(config.load(None, ["algo.name=reinforce_pp", "rollout.group_size=2", "rollout.prompts_per_step=2"]))
    adv = obj.advantages(rl_batch(torch.ones(4, 2, dtype=torch.bool), reward=t([1.0, 0.0, 0.0, 0.0])))
    assert adv.metrics == {"critic/advantages/max": pytest.approx(adv.tokens.max().item())}
    # (1 - 0.25) / (std 0.433 + eps): whitened over 8 tokens
    assert adv.tokens.max().item() == pytest.approx(3**0.5, rel=1e-5)


def test_process_advantages_by_hand():
    # 3 groups of 2 rows, T = 2, each step ending on the last token. Group 0 has a single step (row 1
    # has none): 0. Groups 1 and 2: rewards (0, 4) and (1, 3), unbiased std 2.83 and 1.41, so
    # -/+ 0.707 each; each token sums the steps ending at or after it, so both tokens carry it.
    mask = torch.ones(6, 2, dtype=torch.bool)
    step_end = t([[0, 1], [0, 0], [0, 1], [0, 1], [0, 1], [0, 1]]).bool()
    step_reward = t([[0, 0.5], [0, 0], [0, 0.0], [0, 4.0], [0, 1.0], [0, 3.0]])
    got = core.process_advantages(step_reward, step_end, mask, group_size=2)
    s = 2**-0.5
    want = t([[0, 0], [0, 0], [-s, -s], [s, s], [-s, -s], [s, s]])
    assert torch.allclose(got, want, atol=1e-5)


def test_process_reward_advantages_are_added_and_reported():
    from rlpost.types.roles import Advantages
    from rlpost.algorithms.wrappers import with_process_reward

    mask = torch.ones(2, 2, dtype=torch.bool)
    b = rl_batch(mask, step_reward=t([[0, 1.0], [0, 3.0]]), step_end=t([[0, 1], [0, 1]]).bool())
    out = with_process_reward(Advantages(torch.ones(2, 2), {}), b, group_size=2, in_rewards=False)
    s = 2**-0.5
    assert torch.allclose(out.tokens, t([[1 - s, 1 - s], [1 + s, 1 + s]]), atol=1e-5)
    assert out.metrics["critic/process_advantages/mean"] == pytest.approx(0.0, abs=1e-6)
    assert out.metrics["reward/process_per_seq"] == 2.0 and out.metrics["reward/steps_per_seq"] == 1.0


def test_gspo_divides_by_each_rows_own_length_and_reports_its_clip_fraction():
    # row 0: one token, advantage 2; row 1: two tokens, advantage 1 (broadcast). Ratio 1: the loss is
    # -(2 + 1) / 2. At log-ratio 0.5 per token both sequence ratios (e^0.5) are clipped.
    mask = t([[1, 0], [1, 1]]).bool()
    adv = t([[2.0, 0.0], [1.0, 1.0]])
    loss, _ = objective_loss(["algo.name=gspo"], torch.zeros(2, 2), torch.zeros(2, 2), adv, mask)
    assert loss.item() == pytest.approx(-1.5)
    _, m = objective_loss(["algo.name=gspo"], t([[0.5, 0.0], [0.5, 0.5]]), torch.zeros(2, 2), adv, mask)
    assert m["actor/pg_clipfrac"] == 1.0


def test_distillation_applies_dual_clip_too():
    mask = torch.ones(1, 2, dtype=torch.bool)
    logp, old, adv = t([[2.0, 0.0]]), torch.zeros(1, 2), t([[-2.0, 0.5]])
    keys = ["algo.dual_clip_c=3", "algo.loss_agg=token_mean"]
    got, _ = objective_loss(["algo.name=distill", "algo.teacher=embedded", *keys], logp, old, adv, mask)
    assert got.item() == pytest.approx((6.0 - 0.5) / 2, rel=1e-6)  # as GRPO's dual clip above
