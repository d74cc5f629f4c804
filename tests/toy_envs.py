"""Environments for tests, imported by path in the environment worker processes (envs/worker.py)."""

import os
import threading
import time


class Counter:
    """Chat turns: answers 'turn k' as the user; reward k on turn k; over after ``turns`` turns."""

    def __init__(self, turns: int = 3):
        self.turns, self.k = turns, 0

    def rows(self, split, n, seed):
        return [{"i": i, "split": split} for i in range(n)]

    def reset(self, row):
        return [{"role": "user", "content": "count"}]

    def step(self, message):
        self.k += 1
        return f"turn {self.k}", float(self.k), self.k >= self.turns, {"correct": self.k >= self.turns, "tool_calls": 1}


class Faulty(Counter):
    """Counter, except for the row's fault on its first step: hang, raise, exit, garbage, or a
    state that does not pickle."""

    def reset(self, row):
        self.fault = row.get("fault", "")
        return super().reset(row)

    def step(self, message):
        fault, self.fault = self.fault, ""
        if fault == "hang":
            time.sleep(600)
        if fault == "raise":
            raise RuntimeError("broken environment")
        if fault == "exit":
            os._exit(3)
        if fault == "garbage":
            return "not a tuple"
        if fault == "nan":
            return [], float("nan"), False
        if fault == "past_float32":  # finite as a Python float, inf as the loop's float32
            return [], 1e39, False
        if fault == "correct_as_text":  # bool("no") is True
            return [], 0.0, True, {"correct": "no"}
        if fault == "tool_calls_as_text":
            return [], 0.0, True, {"tool_calls": "two"}
        if fault == "unpicklable":
            self.lock = threading.Lock()
        return super().step(message)


class NoRows(Counter):
    rows = None


class EmptyReset(Counter):
    """reset returns no messages: nothing for the chat template to render."""

    def reset(self, row):
        return []


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


class WithTools(Counter):
    """Counter with a tool for the chat template to render (or not)."""

    tools = [add]
