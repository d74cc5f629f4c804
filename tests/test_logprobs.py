"""The shared-prefix forward equals the plain forward, in values and in gradients."""

import copy

import pytest
import torch

from rlpost.logprobs import completion_logprobs, prompt_groups
from rlpost.roles.rollout_hf import HFRollout


@pytest.fixture
def batch(tiny):
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    torch.manual_seed(0)
    rows = [{"messages": [{"role": "user", "content": "7" * (i + 1) + "+1="}]} for i in range(3)]
    return ro.generate(rows, n=4, temperature=1.0, top_p=1.0, max_new_tokens=6)


def grads_of(model, batch, share):
    model.zero_grad()
    logp, _ = completion_logprobs(model, batch, temperature=0.9, share_prefix=share)
    (logp * batch.completion_mask).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


def test_shared_prefix_equals_full_forward(tiny, batch):
    assert not batch.prompt_mask.all()  # prompts of different lengths: left padding is exercised
    lp_full, g_full = grads_of(tiny.model, batch, share=False)
    lp_shared, g_shared = grads_of(tiny.model, batch, share=True)
    m = batch.completion_mask
    assert torch.allclose(lp_full[m], lp_shared[m], atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_full, g_shared))


def test_groups_cut_by_a_micro_batch_still_share(tiny, batch):
    part = batch.select(slice(2, 9))  # half of group 0, all of group 1, a quarter of group 2
    first, row_to_group = prompt_groups(part)
    assert first.tolist() == [0, 2, 6] and row_to_group.tolist() == [0, 0, 1, 1, 1, 1, 2]
    lp_full, _ = completion_logprobs(tiny.model, part, 0.9, share_prefix=False)
    lp_shared, _ = completion_logprobs(tiny.model, part, 0.9, share_prefix=True)
    assert torch.allclose(lp_full[part.completion_mask], lp_shared[part.completion_mask], atol=1e-5)


def test_rows_with_different_prompts_in_one_group_fall_back(batch):
    other = copy.deepcopy(batch)
    other.prompt_ids[1, -2] += 1  # row 1 no longer has its group's prompt
    assert prompt_groups(other) == (None, None)
