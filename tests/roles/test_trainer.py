"""Trainer: accumulation invariance, no gradient through prompt or pad tokens, schedules."""

import copy
import math
from dataclasses import replace

import pytest
import torch
from helpers import make_batch, objective, rl_batch, tcfg, tiny_cfg
from hypothesis import example, given
from hypothesis import strategies as st

from rlpost import algorithms
from rlpost.algorithms import ALGORITHMS, core
from rlpost.algorithms.grpo import GRPO
from rlpost.model import packed
from rlpost.model.logprobs import CACHE_KW, Scoring, completion_logprobs
from rlpost.model.lora import wrap as lora_wrap
from rlpost.roles.critic import Critic
from rlpost.model.optim import lr_lambda
from rlpost.roles.row_plan import ShardedPlan, at_group_starts
from rlpost.build import trainer_over
from rlpost.roles.forward_plan import SamplerDiffs


def stepped(tr, batch, loss_fn, params=None) -> tuple[list[torch.Tensor], dict]:
    """(the gradients ``update``'s optimizer step read, ``update``'s metrics) for one mini-batch: the
    trainer's public verb, the gradients copied by the optimizer's own step pre-hook. They are the
    summed gradient of the mini-batch, the tied lookup's rows folded into the head's (as the step reads
    them), clipped at trainer.max_grad_norm (set out of reach here where a test compares values)."""
    seen = []
    params = tr.params if params is None else params
    hook = tr.opt.register_step_pre_hook(lambda opt, a, k: seen.append([p.grad.clone() for p in params
                                                                          if p.grad is not None]))
    metrics = tr.update(batch, loss_fn)
    hook.remove()
    return seen[0], metrics


@pytest.mark.parametrize("agg", [core.token_mean, core.seq_mean_token_mean, core.seq_mean_token_sum])
def test_micro_batch_times_accumulation_equals_full_batch(tiny, agg):
    batch = make_batch(tiny)
    algo = GRPO(group_size=4, aggregate=agg)
    batch.advantages = algo.advantages(batch).tokens
    grads = []
    for micro in (16, 4, 1, 3, 5):  # 3 and 5 cut 16 rows unevenly (a last, smaller micro-batch)
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=micro,
                     total_optimizer_steps=1)
        grads.append(stepped(tr, copy.deepcopy(batch), algo.loss)[0])
    for g in grads[1:]:
        assert all(torch.allclose(a, c, atol=1e-6, rtol=1e-5) for a, c in zip(grads[0], g))
    assert any(g.abs().sum() > 0 for g in grads[0])


def test_cuts_move_onto_group_starts_by_hand():
    # pairs: a cut inside a pair moves back to its start; a group longer than the cut is a micro-batch of its own
    assert at_group_starts([0, 3, 5, 8], torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])) == [0, 2, 4, 8]
    assert at_group_starts([0, 2, 4, 6], torch.tensor([0, 0, 0, 1, 1, 1])) == [0, 3, 6]
    assert at_group_starts([0, 1, 2, 3], torch.tensor([5, 6, 7])) == [0, 1, 2, 3]  # one row a group: as cut
    assert at_group_starts([0], torch.tensor([], dtype=torch.long)) == [0]


@pytest.mark.parametrize("share", [0, 1.5])
def test_head_gradient_held_within_its_budget(tiny, share, monkeypatch):
    # HeadGrad holds each micro-batch's dz until the mini-batch ends; past budgets.head_grad_bytes (0 on
    # a GPU) the trainer flushes it after the micro-batch. The gradient is the same either way.
    from rlpost.model import budgets, logprobs

    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    held, flushes, grads = [], [], []
    real_flush = logprobs.HeadGrad.flush
    monkeypatch.setattr(logprobs.HeadGrad, "flush", lambda self, w: held.append(self.held()) or flushes.append(1)
                        or real_flush(self, w))
    for limit in (None, share):  # no budget, then `share` micro-batches' worth
        monkeypatch.setattr(budgets, "head_grad_bytes", lambda gpu, n=limit: 2**40 if n is None else int(n * one))
        held.clear(), flushes.clear()
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=4,
                     total_optimizer_steps=1)
        grads.append(stepped(tr, copy.deepcopy(batch), algo.loss)[0])
        if limit is None:  # one flush at the end, of all four micro-batches
            assert len([h for h in held if h]) == 1
            one = max(held) / 4
        else:  # every flush held at most what crossed the budget: one micro-batch more than it
            assert len([h for h in held if h]) >= (4 if share == 0 else 2)
            assert all(h <= (share + 1.5) * one for h in held)
    assert all(torch.allclose(a, c, atol=1e-6, rtol=1e-5) for a, c in zip(*grads))


def test_micro_batches_read_nothing_back_to_the_host(tiny, monkeypatch):
    # On a GPU a value read back to the host (.item(), a nonzero, a max turned into an int) waits for
    # the device. Between one micro-batch's backward and the next one's forward that wait leaves the
    # GPU idle while the host queues the next forward: so nothing there reads back (the metric sums stay
    # on the device: DeviceSums) and the cuts and the fed tokens' layout are planned before the first
    # micro-batch. Read here on the trunk's CUDA branch, by a dispatch mode, through ``update``: from the
    # end of each micro-batch's loss (before its backward) to the start of the next one's, and after the
    # last until the mini-batch picks its sampler differences (SamplerDiffs.pick, which reads back, as the
    # end of the mini-batch may). The algorithm's own metrics (inside the loss) are left out.
    from torch.utils._python_dispatch import TorchDispatchMode

    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    reads, watching, losses = [], [False], []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if watching[0] and func.overloadpacket.__name__ in ("_local_scalar_dense", "nonzero", "is_nonzero",
                                                                  "equal", "item", "masked_select"):
                reads.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    def loss(logp, mb, *, values=None, entropy=None):
        watching[0] = False
        losses.append(len(mb))
        try:
            return algo.loss(logp, mb)
        finally:
            watching[0] = True

    pick = SamplerDiffs.pick
    monkeypatch.setattr(SamplerDiffs, "pick", lambda self: watching.__setitem__(0, False) or pick(self))
    monkeypatch.setattr(packed, "on_gpu", lambda x: True)
    tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=4,
                      total_optimizer_steps=1)
    assert packed.trunk_of(tr.model) is not None  # the packed trunk's forward, whose layout is planned
    with Watch():
        metrics = tr.update(copy.deepcopy(batch), loss)
    assert len(losses) == 4 and reads == []  # three micro-batches' forwards, four backwards watched
    assert all(isinstance(metrics[k], float) for k in ("actor/loss", "actor/pg_loss", "actor/entropy"))
    assert sum(metrics["hist/sampler_ratio"]) == int(batch.completion_mask.sum())  # every loss token's difference


def test_token_bounds_by_hand():
    from rlpost.roles.row_plan import token_bounds

    # prompt 2, at most 12 tokens: rows of length 1, 1, 2 (3 x 4 = 12) | 4, 4 (2 x 6) | 9 alone (11);
    # a row longer than the budget still makes a micro-batch of its own
    assert token_bounds([1, 1, 2, 4, 4, 9], 2, 12) == [0, 3, 5, 6]
    assert token_bounds([30], 2, 12) == [0, 1] and token_bounds([], 2, 12) == [0]
    # a long row first (issue 51): 1 | 9 | 1, 1 (1 + 9 + 2 tokens); the 9 never rides with the rows after it
    assert token_bounds([1, 9, 1, 1], 0, 12) == [0, 1, 2, 4]


@given(st.lists(st.integers(0, 20), max_size=12), st.integers(0, 5), st.integers(0, 40))
@example([1, 9, 1, 1], 0, 0)
def test_token_bounds_keep_every_micro_batch_within_its_budget_and_fill_it(lengths, prompt, slack):
    # a budget is a memory promise: n rows padded to the longest of them, n x (prompt + L) <= tokens, whenever
    # one row alone fits; and each cut takes as many rows as fit, so the next row would not have
    from rlpost.roles.row_plan import token_bounds

    tokens = prompt + max(lengths, default=0) + slack
    bounds = token_bounds(lengths, prompt, tokens)
    assert bounds[0] == 0 and bounds[-1] == len(lengths) and all(a < b for a, b in zip(bounds, bounds[1:]))
    for a, b in zip(bounds, bounds[1:]):
        assert (b - a) * (prompt + max(lengths[a:b])) <= tokens, (a, b)
        if b < len(lengths):
            assert (b + 1 - a) * (prompt + max(lengths[a : b + 1])) > tokens, (a, b)


@st.composite
def padded_rows(draw):
    """A batch as the trainer gets it: left-padded prompts, and completion masks with holes (a
    multi-turn episode's environment tokens), masked tokens after the last loss token, and rows
    with no loss token at all (a failed episode); a budget one row alone fits; an order."""
    B, T, P = draw(st.integers(1, 8)), draw(st.integers(1, 10)), draw(st.integers(1, 4))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    for b, end in enumerate(draw(st.lists(st.integers(0, T), min_size=B, max_size=B))):
        mask[b, end:] = False  # environment tokens (or nothing) after the last loss token; end 0: an empty row
    used = draw(st.lists(st.integers(1, P), min_size=B, max_size=B))
    prompt_mask = torch.tensor([[c >= P - n for c in range(P)] for n in used])
    extent = max((int(m.nonzero().max()) + 1 if m.any() else 1) for m in mask)
    tokens = P + extent + draw(st.integers(0, 40))
    batch = rl_batch(mask, prompt_ids=torch.zeros(B, P, dtype=torch.long), prompt_mask=prompt_mask,
                     group_ids=torch.arange(B) // 2)
    return batch, tokens, draw(st.sampled_from(["rows", "groups", "own_length"]))


@given(padded_rows())
@example((rl_batch(torch.zeros(4, 3, dtype=torch.bool), prompt_ids=torch.zeros(4, 2, dtype=torch.long),
                   prompt_mask=torch.ones(4, 2, dtype=torch.bool)), 8, "own_length"))
def test_micro_batches_by_tokens_stay_within_the_budget_as_the_trainer_pads_them(case):
    # what the trainer runs is each micro-batch trimmed (Rollouts.trimmed): every row once, and rows x
    # (its prompt + completion columns) <= trainer.micro_batch_tokens. Four rows without a loss token,
    # a 2-token prompt, 8 tokens: counted as 4 x 2 they were one micro-batch, which trimmed keeps one
    # completion column of: 4 x 3 = 12
    from rlpost.roles.row_plan import LocalPlan

    batch, tokens, order = case
    cuts = LocalPlan().micro_batches(batch, 4, order, tokens)
    assert sorted(torch.cat([i for _, i in cuts]).tolist()) == list(range(len(batch)))
    for mb, _ in cuts:
        t = mb.trimmed()
        assert len(t) * (t.prompt_ids.shape[1] + t.completion_ids.shape[1]) <= tokens, (mb.completion_mask, tokens)


@pytest.mark.parametrize("rows_of_longest", [1, 3, 16])
def test_micro_batches_by_tokens_accumulate_the_full_batch_gradient(tiny, rows_of_longest):
    # trainer.micro_batch_tokens: rows sorted by length, as many a micro-batch as fit; the gradient is
    # the whole mini-batch's (micro-batches by rows), whichever cut, with prompts once per mini-batch and without
    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    P, T = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    tokens = rows_of_longest * (P + T)  # room for this many rows of the longest completion
    grads = []
    for kw in ({}, {"micro_batch_tokens": tokens}, {"micro_batch_tokens": tokens, "prompts_once": False}):
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(**kw), 1.0, mini_batch_size=16, micro_batch_size=16,
                     total_optimizer_steps=1)
        if kw:
            for order in ("own_length", "groups", "rows"):
                cuts = tr.plan.micro_batches(batch, 16, order, tokens)
                assert sorted(torch.cat([i for _, i in cuts]).tolist()) == list(range(16))  # every row once
                assert all(len(mb) * (P + mb.trimmed().completion_ids.shape[1]) <= tokens for mb, _ in cuts)
                # at least as many rows a cut as the longest rows allow, fewer cuts where rows are shorter
                assert len(cuts) <= math.ceil(16 / rows_of_longest)
            assert (len(cuts) == 1) == (rows_of_longest == 16)
        grads.append(stepped(tr, copy.deepcopy(batch), algo.loss)[0])
    for g in grads[1:]:
        assert all(torch.allclose(a, c, atol=1e-6, rtol=1e-5) for a, c in zip(grads[0], g))


def test_prompt_and_pad_tokens_carry_no_gradient(tiny):
    # Gradient of the GRPO loss w.r.t. each input position's embedding, through the plain forward
    # (one embedding call covering prompt + completion).
    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    model = copy.deepcopy(tiny.model)
    grads_at = {}

    def keep_grad(module, inputs, out):
        out.register_hook(lambda g: grads_at.setdefault("g", g))

    h = model.get_input_embeddings().register_forward_hook(keep_grad)
    logp, _ = completion_logprobs(model, batch, temperature=1.0, share_prefix=False)
    batch.old_logp = logp.detach()
    algo.loss(logp, batch)[0].backward()
    h.remove()
    g = grads_at["g"].abs().sum(-1)  # (B, P+T) gradient magnitude at each input position
    P = batch.prompt_ids.shape[1]
    mask = batch.completion_mask
    # The last loss token's own input never matters (it predicts nothing that is scored), nor does
    # anything after it: post-EOS pads. Positions that do feed a loss token: real prompt tokens and
    # completion tokens before the last loss token.
    last = mask.long().cumsum(1).argmax(1)  # index of the last loss token per row
    after_last = torch.arange(mask.shape[1])[None, :] >= last[:, None]
    assert (g[:, :P][~batch.prompt_mask] == 0).all(), "left-pad prompt tokens received gradient"
    assert (g[:, P:][after_last] == 0).all(), "pad / post-EOS tokens received gradient"
    assert (g[:, :P][batch.prompt_mask] > 0).any()


def test_changing_pad_contents_changes_nothing(tiny):
    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    other = copy.deepcopy(batch)
    other.prompt_ids[~other.prompt_mask] = 17  # garbage in the left padding
    other.completion_ids[~other.completion_mask] = 23  # garbage after EOS
    losses = []
    for b in (batch, other):
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=16,
                     total_optimizer_steps=1)
        g, m = stepped(tr, copy.deepcopy(b), algo.loss)
        losses.append((m["actor/pg_loss"], g))
    assert losses[0][0] == losses[1][0]
    assert all(torch.allclose(a, c, atol=1e-7) for a, c in zip(losses[0][1], losses[1][1]))


def test_update_changes_weights_and_reports_metrics(tiny):
    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    tr = trainer_over(copy.deepcopy(tiny.model), tcfg(lr=1e-2), 1.0, mini_batch_size=8, micro_batch_size=4,
                 total_optimizer_steps=4)
    before = [p.detach().clone() for p in tr.params]
    m = tr.update(batch, algo.loss)
    assert any(not torch.equal(a, p) for a, p in zip(before, tr.params))
    # (what each metric averages is checked in test_update_averages_metrics_over_epochs_and_mini_batches)
    assert m["actor/lr"] == 1e-2 and m["actor/grad_norm"] > 0 and 0 < m["actor/entropy"] <= math.log(76)
    assert 0 <= m["actor/pg_clipfrac"] <= 1 and sum(m["hist/sampler_ratio"]) == int(batch.completion_mask.sum())
    # two mini-batches -> the old log-probs were recomputed before the first step, so the first
    # mini-batch's ratio is exactly 1 (ppo_kl 0) and the second's is not (the first step moved the
    # weights): their average ppo_kl is the second's half, not 0
    assert abs(m["actor/ppo_kl"]) > 1e-6 and batch.old_logp is None  # the caller's batch is not written
    assert m["actor/logp_diff_sampler_mean"] < 1e-5  # float32 sampler == trainer


def test_lr_schedules_by_hand():
    # warm-up of 2: steps 0, 1 -> 1/2, 2/2
    assert lr_lambda(0, 2, 10, "constant", 0.1) == 0.5 and lr_lambda(1, 2, 10, "constant", 0.1) == 1.0
    # linear from 1 to 0.1 over steps 2..10: at step 6 progress = 4/8 -> 1 - 0.9 * 0.5 = 0.55
    assert math.isclose(lr_lambda(6, 2, 10, "linear", 0.1), 0.55)
    # cosine at progress 0.5: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55; at the end: 0.1
    assert math.isclose(lr_lambda(6, 2, 10, "cosine", 0.1), 0.55)
    assert math.isclose(lr_lambda(10, 2, 10, "cosine", 0.1), 0.1)


def test_gradient_checkpointing_gives_the_same_gradients(tiny):
    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    grads = []
    for gc in (False, True):
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=8,
                     total_optimizer_steps=1, gradient_checkpointing=gc)
        grads.append(stepped(tr, copy.deepcopy(batch), algo.loss)[0])
    assert all(torch.allclose(a, c, atol=1e-6) for a, c in zip(*grads))


def test_reported_metrics_do_not_depend_on_micro_batching(tiny):
    # actor/loss adds up micro-batch shares; the intensive metrics are token-share weighted, so
    # both read the same whether the mini-batch runs in 1 or 4 micro-batches.
    batch = make_batch(tiny)
    algo = GRPO(group_size=4, kl_coef=0.1)
    batch.advantages = algo.advantages(batch).tokens
    batch.ref_logp = torch.zeros_like(batch.sampler_logp)
    reports = []
    for micro in (16, 4):
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=micro,
                     total_optimizer_steps=1)
        reports.append(tr.update(copy.deepcopy(batch), algo.loss))
    for key in ("actor/loss", "actor/pg_loss", "actor/kl", "actor/entropy", "actor/pg_clipfrac"):
        assert math.isclose(reports[0][key], reports[1][key], rel_tol=1e-4, abs_tol=1e-7), key


def test_ratio_histogram_bins():
    from rlpost.algorithms.core import RATIO_EDGES, ratio_histogram

    # 0.3 -> [0, 0.5); 1.0 twice -> [0.99, 1.01); 1.02 -> [1.01, 1.05); 3.0 -> [2, inf)
    counts = ratio_histogram(torch.tensor([1.0, 1.0, 0.3, 3.0, 1.02]))
    assert len(counts) == len(RATIO_EDGES) - 1 and sum(counts) == 5
    assert counts[0] == 1 and counts[5] == 2 and counts[6] == 1 and counts[-1] == 1


def test_tis_inside_the_loss_needs_no_old_logprob_pass(tiny):
    # One optimizer step: the trainer takes old_logp from its first forward, so TIS in the loss
    # (algorithms.with_tis) must give what it gives with old_logp recomputed beforehand. The
    # sampler's log-probs are perturbed so that the weights are not all 1 and some are capped.
    from rlpost.algorithms.wrappers import with_tis

    batch = make_batch(tiny)
    torch.manual_seed(1)
    batch.sampler_logp = (batch.sampler_logp + 0.3 * torch.randn_like(batch.sampler_logp)) * batch.completion_mask
    algo = GRPO(group_size=4, aggregate=core.token_mean)
    batch.advantages = algo.advantages(batch).tokens
    loss_fn = with_tis(algo.loss, cap=1.2, level="token")
    grads, metrics = [], []
    for precompute in (False, True):
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=4,
                     total_optimizer_steps=1)
        b = copy.deepcopy(batch)
        if precompute:
            b.old_logp = tr.recompute(b)[0]
        g, m = stepped(tr, b, loss_fn)
        grads.append(g)
        metrics.append(m)
    assert all(torch.allclose(a, c, atol=1e-6, rtol=1e-5) for a, c in zip(*grads))
    assert 0 < metrics[0]["actor/tis_capped_frac"] < 1
    assert metrics[0]["actor/tis_weight_mean"] == pytest.approx(metrics[1]["actor/tis_weight_mean"], rel=1e-5)
    plain = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=4,
                    total_optimizer_steps=1)
    without = stepped(plain, copy.deepcopy(batch), algo.loss)[0]  # without TIS the gradient differs: the weights did
    assert not all(torch.allclose(a, c, atol=1e-6) for a, c in zip(without, grads[0]))  # something


def with_holes(batch):
    """The batch with a 2-token hole in every other completion that has 4+ tokens (a tool's
    observation: sampled context that gets no loss), as the environment rollout makes them."""
    mask = batch.completion_mask.clone()
    for i in range(0, len(batch), 2):
        if mask[i].sum() >= 4:
            mask[i, 1:3] = False
    batch.completion_mask = mask
    return batch


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_accumulates_exactly_through_the_trainer(tiny, name):
    # One mini-batch of 16 rows as 1, 4 or 16 micro-batches (length-sorted and trimmed by the
    # trainer): the same gradient, with the algorithm's KL term and an entropy bonus on, and holes.
    traits = ALGORITHMS[name].traits
    kl = [] if traits.kl == "none" else ["algo.kl_coef=0.1"]
    kl += ["algo.teacher=tiny"] if traits.teacher else []  # distill: its advantages read ref_logp (set below)
    reads = algorithms.knobs_read(ALGORITHMS[name])  # train refuses a key its algorithm ignores
    knobs = [k for k in ("algo.loss_agg=seq_mean_token_mean", "algo.clip_eps_low=0.1", "algo.clip_eps_high=0.3")
             if k[len("algo."):k.index("=")] in reads]
    role = objective(tiny_cfg(f"algo.name={name}", "algo.entropy_coef=0.01", *knobs, *kl))
    batch = with_holes(make_batch(tiny))
    assert (batch.completion_mask[:, 1:3] < batch.completion_mask[:, 3:4]).any()  # at least one hole
    torch.manual_seed(3)
    batch.ref_logp = batch.sampler_logp + 0.1 * torch.randn_like(batch.sampler_logp)
    grads = []
    for micro in (16, 4, 1):
        model = copy.deepcopy(tiny.model)
        critic = Critic(model, "separate") if traits.needs_values else None
        tr = trainer_over(model, tcfg(), 1.0, mini_batch_size=16, micro_batch_size=micro, total_optimizer_steps=1,
                     critic=critic, entropy_grad=True)
        if micro == 16:  # the advantages once (REINFORCE's baseline moves with every call)
            batch.old_logp, batch.old_values = tr.recompute(batch)
            batch.old_logp = batch.old_logp - 0.2 * batch.completion_mask  # ratios e^0.2: some tokens clip
            adv = role.advantages(batch)
            batch.advantages, batch.returns = adv.tokens, adv.returns
        grads.append(stepped(tr, copy.deepcopy(batch), role.loss, [*tr.params, *tr.critic_params])[0])
    assert len(grads[0]) == len(grads[1]) == len(grads[2]) and any(g.abs().sum() > 0 for g in grads[0])
    for g in grads[1:]:
        assert all(torch.allclose(a, c, atol=1e-6, rtol=1e-5) for a, c in zip(grads[0], g))


def test_update_averages_metrics_over_epochs_and_mini_batches(tiny):
    # update() = epochs x mini-batches, an optimizer step each. Replayed by hand on a second trainer with
    # the same weights and lr schedule, one update (one step) per mini-batch: the metrics are the mean
    # over the 2 x 2 optimizer steps, the entropy the mean over the first epoch's 2 steps, grad_norm the
    # mean of the 4 pre-clip norms, lr the first step's, the sampler differences the first epoch's tokens.
    batch = make_batch(tiny)
    algo = GRPO(group_size=4, kl_coef=0.1)
    batch.advantages = algo.advantages(batch).tokens
    batch.ref_logp = batch.sampler_logp - 0.05
    cfg = tcfg(epochs=2, lr=1e-2, warmup_steps=2)
    make = lambda: trainer_over(copy.deepcopy(tiny.model), cfg, 1.0, mini_batch_size=8, micro_batch_size=4,
                           total_optimizer_steps=4)
    got = make().update(copy.deepcopy(batch), algo.loss)
    tr = trainer_over(copy.deepcopy(tiny.model), replace(cfg, epochs=1), 1.0, mini_batch_size=8, micro_batch_size=4,
                      total_optimizer_steps=4)
    b = copy.deepcopy(batch)
    b.old_logp = tr.recompute(b)[0]
    steps, norms = [], []
    for epoch in range(2):
        for lo in (0, 8):
            steps.append((epoch, tr.update(b.select(slice(lo, lo + 8)), algo.loss)))
            norms.append(steps[-1][1]["actor/grad_norm"])  # the policy's pre-clip norm
    for k in ("actor/loss", "actor/pg_loss", "actor/pg_clipfrac", "actor/kl", "actor/ppo_kl", "actor/ratio_max"):
        assert got[k] == pytest.approx(sum(m[k] for _, m in steps) / 4, rel=1e-5, abs=1e-8), k
    assert got["actor/entropy"] == pytest.approx(sum(m["actor/entropy"] for e, m in steps if e == 0) / 2, rel=1e-5)
    assert got["actor/grad_norm"] == pytest.approx(sum(norms) / 4, rel=1e-5)
    assert got["actor/lr"] == 1e-2 * 0.5  # warm-up step 0 of 2
    first = [(m, int(b.completion_mask[lo : lo + 8].sum())) for (e, m), lo in zip(steps, (0, 8, 0, 8)) if e == 0]
    n = sum(t for _, t in first)  # the first epoch's tokens, each once
    assert n == int(batch.completion_mask.sum()) and sum(got["hist/sampler_ratio"]) == n
    mean = sum(m["actor/logp_diff_sampler_mean"] * t for m, t in first) / n
    assert got["actor/logp_diff_sampler_mean"] == pytest.approx(mean, rel=1e-5, abs=1e-9)
    assert got["actor/logp_diff_sampler_max"] == max(m["actor/logp_diff_sampler_max"] for m, _ in first)
    assert got["hist/sampler_ratio"] == [x + y for x, y in zip(*(m["hist/sampler_ratio"] for m, _ in first))]
    assert got["actor/ppo_kl"] != 0.0  # the second mini-batch's ratio is not 1: the first step moved the weights


def test_train_step_is_one_accumulated_step(tiny):
    # train_step (the offline recipes' verb) = update's one optimizer step on one mini-batch, without the
    # rollout diagnostics (the first pass's entropy, the sampler differences)
    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    batch.old_logp = batch.sampler_logp
    make = lambda: trainer_over(copy.deepcopy(tiny.model), tcfg(lr=1e-2), 1.0, mini_batch_size=16, micro_batch_size=4,
                           total_optimizer_steps=2)
    a, b = make(), make()
    got = a.train_step(copy.deepcopy(batch), algo.loss)
    want = b.update(copy.deepcopy(batch), algo.loss)
    diagnostics = {"actor/entropy", "actor/logp_diff_sampler_mean", "actor/logp_diff_sampler_max", "hist/sampler_ratio",
                   "actor/optimizer_steps"}
    assert set(got) == set(want) - diagnostics and "actor/entropy" not in got
    assert got["actor/nonfinite_steps"] == 0 and got["actor/lr"] == 1e-2
    assert all(got[k] == pytest.approx(want[k], rel=1e-6) for k in got)
    assert all(torch.equal(p, q) for p, q in zip(a.params, b.params))


def test_sampler_diff_metrics_by_hand():
    from rlpost.roles.row_plan import LocalPlan, sampler_diff_metrics

    # |diff| of 0.1, 0.3 (float64 in, so a float32 store of the sums would show: 0.1 is not a float32)
    diff = torch.tensor([0.1, -0.3], dtype=torch.float64)
    m = sampler_diff_metrics(diff, LocalPlan())
    assert m["actor/logp_diff_sampler_mean"] == (0.1 + 0.3) / 2
    assert m["actor/logp_diff_sampler_max"] == 0.3
    # ratios e^0.1 and e^-0.3, one in each of their bins, every bin of the histogram reported
    hist = core.ratio_histogram(diff.exp())
    assert m["hist/sampler_ratio"] == hist and len(hist) == len(core.RATIO_EDGES) - 1 and sum(hist) == 2
    # no tokens (every completion masked): zeros, not a division by zero or a max of nothing
    empty = sampler_diff_metrics(torch.zeros(0), LocalPlan())
    assert empty["actor/logp_diff_sampler_mean"] == 0.0 and empty["actor/logp_diff_sampler_max"] == 0.0
    assert empty["hist/sampler_ratio"] == [0] * (len(core.RATIO_EDGES) - 1)


# --- The update's bookkeeping, each against what it must count (tests/README.md, mutation testing) ---


def grpo_batch(tiny, n_prompts=4):
    batch = make_batch(tiny, n_prompts=n_prompts)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    return batch, algo


def test_non_finite_steps_are_counted_and_skipped(tiny):
    # 3 mini-batches, the 1st and 3rd with a NaN loss: 2 steps skipped, 1 taken
    batch, algo = grpo_batch(tiny, n_prompts=6)  # 24 rows, 3 mini-batches of 8
    calls = []

    def poisoned(logp, mb, **kw):
        loss, m = algo.loss(logp, mb, **kw)
        calls.append(1)
        return (loss * float("nan") if len(calls) in (1, 3) else loss), m

    tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=8, micro_batch_size=8,
                      total_optimizer_steps=3)
    m = tr.update(batch, poisoned)
    assert len(calls) == 3 and m["actor/nonfinite_steps"] == 2 and m["actor/optimizer_steps"] == 1
    assert tr.sched.last_epoch == 1  # the schedule moved for the one step taken
    assert tr.update(grpo_batch(tiny, 6)[0], algo.loss)["actor/nonfinite_steps"] == 0


def test_a_step_whose_critic_loss_alone_is_non_finite_is_skipped_whole(tiny):
    # The policy's gradient is finite, the separate critic's is NaN (its loss term alone): the norms are
    # [finite, nan]. The step is skipped for both (an `all` -> `any` slip in _step takes it, and the NaN
    # gradient turns the critic's weights into NaN); the policy's weights do not move either.
    batch, _ = grpo_batch(tiny)
    model = copy.deepcopy(tiny.model)
    critic = Critic(model, "separate")
    tr = trainer_over(model, tcfg(), 1.0, mini_batch_size=16, micro_batch_size=16, total_optimizer_steps=2,
                      critic=critic)
    policy_before = [p.detach().clone() for p in tr.params]
    critic_before = [p.detach().clone() for p in critic.parameters()]

    def nan_critic(logp, mb, *, values, entropy=None):
        return (logp * mb.completion_mask).sum() / mb.norm_tokens + (values * float("nan")).sum(), {}

    m = tr.update(copy.deepcopy(batch), nan_critic)
    assert (m["actor/nonfinite_steps"] == 1 and m["actor/optimizer_steps"] == 0 and math.isfinite(m["actor/grad_norm"])
            and math.isnan(m["critic/grad_norm"]))
    assert all(torch.equal(a, p) for a, p in zip(policy_before, tr.params))
    assert all(torch.equal(a, p) for a, p in zip(critic_before, critic.parameters()))
    assert tr.sched.last_epoch == 0  # the schedule did not move either


def value_loss(logp, mb, *, values, entropy=None):
    """Squared error of the values against a fixed target, plus the policy's mean log-prob: both
    the policy and a critic get a gradient."""
    err = (values - 0.5) ** 2 + logp
    return (err * mb.completion_mask).sum() / mb.norm_tokens, {}


def test_critic_grad_norm_is_the_mean_over_the_steps_on_both_verbs(tiny):
    batch, _ = grpo_batch(tiny)
    model = copy.deepcopy(tiny.model)
    tr = trainer_over(model, tcfg(), 1.0, mini_batch_size=8, micro_batch_size=4, total_optimizer_steps=4,
                 critic=Critic(model, "separate"))
    norms, step = [], tr._step
    tr._step = lambda: norms.append(step()) or norms[-1]
    m = tr.update(copy.deepcopy(batch), value_loss)
    assert len(norms) == 2 and all(n[1] > 0 for n, _ in norms)
    assert m["critic/grad_norm"] == pytest.approx((norms[0][0][1] + norms[1][0][1]) / 2, rel=1e-6)
    assert m["actor/grad_norm"] == pytest.approx((norms[0][0][0] + norms[1][0][0]) / 2, rel=1e-6)
    batch.old_logp = batch.sampler_logp
    m = tr.train_step(batch.select(slice(0, 8)), value_loss)
    assert m["critic/grad_norm"] == norms[-1][0][1] > 0


def test_the_heap_is_trimmed_every_trim_every_updates_on_the_host(tiny, monkeypatch):
    from rlpost.model import heap

    trims = []
    monkeypatch.setattr(heap, "trim", lambda: trims.append(1))
    batch, algo = grpo_batch(tiny, n_prompts=1)
    tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=4, micro_batch_size=4,
                 total_optimizer_steps=30)
    for i in range(2 * heap.TRIM_EVERY + 1):
        tr.update(copy.deepcopy(batch), algo.loss)
        assert len(trims) == (i + 1) // heap.TRIM_EVERY, i
    assert tr.updates == 2 * heap.TRIM_EVERY + 1


@pytest.mark.parametrize("epochs, mini, recomputes, steps", [(1, 16, 0, 1), (2, 16, 1, 2), (1, 8, 1, 2)])
def test_old_logprobs_are_recomputed_only_when_the_batch_takes_more_than_one_step(tiny, epochs, mini, recomputes,
                                                                                  steps):
    batch, algo = grpo_batch(tiny)
    tr = trainer_over(copy.deepcopy(tiny.model), tcfg(epochs=epochs), 1.0, mini_batch_size=mini, micro_batch_size=4,
                 total_optimizer_steps=4)
    calls, recompute = [], tr.recompute
    tr.recompute = lambda b: calls.append(1) or recompute(b)
    tr.update(batch, algo.loss)
    assert len(calls) == recomputes and tr.sched.last_epoch == steps


def test_actor_loss_is_the_mini_batch_loss_whatever_the_micro_batches(tiny):
    batch, algo = grpo_batch(tiny)
    losses = []
    for micro in (16, 4):
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=16, micro_batch_size=micro,
                     total_optimizer_steps=1)
        losses.append(tr.update(copy.deepcopy(batch), algo.loss)["actor/loss"])
    b = copy.deepcopy(batch)
    b.norm_tokens, b.norm_seqs = float(b.completion_mask.sum()), len(b)
    logp, _ = completion_logprobs(tiny.model, b, 1.0)
    b.old_logp = logp.detach()
    want = algo.loss(logp, b)[0].item()
    assert losses[0] == pytest.approx(want, rel=1e-5, abs=1e-7) and losses[1] == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_a_metric_of_a_one_token_mini_batch_is_its_value(tiny):
    batch, algo = grpo_batch(tiny, n_prompts=1)
    batch.completion_mask = torch.zeros_like(batch.completion_mask)
    batch.completion_mask[2, 0] = True  # one token in the whole mini-batch

    def loss(logp, mb, **kw):
        return (logp * mb.completion_mask).sum() / mb.norm_tokens, {"m": 5.0}

    tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=4, micro_batch_size=2,
                      total_optimizer_steps=1)
    assert tr.update(batch, loss)["m"] == 5.0  # token share 1/1; the empty micro-batch adds 0


def test_an_entropy_bonus_gets_the_entropys_gradient(tiny):
    # entropy_grad=True: the loss receives the entropy with its graph; its gradient must equal the
    # one computed straight from policy_forward(entropy="grad")
    from rlpost.model.logprobs import policy_forward

    batch, _ = grpo_batch(tiny)

    def bonus(logp, mb, *, values=None, entropy=None):
        return -(entropy * mb.completion_mask).sum() / mb.norm_tokens, {}

    tr = trainer_over(copy.deepcopy(tiny.model), tcfg(max_grad_norm=1e9), 1.0, mini_batch_size=16,
                      micro_batch_size=16, total_optimizer_steps=1, entropy_grad=True)
    got = {}  # the gradients the optimizer step reads, by name (the tied lookup's rows folded into the head's)
    named = list(tr.model.named_parameters())
    tr.opt.register_step_pre_hook(lambda opt, a, k: got.update({n: p.grad.clone() for n, p in named
                                                                 if p.grad is not None}))
    b = copy.deepcopy(batch)
    tr.update(copy.deepcopy(b), bonus)
    b.norm_tokens, b.norm_seqs = float(b.completion_mask.sum()), len(b)
    model = copy.deepcopy(tiny.model)
    ent = policy_forward(model, b, Scoring(1.0), entropy="grad").entropy
    bonus(None, b, entropy=ent)[0].backward()
    want = dict(model.named_parameters())  # tied: one embedding/head leaf with both uses' gradient
    got["model.embed_tokens.weight"] = got.pop("lm_head.weight", None)  # the trainer's split leaves, summed
    got = {n: g for n, g in got.items() if n in want}
    assert len(got) == len(want) and all(torch.allclose(g, want[n].grad, atol=1e-6) for n, g in got.items())


@pytest.mark.parametrize("prefix_once", [False, True])
def test_micro_batches_are_cut_from_the_length_order(tiny, prefix_once):
    # rows of similar length share a micro-batch (less padding): the micro-batches are consecutive
    # slices of a stable sort by length, and with one micro-batch the rows keep their order. With
    # the prompts run per micro-batch, groups stay whole (Rollouts.length_order, by each group's
    # longest row); with the prompts run once per mini-batch, rows sort by their own length.
    batch, algo = grpo_batch(tiny)
    for g, longest in enumerate((7, 3, 5, 2)):  # groups of different lengths, not already in order
        batch.completion_mask[4 * g : 4 * g + 4, longest:] = False
        batch.completion_mask[4 * g + 1, 1:] = False  # and one short row in each
    assert batch.length_order().tolist() != list(range(16))
    seen = []
    for micro in (4, 16):
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(prompts_once=prefix_once), 1.0, mini_batch_size=16,
                          micro_batch_size=micro, total_optimizer_steps=1)
        rows = []  # each micro-batch's rows, as the loss sees them
        tr.update(copy.deepcopy(batch), lambda lp, mb, **named: rows.append(mb.completion_ids[:, 0].tolist())
                  or algo.loss(lp, mb))
        seen.append(rows)
    order = batch.length_order()
    if prefix_once:
        order = torch.sort(batch.completion_mask.sum(1), stable=True).indices
        assert order[:4].tolist() == [1, 5, 9, 13]  # the four short rows, one from each group, together
    first = batch.completion_ids[:, 0]
    assert seen[0] == [first[order[i : i + 4]].tolist() for i in range(0, 16, 4)]
    assert seen[1] == [first.tolist()]


def accumulated(tiny, batch, loss, micro, prefix_once, critic=None, bf16=False, lora=False, entropy_grad=False):
    """(every gradient by name, metrics) of one mini-batch of ``batch`` through a fresh trainer's ``update``, the
    gradients as its optimizer step reads them (the tied lookup's rows folded into the head's), unclipped."""
    model = copy.deepcopy(tiny.model)
    if lora:
        model = lora_wrap(model, tiny_cfg("model.lora_r=4", "model.lora_dropout=0").model, seed=0)
    cfg = tcfg(precision="bf16" if bf16 else "fp32", prompts_once=prefix_once, max_grad_norm=1e9)
    tr = trainer_over(model, cfg, 1.0, mini_batch_size=len(batch), micro_batch_size=micro, total_optimizer_steps=1,
                      critic=Critic(model, critic) if critic else None, entropy_grad=entropy_grad)
    grads = {}
    named = [*tr.model.named_parameters(), *((tr.critic.named_parameters()) if critic else [])]
    tr.opt.register_step_pre_hook(lambda opt, a, k: grads.update({n: p.grad.to_dense().clone() for n, p in named
                                                                   if p.grad is not None}))
    metrics = tr.update(copy.deepcopy(batch), loss)
    return grads, {k: v for k, v in metrics.items() if not k.startswith("hist/")}


@pytest.mark.parametrize("case", ["plain", "shared_critic", "lora", "entropy"])
def test_prompts_once_per_mini_batch_give_the_same_gradient(tiny, case):
    # The prompts run once ahead of the micro-batches, the rows regrouped by their own length
    # across groups: the same gradients and metrics as each micro-batch running its groups' prompts.
    batch, algo = grpo_batch(tiny)
    batch.completion_mask[1::4, 2:] = False  # a short row in every group: regrouping moves rows
    loss, critic = algo.loss, None
    if case == "shared_critic":
        critic = "shared"
        loss = lambda logp, mb, values=None, entropy=None: (
            lambda l, m: (l + (values * mb.completion_mask).pow(2).sum() / mb.norm_tokens, m))(*algo.loss(logp, mb))
    if case == "entropy":  # an entropy bonus: the entropy with its gradient, through the prefix too
        loss = lambda logp, mb, values=None, entropy=None: (
            lambda l, m: (l - 0.1 * (entropy * mb.completion_mask).sum() / mb.norm_tokens, m))(*algo.loss(logp, mb))
    kw = dict(critic=critic, lora=case == "lora", entropy_grad=case == "entropy")
    once, m_once = accumulated(tiny, batch, loss, 4, True, **kw)
    per, m_per = accumulated(tiny, batch, loss, 4, False, **kw)
    assert once.keys() == per.keys() and len(once) > 2
    assert all(torch.allclose(once[n], per[n], atol=1e-6, rtol=1e-5) for n in once), (
        max((once[n] - per[n]).abs().max() for n in once))
    assert any(g.abs().sum() > 0 for g in once.values())
    assert m_once == pytest.approx(m_per, rel=1e-5, abs=1e-7)


def test_prompts_once_per_mini_batch_under_bf16_autocast(tiny):
    # bf16 autocast: equal up to bf16 rounding (micro-batchings differ among themselves by as much)
    batch, algo = grpo_batch(tiny)
    once, _ = accumulated(tiny, batch, algo.loss, 4, True, bf16=True)
    per, _ = accumulated(tiny, batch, algo.loss, 4, False, bf16=True)
    scale = max(g.abs().max() for g in per.values())
    assert max((once[n] - per[n]).abs().max() for n in once) < 2e-2 * scale


@pytest.mark.parametrize("forward", ["hf", "packed"])
def test_prompts_run_once_per_mini_batch_only_where_they_fit(tiny, forward, monkeypatch):
    # The decoder's forwards: with the prompts once, one forward over the 4 distinct prompts, then
    # completions only; the prompts are not run again per micro-batch. Where the prompts of a
    # mini-batch outgrow one micro-batch's tokens (micro 1 here), each micro-batch runs its own.
    batch, algo = grpo_batch(tiny)
    P, T = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    calls = []  # (rows, columns, on a cache) of each forward
    if forward == "packed":  # the packed trunk's two verbs: prompts, and completions on top of them
        for verb, on_cache in (("prompts", False), ("completions", True)):
            plain = getattr(packed.PackedTrunk, verb)
            monkeypatch.setattr(packed.PackedTrunk, verb, lambda self, ids, *a, _f=plain, _c=on_cache, **k:
                                calls.append((*ids.shape, _c)) or _f(self, ids, *a, **k))
    for micro, once in ((4, True), (1, False)):
        assert (4 * P <= micro * (P + T)) == once
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(forward=forward), 1.0, mini_batch_size=16,
                          micro_batch_size=micro,
                     total_optimizer_steps=1)
        calls.clear()
        if forward == "hf":
            hook = lambda m, a, kw, out: calls.append((*kw["input_ids"].shape, kw.get(CACHE_KW) is not None))
            tr.model.get_decoder().register_forward_hook(hook, with_kwargs=True)
        tr.update(copy.deepcopy(batch), algo.loss)  # one mini-batch, one step: no forward before it
        fresh = [c for c in calls if not c[2]]  # forwards that start from the prompt
        if once:  # the 4 distinct prompts, then 4 micro-batches of completions on their cache
            assert fresh == [(4, P, False)] and len(calls) == 5, calls
        elif forward == "hf":  # one row a micro-batch: each runs its prompt and completion in one forward
            assert len(fresh) == len(calls) == 16 and all(c[0] == 1 and c[1] > P for c in calls), calls
        else:  # one row a micro-batch: its prompt, then its completion
            assert len(fresh) == 16 and len(calls) == 32 and all(c[0] == 1 for c in calls), calls


def test_update_reports_the_entropy_and_train_step_does_not(tiny):
    batch, algo = grpo_batch(tiny, n_prompts=1)
    tr = trainer_over(copy.deepcopy(tiny.model), tcfg(), 1.0, mini_batch_size=4, micro_batch_size=4,
                      total_optimizer_steps=2)
    assert "actor/entropy" in tr.update(copy.deepcopy(batch), algo.loss)  # the first epoch's diagnostic
    assert "actor/entropy" not in tr.train_step(batch, algo.loss)  # the offline recipes' verb: no rollout diagnostics


def test_one_rank_data_parallel_equals_the_plain_trainer(tiny):
    # The data-parallel path (FSDP2 over a process group, its own accumulation and reductions) on a
    # group of one, in this process: the same metrics and weights as the plain trainer. Two ranks:
    # tests/model/test_fsdp.py (slow, spawned processes).
    import torch.distributed as dist

    batch, algo = grpo_batch(tiny)
    # as the data-parallel path cuts its micro-batches (whole groups, each running its prompts):
    # metrics such as actor/ratio_max are per-micro-batch maxima, so they follow the cut
    plain = trainer_over(copy.deepcopy(tiny.model), tcfg(epochs=2, prompts_once=False), 1.0, mini_batch_size=8,
                         micro_batch_size=2, total_optimizer_steps=4)
    want = plain.update(copy.deepcopy(batch), algo.loss)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        dp = trainer_over(copy.deepcopy(tiny.model), tcfg(epochs=2), 1.0, mini_batch_size=8, micro_batch_size=2,
                     total_optimizer_steps=4, plan=ShardedPlan())
        got = dp.update(copy.deepcopy(batch), algo.loss)
        weights = dp.weights()
    finally:
        dist.destroy_process_group()
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k] == (v if k.startswith("hist/") else pytest.approx(v, rel=1e-4, abs=1e-6)), k
    assert all(torch.allclose(weights[n], p, atol=1e-5) for n, p in plain.model.state_dict().items())


def test_the_forward_computes_the_entropy_only_where_it_is_used(tiny, monkeypatch):
    # the first epoch's forwards report it (detached), later epochs' skip it, a bonus needs its graph
    from rlpost.roles import row_plan

    batch, algo = grpo_batch(tiny, n_prompts=1)
    modes, forward = {}, row_plan.policy_forward
    for entropy_grad in (False, True):
        seen = modes[entropy_grad] = []  # the entropy each forward of the policy was asked for
        monkeypatch.setattr(row_plan, "policy_forward", lambda model, batch, scoring, entropy="none", *a, _s=seen:
                            _s.append(entropy) or forward(model, batch, scoring, entropy, *a))
        tr = trainer_over(copy.deepcopy(tiny.model), tcfg(epochs=2), 1.0, mini_batch_size=4, micro_batch_size=4,
                          total_optimizer_steps=2, entropy_grad=entropy_grad)
        tr.update(copy.deepcopy(batch), algo.loss)
    assert modes[False][-2:] == ["detached", "none"]  # (the recompute's forward comes first)
    assert modes[True][-2:] == ["grad", "grad"]


def test_micro_batches_by_tokens_are_refused_with_fsdp_ranks():
    from rlpost import config
    from rlpost.config import ConfigError

    with pytest.raises(ConfigError, match=r"^trainer\.micro_batch_tokens: .*dist\.trainer_ranks > 1"):
        config.load(None, ["dist.topology=disaggregated", "dist.trainer_ranks=2", "trainer.micro_batch_tokens=4096"])
    assert config.load(None, ["trainer.micro_batch_tokens=4096"]).trainer.micro_batch_tokens == 4096
