"""Code repair: an attempt graded in the sandbox, the failing tests shown without their expected
values, a second attempt, and the rewards for fewer attempts or for the last one."""

import pytest

from rlpost.envs import code
from rlpost.envs.code_repair import CodeRepair
from rlpost.sandbox import bwrap_works

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run here (task.name=code's sandbox)")


def add_k_row():
    row = next(r for r in code.build_splits(200, 1, seed=0)[0] if r["task"] == "add_k")
    return row, row["params"]["a"]


def test_a_failed_attempt_shows_the_failing_tests_and_a_fix_earns_less_than_a_first_try():
    row, k = add_k_row()
    env = CodeRepair(attempts=3, turn_cost=0.1)
    assert env.reset(row) == row["messages"]
    wrong = f"```python\ndef add_k(x):\n    return x + {k + 1}\n```"
    messages, reward, done, info = env.step({"role": "assistant", "content": wrong})
    assert (reward, done, info["correct"]) == (0.0, False, False)
    said = messages[0]["content"]
    assert said.startswith("These hidden tests failed:") and "add_k(" in said and "wrong answer" in said
    # the first three calls are shown (and a count of the rest); what they should return is not
    for test in row["tests"]:
        call, expected = test.removeprefix("assert ").split(" == ")
        assert ((call in said) == (test in row["tests"][:3]) and f"== {expected}" not in said
                and f"-> {expected}" not in said)
    assert f"(and {len(row['tests']) - 3} more)" in said
    right = f"```python\ndef add_k(x):\n    return x + {k}\n```"
    assert env.step({"role": "assistant", "content": right})[1:3] == (pytest.approx(0.9), True)


def test_the_last_attempt_earns_its_share_of_passing_tests():
    row, k = add_k_row()
    env = CodeRepair(attempts=2)
    env.reset(row)
    env.step({"role": "assistant", "content": "no code at all"})
    # right only at x = 0... wrong everywhere else: its share of the hidden tests
    half = f"```python\ndef add_k(x):\n    return x + {k} if x == 0 else 0\n```"
    _, reward, done, info = env.step({"role": "assistant", "content": half})
    passed = code.score(half, {**row, "sandbox": {"backend": "bwrap", "parallel": 1}})[0]
    assert done and not info["correct"] and reward == passed and 0 < passed < 1
