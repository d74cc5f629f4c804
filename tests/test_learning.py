"""A tiny random model must learn a toy verifiable task through the real loop, in seconds."""

import random

from conftest import tiny_cfg
from rlpost.envs import Task
from rlpost.roles.controller import train


def digit_rows(n, seed):
    rng = random.Random(seed)
    return [{"messages": [{"role": "user", "content": str(d)}], "answer": str(d)}
            for d in (rng.randint(0, 9) for _ in range(n))]


def test_tiny_model_learns_to_copy_a_digit(tmp_path):
    # Reward 1 when the completion starts with the prompt's digit. A random 76-token model hits it
    # 1 time in 76; GRPO must take it past 0.8 held-out (greedy) accuracy. lr 3e-3: at 3e-2 the
    # policy's entropy collapses within 20 steps and every group loses its reward variance.
    task = Task(digit_rows(200, 0), digit_rows(50, 1), "toy_verifiers:first_char_digit")
    cfg = tiny_cfg("run.steps=150", "rollout.prompts_per_step=16", "rollout.group_size=8",
                   "rollout.max_new_tokens=2", "trainer.lr=3e-3", "run.eval_every=50")
    summary = train(cfg, tmp_path / "run", task=task)
    assert summary["heldout_accuracy_before"] < 0.2
    assert summary["heldout_accuracy_after"] >= 0.8, summary
    assert summary["reward_mean_last"] >= 0.8 > summary["reward_mean_first"] + 0.5
