"""Per-turn credit for environment episodes (algorithms/turns.py), by hand: the turn rewards, the
discounted returns, the group methods' episode and turn rules, PPO's token rewards into GAE, and the
refusals. Every number is worked out in a comment."""

import math

import pytest
import torch
from helpers import rl_batch, tiny_cfg

from rlpost import build
from rlpost.algorithms import turns
from rlpost.algorithms.grpo import GRPO
from rlpost.algorithms.objective import Objective
from rlpost.algorithms.ppo import PPO
from rlpost.types.errors import ConfigError

R = 1 / math.sqrt(2)  # GRPO's advantage in a group of two unequal returns: +-0.5 / unbiased std 0.7071


def episodes(reward=(0.0, 0.0)):
    """One group of K=2, T=7. Episode A: turn 0 on columns 0-1, the environment's tokens on 2-3 (no
    loss), turn 1 on 4-5; turn rewards 0 then 1. Episode B: one turn on columns 0-2, reward 1."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    ends = torch.zeros(2, 7, dtype=torch.bool)
    ends[0, 1] = ends[0, 5] = ends[1, 2] = True
    turn_reward = torch.zeros(2, 7)
    turn_reward[0, 5] = turn_reward[1, 2] = 1.0
    return rl_batch(mask, reward=torch.tensor(reward), turn_end=ends, turn_reward=turn_reward,
                    group_ids=torch.zeros(2, dtype=torch.long), old_values=torch.zeros(2, 7))


def test_turn_rewards_returns_and_turn_index_by_hand():
    b = episodes()
    assert turns.per_turn(b.turn_reward, b.turn_end).tolist() == [[0.0, 1.0], [1.0, 0.0]]
    # G_k = r_k + gamma G_(k+1): A (0 + 0.5 * 1, 1), B (1, 0)
    assert turns.returns(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), 0.5).tolist() == [[0.5, 1.0], [1.0, 0.0]]
    assert turns.episode_return(b.turn_reward, b.turn_end, 1.0).tolist() == [1.0, 1.0]
    # three turns, gamma 0.5: (1 + 0.5 * (2 + 0.5 * 4), 2 + 0.5 * 4, 4) = (3, 4, 4)
    assert turns.returns(torch.tensor([[1.0, 2.0, 4.0]]), 0.5).tolist() == [[3.0, 4.0, 4.0]]
    # the turn of each column: turn ends strictly before it (A's environment tokens lead into turn 1)
    assert turns.turn_index(b.turn_end).tolist() == [[0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 1, 1, 1, 1]]


def test_group_credit_by_episode_and_by_turn_by_hand():
    grpo = GRPO(group_size=2)
    # gamma = 1: returns A (1, 1), B (1, 0). Episode rule: G_0 = (1, 1), no difference, no advantage.
    b = episodes(reward=(1.0, 1.0))
    assert turns.advantages(grpo, b, "episode", 1.0).tokens.abs().sum() == 0
    # Turn rule: turn 0 compares (1, 1): 0; turn 1 compares (1, 0): +R for A's turn-1 tokens (B has none)
    want = torch.tensor([[0, 0, 0, 0, R, R, 0], [0, 0, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(turns.advantages(grpo, b, "turn", 1.0).tokens, want, atol=1e-5, rtol=0)
    # gamma = 0.5: returns A (0.5, 1), B (1, 0). Episode rule on G_0 = (0.5, 1): A -R on every model token, B +R.
    b = episodes(reward=(0.5, 1.0))
    want = torch.tensor([[-R, -R, 0, 0, -R, -R, 0], [R, R, R, 0, 0, 0, 0]])
    torch.testing.assert_close(turns.advantages(grpo, b, "episode", 0.5).tokens, want, atol=1e-5, rtol=0)
    # Turn rule: turn 0 compares (0.5, 1): A -R, B +R; turn 1 compares (1, 0): A +R. A's early turn
    # is blamed for the late win, its late turn credited for it.
    want = torch.tensor([[-R, -R, 0, 0, R, R, 0], [R, R, R, 0, 0, 0, 0]])
    torch.testing.assert_close(turns.advantages(grpo, b, "turn", 0.5).tokens, want, atol=1e-5, rtol=0)
    # through the Objective the loop calls: the same numbers
    objective = Objective(grpo, grpo.loss, group_size=2, turn_credit="turn", turn_discount=0.5)
    torch.testing.assert_close(objective.advantages(b).tokens, want, atol=1e-5, rtol=0)


def test_ppo_gets_each_turn_reward_on_its_last_token_into_gae():
    # V = 0, gamma = lambda = 1, no whitening: each loss token's advantage is the sum of the turn
    # rewards at or after it. A: turn rewards 0 (column 1) and 1 (column 5) -> 1 on columns 0, 1, 4, 5;
    # GAE carries across the environment's tokens (2-3), which get 0. B: 1 on columns 0-2. The
    # batch's reward (the episode's return, 5 here) is not added again at the last token.
    b = episodes(reward=(5.0, 5.0))
    adv = turns.advantages(PPO(whiten_advantages=False), b, "episode", 1.0)
    want = torch.tensor([[1.0, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    torch.testing.assert_close(adv.tokens, want)
    torch.testing.assert_close(adv.returns, want)
    # PPO's own discount runs over model tokens: gamma 0.5 -> A (0.125, 0.25, -, -, 0.5, 1)
    adv = turns.advantages(PPO(gamma=0.5, whiten_advantages=False), b, "turn", 1.0)
    torch.testing.assert_close(adv.tokens[0], torch.tensor([0.125, 0.25, 0, 0, 0.5, 1, 0]))


@pytest.mark.parametrize("algo", ["gspo", "reinforce"])
def test_turn_credit_is_refused_where_a_turn_cannot_get_its_own_advantage(algo):
    with pytest.raises(ConfigError, match=r"^task.turn_credit: "):
        build.check_algorithm(tiny_cfg("task.name=env", "task.env=guess", f"algo.name={algo}", "task.turn_credit=turn"))
    # the episode rule runs anywhere
    build.check_algorithm(tiny_cfg("task.name=env", "task.env=guess", f"algo.name={algo}"))


def test_turn_credit_is_refused_outside_environment_episodes():
    with pytest.raises(ConfigError, match=r"^task.turn_credit: applies to task.name=env, tools or agent"):
        tiny_cfg("task.turn_credit=turn")
