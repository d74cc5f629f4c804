"""Property-based tests (hypothesis) of the invariants the algorithms promise, over many batches
rather than one hand-worked one (the examples are derandomised: the same ones on every run, see
tests/conftest.py):

- a group's advantages do not change when a constant is added to its rewards (every group
  baseline, and REINFORCE++'s batch whitening), nor, where the std divides, when they are scaled;
- a group whose rewards are all equal gets advantage 0 on every token;
- the unbiased pass@k equals 1 - C(n - c, k) / C(n, k) in exact rational arithmetic;
- masking a token leaves every other sequence's loss term unchanged, and (for token-level losses
  with the mini-batch's normaliser) every other token's gradient;
- every aggregator and every algorithm's loss is exact under any split into micro-batches.
"""

import math
from fractions import Fraction

import torch
from helpers import algorithm, rl_batch, tiny_cfg
from hypothesis import given
from hypothesis import strategies as st

from rlpost.algorithms import ALGORITHMS, core
from rlpost.search.metrics import pass_at_k

AGGREGATORS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "const_norm"]
GROUP = [n for n, a in ALGORITHMS.items() if a.traits.group_baseline]
SHIFT_INVARIANT = [*GROUP, "reinforce_pp"]  # the batch whitening removes a shift too
SCALE_INVARIANT = ["grpo", "dapo", "gspo", "cispo", "reinforce_pp"]  # r / std(r)
MAX_NEW = 5


def algo(name: str, K: int, agg: str = "token_mean", **kw):
    extra = [f"algo.{k}={v}" for k, v in kw.items()]
    return algorithm(tiny_cfg(f"algo.name={name}", f"rollout.group_size={K}", f"algo.loss_agg={agg}",
                                                 f"rollout.max_new_tokens={MAX_NEW}", *extra))


@st.composite
def batches(draw, K=None, min_rows=1):
    """A batch of whole groups with rewards on a quarter grid (exact in float32 under shifts and
    scalings by powers of 2), a mask with at least one loss token per row, and log-probs."""
    K = K or draw(st.integers(2, 4))
    n = draw(st.integers(min_rows, 3)) * K
    T = draw(st.integers(1, MAX_NEW))
    rewards = torch.tensor(draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n)), dtype=torch.float32) / 4
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=n, max_size=n)))
    mask[:, 0] = True  # no empty completion
    small = st.floats(-2.0, 0.0, allow_nan=False, width=32)
    grid = lambda: torch.tensor(draw(st.lists(st.lists(small, min_size=T, max_size=T), min_size=n, max_size=n)))
    b = rl_batch(mask, reward=rewards, old_logp=grid(), ref_logp=grid(), old_values=grid(),
                 group_ids=torch.arange(n) // K)
    return K, b, grid()  # the last: log pi under the policy being trained


@given(batches(), st.integers(-40, 40), st.sampled_from(SHIFT_INVARIANT))
def test_group_advantages_ignore_a_shift_of_the_rewards(data, shift, name):
    K, b, _ = data
    a = algo(name, K)
    before = a.advantages(b).tokens
    b.reward = b.reward + shift / 4
    assert torch.allclose(a.advantages(b).tokens, before, atol=1e-4)


@given(batches(), st.sampled_from([0.25, 0.5, 2.0, 4.0]), st.sampled_from(SCALE_INVARIANT))
def test_std_normalised_advantages_ignore_a_scaling_of_the_rewards(data, scale, name):
    K, b, _ = data
    a = algo(name, K)
    before = a.advantages(b).tokens
    b.reward = b.reward * scale
    # a group with std 0 stays 0; elsewhere eps = 1e-6 in (std + eps) is the only difference
    assert torch.allclose(a.advantages(b).tokens, before, atol=1e-4)


@given(batches(min_rows=2), st.integers(-8, 8), st.sampled_from(GROUP))
def test_a_group_without_reward_variance_gets_zero_advantage(data, value, name):
    K, b, _ = data
    b.reward[:K] = value / 4  # the first group: all equal
    adv = algo(name, K).advantages(b).tokens
    assert (adv[:K] == 0).all()


@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_exact_combinatorial_value(nck):
    n, c, k = nck
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert math.isclose(pass_at_k(n, c, k), float(exact), rel_tol=1e-9, abs_tol=1e-12)


def prepared(name: str, K: int, b, agg: str):
    """The algorithm, and b with its advantages (and PPO's returns) and fixed mini-batch totals."""
    a = algo(name, K, agg, kl_coef=0.1) if ALGORITHMS[name].traits.kl != "none" else algo(name, K, agg)
    out = a.advantages(b)
    b.advantages, b.returns = out.tokens, out.returns
    b.norm_tokens, b.norm_seqs = float(b.completion_mask.sum()), len(b)
    return a


def loss_and_grads(a, b, logp):
    logp = logp.clone().requires_grad_()
    values = b.old_values.clone().add_(0.1).requires_grad_()
    loss, _ = a.loss(logp, b, **({"values": values} if a.traits.needs_values else {}))
    loss.backward()
    return loss.item(), logp.grad, values.grad


@given(batches(), st.sampled_from(list(ALGORITHMS)),
       st.sampled_from(["token_mean", "seq_mean_token_sum", "const_norm"]), st.data())
def test_masking_a_token_leaves_the_others_alone(data, name, agg, pick):
    K, b, logp = data
    a = prepared(name, K, b, agg)
    on = b.completion_mask.nonzero().tolist()
    row, col = pick.draw(st.sampled_from(on))
    whole, g, _ = loss_and_grads(a, b, logp)
    b.completion_mask = b.completion_mask.clone()
    b.completion_mask[row, col] = False
    b.advantages = b.advantages * b.completion_mask  # what the algorithm writes: 0 off the mask
    masked, g2, _ = loss_and_grads(a, b, logp)
    assert g2[row, col] == 0
    others = torch.ones(len(b), dtype=torch.bool)
    others[row] = False
    if name == "gspo":  # a sequence-level loss: the token's own sequence changes, no other does
        assert torch.allclose(g[others], g2[others], atol=1e-6)
    else:  # token-level: every other token's gradient, in its row too
        keep = b.completion_mask
        assert torch.allclose(g[keep], g2[keep], atol=1e-6)


@given(batches(), st.sampled_from(list(ALGORITHMS)), st.sampled_from(AGGREGATORS), st.data())
def test_any_split_into_micro_batches_is_exact(data, name, agg, pick):
    K, b, logp = data
    a = prepared(name, K, b, agg)
    cuts = sorted(pick.draw(st.sets(st.integers(1, len(b) - 1), max_size=len(b) - 1))) if len(b) > 1 else []
    whole, g, gv = loss_and_grads(a, b, logp)
    total, grads, vgrads = 0.0, [], []
    for lo, hi in zip([0, *cuts], [*cuts, len(b)]):
        part = b.select(slice(lo, hi))  # keeps the mini-batch's norm_tokens / norm_seqs
        loss, gp, gvp = loss_and_grads(a, part, logp[lo:hi])
        total += loss
        grads.append(gp)
        vgrads.append(gvp)
    assert math.isclose(total, whole, rel_tol=1e-4, abs_tol=1e-5)
    assert torch.allclose(torch.cat(grads), g, atol=1e-5)
    if a.traits.needs_values:
        assert torch.allclose(torch.cat(vgrads), gv, atol=1e-5)


@given(st.integers(1, 6), st.integers(1, 5), st.sampled_from(AGGREGATORS), st.data())
def test_aggregators_add_up_over_any_split(B, T, agg_name, pick):
    x = torch.tensor(pick.draw(st.lists(st.lists(st.floats(-3, 3, width=32), min_size=T, max_size=T), min_size=B,
                                        max_size=B)))
    mask = torch.tensor(pick.draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    agg = core.aggregator(agg_name, MAX_NEW)
    n_tok, n_seq = float(mask.sum()), B
    whole = agg(x, mask, n_tokens=n_tok, n_seqs=n_seq)
    cuts = sorted(pick.draw(st.sets(st.integers(1, B - 1), max_size=B - 1))) if B > 1 else []
    parts = sum(agg(x[lo:hi], mask[lo:hi], n_tokens=n_tok, n_seqs=n_seq) for lo, hi in zip([0, *cuts], [*cuts, B]))
    assert math.isclose(float(parts), float(whole), rel_tol=1e-5, abs_tol=1e-6)
