"""Every path of model/logprobs.py against a computation written out here: the top-p truncation by
hand, which heads take the chunked path, the entropy modes, the value head on both paths, the
top-p floor through both paths, the chunking itself, the bf16 head matmul, a frozen head and an
empty batch. Each test names the behaviour a one-line slip would change (tests/README.md,
mutation testing)."""

import copy
import math

import pytest
import torch
from torch import nn

import rlpost.model.chunked as chunked_mod
import rlpost.model.routes as routes
from rlpost.model.logprobs import (ChunkedLogp, HeadSpec, Scoring, completion_logprobs, completion_values, plain_head,
                                   policy_forward,
                                   truncated)

T = 0.9  # a temperature other than 1, so a missing division shows


def full_logits(model, batch):  # (B, T, V) float32 / T: the positions that predict each completion token
    ids, attn = batch.input_ids(), batch.attention_mask()
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    n = batch.completion_ids.shape[1]
    return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -n - 1 : -1].float() / T


def reference(model, batch, floor=None):
    """(logp, entropy) of each completion token written out: full logits, the kept set (tokens at
    or above the floor, plus the target), the log-softmax over it."""
    z = full_logits(model, batch)
    y = batch.completion_ids
    keep = torch.ones_like(z, dtype=torch.bool)
    if floor is not None:
        keep = (z - z.logsumexp(-1, keepdim=True)) >= floor[..., None]
        keep |= nn.functional.one_hot(y, z.shape[-1]).bool()
    zk = z.masked_fill(~keep, -math.inf)
    logq = zk - zk.logsumexp(-1, keepdim=True)
    logp = logq.gather(-1, y[..., None])[..., 0]
    ent = -(logq.exp() * logq.masked_fill(~keep, 0)).sum(-1)
    m = batch.completion_mask
    return logp * m, ent * m


# --- truncated, by hand ---


def test_truncated_keeps_the_top_p_set_and_the_target_by_hand():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    z = probs.log().repeat(2, 3, 1) + torch.arange(6.0).view(2, 3, 1)  # (B=2, T=3, V=4); a shift per position
    lse = z.logsumexp(-1)  # (2, 3)
    logq = z - lse[..., None]  # the same expression truncated uses, so a floor can sit exactly on a token
    floor = (torch.stack([logq[0, 0, 1], logq[0, 1, 0], logq[0, 2, 3], logq[1, 0, 2], logq[1, 1, 1], logq[1, 2, 0]])
             .view(2, 3))
    targets = torch.tensor([[3, 2, 0], [3, 0, 1]])
    out = truncated(z, lse, floor, targets)
    want = [[[1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 1]],  # a token exactly at the floor is kept (>=)
            [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]]  # the target is kept below the floor
    assert torch.isfinite(out).int().tolist() == want
    assert torch.equal(out[torch.isfinite(out)], z[torch.isfinite(out)])  # kept logits unchanged
    assert truncated(z, lse, None, targets) is z


# --- which heads take the chunked path ---


class Head(nn.Linear):
    """An lm_head that is not a plain nn.Linear (a subclass may scale or cap in forward)."""


def test_plain_head_is_a_bias_free_linear_without_logit_scaling(tiny):
    assert plain_head(tiny.model)
    cases = {"bias": lambda m: setattr(m, "lm_head", nn.Linear(64, 76, bias=True)),
             "subclass": lambda m: setattr(m, "lm_head", Head(64, 76, bias=False)),
             "final_logit_softcapping": lambda m: setattr(m.config, "final_logit_softcapping", 30.0),
             "logit_scale": lambda m: setattr(m.config, "logit_scale", 2.0),
             "logits_scaling": lambda m: setattr(m.config, "logits_scaling", 2.0)}
    for name, change in cases.items():
        model = copy.deepcopy(tiny.model)
        change(model)
        assert not plain_head(model), name


def test_a_head_with_a_bias_is_scored_with_its_bias(tiny, batch):
    model = copy.deepcopy(tiny.model)
    model.lm_head = nn.Linear(64, 76, bias=True)
    nn.init.normal_(model.lm_head.bias, std=1.0)  # large enough that ignoring it shows
    want, _ = reference(model, batch)
    for chunked in (True, False):
        got, _ = completion_logprobs(model, batch, T, chunked=chunked)
        # the full path leaves pads unmasked
        assert torch.allclose(got * batch.completion_mask, want, atol=1e-5), chunked


# --- entropy modes ---


@pytest.mark.parametrize("chunked", [True, False])
def test_entropy_modes(tiny, batch, chunked):
    _, want = reference(tiny.model, batch)
    m = batch.completion_mask
    assert policy_forward(tiny.model, batch, Scoring(T, chunked=chunked)).entropy is None  # the default: not computed
    assert policy_forward(tiny.model, batch, Scoring(T, chunked=chunked), entropy="none").entropy is None
    det = policy_forward(tiny.model, batch, Scoring(T, chunked=chunked), entropy="detached").entropy
    assert not det.requires_grad and det.dtype == torch.float32 and torch.allclose(det * m, want, atol=1e-5)
    grad = policy_forward(tiny.model, batch, Scoring(T, chunked=chunked), entropy="grad")
    assert grad.entropy.requires_grad and grad.logp.requires_grad
    with torch.no_grad():
        assert not policy_forward(tiny.model, batch, Scoring(T, chunked=chunked), entropy="grad").entropy.requires_grad
    with pytest.raises(ValueError, match="entropy='detach'"):
        policy_forward(tiny.model, batch, Scoring(T, chunked=chunked), entropy="detach")


def test_completion_logprobs_gives_entropy_only_when_asked(tiny, batch):
    _, want = reference(tiny.model, batch)
    logp, ent = completion_logprobs(tiny.model, batch, T)
    assert ent is None and logp.dtype == torch.float32
    _, ent = completion_logprobs(tiny.model, batch, T, with_entropy=True)
    assert not ent.requires_grad and torch.allclose(ent * batch.completion_mask, want, atol=1e-5)


def reached(monkeypatch):
    """A spy on the routes model/routes.py can take. The returned function gives what the calls since
    its last call reached, in order: ("shared", run) or ("full", run) for completion_states' two
    forwards, run being "decoder" (final hidden states) or "lm" (the *ForCausalLM's logits), then
    "chunked" where ChunkedLogp scored the tokens. The route is read, not inferred from rounding: the
    two forwards agree bit for bit on some CPUs (Intel AMX) and not on others."""
    seen = []

    def spy(name, real):
        def wrapped(module, batch, *rest):  # run is the last positional argument of both
            run = rest[-1]
            seen.append((name, "decoder" if run is routes.backbone else "lm" if run is routes.causal_lm else run))
            return real(module, batch, *rest)
        return wrapped

    monkeypatch.setattr(routes, "shared_prefix", spy("shared", routes.shared_prefix))
    monkeypatch.setattr(routes, "full", spy("full", routes.full))
    apply = ChunkedLogp.apply
    monkeypatch.setattr(ChunkedLogp, "apply", lambda *a: seen.append("chunked") or apply(*a))

    def take():
        got = list(seen)
        seen.clear()
        return got
    return take


def test_the_defaults_are_the_shared_prefix_chunked_path(tiny, batch, monkeypatch):
    # the batch has prompts to share (groups of 4) and left padding, so each flag has a path to choose
    assert len(batch.group_ids.unique()) < len(batch) and not batch.prompt_mask.all()
    took = reached(monkeypatch)
    shared_chunked = [("shared", "decoder"), "chunked"]
    explicit = policy_forward(tiny.model, batch, Scoring(T, share_prefix=True, chunked=True)).logp
    assert took() == shared_chunked
    assert torch.equal(policy_forward(tiny.model, batch, Scoring(T)).logp, explicit) and took() == shared_chunked
    assert torch.equal(completion_logprobs(tiny.model, batch, T)[0], explicit) and took() == shared_chunked
    # each other path is reached by its flag, and scores the same distribution
    for s, c, route in ((False, True, [("full", "decoder"), "chunked"]), (True, False, [("shared", "lm")])):
        other = policy_forward(tiny.model, batch, Scoring(T, share_prefix=s, chunked=c)).logp
        assert took() == route, (s, c)
        assert torch.allclose(other * batch.completion_mask, explicit, atol=1e-5), (s, c)


# --- the value head ---


def decoder_states(model, batch):  # (B, T, H) final hidden states at the positions that predict each token
    ids, attn = batch.input_ids(), batch.attention_mask()
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    n = batch.completion_ids.shape[1]
    return model.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state[:, -n - 1 : -1]


@pytest.mark.parametrize("chunked", [True, False])
def test_a_shared_value_head_reads_the_policys_final_states_on_both_paths(tiny, batch, chunked):
    torch.manual_seed(1)
    head = nn.Linear(64, 1)
    want = head(decoder_states(tiny.model, batch)).squeeze(-1)
    out = policy_forward(tiny.model, batch, Scoring(T, chunked=chunked, value_head=head))
    m = batch.completion_mask
    assert out.values.shape == m.shape and out.values.dtype == torch.float32
    assert torch.allclose(out.values * m, want * m, atol=1e-5)
    plain = policy_forward(tiny.model, batch, Scoring(T, chunked=chunked)).logp  # the head changes no log-prob
    assert torch.allclose(out.logp, plain, atol=1e-6)
    assert policy_forward(tiny.model, batch, Scoring(T, chunked=chunked)).values is None


def test_a_separate_critics_values_are_its_trunks_states_through_its_head(tiny, batch):
    torch.manual_seed(1)
    head = nn.Linear(64, 1)
    want = head(decoder_states(tiny.model, batch)).squeeze(-1) * batch.completion_mask
    default = completion_values(tiny.model.get_decoder(), head, batch)
    assert torch.allclose(default * batch.completion_mask, want, atol=1e-5)
    assert torch.equal(default, completion_values(tiny.model.get_decoder(), head, batch, share_prefix=True))


# --- the top-p floor through both paths ---


def with_floor(model, batch):
    """A copy of ``batch`` with a top-p floor per token: 0.05 nats below the sampled token's
    log-prob on most tokens (several tokens kept), above it on every third (the target is kept
    only because it was drawn)."""
    with torch.no_grad():
        z = full_logits(model, batch)
        own = (z - z.logsumexp(-1, keepdim=True)).gather(-1, batch.completion_ids[..., None])[..., 0]
    shift = torch.full_like(own, -0.05)
    shift.view(-1)[::3] = 0.5
    b = copy.deepcopy(batch)
    b.sampler_floor = (own + shift) * b.completion_mask
    return b


def test_a_top_p_floor_scores_the_truncated_distribution_on_both_paths(tiny, batch, monkeypatch):
    b = with_floor(tiny.model, batch)
    want_lp, want_ent = reference(tiny.model, b, b.sampler_floor)
    full_lp, _ = reference(tiny.model, b)
    m = b.completion_mask
    assert (want_lp[m] > full_lp[m] + 1e-3).float().mean() > 0.9  # the truncation matters on nearly every token
    monkeypatch.setattr(chunked_mod, "CHUNK_TOKENS", 7)  # several chunks
    grads = []
    for chunked in (True, False):
        model = copy.deepcopy(tiny.model)
        out = policy_forward(model, b, Scoring(T, chunked=chunked), entropy="grad")
        assert torch.allclose(out.logp * m, want_lp, atol=1e-5) and torch.allclose(out.entropy * m, want_ent, atol=1e-5)
        w = torch.linspace(0.5, 1.5, m.numel()).view(m.shape) * m
        ((out.logp * w).sum() + 0.3 * (out.entropy * w).sum()).backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.allclose(a, c, atol=1e-5) for a, c in zip(*grads))


# --- ChunkedLogp itself ---


def rows(n=20, h=8, v=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, h, generator=g, requires_grad=True), torch.randn(v, h, generator=g, requires_grad=True),
            torch.randint(0, v, (n,), generator=g))


def test_each_token_runs_through_the_head_once_in_chunks(monkeypatch):
    h, w, y = rows()
    monkeypatch.setattr(chunked_mod, "CHUNK_TOKENS", 7)
    seen = []
    real = ChunkedLogp._logits
    monkeypatch.setattr(ChunkedLogp, "_logits", staticmethod(lambda hh, ww: seen.append(len(hh)) or real(hh, ww)))
    logp, ent = ChunkedLogp.apply(h, w, y, HeadSpec(T, torch.float32, True), None)
    assert seen == [7, 7, 6]  # forward: 20 tokens in chunks of 7
    (logp.sum() + ent.sum()).backward()
    assert seen == [7, 7, 6]  # the backward reads the logits the forward kept: no second pass through the head


def manual(h, w, y, dtype):
    z = (h.to(dtype) @ w.to(dtype).T).float() / T
    logq = z.log_softmax(-1)
    return logq.gather(-1, y[:, None])[:, 0], -(logq.exp() * logq).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_values_and_gradients_match_autograd_in_the_head_dtype(dtype, monkeypatch):
    # bf16: the lm_head matmul runs in bf16 (as autocast would run it), the softmax in float32
    monkeypatch.setattr(chunked_mod, "CHUNK_TOKENS", 7)
    h, w, y = rows()
    gl, ge = torch.linspace(0.5, 1.5, len(y)), torch.linspace(-1, 1, len(y))
    out = ChunkedLogp.apply(h, w, y, HeadSpec(T, dtype, True), None)
    assert out[0].dtype == out[1].dtype == torch.float32
    (out[0] @ gl + out[1] @ ge).backward()
    got = (out[0].detach(), out[1].detach(), h.grad.clone(), w.grad.clone())
    assert got[2].dtype == h.dtype and got[3].dtype == w.dtype
    h.grad = w.grad = None
    want = manual(h, w, y, dtype)
    (want[0] @ gl + want[1] @ ge).backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the closed form and autograd round differently
    assert torch.allclose(got[0], want[0].detach(), atol=1e-5) and torch.allclose(got[1], want[1].detach(), atol=1e-5)
    assert torch.allclose(got[2], h.grad, atol=tol, rtol=tol) and torch.allclose(got[3], w.grad, atol=tol, rtol=tol)
    if dtype == torch.bfloat16:  # the values are the bf16 matmul's, not float32's
        fp32 = manual(h.detach(), w.detach(), y, torch.float32)[0]
        assert (got[0] - fp32).abs().max() > 1e-4


def test_a_frozen_head_gets_no_gradient_and_the_states_still_do():
    h, w, y = rows()
    w = w.detach()  # LoRA: the base model's head is frozen
    logp, _ = ChunkedLogp.apply(h, w, y, HeadSpec(T, torch.float32, False), None)
    logp.sum().backward()
    got = h.grad.clone()
    h.grad = None
    manual(h, w, y, torch.float32)[0].sum().backward()
    assert torch.allclose(got, h.grad, atol=1e-6)


def test_no_tokens_give_a_zero_head_gradient():
    h, w, y = rows(n=0)
    logp, ent = ChunkedLogp.apply(h, w, y, HeadSpec(T, torch.float32, True), None)
    (logp.sum() + ent.sum()).backward()
    assert logp.shape == (0,) and torch.equal(w.grad, torch.zeros_like(w))


# --- the arguments each entry point passes on, bit for bit ---


def test_share_prefix_and_chunked_reach_the_forward_they_name(tiny, batch, monkeypatch):
    # every entry point, every combination of the flags: the forward reached (a spy, not a rounding
    # difference) is the one the flags name, so a flag dropped on its way down shows
    dec = tiny.model.get_decoder()
    torch.manual_seed(1)
    head = nn.Linear(64, 1)
    took = reached(monkeypatch)
    for share_prefix in (True, False):
        forward = "shared" if share_prefix else "full"
        for chunked in (True, False):
            route = [(forward, "decoder"), "chunked"] if chunked else [(forward, "lm")]
            with_head = [(forward, "decoder")] + (["chunked"] if chunked else [])  # the head reads hidden states
            scoring = Scoring(T, share_prefix=share_prefix, chunked=chunked, value_head=head)
            out = policy_forward(tiny.model, batch, scoring)
            assert took() == with_head and out.values is not None, (share_prefix, chunked)
            want = policy_forward(tiny.model, batch, Scoring(T, share_prefix=share_prefix, chunked=chunked)).logp
            assert took() == route, (share_prefix, chunked)
            got = completion_logprobs(tiny.model, batch, T, share_prefix=share_prefix, chunked=chunked)[0]
            assert took() == route and torch.equal(got, want), (share_prefix, chunked)
        completion_values(dec, head, batch, share_prefix=share_prefix)
        assert took() == [(forward, "decoder")], share_prefix
    completion_values(dec, head, batch)
    assert took() == [("shared", "decoder")]  # the critic's default


def test_rows_that_share_no_prompt_take_the_full_forward(tiny, batch):
    b = batch.select(torch.tensor([0, 4, 8]))  # one row of each group: nothing to share
    b.group_ids = torch.arange(3)
    shared, _ = completion_logprobs(tiny.model, b, T, share_prefix=True)
    assert torch.equal(shared, completion_logprobs(tiny.model, b, T, share_prefix=False)[0])


def test_checkpointing_is_read_from_the_model():
    from rlpost.model.logprobs import checkpointing

    assert not checkpointing(nn.Linear(2, 2))  # a module with neither flag is not checkpointing


def gpt2_like(tiny):
    """A random GPT-2 on the tiny tokenizer: learned absolute positions, where a position off by one
    changes the output (Llama's rotary positions are relative, so a shift of a whole row is invisible)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=76, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2,
                     pad_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("share_prefix", [True, False])
def test_left_padding_changes_no_log_prob_under_absolute_positions(tiny, batch, share_prefix):
    model = gpt2_like(tiny)
    got, _ = completion_logprobs(model, batch, T, share_prefix=share_prefix)
    n = batch.completion_ids.shape[1]
    for i in range(len(batch)):  # each row alone, without its left padding, positions from 0
        ids = torch.cat([batch.prompt_ids[i][batch.prompt_mask[i]], batch.completion_ids[i]])[None]
        with torch.no_grad():
            z = model(input_ids=ids).logits[0, -n - 1 : -1].float() / T
        want = z.log_softmax(-1).gather(-1, batch.completion_ids[i][:, None])[:, 0]
        m = batch.completion_mask[i]
        assert torch.allclose(got[i][m], want[m], atol=1e-5), i
    assert not batch.prompt_mask.all()  # some rows were padded


# --- the dtypes the forward computes in ---


def test_the_head_runs_in_autocasts_dtype_or_the_weights(tiny, batch, monkeypatch):
    # ChunkedLogp's backward runs outside autocast, so the forward must hand it the dtype autocast
    # would use (bf16), or else the weights' own; the results are float32 either way
    from rlpost.model.precision import cast_params

    seen, apply = [], ChunkedLogp.apply
    monkeypatch.setattr(ChunkedLogp, "apply", lambda *a: seen.append((a[3].dtype, a[3].entropy)) or apply(*a))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = policy_forward(tiny.model, batch, Scoring(T), entropy="detached")
    assert got.logp.dtype == got.entropy.dtype == torch.float32
    policy_forward(tiny.model, batch, Scoring(T))
    policy_forward(cast_params(copy.deepcopy(tiny.model), torch.bfloat16), batch, Scoring(T), entropy="grad")
    # (dtype, whether the entropy is computed at all: not for entropy="none")
    assert seen == [(torch.bfloat16, True), (torch.float32, False), (torch.bfloat16, True)]


def test_a_bf16_model_still_gives_float32_log_probs_and_entropies(tiny, batch):
    from rlpost.model.precision import cast_params

    model = cast_params(copy.deepcopy(tiny.model), torch.bfloat16)  # trainer.param_dtype=bfloat16
    for chunked in (True, False):
        out = policy_forward(model, batch, Scoring(T, chunked=chunked), entropy="detached")
        assert out.logp.dtype == out.entropy.dtype == torch.float32, chunked
    h, w, y = rows()
    logp, ent = ChunkedLogp.apply(h.detach().bfloat16(), w.detach().bfloat16(), y, HeadSpec(T, torch.bfloat16, True),
                                  None)
    assert logp.dtype == ent.dtype == torch.float32
