"""Credit for multi-turn episodes: which tokens a turn's reward reaches (task.turn_credit).

An environment gives a reward r_k for each assistant turn k (k = 0..K-1; 0 is allowed), on that
turn's last model token in the batch (``turn_reward`` at ``turn_end``: roles/rollout_env.py). With
gamma = task.turn_discount, the return from turn k is G_k = r_k + gamma r_{k+1} + ... (0 after the
episode's last turn), and the episode's return, the reward the run reports and filters on, is G_0.

The rules, by what the algorithm is:

* Group algorithms (GRPO, RLOO, Dr. GRPO, DAPO, CISPO; GSPO with 'episode' only):
  - ``episode`` (the default): the algorithm's own advantage of the episode's return G_0, on every
    model token of every turn: the turns share the episode's credit, as a single-turn completion's
    tokens do.
  - ``turn``: turn k's tokens get the algorithm's own group advantage computed on G_k across the
    group (an episode over before turn k counts with G_k = 0). A turn is credited with what came
    after it, not before: an early success is not diluted by the turns after it, and a late turn is
    judged against the group's returns from that same turn. With the reward on the last turn and
    gamma = 1 every G_k equals G_0 while an episode lasts, so for episodes of equal length this is
    the episode rule.
* Token-reward algorithms (PPO's GAE, REINFORCE++'s returns-to-go): each turn's reward is a token
  reward on its last model token, into the algorithm's own estimator (PPO's algo.gamma and
  algo.lam run over the model tokens; environment tokens carry no loss and GAE carries across them).
  task.turn_credit and task.turn_discount do not apply there.

Pure tensor maths with hand-worked tests (tests/algorithms/test_turns.py); ``advantages`` is the one
entry point, called by the Objective when a batch has turns.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from rlpost.types.batch import Rollouts
from rlpost.types.roles import Advantages, Algorithm, Traits

CREDITS = ("episode", "turn")


def per_turn(turn_reward: Tensor, turn_end: Tensor) -> Tensor:
    """(B, K) each row's turn rewards in order, 0 after its last turn; K = the most turns (>= 1)."""
    n = turn_end.sum(1)  # (B,)
    K = max(1, int(n.max())) if len(n) else 1
    out = torch.zeros(turn_end.shape[0], K, dtype=turn_reward.dtype, device=turn_reward.device)
    rows, cols = turn_end.nonzero(as_tuple=True)  # row-major: each row's ends in order
    # turn number of each end
    k = torch.arange(len(rows), device=rows.device) - torch.repeat_interleave(n.cumsum(0) - n, n)
    out[rows, k] = turn_reward[rows, cols]
    return out


def returns(rewards: Tensor, gamma: float) -> Tensor:
    """(B, K) G_k = r_k + gamma * G_{k+1}, with G_K = 0."""
    out = torch.zeros_like(rewards)
    after = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for k in reversed(range(rewards.shape[1])):
        after = rewards[:, k] + gamma * after
        out[:, k] = after
    return out


def episode_return(turn_reward: Tensor, turn_end: Tensor, gamma: float) -> Tensor:
    """(B,) G_0: the episode's discounted sum of turn rewards."""
    return returns(per_turn(turn_reward, turn_end), gamma)[:, 0]


def turn_index(turn_end: Tensor) -> Tensor:
    """(B, T) int64: the turn each position belongs to, counting turn ends strictly before it
    (environment tokens after turn k's end read k + 1, the turn they lead into)."""
    ends = turn_end.long()
    return ends.cumsum(1) - ends


def check(traits: Traits, credit: str) -> str | None:
    """Why this algorithm cannot run task.turn_credit=credit, or None."""
    if credit == "turn" and not traits.token_rewards and (not traits.group_baseline
                                                          or traits.fixed_aggregator == "sequence"):
        return ("per-turn credit gives the turns of one episode different advantages: it needs a group algorithm with "
                "a token-level loss (grpo, rloo, dr_grpo, dapo, cispo) or token rewards (ppo, reinforce_pp)")
    return None


def advantages(algo: Algorithm, batch: Rollouts, credit: str, gamma: float) -> Advantages:
    """The algorithm's advantages for a batch of episodes, by the rules in the module docstring."""
    mask = batch.completion_mask
    if algo.traits.token_rewards:
        dense = batch.turn_reward * batch.turn_end
        dense = dense if batch.step_reward is None else dense + batch.step_reward
        return algo.advantages(replace(batch, reward=torch.zeros_like(batch.reward), step_reward=dense))
    if credit == "episode":
        return algo.advantages(batch)  # batch.reward is the episode's return (rewards/episodes.py)
    g = returns(per_turn(batch.turn_reward, batch.turn_end), gamma)  # (B, K)
    index = turn_index(batch.turn_end)  # (B, T)
    tokens, metrics = torch.zeros_like(batch.turn_reward), {}
    for k in range(g.shape[1]):
        adv = algo.advantages(replace(batch, reward=g[:, k]))
        metrics = metrics or adv.metrics
        tokens = torch.where((index == k) & mask, adv.tokens, tokens)
    return Advantages(tokens, {**metrics, "critic/turn_returns/mean": g[:, 0].mean().item()})
