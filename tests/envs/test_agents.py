"""What an agent's return value means (envs/agents.py), and what task.name=agent needs of the config."""

import pytest
from helpers import tiny_cfg

from rlpost.envs.agents import Garbage, result_of, transcript_text
from rlpost.types.errors import ConfigError


def verifier(text, row):
    return float(text == row["answer"]), {"correct": text == row["answer"]}


def test_a_number_a_list_a_dict_or_a_transcript_become_rewards():
    row = {"answer": "42"}
    assert result_of(1, None, row) == {"rewards": [1.0], "correct": None}
    assert result_of([0, 0.5], None, row) == {"rewards": [0.0, 0.5], "correct": None}
    assert result_of({"reward": 0.25, "correct": True}, None, row) == {"rewards": [0.25], "correct": True}
    assert result_of("42", verifier, row) == {"rewards": [1.0], "correct": True}
    said = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "41"},
            {"role": "user", "content": "again"}, {"role": "assistant", "content": "42"}]
    assert transcript_text(said) == "42" and result_of(said, verifier, row) == {"rewards": [1.0], "correct": True}
    assert result_of(said[:2], verifier, row) == {"rewards": [0.0], "correct": False}


@pytest.mark.parametrize("value, why", [
    (None, "the agent's reward is None"), (float("nan"), "the agent's reward is nan"), ("42", "no task.verifier"),
    ([], "an empty list"), ([1, "x"], "reward 1 is 'x'"), ({"reward": 1, "correct": "yes"}, "correct"),
    (1e39, "finite number in float32"),
])
def test_what_is_no_reward_is_refused_in_one_line(value, why):
    with pytest.raises(Garbage, match=why):
        result_of(value, None, {})


@pytest.mark.parametrize("overrides, line", [
    (["task.name=agent", "task.data=x.jsonl"], "task.agent: task.name=agent needs the agent as 'module:function'"),
    (["task.name=agent", "task.agent=my_agent:run"], "task.data: task.name=agent needs rows"),
    (["task.agent=my_agent:run"], "task.agent: applies to task.name=agent, not task.name=arithmetic"),
    (["task.name=agent", "task.agent=my_agent:run", "task.env=guess", "rollout.top_p=0.9"], "rollout.top_p"),
    (["task.mix=agent:1,arithmetic:1"], "task.mix: agent runs multi-turn episodes"),
])
def test_the_config_of_an_agent_is_checked_in_one_line(overrides, line):
    with pytest.raises(ConfigError, match=line.replace("(", r"\(").replace(")", r"\)")):
        tiny_cfg(*overrides)


def test_an_agent_with_rows_and_a_verifier_loads():
    cfg = tiny_cfg("task.name=agent", "task.agent=my_agent:run", "task.env=guess", "task.verifier=my_agent:score")
    assert cfg.task.agent == "my_agent:run" and cfg.task.verifier == "my_agent:score"
