"""Code repair (``task.name=env task.env=code_repair``): write a function, see the failing hidden
tests, try again.

The problems are ``task.name=code``'s (envs/code.py: its templates, or task.data rows with
``tests``), graded by its grader in the hardened sandbox (envs/grading.py, rlpost/sandbox/): the
program runs there, and pass or fail is decided outside it. After an attempt that fails, the
environment answers as the user with what failed: each failing test's call or input and its status
(``wrong answer``, an exception's name, ``timeout``, ...), never its expected value, so the tests
stay hidden. The episode ends when every test passes, with reward 1 - ``turn_cost`` x (the attempts
before), or after ``attempts`` attempts, with the final attempt's share of passing tests as the
reward (task.max_turns should allow ``attempts`` turns).

Each attempt costs sandbox runs (~60 ms each under bubblewrap on 2 cores, benchmarks/sandbox.py),
which is why these steps run in the environment workers while the sampler decodes other episodes.
"""

from __future__ import annotations

from rlpost.envs import code
from rlpost.sandbox import BACKENDS

SHOWN = 3  # failing tests shown per attempt: enough to act on, short enough for a small context


def failures(row: dict, info: dict) -> list[str]:
    """'call: status' (or 'input ...: status') of each failing test, the expected values left out."""
    out = []
    for test, status, message in zip(row["tests"], info.get("statuses", []), info.get("messages", [])):
        if status == "pass":
            continue
        if isinstance(test, dict):
            what = test["call"] if "call" in test else f"input {test['stdin']!r}"
        else:
            what = str(test).removeprefix("assert ").split(" == ")[0]
        why = {"fail": "wrong answer"}.get(status, status) + (f" ({message})" if message else "")
        out.append(f"{what}: {why}")
    return out


class CodeRepair:
    """One problem per row; each attempt graded by the code task's grader in the sandbox."""

    def __init__(self, attempts: int = 3, turn_cost: float = 0.1, sandbox: str = "bwrap"):
        if sandbox not in BACKENDS:
            raise ValueError(f"sandbox={sandbox!r}: expected one of {BACKENDS}")
        self.attempts, self.turn_cost, self.sandbox = attempts, turn_cost, sandbox
        self.row: dict = {}
        self.tries = 0

    def rows(self, split: str, n: int, seed: int) -> list[dict]:
        """The code task's built-in problems (held-out parameters never trained on: code.build_splits)."""
        train, heldout = code.build_splits(n if split == "train" else 1, n if split == "heldout" else 1, seed)
        return train if split == "train" else heldout

    def reset(self, row: dict) -> list[dict]:
        self.row = {**row, "sandbox": {"backend": self.sandbox, "parallel": 1}}
        self.tries = 0
        return row["messages"]

    def step(self, message: dict) -> tuple[list[dict], float, bool, dict]:
        self.tries += 1
        passed, info = code.score(message["content"], self.row)
        if passed == 1.0:
            return [], max(0.0, 1.0 - self.turn_cost * (self.tries - 1)), True, {"correct": True}
        if self.tries >= self.attempts:
            return [], passed, True, {"correct": False}
        failing = failures(self.row, info)
        text = ("These hidden tests failed:\n" + "\n".join(f"- {f}" for f in failing[:SHOWN])
                + (f"\n(and {len(failing) - SHOWN} more)" if len(failing) > SHOWN else "")
                + "\nFix the code. Reply with the whole program in a ```python block.")
        return [{"role": "user", "content": text}], 0.0, False, {"correct": False}
