"""rlpost's own decode loop against transformers `generate`, on the tiny model in float32 (where the
two must agree exactly), and its sampler against the distribution it claims to draw from."""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TopPLogitsWarper

from rlpost.model.logprobs import completion_logprobs
from rlpost.roles.rollout_fast import FastRollout, _top_p, build_rollout
from rlpost.roles.rollout_hf import HFRollout
from rlpost.sections import ConfigError


def rows(n):  # prompts of different lengths, so the batch is left-padded
    return [{"messages": [{"role": "user", "content": f"{i * 37}+{i}="}]} for i in range(n)]


def pair(tiny):
    return (HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32),
            FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32))


def test_greedy_matches_generate_token_for_token(tiny):
    hf, fast = pair(tiny)
    a = hf.generate(rows(5), n=1, temperature=0.0, top_p=1.0, max_new_tokens=12)
    b = fast.generate(rows(5), n=1, temperature=0.0, top_p=1.0, max_new_tokens=12)
    assert torch.equal(a.prompt_ids, b.prompt_ids)
    assert torch.equal(a.completion_ids * a.completion_mask, b.completion_ids * b.completion_mask)
    assert a.completions == b.completions


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampler_logp_match_trainer_with_groups_and_finished_rows_leaving(tiny, top_p):
    _, fast = pair(tiny)
    # Make a third of the vocabulary count as EOS so rows finish at different steps and the
    # decode batch is compacted several times (COMPACT_FRACTION), the path most likely to misplace a row.
    fast.hf.eos_ids = torch.arange(5, len(tiny.tokenizer), 3)
    torch.manual_seed(0)
    b = fast.generate(rows(4), n=4, temperature=0.9, top_p=top_p, max_new_tokens=16)
    lengths = b.completion_mask.sum(1)
    assert len(set(lengths.tolist())) > 3 and b.group_ids.tolist() == sorted([0, 1, 2, 3] * 4)
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny.model, b, temperature=0.9)  # trainer: plain HF forward
    m = b.completion_mask
    assert (logp[m] - b.sampler_logp[m]).abs().max() < 1e-5
    assert (b.sampler_logp[~m] == 0).all() and (b.completion_ids[~m] == tiny.tokenizer.pad_token_id).all()


def test_draw_samples_the_recorded_distribution():
    fast = FastRollout.__new__(FastRollout)  # _draw uses no weights
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]]).repeat(40000, 1)
    torch.manual_seed(0)
    tok, lp = fast._draw(logits, temperature=0.7, top_p=1.0)
    want = (logits[0] / 0.7).softmax(-1)
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    assert (freq - want).abs().max() < 0.01
    assert torch.allclose(lp, want.log()[tok])
    # top-p 0.8 keeps tokens 4 and 0 (mass 0.60 + 0.14... until >= 0.8), renormalised; lp stays un-truncated
    tok, lp = fast._draw(logits, temperature=0.7, top_p=0.8)
    kept = torch.isfinite(_top_p(want.log()[None], 0.8))[0]
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    assert (freq[~kept] == 0).all()
    assert (freq[kept] - want[kept] / want[kept].sum()).abs().max() < 0.01
    assert torch.allclose(lp, want.log()[tok])


def test_top_p_keeps_what_transformers_keeps():
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 2
    for p in (0.3, 0.7, 0.95):
        ours = torch.isfinite(_top_p(logits.log_softmax(-1), p))
        theirs = torch.isfinite(TopPLogitsWarper(p)(None, logits.clone()))
        assert torch.equal(ours, theirs)


def test_weight_sync_reaches_the_fused_weights(tiny):
    hf, fast = pair(tiny)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in tiny.model.state_dict().items()}
    hf.load_weights(state)
    fast.load_weights(state)
    a = hf.generate(rows(3), n=1, temperature=0.0, top_p=1.0, max_new_tokens=10)
    b = fast.generate(rows(3), n=1, temperature=0.0, top_p=1.0, max_new_tokens=10)
    assert a.completions == b.completions
    assert torch.equal(fast.layers[0].qkv.weight[: fast.nh * fast.hd], fast.model.model.layers[0].self_attn.q_proj.weight)


def test_build_rollout_picks_an_engine(tiny):
    assert type(build_rollout("auto", copy.deepcopy(tiny.model), tiny.tokenizer, torch.float32)) is FastRollout
    assert type(build_rollout("hf", copy.deepcopy(tiny.model), tiny.tokenizer, torch.float32)) is HFRollout
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tiny.tokenizer)))
    assert type(build_rollout("auto", gpt2, tiny.tokenizer, torch.float32)) is HFRollout
    with pytest.raises(ConfigError, match="rollout.engine=fast"):
        build_rollout("fast", gpt2, tiny.tokenizer, torch.float32)
