"""The verifier role for environment episodes: the reward is what the environment gave.

An environment rewards each turn as the episode runs (roles/rollout_env.py records the rewards in
the batch), so scoring reads them: an episode's reward is its return G_0 = r_0 + gamma r_1 + ...
(gamma = task.turn_discount; algorithms/turns.py has the credit rules), and its info says what it
did. Correct (held-out accuracy, pass rates) is the environment's own ``correct`` from the last
step's info when it gave one, else a return >= 1. That ``correct`` is a boolean: the environment
worker refuses anything else (envs/worker.py, types/values.py), since bool("no") is True.

Metrics, every step (the report plots them): ``env/turns_mean``, ``env/tool_calls_per_episode``,
``env/turn_reward/mean`` (per turn), ``env/turn_reward/first|last`` (the first and the last turn's
reward, averaged over episodes), ``env/done_frac`` (episodes the environment ended, not a limit),
``env/errors`` and ``env/timeouts`` with ``env/episodes``: the guard stops the run when errors and
timeouts pass task.max_reward_error_frac of a step's episodes (recipes/guard.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlpost.algorithms.turns import returns
from rlpost.types.batch import Rollouts


class EpisodeReward:
    """Scores a batch of episodes from the rewards its environment gave; never fails."""

    def __init__(self, gamma: float = 1.0):
        self.gamma = gamma

    def score(self, batch: Rollouts) -> tuple[Tensor, list[dict], dict]:
        rewards, infos = [], []
        for e in batch.episodes:
            per_turn = torch.tensor([e["turn_rewards"] or [0.0]])  # (1, K)
            ret = float(returns(per_turn, self.gamma)[0, 0])
            rewards.append(ret)
            infos.append({**e, "correct": bool(e.get("correct", ret >= 1.0)) and not e.get("error")})
        return torch.tensor(rewards, dtype=torch.float32), infos, metrics(batch.episodes)

    def close(self) -> None:
        """Nothing to release: the environment's workers belong to the rollout."""


def metrics(episodes: list[dict]) -> dict:
    n = max(1, len(episodes))
    turn_rewards = [r for e in episodes for r in e["turn_rewards"]]
    with_turns = [e["turn_rewards"] for e in episodes if e["turn_rewards"]] or [[0.0]]
    return {
        "env/episodes": len(episodes),
        "env/turns_mean": sum(e["turns"] for e in episodes) / n,
        "env/tool_calls_per_episode": sum(e["tool_calls"] for e in episodes) / n,
        "env/turn_reward/mean": sum(turn_rewards) / max(1, len(turn_rewards)),
        "env/turn_reward/first": sum(t[0] for t in with_turns) / len(with_turns),
        "env/turn_reward/last": sum(t[-1] for t in with_turns) / len(with_turns),
        "env/done_frac": sum(e["stop"] == "done" for e in episodes) / n,
        "env/errors": sum(bool(e.get("error")) and not e.get("timeout") for e in episodes),
        "env/timeouts": sum(bool(e.get("timeout")) for e in episodes),
    }
