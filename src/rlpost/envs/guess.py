"""Guess the number (``task.name=env task.env=guess``): a game with feedback, in chat turns.

The environment thinks of a number between ``low`` and ``high``; each assistant turn is a guess
(the first integer in it), and the environment answers as the user: "Higher.", "Lower." or, for a
reply without a number, a reminder. A right guess ends the episode with reward 1 - ``turn_cost`` x
(the guesses before it); an episode that runs out of turns (task.max_turns) earns 0. So the policy
is paid for using the feedback: with the default range of 5 and 4 turns, bisection wins every
game in at most 3 guesses.

The default range and prompt were chosen on the embedded 135M model (64 held-out games, 4 turns,
8 tokens a turn): greedy success 0.14 and sampled 0.28 at temperature 0.7, inside the learnable
band; with the rules as a system prompt and a range of 10 it was 0.00 greedy (0.05 sampled: it
rarely wrote a number), with a worked game before the real one 0.86 (too easy to learn from).
"""

from __future__ import annotations

import random
import re

NUMBER = re.compile(r"-?\d+")


class GuessNumber:
    """One game per row: ``row['secret']`` is the number."""

    def __init__(self, low: int = 1, high: int = 5, turn_cost: float = 0.1):
        self.low, self.high, self.turn_cost = low, high, turn_cost
        self.secret, self.guesses = low, 0

    def rows(self, split: str, n: int, seed: int) -> list[dict]:
        """Secrets drawn uniformly; the held-out games come from another stream of the same seed."""
        rng = random.Random(f"{seed}:{split}")
        return [{"secret": rng.randint(self.low, self.high), "game": i} for i in range(n)]

    def reset(self, row: dict) -> list[dict]:
        self.secret, self.guesses = int(row["secret"]), 0
        return [{"role": "user", "content": f"I think of a number from {self.low} to {self.high}. Guess it. "
                                             "Reply with only the number."}]

    def step(self, message: dict) -> tuple[list[dict], float, bool, dict]:
        found = NUMBER.search(message["content"])
        if found is None:
            self.guesses += 1
            return [{"role": "user", "content": "Reply with one number."}], 0.0, False, {}
        guess = int(found.group())
        self.guesses += 1
        if guess == self.secret:
            return [], max(0.0, 1.0 - self.turn_cost * (self.guesses - 1)), True, {"correct": True}
        hint = "Higher." if self.secret > guess else "Lower."
        return [{"role": "user", "content": hint}], 0.0, False, {"correct": False}
