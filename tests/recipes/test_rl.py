"""Shared knobs and task families through the real loop (recipes/rl.py) on the tiny model."""

import json

from helpers import tiny_cfg

from rlpost.recipes.rl import train


def test_prime_runs_in_the_loop_and_logs_the_implicit_reward(tmp_path):
    cfg = tiny_cfg("algo.prime_coef=0.5", "algo.kl_coef=0")
    train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/implicit_prm_mean" in r]
    assert len(steps) == 2


def test_tool_task_trains_through_the_loop(tmp_path):
    cfg = tiny_cfg("task.name=tools", "task.max_episode_tokens=12")
    summary = train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("tools/calls_per_episode" in r for r in rows) == 2
    assert "heldout_accuracy_after" in summary
