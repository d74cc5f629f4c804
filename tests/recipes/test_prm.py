"""Process reward models and search (rewards/prm.py, recipes/prm.py, recipes/search.py) with the tiny model: step
splitting, Monte-Carlo labels, the masked loss, a learnable labelling, and the searches' choices
and token counts on scripted cases (each expected number is worked out in a comment)."""

import copy
import math
import random

import pytest
import torch

from rlpost.algorithms.preference import bce_at_positions
from rlpost.model.encode import make_batch
from rlpost.model.logprobs import completion_values
from rlpost.recipes import search as beam
from rlpost.recipes.prm import (
    Example,
    LabelledSolution,
    auc,
    label_solutions,
    mc_step_labels,
    outcome_examples,
    process_examples,
    train_prm,
)
from rlpost.rewards.prm import ProcessRewardModel, agg_last, agg_min, agg_prod, step_ends, token_texts
from rlpost.roles.critic import Critic
from rlpost.roles.rollout_hf import HFRollout

HIT = "0123"  # the scripted verifier: a completion is "correct" when it holds one of these characters


def hit_verifier(text, row):
    return float(any(ch in text for ch in HIT)), {}


def ids(tok, text, eos=False):
    return tok(text, add_special_tokens=False).input_ids + ([tok.eos_token_id] if eos else [])


def rows(n):
    return [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": "0"} for i in range(n)]


# --- steps -------------------------------------------------------------------------------------


def test_step_ends_by_hand(tiny):
    tok = tiny.tokenizer
    ends = lambda text, eos=True: step_ends(token_texts(tok, ids(tok, text, eos)))
    # a b \n c d \n \n e f </s> = tokens 0..9: lines end at 2 and 5; the blank line (6) joins "ef",
    # which ends at EOS (9)
    assert ends("ab\ncd\n\nef") == [2, 5, 9]
    # a b \n </s>: nothing but EOS after the newline, so the one step runs to the final token (3)
    assert ends("ab\n") == [3]
    assert ends("ab\ncd", eos=False) == [2, 4]  # truncated: the last step ends at the last token
    assert ends("ab\ncd\n", eos=False) == [2, 5]  # ...which may itself be a newline
    assert ends("\nab") == [3]  # a leading blank line is not a step
    assert step_ends([]) == []
    # multi-character tokens (BPE): "x\ny" ends the step "a x" and opens the next one with "y"
    assert step_ends(["a", "x\ny", "c"]) == [1, 2]
    assert step_ends(["a", "\n\n", "b", ""]) == [1, 3]


# --- Monte-Carlo labels ------------------------------------------------------------------------


class ScriptedContinuations:
    """Stands in for HFRollout in labelling: every continuation is "0</s>" or "9</s>", alternating
    over all calls, and each call is recorded."""

    def __init__(self, tok):
        self.tok, self.count, self.calls = tok, 0, []

    def sample_ids(self, seqs, temperature, top_p, max_new_tokens, stop_strings):
        self.calls.append((seqs, max_new_tokens))
        out = []
        for _ in seqs:
            new = ids(self.tok, "0" if self.count % 2 == 0 else "9", eos=True)
            self.count += 1
            out.append((new, [0.0] * len(new), "eos"))
        return out


@pytest.mark.parametrize("chunk", [64, 3])
def test_mc_labels_equal_a_hand_count(tiny, chunk):
    tok = tiny.tokenizer
    prompt = ids(tok, "<|user|>q<|assistant|>")
    # a b \n c 0 \n d </s>: steps end at [2, 5, 7];  a b \n c d </s>: at [2, 5]
    sols = [ids(tok, "ab\nc0\nd", eos=True), ids(tok, "ab\ncd", eos=True)]
    batch = make_batch([prompt, prompt], sols, tok.pad_token_id)
    batch.completions, batch.rows = [tok.decode(s, skip_special_tokens=True) for s in sols], [{}, {}]
    ro = ScriptedContinuations(tok)
    out = label_solutions(ro, batch, hit_verifier, m_rollouts=4, max_new_tokens=16, temperature=1.0, chunk=chunk)
    # Continuations alternate "0", "9", so each block of 4 has two hits: a prefix without a hit gets 2/4.
    # Solution 0: "ab\n" -> 0.5; "ab\nc0\n" already holds "0", so all 4 hit -> 1.0; last step = outcome 1.
    # Solution 1: "ab\n" -> 0.5; last step = outcome of "ab\ncd" (no hit) -> 0.
    assert out[0].step_ends == [2, 5, 7] and out[0].labels == [0.5, 1.0, 1.0] and out[0].outcome == 1.0
    assert out[1].step_ends == [2, 5] and out[1].labels == [0.5, 0.0] and out[1].outcome == 0.0
    # 3 prefixes x 4 continuations of 2 tokens ("0" or "9", EOS) each
    assert out[0].label_tokens == 2 * 4 * 2 and out[1].label_tokens == 1 * 4 * 2
    assert len(out[0].continuations[1]) == 4 and out[0].continuations[1][0].startswith("ab\nc0\n")
    seqs = [s for call, _ in ro.calls for s in call]
    assert len(seqs) == 12 and len(ro.calls) == math.ceil(12 / chunk)
    assert prompt + sols[0][:6] in seqs  # a continuation starts from prompt + the prefix's token ids
    assert ro.calls[0][1] == 16 - 3  # the budget: the solution's cap minus the shortest prefix


def newline_bias(model, tok, boost=3.0):
    """Make the random tiny model write lines: +boost on the newline logit (p ~ 0.2 per token)."""
    bias = torch.zeros(model.config.vocab_size)
    bias[tok.convert_tokens_to_ids("\n")] = boost
    model.lm_head.register_forward_hook(lambda m, i, out: out + bias.to(out.dtype))
    return model


def test_mc_labels_on_the_tiny_model_are_fractions_of_m(tiny):
    torch.manual_seed(0)
    ro = HFRollout(newline_bias(copy.deepcopy(tiny.model), tiny.tokenizer), tiny.tokenizer, dtype=torch.float32)
    M = 3
    sols = mc_step_labels(ro, rows(3), hit_verifier, n_solutions=2, m_rollouts=M, max_new_tokens=20, temperature=1.0)
    assert len(sols) == 6 and sum(len(s.step_ends) > 1 for s in sols) >= 3  # several multi-step solutions
    for s in sols:
        assert len(s.labels) == len(s.step_ends) and s.labels[-1] == s.outcome
        for k, label in enumerate(s.labels[:-1]):
            assert 0.0 <= label <= 1.0 and abs(label * M - round(label * M)) < 1e-9  # k/M
            # the hand count: re-score the stored continuations
            assert len(s.continuations[k]) == M
            assert label == pytest.approx(sum(hit_verifier(c, {})[0] for c in s.continuations[k]) / M)
            prefix = tiny.tokenizer.decode(s.completion_ids[: s.step_ends[k] + 1], skip_special_tokens=True)
            assert all(c.startswith(prefix) for c in s.continuations[k])
            if hit_verifier(prefix, {})[0]:
                assert label == 1.0  # the prefix already holds a hit: every continuation keeps it


# --- the loss ----------------------------------------------------------------------------------


def test_bce_touches_only_labelled_positions_by_hand(tiny):
    pad = tiny.tokenizer.pad_token_id
    batch = make_batch([[5, 6]], [[10, 11, 12, 13]], pad, positions=[[1, 3]], targets=[[1.0, 0.25]])
    assert batch.completion_mask.tolist() == [[False, True, False, True]]
    values = torch.zeros(1, 4, requires_grad=True)
    loss, m = bce_at_positions(values, batch)
    # at logit 0 the BCE is log 2 whatever the target: mean over the 2 labels = log 2 = 0.693
    assert loss.item() == pytest.approx(math.log(2))
    loss.backward()
    # d/dv BCE = sigmoid(v) - y, divided by the 2 labels: (0.5 - 1)/2 = -0.25; (0.5 - 0.25)/2 = 0.125
    assert values.grad.tolist() == [[0.0, -0.25, 0.0, 0.125]]


def test_loss_through_the_trunk_has_no_gradient_off_the_step_ends(tiny):
    tok = tiny.tokenizer
    sol = LabelledSolution(ids(tok, "<|user|>q<|assistant|>"), ids(tok, "ab\ncd\nef", eos=True), [2, 5, 8],
                           [0.5, 0.25, 1.0], 1.0, {})
    head = Critic(tiny.model, "shared")
    torch.nn.init.normal_(head.head.weight)
    for ex, where in [(process_examples([sol])[0], [2, 5, 8]), (outcome_examples([sol])[0], [8])]:
        batch = make_batch([ex.prompt_ids], [ex.completion_ids], tok.pad_token_id, [ex.positions], [ex.targets])
        values = completion_values(tiny.model.get_decoder(), head.head, batch)  # (1, 9): a b \n c d \n e f </s>
        values.retain_grad()
        bce_at_positions(values, batch)[0].backward()
        nonzero = values.grad[0].nonzero().flatten().tolist()
        assert nonzero == where  # PRM: the three step ends; ORM: the final token only
        assert batch.returns[0, where].tolist() == ex.targets


# --- learning ----------------------------------------------------------------------------------


def synthetic(tok, n, seed):
    """Solutions of 3 lines of 3 letters from 'abcz'; a step is labelled 1 iff it contains 'z'."""
    rng = random.Random(seed)
    prompt = ids(tok, "<|user|>go<|assistant|>")
    out = []
    for _ in range(n):
        lines = ["".join(rng.choice("abcz" if rng.random() < 0.5 else "abc") for _ in range(3)) for _ in range(3)]
        comp = ids(tok, "".join(line + "\n" for line in lines), eos=True)
        ends = step_ends(token_texts(tok, comp))
        out.append(Example(prompt, comp, ends, [float("z" in line) for line in lines]))
    return out


def test_prm_learns_a_trivial_labelling(tiny):
    tok = tiny.tokenizer
    torch.manual_seed(0)
    prm, history = train_prm(tiny.model, tok, synthetic(tok, 128, 0), epochs=4, batch_size=16, micro_batch_size=16,
                             lr=3e-3, head_lr=3e-2, autocast_bf16=False)
    held = synthetic(tok, 48, 1)
    scores = prm.step_scores([e.prompt_ids for e in held], [e.completion_ids for e in held])
    flat_s = [x for s in scores for x in s]
    flat_y = [y for e in held for y in e.targets]
    acc = sum((s > 0.5) == (y > 0.5) for s, y in zip(flat_s, flat_y)) / len(flat_y)
    assert auc(flat_s, flat_y) > 0.8 and acc > 0.8, (auc(flat_s, flat_y), acc, history[-1])


def test_save_and_load_give_the_same_scores(tiny, tmp_path):
    tok = tiny.tokenizer
    head = Critic(tiny.model, "shared")
    torch.nn.init.normal_(head.head.weight)
    prm = ProcessRewardModel(tiny.model, head, tok, autocast_bf16=False)
    ex = synthetic(tok, 3, 0)
    before = prm.step_scores([e.prompt_ids for e in ex], [e.completion_ids for e in ex])
    prm.save(tmp_path / "prm")
    after = ProcessRewardModel.load(tmp_path / "prm", autocast_bf16=False).step_scores(
        [e.prompt_ids for e in ex], [e.completion_ids for e in ex])
    assert all(len(s) == 3 for s in before)
    assert [pytest.approx(s, abs=1e-6) for s in before] == after


def test_aggregates_by_hand():
    s = [0.9, 0.5, 0.8]
    assert agg_min(s) == 0.5 and agg_last(s) == 0.8 and agg_prod(s) == pytest.approx(0.36)  # 0.9 * 0.5 * 0.8
    assert agg_min([]) == agg_last([]) == agg_prod([]) == 0.0
    # AUC: pairs (pos, neg) = (0.9, 0.1) win, (0.9, 0.5) win, (0.4, 0.1) win, (0.4, 0.5) lose -> 3/4
    assert auc([0.9, 0.4, 0.1, 0.5], [1, 1, 0, 0]) == 0.75


# --- search ------------------------------------------------------------------------------------


def test_best_of_n_with_an_oracle_picks_the_max_and_counts_tokens(tiny):
    torch.manual_seed(0)
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    seen = {}

    def oracle(batch):  # the verifier itself, so the chosen sample is correct iff any sample is
        seen["batch"] = batch
        return [hit_verifier(c, {})[0] for c in batch.completions]

    out = beam.best_of_n(ro, rows(5), oracle, n=4, max_new_tokens=6, temperature=1.0)
    b = seen["batch"]
    for r in range(5):
        mine = [hit_verifier(c, {})[0] for c in b.completions[4 * r:4 * r + 4]]
        assert hit_verifier(out.completions[r], {})[0] == max(mine) == out.scores[r]
        assert out.tokens[r] == int(b.completion_mask[4 * r:4 * r + 4].sum()) and out.samples[r] == 4
    assert sum(out.tokens) <= 5 * 4 * 6


def test_majority_and_weighted_majority_by_hand(tiny):
    tok = tiny.tokenizer
    texts = ["x 1", "x 2", "y 2", "z 1", "7", "7", "8", "none"]  # 2 problems x 4 samples
    comps = [ids(tok, t, eos=True) for t in texts]
    batch = make_batch([[5]] * 8, comps, tok.pad_token_id)
    batch.completions = texts
    last_int = lambda t: ([w for w in t.split() if w.isdigit()] or [None])[-1]
    plain = beam.pick_majority(batch, 4, last_int)
    # problem 0: "1" and "2" have two votes each -> the first seen, "1", from sample 0; problem 1: "7"
    assert plain.completions == ["x 1", "7"] and plain.scores == [2.0, 2.0]
    weighted = beam.pick_majority(batch, 4, last_int, weights=[0.1, 0.9, 0.2, 0.1, 0.3, 0.3, 0.7, 0.9])
    # problem 0: "1" = 0.1 + 0.1 = 0.2, "2" = 0.9 + 0.2 = 1.1 -> "2", its heaviest sample "x 2"
    # problem 1: "7" = 0.6 < "8" = 0.7 ("none" has no answer, so its 0.9 votes for nothing)
    assert weighted.completions == ["x 2", "8"] and weighted.scores == pytest.approx([1.1, 0.7])
    # tokens: every sample's characters + EOS: (3+1)*4 = 16; (1+1)*3 + (4+1) = 11
    assert plain.tokens == [16, 11] and plain.samples == [4, 4]


class ScriptedTree:
    """A sampler that walks a fixed tree: the k-th request to continue a prefix gets its k-th child."""

    def __init__(self, tok, tree):
        self.tok, self.tree, self.asked, self.calls = tok, tree, {}, []

    def render(self, rows):
        return HFRollout.render(self, rows)

    def sample_ids(self, seqs, temperature, top_p, max_new_tokens, stop_strings):
        self.calls.append((len(seqs), max_new_tokens, stop_strings))
        out = []
        for s in seqs:
            text = self.tok.decode(s, skip_special_tokens=False).split("<|assistant|>", 1)[1]
            k = self.asked.get(text, 0)
            self.asked[text] = k + 1
            child = self.tree[text][k % len(self.tree[text])]
            new = ids(self.tok, child.replace("</s>", ""), eos=child.endswith("</s>"))
            out.append((new, [0.0] * len(new), "eos" if child.endswith("</s>") else "stop"))
        return out


class OraclePRM:
    """Step scores looked up by step text."""

    def __init__(self, tok, table):
        self.tok, self.table = tok, table

    def score(self, prompts, completions, aggregate):
        out = []
        for c in completions:
            ends, start, steps = step_ends(token_texts(self.tok, c)), 0, []
            for e in ends:
                steps.append(self.table[self.tok.decode(c[start:e + 1], skip_special_tokens=True)])
                start = e + 1
            out.append(aggregate(steps))
        return out


def test_step_beam_search_with_an_oracle_takes_the_right_path(tiny):
    tok = tiny.tokenizer
    tree = {"": ["a\n", "b\n", "c\n", "d\n"], "a\n": ["1</s>", "2\n"], "b\n": ["3</s>", "4</s>"],
            "a\n2\n": ["5</s>", "6</s>"]}
    table = {"a\n": 0.8, "b\n": 0.9, "c\n": 0.1, "d\n": 0.2, "1": 0.3, "2\n": 0.95, "3": 0.5, "4": 0.7,
             "5": 0.99, "6": 0.1}
    ro = ScriptedTree(tok, tree)
    out = beam.step_beam_search(ro, OraclePRM(tok, table), rows(1), beam_width=2, expand=2, max_steps=5,
                                max_step_tokens=8)
    # Round 1: the root proposes 2*2 = 4 first steps; b (0.9) and a (0.8) survive.
    # Round 2 (min over steps): a1 = min(.8, .3) = .3, a2 = min(.8, .95) = .8, b3 = .5, b4 = .7 -> a2 and b4
    #   survive; b4 ended (EOS), so it is kept and stops; a1, b3 are finished and kept as candidates.
    # Round 3: a2 proposes 2: a25 = min(.8, .95, .99) = .8, a26 = .1. No live beam remains.
    # Best finished: a25 (.8) over b4 (.7) -- although greedy on the first step would have taken b.
    assert out.completions == ["a\n2\n5"] and out.scores == [pytest.approx(0.8)]
    # Every proposal is 2 tokens (a letter or digit, then "\n" or EOS): 4 + 4 + 2 = 10 proposals, 20 tokens.
    assert out.samples == [10] and out.tokens == [20]
    assert [c[0] for c in ro.calls] == [4, 4, 2] and all(c[1:] == (8, ["\n"]) for c in ro.calls)


def test_step_beam_search_counts_every_sampled_token_on_the_tiny_model(tiny):
    torch.manual_seed(0)
    ro = HFRollout(newline_bias(copy.deepcopy(tiny.model), tiny.tokenizer), tiny.tokenizer, dtype=torch.float32)
    drawn = []
    inner = ro.sample_ids

    def counting(seqs, *a):
        outs = inner(seqs, *a)
        drawn.append(sum(len(o[0]) for o in outs))
        return outs

    ro.sample_ids = counting
    prm = ProcessRewardModel(tiny.model, Critic(tiny.model, "shared"), tiny.tokenizer, autocast_bf16=False)
    out = beam.step_beam_search(ro, prm, rows(3), beam_width=2, expand=2, max_steps=3, max_step_tokens=5)
    assert sum(out.tokens) == sum(drawn) and len(out.completions) == 3
    # at most 4 proposals per problem per round, each at most 5 tokens
    assert all(s <= 3 * 4 for s in out.samples) and all(t <= 3 * 4 * 5 for t in out.tokens)
