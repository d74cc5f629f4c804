"""Test-time search with a verifier-free scorer: greedy, majority vote, best-of-N, weighted
majority and step-level beam search under a process reward model (PRM, rewards/prm.py).

Why all of them in one place: they are only worth comparing at an equal sampling budget, so every
method returns a ``SearchResult`` that counts the tokens it generated and the samples it drew for
each problem. Best-of-N and majority take one ``Rollouts`` of N samples per problem, so several
selectors (majority, ORM best-of-N, PRM best-of-N, PRM-weighted majority) can be compared on the
very same samples (a paired comparison: their differences are not sampling noise).

Step-level beam search, as implemented here (the variant of Snell et al. 2024, arXiv:2408.03314,
Sec. 5 / HF search-and-learn, with the prefix ranking done by an aggregate of step scores):
1. The root (the prompt) proposes ``beam_width * expand`` first steps; afterwards each live beam
   proposes ``expand`` next steps, so every round samples at most ``beam_width * expand`` steps per
   problem, the same count as best-of-N with N = beam_width * expand.
2. A step is a line: sampling stops at "\\n", at EOS, or after ``max_step_tokens`` tokens.
3. The PRM scores every proposed prefix (``aggregate`` of its step scores, min by default); per
   problem the best ``beam_width`` proposals survive. Proposals that ended in EOS are finished:
   all are kept as candidates; those among the survivors take a slot and stop expanding.
4. After ``max_steps`` rounds (or when no beam is live) the answer is the best-scored finished
   solution, or the best live one if none finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from rlpost.rewards.prm import agg_min
from rlpost.search import metrics
from rlpost.types.batch import Rollouts

Scorer = Callable[[Rollouts], Sequence[float]]  # one score per sampled completion (higher = better)
AnswerFn = Callable[[str], "str | None"]  # the final answer of a completion, None when there is none


@dataclass
class SearchResult:
    completions: list[str]  # the chosen solution of each problem
    tokens: list[int]  # tokens generated for each problem, over every sample or proposed step
    samples: list[int]  # samples drawn per problem (completions, or proposed steps for beam search)
    scores: list[float]  # the selector's score of each chosen solution (0 when it has none)


def tokens_per_problem(batch: Rollouts, n: int) -> list[int]:
    """Generated tokens per problem: each completion's tokens up to and incl. EOS, summed over its n samples."""
    return batch.completion_mask.sum(1).view(-1, n).sum(1).tolist()  # (B,) -> (R,)


def greedy(rollout, rows: list[dict], max_new_tokens: int) -> SearchResult:
    """One greedy completion per problem: the baseline with the smallest budget."""
    batch = rollout.generate(rows, 1, 0.0, 1.0, max_new_tokens)
    return SearchResult(batch.completions, tokens_per_problem(batch, 1), [1] * len(rows), [0.0] * len(rows))


def pick_best(batch: Rollouts, scores: Sequence[float], n: int) -> SearchResult:
    """Best-of-N on given samples: per problem, the completion with the highest score (first on ties)."""
    chosen, best = [], []
    for g in range(len(batch) // n):
        i = g * n + metrics.best_of_n(scores[g * n:(g + 1) * n])
        chosen.append(batch.completions[i])
        best.append(float(scores[i]))
    return SearchResult(chosen, tokens_per_problem(batch, n), [n] * len(chosen), best)


def pick_majority(batch: Rollouts, n: int, answer_fn: AnswerFn, weights: Sequence[float] | None = None) -> SearchResult:
    """Majority vote over each problem's n answers (weighted by ``weights`` when given: the
    PRM-weighted majority). The returned completion is the heaviest sample with the winning answer
    (the first one without weights); a problem where no sample has an answer returns its first."""
    chosen, totals = [], []
    for g in range(len(batch) // n):
        idx = range(g * n, (g + 1) * n)
        answers = [answer_fn(batch.completions[i]) for i in idx]
        w = [weights[i] for i in idx] if weights is not None else [1.0] * n
        winner = metrics.majority_vote(answers, w if weights is not None else None)
        mine = [k for k, a in enumerate(answers) if a == winner and winner is not None] or [0]
        k = max(mine, key=lambda j: (w[j], -j))
        chosen.append(batch.completions[idx[k]])
        totals.append(sum(w[j] for j in mine) if winner is not None else 0.0)
    return SearchResult(chosen, tokens_per_problem(batch, n), [n] * len(chosen), totals)


def best_of_n(rollout, rows: list[dict], scorer: Scorer, n: int, max_new_tokens: int, temperature: float,
              top_p: float = 1.0) -> SearchResult:
    """Sample n completions per problem, keep the one ``scorer`` rates highest (an ORM, a PRM, or an oracle)."""
    batch = rollout.generate(rows, n, temperature, top_p, max_new_tokens)
    return pick_best(batch, scorer(batch), n)


def majority(rollout, rows: list[dict], n: int, answer_fn: AnswerFn, max_new_tokens: int, temperature: float,
             top_p: float = 1.0, scorer: Scorer | None = None) -> SearchResult:
    """Self-consistency: n samples, the most common answer; with ``scorer``, weighted majority."""
    batch = rollout.generate(rows, n, temperature, top_p, max_new_tokens)
    return pick_majority(batch, n, answer_fn, scorer(batch) if scorer is not None else None)


@dataclass
class Beam:
    problem: int  # index into rows
    ids: list[int]  # completion tokens so far
    done: bool = False  # ended with EOS
    score: float = 0.0  # aggregate PRM score of the prefix


def step_beam_search(rollout, prm, rows: list[dict], beam_width: int, expand: int, max_steps: int,
                     max_step_tokens: int, temperature: float = 0.7, top_p: float = 1.0,
                     aggregate=agg_min) -> SearchResult:
    """Step-level beam search under ``prm`` (anything with ``score(prompts, completions, aggregate)``);
    the variant is described in the module docstring. All problems' beams are sampled in one
    ``sample_ids`` call per round and scored in one PRM call per round."""
    tok = rollout.tok
    prompts = [tok(t, add_special_tokens=False).input_ids for t in rollout.render(rows)]
    R = len(rows)
    live = [Beam(r, []) for r in range(R)]
    finished: list[list[Beam]] = [[] for _ in range(R)]
    tokens, samples = [0] * R, [0] * R
    for step in range(max_steps):
        if not live:
            break
        k = beam_width * expand if step == 0 else expand  # every round proposes <= beam_width * expand steps
        parents = [b for b in live for _ in range(k)]
        outs = rollout.sample_ids([prompts[b.problem] + b.ids for b in parents], temperature, top_p,
                                  max_step_tokens, ["\n"])
        cands = [Beam(b.problem, b.ids + new, how == "eos") for b, (new, _, how) in zip(parents, outs)]
        for c, (new, _, _) in zip(cands, outs):
            tokens[c.problem] += len(new)
            samples[c.problem] += 1
        for c, s in zip(cands, prm.score([prompts[c.problem] for c in cands], [c.ids for c in cands], aggregate)):
            c.score = s
        live = []
        for r in range(R):
            mine = sorted((c for c in cands if c.problem == r), key=lambda c: -c.score)  # stable: first on ties
            finished[r] += [c for c in mine if c.done]
            live += [c for c in mine[:beam_width] if not c.done]
    chosen, scores = [], []
    for r in range(R):
        pool = finished[r] or [b for b in live if b.problem == r] or [Beam(r, [])]
        best = max(pool, key=lambda c: c.score)  # max() keeps the first of equal scores
        chosen.append(tok.decode(best.ids, skip_special_tokens=True))
        scores.append(best.score)
    return SearchResult(chosen, tokens, samples, scores)
