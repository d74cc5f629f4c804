"""Guess the number (``task.name=env task.env=guess``): a game with feedback, in chat turns.

The environment thinks of a number between ``low`` and ``high``; each assistant turn is a guess
(the first integer in it), and the environment answers as the user: "Higher.", "Lower." or, for a
reply without a number, a reminder. A right guess ends the episode with reward 1 - ``turn_cost`` x
(the guesses before it); an episode that runs out of turns (task.max_turns) earns 0. So the policy
is paid for using the feedback: with a range of 10 and 4 turns, blind guessing wins about 4 games
in 10, bisection every one.

Measured on the embedded 135M model before training (benchmarks/README.md, "Environments"): see
the learning rows there; the default range was chosen so that its greedy success sits inside the
learnable band, neither near 0 nor near 1.
"""

from __future__ import annotations

import random
import re

NUMBER = re.compile(r"-?\d+")


class GuessNumber:
    """One game per row: ``row['secret']`` is the number."""

    def __init__(self, low: int = 1, high: int = 10, turn_cost: float = 0.1):
        self.low, self.high, self.turn_cost = low, high, turn_cost
        self.secret, self.guesses = low, 0

    def rows(self, split: str, n: int, seed: int) -> list[dict]:
        """Secrets drawn uniformly; the held-out games come from another stream of the same seed."""
        rng = random.Random(f"{seed}:{split}")
        return [{"secret": rng.randint(self.low, self.high), "game": i} for i in range(n)]

    def reset(self, row: dict) -> list[dict]:
        self.secret, self.guesses = int(row["secret"]), 0
        return [{"role": "system", "content": f"We play a game. I think of a whole number from {self.low} to {self.high}. "
                                               "You guess it. Reply with only your guess, one number. After each guess "
                                               "I say if my number is higher or lower."},
                {"role": "user", "content": "Guess my number."}]

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
