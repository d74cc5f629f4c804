"""Branches of the algorithms that mutation testing found no test reaching (tests/README.md), each
against numbers worked out here or the wrapper it must apply."""

import pytest
import torch
from helpers import rl_batch

from rlpost import config
from rlpost.algorithms import build, core
from rlpost.algorithms.grpo import dual_clip_frac
from rlpost.algorithms.ppo import clipped_value_loss, explained_variance
from rlpost.algorithms.wrappers import with_overlong_filter, with_prime

t = torch.tensor


def prime_batch():
    """2 groups of 2, every field the objective's wrappers read; row 1 truncated."""
    g = torch.Generator().manual_seed(0)
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]).bool()
    logp = torch.randn(4, 3, generator=g) * mask
    return rl_batch(mask, sampler_logp=logp, old_logp=logp, ref_logp=(logp + 0.3 * torch.randn(4, 3, generator=g)) * mask,
                    reward=t([1.0, 0.0, 0.5, 1.0]), group_ids=t([0, 0, 1, 1]), truncated=t([False, True, False, False]))


@pytest.mark.parametrize("keys", [["algo.prime_coef=0.5"], ["algo.overlong_filter=true"],
                                  ["algo.prime_coef=0.5", "algo.overlong_filter=true"]])
def test_the_objective_applies_prime_then_the_overlong_filter(keys):
    cfg = config.load(None, ["rollout.group_size=2", "rollout.prompts_per_step=2", *keys])
    plain = build(config.load(None, ["rollout.group_size=2", "rollout.prompts_per_step=2"]))
    want = plain.advantages(prime_batch())
    if cfg.algo.prime_coef > 0:
        want = with_prime(want, prime_batch(), 0.5, 2)
    if cfg.algo.overlong_filter:
        want = with_overlong_filter(want, prime_batch())
    got = build(cfg).advantages(prime_batch())
    assert torch.equal(got.tokens, want.tokens) and got.metrics == want.metrics
    assert not torch.equal(got.tokens, plain.advantages(prime_batch()).tokens)  # the knob did something


def test_a_fixed_kl_coef_is_the_configs_not_the_checkpoints():
    obj = build(config.load(None, ["algo.kl_coef=0.1"]))  # no algo.kl_target: nothing adapts it
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
    assert dual_clip_frac(ratio, t([[-1.0, 0.0, 1.0]]), mask, 3.0) == pytest.approx(1 / 3)  # a zero advantage is not negative
