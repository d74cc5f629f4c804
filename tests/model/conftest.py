"""The batch the log-prob tests share (test_logprobs.py, test_logprobs_paths.py)."""

import copy

import pytest
import torch

from rlpost.roles.rollout_hf import HFRollout


@pytest.fixture
def batch(tiny):
    """3 prompts of different lengths (so left padding) x 4 completions of up to 6 tokens, sampled
    from the tiny model in float32."""
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    torch.manual_seed(0)
    rows = [{"messages": [{"role": "user", "content": "7" * (i + 1) + "+1="}]} for i in range(3)]
    return ro.generate(rows, n=4, temperature=1.0, top_p=1.0, max_new_tokens=6)
