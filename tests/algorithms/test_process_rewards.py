"""A process reward model's step rewards in the advantages (issue 23, item 10): the group methods'
process advantage (DeepSeekMath, Sec. 4.1.3), the token-reward methods' GAE and returns-to-go
(Math-Shepherd's step-by-step PPO), the two reward forms, and the wrapper's metrics. Every number is
worked out in a comment."""

import math

import pytest
import torch
from helpers import rl_batch

from rlpost.algorithms import core
from rlpost.algorithms.grpo import GRPO
from rlpost.algorithms.objective import Objective
from rlpost.algorithms.ppo import PPO
from rlpost.algorithms.reinforce_pp import ReinforcePP
from rlpost.rewards.prm import step_rewards

S3 = math.sqrt(0.5 / 3)  # the unbiased std of [0.5, 1.0, 0.0, 0.5]: deviations 0, .5, -.5, 0 -> 0.5 / 3


def group_case():
    """One group of K=2, T=4. Row 0: steps end at columns 1 and 3 (rewards 0.5, 1.0), four loss tokens.
    Row 1: steps end at columns 0 and 2 (rewards 0.0, 0.5), three loss tokens."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    reward = torch.tensor([[0.0, 0.5, 0.0, 1.0], [0.0, 0.0, 0.5, 0.0]])
    ends = torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0]], dtype=torch.bool)
    return reward, ends, mask


def test_process_advantages_by_hand():
    reward, ends, mask = group_case()
    adv = core.process_advantages(reward, ends, mask, group_size=2)
    # group mean 0.5, std S3: normalised row 0 = (0 at col 1, 0.5 / S3 at col 3), row 1 = (-0.5 / S3 at col 0, 0 at col
    # 2)
    z = 0.5 / S3  # 1.2247
    # summed to go: row 0 every token sees the col-3 step (z); row 1 col 0 sees both (-z + 0), later ones 0; col 3 is
    # padding
    want = torch.tensor([[z, z, z, z], [-z, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, want)


def test_process_advantages_groups_are_independent_and_equal_steps_give_zero():
    reward, ends, mask = group_case()
    flat = torch.tensor([[0.0, 0.7, 0.0, 0.7], [0.7, 0.0, 0.7, 0.0]])  # a second group: every step reward 0.7
    adv = core.process_advantages(torch.cat([reward, flat]), torch.cat([ends, ends]), torch.cat([mask, mask]),
                                  group_size=2)
    torch.testing.assert_close(adv[:2], core.process_advantages(reward, ends, mask, 2))  # the first group unchanged
    assert adv[2:].abs().max() == 0  # std 0: every normalised reward is 0, not 0 / 0


def test_process_advantages_skip_steps_off_the_mask_and_carry_across_holes():
    # K=1, T=4: a tool observation at column 1 (a hole); a step end on the hole is not a step (the
    # role never puts one there, and if it did it must not count); the real step ends are columns 0 and 3.
    mask = torch.tensor([[1, 0, 1, 1]], dtype=torch.bool)
    reward = torch.tensor([[0.2, 9.0, 0.0, 0.6]])
    ends = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    adv = core.process_advantages(reward, ends, mask, group_size=1)
    # steps 0.2 and 0.6: mean 0.4, unbiased std sqrt(0.08) = 0.28284 -> normalised -0.7071, +0.7071
    a = 0.2 / math.sqrt(0.08)
    torch.testing.assert_close(adv, torch.tensor([[-a + a, 0.0, a, a]]))  # column 0: both steps to go -> 0; the hole: 0


def test_step_reward_forms_by_hand():
    assert step_rewards([0.2, 0.5, 0.4], "score") == [0.2, 0.5, 0.4]
    delta = step_rewards([0.2, 0.5, 0.4], "delta")  # 0.2 - 0, 0.5 - 0.2, 0.4 - 0.5
    assert delta == pytest.approx([0.2, 0.3, -0.1])
    assert sum(delta) == pytest.approx(0.4)  # telescopes to the last score, however many steps
    assert step_rewards([], "delta") == []


def test_token_rewards_add_the_dense_rewards_on_loss_tokens_only():
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    dense = torch.tensor([[0.5, 0.0, 0.25, 7.0]])  # 7 sits on padding and must not count
    r = core.token_rewards(torch.tensor([1.0]), mask, dense=dense)
    # score 1 on the last loss token (col 2) + 0.25
    torch.testing.assert_close(r, torch.tensor([[0.5, 0.0, 1.25, 0.0]]))


def test_ppo_gae_takes_the_step_rewards():
    mask = torch.tensor([[1, 1, 1]], dtype=torch.bool)
    step_reward = torch.tensor([[0.5, 0.0, 0.25]])
    b = rl_batch(mask, reward=torch.tensor([1.0]), old_values=torch.zeros(1, 3), step_reward=step_reward,
                 step_end=step_reward > 0)
    adv = PPO(whiten_advantages=False).advantages(b)
    # V = 0, gamma = lambda = 1: each token's return to go: rewards (0.5, 0, 1.25) -> (1.75, 1.25, 1.25)
    torch.testing.assert_close(adv.tokens, torch.tensor([[1.75, 1.25, 1.25]]))
    torch.testing.assert_close(adv.returns, torch.tensor([[1.75, 1.25, 1.25]]))


def test_reinforce_pp_returns_to_go_take_the_step_rewards():
    mask = torch.tensor([[1, 1], [1, 1]], dtype=torch.bool)
    step_reward = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    b = rl_batch(mask, reward=torch.tensor([1.0, 0.0]), step_reward=step_reward, step_end=step_reward > 0)
    adv = ReinforcePP().advantages(b).tokens
    # returns to go: row 0 (1 + 1, 1), row 1 (0, 0) = [2, 1, 0, 0]: mean 0.75, biased std sqrt(2.75/4) = 0.8292
    x = torch.tensor([2.0, 1.0, 0.0, 0.0])
    want = ((x - 0.75) / (math.sqrt(2.75 / 4) + 1e-6)).view(2, 2)
    torch.testing.assert_close(adv, want)
    # without step rewards the old path: each token its sequence's reward, whitened ([1, 1, 0, 0] -> [1, 1, -1, -1])
    b.step_reward = b.step_end = None
    torch.testing.assert_close(ReinforcePP().advantages(b).tokens, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), atol=1e-5,
                               rtol=0)


def test_objective_adds_the_process_advantage_to_a_group_method_once():
    reward, ends, mask = group_case()
    grpo = GRPO(group_size=2)
    b = rl_batch(mask, reward=torch.tensor([1.0, 0.0]), group_ids=torch.zeros(2, dtype=torch.long), step_reward=reward,
                 step_end=ends)
    adv = Objective(grpo, grpo.loss, group_size=2).advantages(b)
    outcome = grpo.advantages(b).tokens  # (1 - 0.5) / std([1, 0]) = 0.7071 on row 0's tokens, -0.7071 on row 1's
    torch.testing.assert_close(adv.tokens, outcome + core.process_advantages(reward, ends, mask, 2))
    assert adv.metrics["reward/process_per_seq"] == pytest.approx(1.0)  # (0.5 + 1.0 + 0.0 + 0.5) / 2 rows
    assert adv.metrics["reward/steps_per_seq"] == pytest.approx(2.0)


def test_objective_leaves_a_token_reward_method_to_its_own_rewards():
    # PPO has put the step rewards into its GAE already: the wrapper must not add them a second time
    mask = torch.tensor([[1, 1, 1]], dtype=torch.bool)
    step_reward = torch.tensor([[0.5, 0.0, 0.25]])
    b = rl_batch(mask, reward=torch.tensor([1.0]), old_values=torch.zeros(1, 3), step_reward=step_reward,
                 step_end=step_reward > 0)
    ppo = PPO(whiten_advantages=False)
    adv = Objective(ppo, ppo.loss, group_size=1).advantages(b)
    torch.testing.assert_close(adv.tokens, ppo.advantages(b).tokens)
    assert adv.metrics["reward/process_per_seq"] == pytest.approx(0.75)


def test_no_step_rewards_change_nothing():
    _, _, mask = group_case()
    grpo = GRPO(group_size=2)
    b = rl_batch(mask, reward=torch.tensor([1.0, 0.0]), group_ids=torch.zeros(2, dtype=torch.long))
    adv = Objective(grpo, grpo.loss, group_size=2).advantages(b)
    torch.testing.assert_close(adv.tokens, grpo.advantages(b).tokens)
    assert "reward/process_per_seq" not in adv.metrics
