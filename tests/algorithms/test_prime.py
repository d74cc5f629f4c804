"""PRIME-style implicit process rewards: hand-worked advantages, and a run of the real loop."""

import json

import torch
from helpers import tiny_cfg

from rlpost.algorithms import core
from rlpost.recipes.rl import train


def test_prime_advantages_by_hand():
    implicit = torch.tensor([[0.3, 0.1, 0.2], [0.4, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    # per-token means: 0.2 and 0.3; leave-one-out baselines (K = 2): 0.3 for row 0, 0.2 for row 1
    # row 0: r - b = [0.0, -0.2, -0.1] -> returns-to-go [-0.3, -0.3, -0.1]
    # row 1: r - b = [0.2, 0.0, (pad)] -> returns-to-go [0.2, 0.0, 0]
    out = core.prime_advantages(implicit, mask, 2)
    assert torch.allclose(out, torch.tensor([[-0.3, -0.3, -0.1], [0.2, 0.0, 0.0]]), atol=1e-6)


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
