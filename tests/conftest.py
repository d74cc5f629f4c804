"""Shared fixtures: a tiny random model with a character tokenizer, and a config for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlpost import config
from rlpost.models import load_policy

ROOT = Path(__file__).resolve().parents[1]
# Tiny-model tests are faster on one thread, and the suite may share 2 cores with other work.
torch.set_num_threads(1)

TINY = [
    "model.name=tiny", "rollout.dtype=float32", "rollout.max_new_tokens=6", "rollout.prompts_per_step=4",
    "rollout.group_size=4", "task.n_train=64", "task.n_heldout=8", "run.steps=2", "run.progress=false",
    "run.checkpoint_every=0", "trainer.lr=1e-3", "trainer.autocast_bf16=false", "run.threads=1",
]


def tiny_cfg(*overrides: str) -> config.Config:
    return config.load(None, [*TINY, *overrides])


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return load_policy("tiny")


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real `rlpost` entry point in a subprocess."""
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), *sys.path])}
    return subprocess.run([sys.executable, "-m", "rlpost.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)
