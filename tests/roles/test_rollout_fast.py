"""rlpost's own decode loop against transformers `generate`, on the tiny model in float32 (where the
two must agree exactly), and its sampler against the distribution it claims to draw from."""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TopPLogitsWarper

from rlpost.model.logprobs import completion_logprobs
from rlpost.roles.engine import build_rollout, pick
from rlpost.roles.rollout_fast import FastRollout
from rlpost.roles.rollout_hf import HFRollout, top_p_truncate
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


def test_rope_and_decode_scores_are_transformers_bit_for_bit_in_bf16(tiny):
    # The loop turns q and k with roll(x) * (sin, first half negated) and adds a 0/-inf mask to
    # the scores; transformers' rotate_half(x) * sin and eager's masked_fill must give the same bits.
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    fast = FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 500, (4, 3), generator=g)
    cos, sin = fast.rotary(fast.embed[:1], pos)  # (4, 3, hd), the loop's dtype
    q = torch.randn(4, 2, 3, fast.hd, generator=g).bfloat16()
    k = torch.randn(4, 1, 3, fast.hd, generator=g).bfloat16()
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)  # (b, heads, s, hd)
    got = fast.rope(torch.cat([q, k], 1).transpose(1, 2), *fast.cos_sin(pos))  # (b, s, heads, hd)
    assert torch.equal(got.transpose(1, 2), torch.cat([want_q, want_k], 1))

    # A decode step's attention (attend_step) against eager's: float32 scores * scale, masked, softmax.
    L, g_ = 7, fast.nh // fast.nkv
    q = torch.randn(4, fast.nh, 1, fast.hd, generator=g).bfloat16()
    kt = torch.randn(4, fast.nkv, fast.hd, L, generator=g).bfloat16()
    v = torch.randn(4, fast.nkv, L, fast.hd, generator=g).bfloat16()
    keep = torch.rand(4, 1, 1, L, generator=g) > 0.3
    keep[..., -1] = True  # the token being decoded always sees itself
    scores = (q.view(4, fast.nkv, g_, fast.hd) @ kt).float() * fast.hd**-0.5
    probs = scores.masked_fill(~keep, float("-inf")).softmax(-1).to(v.dtype)
    eager = (probs @ v).view(4, fast.nh, 1, fast.hd)
    additive = torch.zeros(4, 1, 1, L).masked_fill(~keep, float("-inf"))
    assert torch.equal(fast.attend_step(q.view(4, fast.nh, fast.hd), kt, v, additive), eager.view(4, -1))


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
    m = b.completion_mask
    for chunked in (True, False):  # the trainer's ChunkedLogp and the plain (B, T, V) path
        with torch.no_grad():
            logp, _ = completion_logprobs(tiny.model, b, temperature=0.9, chunked=chunked)  # trainer: HF forward
        assert (logp[m] - b.sampler_logp[m]).abs().max() < 1e-5, chunked
    assert (b.sampler_logp[~m] == 0).all() and (b.completion_ids[~m] == tiny.tokenizer.pad_token_id).all()
    assert (b.sampler_floor is None) == (top_p == 1.0)


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_under_top_p_sampler_trainer_and_reference_score_the_truncated_distribution(tiny, engine):
    # DeepSeek-V3.2's "keep sampling mask": the sampler draws from the top-p set, renormalised, and
    # records it; the trainer's log-probs of the same batch (the threshold it stored) agree with it.
    # Without the threshold they are the full softmax: log pi(y) - log(mass of the kept set) lower.
    ro = pair(tiny)[0 if engine == "hf" else 1]
    torch.manual_seed(1)
    b = ro.generate(rows(3), n=4, temperature=1.0, top_p=0.5, max_new_tokens=10)
    m = b.completion_mask
    assert b.sampler_floor is not None and (b.sampler_floor[m] <= b.sampler_logp[m]).all()
    from helpers import tcfg

    from rlpost.model.logprobs import Scoring
    from rlpost.roles.reference import Reference
    from rlpost.build import trainer_over
    trainer = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=12, micro_batch_size=4,
                      total_optimizer_steps=1)
    old_logp = trainer.recompute(b)[0]  # the trainer's pi_old, micro-batched and trimmed
    ref_logp = Reference(copy.deepcopy(tiny.model), Scoring(1.0), 4, autocast_bf16=False).logprobs(b)
    with torch.no_grad():
        kept, _ = completion_logprobs(tiny.model, b, temperature=1.0)
        b.sampler_floor = None
        full, _ = completion_logprobs(tiny.model, b, temperature=1.0)
    for logp in (kept, old_logp, ref_logp):
        assert (logp[m] - b.sampler_logp[m]).abs().max() < 1e-5
    # top_p = 0.5 keeps at most about half of the mass, so the full softmax is log 2 or more lower
    assert (full[m] < kept[m] - 0.5).all()


def test_truncated_log_probs_and_gradients_by_hand():
    # logits [ln 4, ln 2, ln 1, ln 1] at T = 1: p = [.5, .25, .125, .125]. The sampler's top-p 0.7 keeps
    # tokens 0 and 1 (.5 + .25 >= .7): floor halfway between ln .25 and ln .125. Truncated: p' = [2/3, 1/3, 0, 0], so
    # for the target 1: log p' = ln 1/3; d log p'(1) / dz = onehot(1) - p' = [-2/3, 2/3, 0, 0].
    # For target 2 (outside the set: kept anyway, so never -inf): p'' = [4/7, 2/7, 1/7, 0], log p''(2) = ln 1/7.
    import math

    from rlpost.model.logprobs import ChunkedLogp, HeadSpec
    z = torch.tensor([[math.log(4), math.log(2), 0.0, 0.0]] * 2)
    lp_sampler, floor = top_p_truncate(z.log_softmax(-1), 0.7)
    assert torch.allclose(floor, torch.full((2,), (math.log(0.25) + math.log(0.125)) / 2))
    assert torch.allclose(lp_sampler[0], torch.tensor([math.log(2 / 3), math.log(1 / 3), -math.inf, -math.inf]))
    h = torch.ones(2, 1, requires_grad=True)
    w = z[0][:, None].clone().requires_grad_(True)  # (V, H=1): h W^T = z
    lp, ent = ChunkedLogp.apply(h, w, torch.tensor([1, 2]), HeadSpec(1.0, torch.float32, True), floor)
    assert torch.allclose(lp, torch.tensor([math.log(1 / 3), math.log(1 / 7)]), atol=1e-6)
    p1 = torch.tensor([2 / 3, 1 / 3])
    assert math.isclose(ent[0].item(), -(p1 * p1.log()).sum().item(), rel_tol=1e-5)  # entropy of p'
    lp[0].backward()
    assert torch.allclose(w.grad[:, 0], torch.tensor([-2 / 3, 2 / 3, 0.0, 0.0]), atol=1e-6)


def test_draw_samples_the_recorded_distribution():
    fast = FastRollout.__new__(FastRollout)  # draw_tokens uses no weights
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]]).repeat(40000, 1)
    torch.manual_seed(0)
    tok, lp, floor = fast.draw_tokens(logits, temperature=0.7, top_p=1.0)
    want = (logits[0] / 0.7).softmax(-1)
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    assert (freq - want).abs().max() < 0.01
    assert torch.allclose(lp, want.log()[tok]) and floor is None
    # top-p 0.8 keeps tokens 4 and 0 (mass 0.60 + 0.14... until >= 0.8), renormalised; lp is the
    # log-prob under that truncated distribution, and floor halfway between the last kept and the first dropped
    tok, lp, floor = fast.draw_tokens(logits, temperature=0.7, top_p=0.8)
    kept = torch.isfinite(top_p_truncate(want.log()[None], 0.8)[0])[0]
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    assert (freq[~kept] == 0).all()
    assert (freq[kept] - want[kept] / want[kept].sum()).abs().max() < 0.01
    assert torch.allclose(lp, (want / want[kept].sum()).log()[tok])
    assert torch.allclose(floor, (want[kept].min().log() + want[~kept].max().log()) / 2)


def test_top_p_keeps_what_transformers_keeps():
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 2
    for p in (0.3, 0.7, 0.95):
        ours = torch.isfinite(top_p_truncate(logits.log_softmax(-1), p)[0])
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
    assert torch.equal(fast.layers[0].qkv.weight[: fast.nh * fast.hd],
                       fast.model.model.layers[0].self_attn.q_proj.weight)


def test_build_rollout_picks_an_engine(tiny):
    assert type(build_rollout("auto", copy.deepcopy(tiny.model), tiny.tokenizer, torch.float32)) is FastRollout
    assert type(build_rollout("hf", copy.deepcopy(tiny.model), tiny.tokenizer, torch.float32)) is HFRollout
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tiny.tokenizer)))
    assert type(build_rollout("auto", gpt2, tiny.tokenizer, torch.float32)) is HFRollout
    with pytest.raises(ConfigError, match="rollout.engine=fast"):
        build_rollout("fast", gpt2, tiny.tokenizer, torch.float32)


def test_rollout_slots_reach_the_own_engine_and_generate_says_it_has_none(tiny, capsys):
    from rlpost import build, config  # build imports the whole run's roles: only this test needs it

    cfg = config.load(None, ["rollout.slots=3", "rollout.dtype=float32"])
    fast = build.make_rollout(cfg, copy.deepcopy(tiny.model), tiny.tokenizer)
    assert type(fast) is FastRollout and fast.slots == 3
    fast.generate(rows(5), n=1, temperature=0.0, top_p=1.0, max_new_tokens=4)
    assert fast.last_metrics["rollout/slots"] == 3  # 5 rows through 3 slots
    assert FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32).slots == 0  # the default
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tiny.tokenizer)))
    assert type(build_rollout("auto", gpt2, tiny.tokenizer, torch.float32, slots=3)) is HFRollout
    assert "rollout.slots=3 unused" in capsys.readouterr().err


def test_engine_table_on_each_device():
    # (rollout.engine, on a GPU, a model the own engine runs) -> the engine (roles/engine.py's table)
    assert [pick(e, False, True) for e in ("auto", "fast", "hf")] == ["fast", "fast", "hf"]
    assert [pick(e, True, True) for e in ("auto", "fast", "hf")] == ["static", "static", "hf"]
    assert [pick(e, gpu, False) for e in ("auto", "hf") for gpu in (False, True)] == ["hf"] * 4
    for gpu in (False, True):
        with pytest.raises(ConfigError, match="rollout.engine=fast supports"):
            pick("fast", gpu, False)


def shaken(tiny, scale: float = 0.1):
    """The tiny model with its matrices shaken, so greedy completions vary and rows end at different steps."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in tiny.model.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return tiny


def long_tailed(tiny, slots: int) -> FastRollout:
    """A fast engine on ``slots`` slots where a quarter of the vocabulary counts as EOS: most rows stop
    within a few tokens, a few run to the cap."""
    fast = FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32, slots=slots)
    fast.hf.eos_ids = torch.arange(5, len(tiny.tokenizer), 4)
    return fast


def test_continuous_batching_long_tail_greedy_equals_generate_row_by_row_in_fewer_steps(tiny):
    # 12 rows on 3 slots: each finished row's slot goes to the next row. The tokens are generate's row
    # by row, and the decode steps are about the tokens over the slots plus the longest row, where
    # waves of 3 rows, each run to its longest, take many more.
    shaken(tiny)
    hf = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    hf.eos_ids = torch.arange(5, len(tiny.tokenizer), 4)
    want = hf.generate(rows(12), n=1, temperature=0.0, top_p=1.0, max_new_tokens=20)
    fast = long_tailed(tiny, 3)
    got = fast.generate(rows(12), n=1, temperature=0.0, top_p=1.0, max_new_tokens=20)
    lengths = want.completion_mask.sum(1)
    assert (lengths == 20).sum() >= 2 and (lengths <= 5).sum() >= 6  # long-tailed: a few long, most short
    assert got.completions == want.completions
    assert torch.equal(got.completion_ids * got.completion_mask, want.completion_ids * want.completion_mask)
    # A row's first token comes from the prefill; each decode step draws one token in each busy slot.
    steps, tokens = fast.last_metrics["rollout/decode_steps"], int(lengths.sum())
    assert steps <= (tokens - 12) / 3 + 20
    waves = sum(int(lengths[i : i + 3].max()) - 1 for i in range(0, 12, 3))
    assert steps < 0.7 * waves, (steps, waves)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_a_rows_samples_do_not_depend_on_its_slot_or_the_slot_count(tiny, top_p):
    # Each draw's uniform is a hash of (the call's key, row, token index): the same seed gives each
    # row the same tokens and log-probs on 3 slots, 5 slots or one slot per row, whichever slot
    # it ran in and whenever it entered; and the trainer scores them as the sampler recorded.
    shaken(tiny)
    out = []
    for slots in (0, 3, 5):
        torch.manual_seed(7)
        out.append(long_tailed(tiny, slots).generate(rows(4), n=4, temperature=0.9, top_p=top_p, max_new_tokens=16))
    lengths = out[0].completion_mask.sum(1)
    assert len(set(lengths.tolist())) > 3 and out[0].group_ids.tolist() == sorted([0, 1, 2, 3] * 4)
    for b in out[1:]:
        assert torch.equal(b.completion_ids, out[0].completion_ids)
        assert torch.allclose(b.sampler_logp, out[0].sampler_logp, atol=1e-5)
    m = out[1].completion_mask
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny.model, out[1], temperature=0.9)
    assert (logp[m] - out[1].sampler_logp[m]).abs().max() < 1e-5
    torch.manual_seed(8)  # another seed, other samples
    other = long_tailed(tiny, 3).generate(rows(4), n=4, temperature=0.9, top_p=top_p, max_new_tokens=16)
    assert not torch.equal(other.completion_ids, out[0].completion_ids)


def test_the_ring_wraps_without_a_row_reading_another_rows_keys(tiny, monkeypatch):
    # One slot, 6 rows: the cache's ring of P + 8 columns wraps several times, each row's prompt placed
    # across the wrap at some point; greedy tokens are still generate's.
    shaken(tiny)
    hf = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    fast = FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32, slots=1)
    want = hf.generate(rows(6), n=1, temperature=0.0, top_p=1.0, max_new_tokens=8)
    got = fast.generate(rows(6), n=1, temperature=0.0, top_p=1.0, max_new_tokens=8)
    assert got.completions == want.completions and fast.last_metrics["rollout/decode_steps"] > 2 * 8
