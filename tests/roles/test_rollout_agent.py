"""Agents by import path (roles/rollout_agent.py, envs/agents.py): episodes from recorded tokens only,
per-call rewards on their calls, transcripts scored by task.verifier, and hostile agents (never
calls, calls forever, malformed requests, past the context, past the deadline, raises) ending only
their own episode with reward 0 and a counted error, past task.max_reward_error_frac one line."""

from pathlib import Path

import pytest
import torch

from rlpost.envs.agents import AgentPool
from rlpost.recipes.guard import stop_on_failures
from rlpost.rewards.episodes import EpisodeReward
from rlpost.roles.endpoint import Endpoint, Limits
from rlpost.roles.rollout_agent import AgentRollout
from rlpost.roles.rollout_fast import FastRollout
from rlpost.types.errors import RunError

TESTS = str(Path(__file__).resolve().parents[1])


def agent_rollout(tiny, agent="toy_agents:by_row", verifier="", deadline=8.0, workers=8):
    engine = FastRollout(tiny.model, tiny.tokenizer, torch.float32)
    pool = AgentPool(agent, verifier, deadline, workers=workers, import_paths=(TESTS,))
    return AgentRollout(engine, pool, Endpoint(engine, Limits(1, context=256, max_calls=3, max_episode_tokens=100)))


@pytest.mark.slow
def test_hostile_agents_lose_only_their_own_episode_and_are_counted(tiny):
    hostile = ["never_calls", "calls_forever", "malformed", "too_long", "sleeps", "raises", "wrong_count"]
    names = ["two_calls", *hostile, "rewrites_history"]
    ro = agent_rollout(tiny, deadline=6.0, workers=len(names))
    try:
        batch = ro.generate([{"prompt": "hi", "agent": n} for n in names], 1, 1.0, 1.0, 6)
    finally:
        ro.close()
    got = dict(zip(names, batch.episodes))
    assert got["two_calls"] == {"turns": 2, "turn_rewards": [0.25, 1.0], "tool_calls": 0, "stop": "done"}
    why = {n: got[n].get("error", "") for n in names}
    assert why["never_calls"] == "the agent made no call to the endpoint"
    assert got["calls_forever"]["timeout"] and got["sleeps"]["timeout"]  # the deadline killed them
    assert "messages[0]: expected an object with a role" in why["malformed"]
    assert "the model's context is 256" in why["too_long"]
    assert why["raises"] == "RuntimeError: the agent broke"
    assert why["wrong_count"] == "the agent returned 3 rewards for 1 recorded calls; expected one, or one per call"
    # served, not recorded past its first call (the second rewrote the conversation): trained on the first
    assert got["rewrites_history"]["turns"] == 1 and not why["rewrites_history"]
    assert ro.last_metrics["agent/prefix_breaks"] >= 2  # rewrites_history's second call, calls_forever's repeats
    rewards, infos, metrics = EpisodeReward().score(batch)
    assert rewards.tolist() == [1.25] + [0.0] * len(hostile) + [1.0]
    assert metrics["env/errors"] == 5 and metrics["env/timeouts"] == 2 and metrics["env/episodes"] == 9
    # the rest of the batch trains: the good episodes' drawn tokens are in the loss, a failed one's reward is 0
    assert batch.completion_mask[0].sum() == 8 and batch.turn_reward[0].sum() == 1.25  # max_tokens=4, twice
    assert batch.completion_mask[names.index("never_calls")].sum() == 0
    # 7 of 9 failed: past task.max_reward_error_frac=0.5 the run stops in one line naming the agent
    with pytest.raises(RunError, match=r"agent toy_agents:by_row failed on 7 of 9 episodes at step 3 \(78% > "):
        stop_on_failures([("agent toy_agents:by_row", "episodes", 9, 7, "agent.log")], 0.5, "at step 3", False,
                         "stopped")


def test_a_transcript_is_scored_by_the_verifier_and_a_number_goes_to_the_last_call(tiny):
    ro = agent_rollout(tiny, agent="toy_agents:transcript", verifier="toy_agents:last_word", workers=2)
    try:
        batch = ro.generate([{"prompt": "hi", "answer": ""}, {"prompt": "hi", "answer": "#"}], 2, 1.0, 1.0, 6)
    finally:
        ro.close()
    # '' is in every text, '#' is in none (the tiny vocabulary has no '#'): the verifier's reward and correct
    assert [e["turn_rewards"] for e in batch.episodes] == [[1.0], [1.0], [0.0], [0.0]]
    assert [e["correct"] for e in batch.episodes] == [True, True, False, False]
    assert batch.turn_reward.sum(1).tolist() == [1.0, 1.0, 0.0, 0.0]
    assert batch.group_ids.tolist() == [0, 0, 1, 1] and not batch.truncated.any()


@pytest.mark.parametrize("join", [True, False])
def test_task_agent_join_decides_whether_calls_join_a_running_decode(tiny, join):
    # task.agent_join=false: a decode at a time (short, even turns run faster so: benchmarks/README.md)
    from rlpost import config
    from rlpost.roles.rollout_agent import agent_rollout as from_task

    task = config.load(None, ["task.name=agent", "task.agent=toy_agents:by_row", f"task.agent_join={join}",
                              "task.env=guess", "task.env_workers=1"]).task
    engine = FastRollout(tiny.model, tiny.tokenizer, torch.float32)
    ro = from_task(engine, task, 256, None)
    try:
        assert ro.endpoint.admit is join and engine.admits
    finally:
        ro.close()
