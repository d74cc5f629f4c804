"""The shared-prefix forward equals the plain forward, in values and in gradients."""

import copy
import warnings

import pytest
import torch

from rlpost.model.logprobs import Scoring, completion_logprobs, prompt_groups


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


def test_the_kv_cache_goes_by_the_installed_transformers_name(tiny, batch):
    # transformers 5.24 renamed past_key_values (argument and output field) to cache: the old name
    # warned on every run and goes in 5.40, while rlpost admits transformers 5.0 to 5.x.
    import inspect

    from transformers.modeling_outputs import CausalLMOutputWithPast

    from rlpost.model.logprobs import CACHE_KW

    assert CACHE_KW in CausalLMOutputWithPast.__dataclass_fields__
    assert CACHE_KW in inspect.signature(type(tiny.model.get_decoder()).forward).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the deprecated name, passed
        completion_logprobs(tiny.model, batch, 0.9, share_prefix=True)


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


def _chunked_vs_plain(model, batch, entropy_weight, monkeypatch, chunk):
    import rlpost.model.chunked as chunked_mod
    import rlpost.model.logprobs as lp_mod

    monkeypatch.setattr(chunked_mod, "CHUNK_TOKENS", chunk)  # several chunks even on a small batch
    m = batch.completion_mask
    out = []
    for chunked in (False, True):
        model.zero_grad()
        f = lp_mod.policy_forward(model, batch, Scoring(0.9, chunked=chunked), entropy="grad")
        # weights that differ per token, so a misplaced token changes the gradient
        w = torch.linspace(0.5, 1.5, m.numel()).view(m.shape) * m
        ((f.logp * w).sum() + entropy_weight * (f.entropy * w).sum()).backward()
        out.append((f.logp.detach() * m, f.entropy.detach() * m, [p.grad.clone() for p in model.parameters()]))
    return out


@pytest.mark.parametrize("entropy_weight", [0.0, 0.3])
def test_chunked_logp_equals_full_logits_in_values_and_gradients(tiny, batch, monkeypatch, entropy_weight):
    (lp0, ent0, g0), (lp1, ent1, g1) = _chunked_vs_plain(tiny.model, batch, entropy_weight, monkeypatch, chunk=7)
    assert int(batch.completion_mask.sum()) > 14  # more than two chunks
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(ent0, ent1, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g0, g1))
    assert (lp1[~batch.completion_mask] == 0).all()


def test_chunked_logp_under_bf16_autocast_tracks_the_plain_path(tiny, batch, monkeypatch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (lp0, _, g0), (lp1, _, g1) = _chunked_vs_plain(tiny.model, batch, 0.0, monkeypatch, chunk=16)
    assert (lp0 - lp1).abs().max() < 0.05
    cos = [torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) for a, b in zip(g0, g1)]
    assert min(cos) > 0.99


def test_cached_head_cast_is_dropped_when_weights_change(tiny, batch):
    from helpers import tcfg

    from rlpost.build import trainer_over
    from rlpost.model import chunked

    w = tiny.model.get_output_embeddings().weight
    first = chunked.cast_weight(w, torch.bfloat16)
    assert chunked.cast_weight(w, torch.bfloat16) is first  # reused while the weights stand still
    with torch.no_grad():
        w.copy_(w + 1)  # an in-place write bumps _version
    assert torch.equal(chunked.cast_weight(w, torch.bfloat16), (w + 0).to(torch.bfloat16))
    # fused AdamW does not bump _version: the trainer must drop the cache after its step
    tr = trainer_over(tiny.model, tcfg(), 1.0, 8, 8, 10)
    chunked.cast_weight(w, torch.bfloat16)
    metrics = tr.train_step(batch, lambda logp, b, **named: ((logp * b.completion_mask).sum(), {}))
    assert metrics["actor/nonfinite_steps"] == 0  # a step was taken (float32 here: the forward cast nothing)
    assert not chunked._cast_cache


def test_head_gradient_formed_once_per_mini_batch_equals_the_backwards_own(tiny, batch):
    # HeadGrad: each micro-batch's backward leaves its dz and h, and flush forms sum dz^T h in one
    # matmul into the head's .grad. The same gradient as each backward returning its own.
    from rlpost.model.logprobs import HeadGrad, policy_forward

    head = tiny.model.get_output_embeddings().weight
    parts = (torch.arange(0, 5), torch.arange(5, len(batch)))
    grads = []
    for defer in (False, True):
        tiny.model.zero_grad()
        acc = HeadGrad() if defer else None
        for idx in parts:
            mb = batch.select(idx)
            out = policy_forward(tiny.model, mb, Scoring(0.9), head_grad=acc)
            (out.logp * mb.completion_mask * torch.linspace(0.5, 1.5, mb.completion_mask.shape[1])).sum().backward()
        if defer:  # (the head is tied to the embedding here, whose lookup's gradient is already in .grad)
            before = head.grad.clone()
            acc.flush(head)
            assert not torch.equal(before, head.grad)  # the head's own share came in the flush
        grads.append([p.grad.clone() for p in tiny.model.parameters()])
    assert grads[0][0].abs().sum() > 0
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*grads))  # float32 sums in another order


def test_chunk_size_by_device_by_hand():
    from rlpost.model.logprobs import chunk_tokens

    # a CPU keeps 128-token chunks (cache-sized); a GPU takes 256 MiB of float32 logits a chunk:
    # 2**28 / (4 x 49152) = 1365 tokens of SmolLM2's vocabulary, 441 of Qwen2.5's 151936, never below 128
    assert chunk_tokens(False, 49152) == 128 and chunk_tokens(True, 49152) == 1365
    assert chunk_tokens(True, 151936) == 441 and chunk_tokens(True, 10**7) == 128
