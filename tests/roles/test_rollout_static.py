"""The own engine's GPU path (roles/rollout_static.py) run eagerly on the CPU: the decode step a CUDA
graph captures is this same function, so here it is held to transformers' `generate` (greedy tokens,
sampler log-probs, the sampled frequencies) as rows finish and leave the batch."""

import copy

import pytest
import torch

from rlpost.model.logprobs import completion_logprobs
from rlpost.roles import rollout_static
from rlpost.roles.rollout_hf import HFRollout, top_p_truncate
from rlpost.roles.rollout_static import StaticRollout, buckets, fitting


def rows(n):  # prompts of different lengths, so the batch is left-padded
    return [{"messages": [{"role": "user", "content": f"{i * 37}+{i}="}]} for i in range(n)]


def shake(model, scale: float):
    """The tiny model with its matrices shaken: the random init's greedy completions repeat one
    token and its distributions are nearly flat; shaken, completions vary (rows reach an EOS at
    different steps) and the distributions have shape."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def engines(tiny, eos=None):
    hf = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    static = StaticRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    if eos is not None:  # more ids count as EOS, so rows finish at different steps
        hf.eos_ids = static.hf.eos_ids = static.eos_dev = eos
    return hf, static


def test_bucket_ladder_by_hand():
    assert buckets(128) == [128, 64, 32, 16, 8] and buckets(100) == [100, 64, 32, 16, 8]
    assert buckets(16) == [16, 8] and buckets(8) == [8] and buckets(5) == [5] and buckets(1) == [1]
    assert fitting([128, 64, 32, 16, 8], 33) == 64 and fitting([128, 64, 32, 16, 8], 3) == 8


@pytest.mark.parametrize("check_every", [1, 3, 8])
def test_greedy_matches_generate_as_rows_finish_and_free_their_slots(tiny, monkeypatch, check_every):
    # When the host looks at the finished flags (every check_every steps) changes nothing in what
    # is drawn; rows that finished leave for a smaller bucket, the path most likely to misplace a row.
    monkeypatch.setattr(rollout_static, "CHECK_EVERY", check_every)
    monkeypatch.setattr(rollout_static, "MIN_BUCKET", 2)
    shake(tiny.model, 0.1)
    hf, static = engines(tiny, eos=torch.arange(5, len(tiny.tokenizer), 4))
    a = hf.generate(rows(12), n=1, temperature=0.0, top_p=1.0, max_new_tokens=14)
    b = static.generate(rows(12), n=1, temperature=0.0, top_p=1.0, max_new_tokens=14)
    assert len(set(a.completion_mask.sum(1).tolist())) > 3  # rows of many lengths
    assert torch.equal(a.prompt_ids, b.prompt_ids) and a.completions == b.completions
    assert torch.equal(a.completion_ids * a.completion_mask, b.completion_ids * b.completion_mask)
    assert static.buckets_used[0] == 12 and static.buckets_used == sorted(static.buckets_used, reverse=True)
    if check_every == 1:
        assert len(static.buckets_used) >= 3  # the live rows moved down the ladder twice or more


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampler_logp_match_trainer_with_groups_and_finished_rows_leaving(tiny, monkeypatch, top_p):
    monkeypatch.setattr(rollout_static, "CHECK_EVERY", 2)
    monkeypatch.setattr(rollout_static, "MIN_BUCKET", 2)
    _, static = engines(tiny, eos=torch.arange(5, len(tiny.tokenizer), 3))
    torch.manual_seed(0)
    b = static.generate(rows(4), n=4, temperature=0.9, top_p=top_p, max_new_tokens=16)
    lengths = b.completion_mask.sum(1)
    assert len(set(lengths.tolist())) > 3 and b.group_ids.tolist() == sorted([0, 1, 2, 3] * 4)
    assert len(static.buckets_used) >= 2
    m = b.completion_mask
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny.model, b, temperature=0.9)  # the trainer's forward
    assert (logp[m] - b.sampler_logp[m]).abs().max() < 1e-5
    assert (b.sampler_logp[~m] == 0).all() and (b.completion_ids[~m] == tiny.tokenizer.pad_token_id).all()
    assert (b.sampler_floor is None) == (top_p == 1.0)
    if b.sampler_floor is not None:
        assert (b.sampler_floor[m] <= b.sampler_logp[m]).all()


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_sampled_tokens_follow_the_models_distribution(tiny, top_p):
    # Every token the engine drew, at every position (the prefill's first, the decode step's later
    # ones), against the model's own distribution there, p_i. Two statistics, each ~N(0, 1) when the
    # sampler is right: the summed log p_i(drawn) against its expectation, -sum H(p_i) (it moves
    # by 8 sigma when the sampler draws at a 10% lower temperature), and for each vocabulary entry
    # its count against sum p_i(v) (a bias towards some tokens). None outside the top-p sets.
    shake(tiny.model, 0.3)
    _, static = engines(tiny)
    torch.manual_seed(1)
    b = static.generate(rows(6), n=64, temperature=1.0, top_p=top_p, max_new_tokens=8)
    ids, mask = b.input_ids(), b.attention_mask()
    with torch.no_grad():
        logits = tiny.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    P, m = b.prompt_ids.shape[1], b.completion_mask
    logp = logits[:, P - 1 : -1].log_softmax(-1)[m].double()  # (positions, V): what each token was drawn from
    if top_p < 1:
        logp = top_p_truncate(logp, top_p)[0]
    p, drawn = logp.exp(), b.completion_ids[m]
    assert len(p) > 2500
    plogp = torch.where(p > 0, p * logp, 0.0)
    entropy, second = -plogp.sum(1), torch.where(p > 0, plogp * logp, 0.0).sum(1)
    s = (logp.gather(1, drawn[:, None])[:, 0] + entropy).sum() / (second - entropy**2).sum().sqrt()
    assert s.abs() < 4, s
    count = torch.bincount(drawn, minlength=p.shape[1]).double()
    z = (count - p.sum(0)) / (p * (1 - p)).sum(0).clamp(min=1e-9).sqrt()
    assert z.abs().max() < 4.5, z.abs().max()


def test_arena_is_reused_grown_and_freed_without_a_trace(tiny):
    _, static = engines(tiny)
    fresh = StaticRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    torch.manual_seed(3)
    static.generate(rows(2), n=2, temperature=0.8, top_p=1.0, max_new_tokens=5)  # a small arena, warmed up
    small = static.arena
    torch.manual_seed(4)
    again = static.generate(rows(3), n=4, temperature=0.8, top_p=1.0, max_new_tokens=30)  # more rows and columns
    assert static.arena is not small and static.arena.rows == 12 and static.arena.columns == 64
    torch.manual_seed(4)
    first = fresh.generate(rows(3), n=4, temperature=0.8, top_p=1.0, max_new_tokens=30)
    assert torch.equal(again.completion_ids, first.completion_ids)  # warm-up and an earlier decode left nothing behind
    assert torch.equal(again.sampler_logp, first.sampler_logp)
    static.sleep()
    assert static.arena is None  # the KV cache (and on CUDA the graphs) go before the update
    greedy = lambda ro: ro.generate(rows(3), n=1, temperature=0.0, top_p=1.0, max_new_tokens=10).completions
    assert greedy(static) == greedy(fresh)
    static.sleep(discard_weights=True)
    static.load_weights(tiny.model.state_dict(), version=2)
    assert greedy(static) == greedy(fresh)


# Ops that make the host wait for the device (a value or an output size read back): inside a CUDA graph
# capture they fail, and in an eager GPU loop each one is a synchronisation per token.
HOST_SYNC_OPS = {"_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "unique", "_unique",
                 "_unique2", "unique_consecutive", "equal", "bincount", "argwhere", "multinomial", "allclose"}


def ops_in_the_step(tiny, monkeypatch, temperature: float, top_p: float, slots: int = 0) -> set[str]:
    """The aten ops _advance (what a CUDA graph captures) dispatches during a generate on ``slots`` slots."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    plain = StaticRollout._advance

    def watched(self, *args, **kw):
        with Ops():
            return plain(self, *args, **kw)

    monkeypatch.setattr(StaticRollout, "_advance", watched)
    shake(tiny.model, 0.1)
    _, static = engines(tiny)
    static.slots = slots
    static.generate(rows(5), n=2, temperature=temperature, top_p=top_p, max_new_tokens=6)
    return seen


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (0.7, 1.0), (0.7, 0.8)])
def test_the_captured_step_never_waits_for_the_host(tiny, monkeypatch, temperature, top_p):
    # No GPU here, so the ops the step dispatches are read instead, on the CPU: none may read a value
    # or a data-dependent size back to the host.
    seen = ops_in_the_step(tiny, monkeypatch, temperature, top_p)
    assert {"index_copy_", "bmm"} <= seen  # the step ran, and its ops were seen
    assert not seen & HOST_SYNC_OPS, sorted(seen & HOST_SYNC_OPS)


def test_the_host_sync_check_catches_a_sync(tiny, monkeypatch):
    # The check above can fail: a step with a per-token EOS check (`bool(finished.all())`) in it is caught.
    plain = StaticRollout._advance

    def syncing(self, a, b, *args):
        plain(self, a, b, *args)
        bool(a.finished[:b].all())

    monkeypatch.setattr(StaticRollout, "_advance", syncing)
    assert ops_in_the_step(tiny, monkeypatch, 0.7, 1.0) & HOST_SYNC_OPS == {"_local_scalar_dense"}


@pytest.mark.parametrize("check_every", [1, 3])
def test_continuous_batching_long_tail_greedy_equals_generate_row_by_row_in_fewer_steps(tiny, monkeypatch,
                                                                                        check_every):
    # 12 rows, 3 slots: when the host looks, finished slots take the next rows (prompt KV from the
    # group's prefill, placed in the ring before the step's column). Greedy tokens are generate's row
    # by row; with the host looking every step, the decode steps are about the tokens over the slots
    # plus the longest row, where waves of 3 rows each run to its longest take many more.
    monkeypatch.setattr(rollout_static, "CHECK_EVERY", check_every)
    monkeypatch.setattr(rollout_static, "MIN_BUCKET", 1)
    shake(tiny.model, 0.1)
    hf, static = engines(tiny, eos=torch.arange(5, len(tiny.tokenizer), 4))
    static.slots = 3
    want = hf.generate(rows(12), n=1, temperature=0.0, top_p=1.0, max_new_tokens=20)
    got = static.generate(rows(12), n=1, temperature=0.0, top_p=1.0, max_new_tokens=20)
    lengths = want.completion_mask.sum(1)
    assert (lengths == 20).sum() >= 2 and (lengths <= 5).sum() >= 6  # long-tailed: a few long, most short
    assert got.completions == want.completions
    assert torch.equal(got.completion_ids * got.completion_mask, want.completion_ids * want.completion_mask)
    assert static.arena.rows == 3 and static.buckets_used[0] == 3 and len(static.buckets_used) >= 2
    steps = static.last_metrics["rollout/decode_steps"]
    waves = sum(int(lengths[i : i + 3].max()) - 1 for i in range(0, 12, 3))
    if check_every == 1:
        assert steps <= (int(lengths.sum()) - 12) / 3 + 20 and steps < 0.7 * waves, (steps, waves)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_static_engine_samples_what_the_cpu_loop_samples_on_any_slot_count(tiny, monkeypatch, top_p):
    # Both engines draw each token with the uniform of its (row, token index) under the call's key:
    # the same seed gives the same rows on 16 slots or 3, in the static engine or the CPU loop, and
    # the trainer scores them as the sampler recorded.
    from rlpost.roles.rollout_fast import FastRollout

    monkeypatch.setattr(rollout_static, "CHECK_EVERY", 2)
    monkeypatch.setattr(rollout_static, "MIN_BUCKET", 2)
    eos = torch.arange(5, len(tiny.tokenizer), 3)
    out = []
    for slots in (0, 3):
        _, static = engines(tiny, eos=eos)
        static.slots = slots
        torch.manual_seed(0)
        out.append(static.generate(rows(4), n=4, temperature=0.9, top_p=top_p, max_new_tokens=16))
    fast = FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32, slots=5)
    fast.hf.eos_ids = eos
    torch.manual_seed(0)
    out.append(fast.generate(rows(4), n=4, temperature=0.9, top_p=top_p, max_new_tokens=16))
    assert len(set(out[0].completion_mask.sum(1).tolist())) > 3
    for b in out[1:]:
        assert torch.equal(b.completion_ids, out[0].completion_ids)
        assert torch.allclose(b.sampler_logp, out[0].sampler_logp, atol=1e-5)
    m = out[1].completion_mask
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny.model, out[1], temperature=0.9)
    assert (logp[m] - out[1].sampler_logp[m]).abs().max() < 1e-5
    assert (out[1].sampler_logp[~m] == 0).all() and (out[1].completion_ids[~m] == tiny.tokenizer.pad_token_id).all()
    assert (out[1].sampler_floor is None) == (top_p == 1.0)


def test_one_slot_wraps_the_ring_and_the_step_still_never_waits_for_the_host(tiny, monkeypatch):
    # One slot, 5 rows of up to 8 tokens: the ring of 64 columns wraps; greedy tokens are generate's,
    # and the step that refills run between dispatches no op that reads back to the host.
    monkeypatch.setattr(rollout_static, "COLUMNS", 8)
    shake(tiny.model, 0.1)
    hf, static = engines(tiny)
    static.slots = 1
    want = hf.generate(rows(5), n=1, temperature=0.0, top_p=1.0, max_new_tokens=8)
    got = static.generate(rows(5), n=1, temperature=0.0, top_p=1.0, max_new_tokens=8)
    assert got.completions == want.completions and static.last_metrics["rollout/decode_steps"] > static.arena.columns
    seen = ops_in_the_step(tiny, monkeypatch, 0.7, 0.8, slots=2)
    assert {"index_copy_", "bmm"} <= seen and not seen & HOST_SYNC_OPS


def partial(tiny, engine, switch_at):
    """A sampled batch whose engine loads new weights (version 1) at its hook's switch_at-th call."""
    g = torch.Generator().manual_seed(1)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in tiny.model.state_dict().items()}
    calls = []

    def hook(e):
        calls.append(e.version)
        if len(calls) == switch_at:
            e.load_weights(new, version=1)

    engine.between_steps = hook
    torch.manual_seed(0)
    return engine.generate(rows(3), n=2, temperature=1.0, top_p=1.0, max_new_tokens=12), calls


def test_partial_rollouts_take_weights_where_the_host_looks_and_equal_the_cpu_loops(tiny, monkeypatch):
    # The static engine's hook runs once a round (every CHECK_EVERY = 4 steps, after the prefill drew
    # token 0): loaded at its 2nd call, tokens 0-4 are version 0 and 5.. version 1. The CPU loop's hook
    # runs before every step, so the same switch is its 5th call: the two engines then draw the same
    # tokens with the same log-probs and versions, and the tokens before the switch are the unhooked run's.
    from rlpost.roles.rollout_fast import FastRollout

    monkeypatch.setattr(rollout_static, "CHECK_EVERY", 4)
    _, plain = engines(tiny)
    torch.manual_seed(0)
    before = plain.generate(rows(3), n=2, temperature=1.0, top_p=1.0, max_new_tokens=12)
    assert before.token_version is None  # no hook: nothing recorded, as every other topology runs it
    _, static = engines(tiny)
    switched, calls = partial(tiny, static, 2)
    assert calls[:2] == [0, 0] and set(calls[2:]) == {1}
    mask = switched.completion_mask
    t = torch.arange(mask.shape[1]).expand_as(mask)
    assert torch.equal(switched.token_version, ((t >= 5) & mask).long())
    early = (t < 5) & mask
    assert torch.equal(switched.completion_ids[early], before.completion_ids[early])
    late = (t >= 5) & mask & before.completion_mask
    assert late.any() and not torch.equal(switched.sampler_logp[late], before.sampler_logp[late])
    cpu, _ = partial(tiny, FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32), 5)
    assert torch.equal(cpu.completion_ids, switched.completion_ids)
    assert torch.equal(cpu.token_version, switched.token_version)
    assert torch.allclose(cpu.sampler_logp, switched.sampler_logp, atol=1e-5)
    assert switched.policy_version == 0  # the oldest token's


def test_partial_rollouts_on_slots_stamp_each_entering_row_with_the_version_it_entered_under(tiny, monkeypatch):
    # 6 rows through 2 slots: rows enter as others finish; a row entering after the switch draws all of
    # its tokens under version 1, a row running across it has both versions, in token order.
    monkeypatch.setattr(rollout_static, "CHECK_EVERY", 2)
    monkeypatch.setattr(rollout_static, "MIN_BUCKET", 2)
    _, static = engines(tiny, eos=torch.arange(5, len(tiny.tokenizer), 17))
    static.slots = 2
    out, calls = partial(tiny, static, 3)
    v, m = out.token_version, out.completion_mask
    assert set(calls) == {0, 1}
    rows_v = [v[r][m[r]] for r in range(len(v))]
    assert all(torch.equal(seq, seq.sort().values) for seq in rows_v)  # never back within a row
    assert any(not seq.any() for seq in rows_v)  # a row done before the switch
    assert any(0 < int(seq.sum()) < len(seq) for seq in rows_v)  # a row running across it
    assert sum(bool(seq.all()) for seq in rows_v) >= 2  # rows that entered after it
    assert (v[~m] == 0).all()
