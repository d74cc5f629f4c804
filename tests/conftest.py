"""Shared fixtures: a tiny random model with a character tokenizer, and a config for it."""

from __future__ import annotations

import pytest
import torch

from rlpost.model.load import load_policy

# Tiny-model tests are faster on one thread, and the suite may share 2 cores with other work.
torch.set_num_threads(1)


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return load_policy("tiny")
