"""TextArena's games on rlpost's sampler (``task.env=textarena:ENV_ID``; ``pip install 'rlpost[textarena]'``).

TextArena (Guertler et al. 2025, arXiv:2504.11442) is a collection of text games with one gym-like
interface: ``ta.make(id)``, ``reset(num_players, seed)``, ``get_observation()``, ``step(action)``,
``close()`` -> rewards. Chosen over GEM as the library of games here because it installs from PyPI
with few dependencies (nltk, chess, requests) and none pinned against rlpost's, where gem-llm pins
reasoning-gym to an older release than the one rlpost's ``envs`` extra installs; and its
single-player games (GuessTheNumber, Mastermind, FrozenLake, Minesweeper, TowerOfHanoi, ...) run
without network or downloaded data.

One game per row, with the row's seed (train and held-out seeds never meet). The game is the raw
environment (the ``-raw`` registration, without TextArena's wrappers that fold the whole history
into one prompt): each of its messages to the player becomes a user message, the player's actions
are the assistant's messages as the model wrote them (a game reads its move from them, e.g. the
number in ``[5]``), and the game's reward for player 0 when it ends is the episode's last turn
reward. Only single-player games: rlpost plays one side.
"""

from __future__ import annotations

import difflib

import textarena as ta


def game_text(observation, player: int = 0) -> str:
    """What the game said to the player since the last move: every message but the player's own echoed actions."""
    if isinstance(observation, str):
        return observation
    return "\n".join(str(text) for sender, text, *_ in observation if sender != player)


class TextArenaEnv:
    """A single-player TextArena game per episode."""

    def __init__(self, env_id: str, **kwargs):
        self.env_id = env_id if env_id.endswith("-raw") else f"{env_id}-raw"
        self.kwargs = kwargs
        self.game = None

    def rows(self, split: str, n: int, seed: int) -> list[dict]:
        if split == "train":  # asked first, at start: a game that cannot run stops here, before any run folder
            self.check()
        base = seed * 1_000_003 + (0 if split == "train" else 500_000)
        return [{"seed": base + i, "game": self.env_id} for i in range(n)]

    def check(self) -> None:
        """ValueError, in one line, unless the game is registered and plays with one player."""
        from textarena.envs.registration import ENV_REGISTRY

        if self.env_id not in ENV_REGISTRY:
            raw = sorted(name.removesuffix("-raw") for name in ENV_REGISTRY if name.endswith("-raw"))
            close = difflib.get_close_matches(self.env_id.removesuffix("-raw"), raw, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f" (its games: {', '.join(raw[:8])}, ...)"
            raise ValueError(f"no TextArena game {self.env_id.removesuffix('-raw')!r}{hint}")
        self.reset({"seed": 0})
        self.game = None

    def reset(self, row: dict) -> list[dict]:
        self.game = ta.make(self.env_id, **self.kwargs)
        try:
            self.game.reset(num_players=1, seed=int(row["seed"]))
        except Exception as e:  # noqa: BLE001 - a game for more players says so in its own words
            raise ValueError(f"{self.env_id}: rlpost plays single-player TextArena games "
                             f"({type(e).__name__}: {e})") from None
        _, observation = self.game.get_observation()
        return [{"role": "user", "content": game_text(observation)}]

    def step(self, message: dict) -> tuple[list[dict], float, bool, dict]:
        done, _ = self.game.step(message["content"])
        if done:
            rewards, info = self.game.close()
            reward = float((rewards or {}).get(0, 0.0))
            return [], reward, True, {"correct": reward > 0}
        _, observation = self.game.get_observation()
        return [{"role": "user", "content": game_text(observation)}], 0.0, False, {}
