"""What user code hands back, checked as the loop will hold it: a reward (from a reward function,
rewards/worker.py, or an environment's step, envs/worker.py) and the info flags rlpost reads as
True or False. Both workers call these, so every door a user's reward comes through is checked the
same way. (A judge's or a reward model's score is a float32 tensor of its own model's making:
rewards/stack.py zeroes and counts a NaN there.)

Kept free of torch and numpy: the workers import this before the user's module.
"""

from __future__ import annotations

import math
import struct

# Info keys rlpost reads as True or False: `correct` decides held-out accuracy, pass@k, maj@k and
# length shaping (envs.is_correct, rewards/episodes.py). bool("no") is True, so a string there would
# count as correct without a word.
FLAGS = ("correct",)


class NotAReward(ValueError):
    """A value that is not a reward; ``shown`` is the value as a message shows it, ``expected`` what a reward is."""

    def __init__(self, shown: str, expected: str = "a finite number"):
        super().__init__(f"{shown}, expected {expected}")
        self.shown, self.expected = shown, expected


class NotAFlag(ValueError):
    """An info flag (FLAGS) that is not a boolean."""


def reward_value(value) -> float:
    """``value`` as a reward: a real number that float32 holds as a finite number, since the loop
    keeps rewards in float32 tensors (a Python float of 1e39 is finite, and inf there, where the
    loop would zero it); else NotAReward."""
    if isinstance(value, (str, bytes)) or value is None:
        raise NotAReward(repr(value)[:80])
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise NotAReward(f"a {type(value).__name__}") from None
    except OverflowError:  # an int past float64's range
        raise NotAReward(f"a {type(value).__name__} past float's range") from None
    if not math.isfinite(reward):
        raise NotAReward(str(reward))
    try:
        struct.pack("<f", reward)  # C's cast to float32, rounding to nearest as torch's does; past its range, an error
    except OverflowError:
        raise NotAReward(f"{reward:g}", "a finite number in float32, the type rewards are held in "
                                        "(|reward| <= 3.4e38)") from None
    return reward


def checked_flags(info: dict) -> dict:
    """``info`` with each flag (FLAGS) it has as a Python bool; a flag that is not a boolean (Python's
    or numpy's) is NotAFlag, naming the key."""
    out = info
    for key in FLAGS:
        if key not in info:
            continue
        v = info[key]
        if not (isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool"))):
            raise NotAFlag(f"info[{key!r}] = {repr(v)[:60]} (a {type(v).__name__}), expected True or False")
        if type(v) is not bool:
            out = {**out, key: bool(v)}
    return out
