"""Metrics at a fixed sampling budget: pass@k, majority vote / maj@k, best-of-n and weighted
majority. Pure Python on plain lists, so they serve evaluation scripts and test-time search
alike without torch.

Which variant each one is:
- pass@k: the unbiased estimator of Chen et al. 2021 (arXiv:2107.03374, Eq. 1) from n >= k
  samples of which c are correct, not the biased 1 - (1 - c/n)^k.
- maj@k: self-consistency (Wang et al. 2022) at a budget of k samples, estimated from n >= k
  without bias the way pass@k is: the expected correctness of the majority answer of k samples
  drawn without replacement from the n, i.e. the mean over all C(n, k) subsets (over a seeded
  uniform sample of them when there are more than ``max_subsets``, which is still unbiased). A tie
  between answers counts as a uniform pick among them (credit = their share that is correct), so
  maj@1 equals pass@1 exactly and the order of the samples does not matter. Voting on the first
  k samples only would be one draw of this estimate, with its variance.
- weighted majority: the answer with the largest summed score (Uesato et al. 2022's
  verifier-weighted majority; Math-Shepherd's "self-consistency + reward model"); best-of-n: the
  single highest-scored sample.
Ties always go to the answer (or sample) seen first, so results do not depend on dict order.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Callable, Mapping, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples, drawn without replacement from n samples of
    which c are correct, is correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), the product form of the ratio of binomials
    (Chen et al.'s numpy snippet), which never forms the huge binomial coefficients."""
    if not (0 <= c <= n and k >= 1):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if n < k:
        raise ValueError(f"pass_at_k needs n >= k samples, got n={n} < k={k}")
    if n - c < k:  # fewer than k wrong samples: every k-subset contains a correct one
        return 1.0
    # C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n} (i-k)/i : the probability that all k picks are wrong.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_vote(answers: Sequence[str | None], weights: Sequence[float] | None = None) -> str | None:
    """The most common non-None answer; with ``weights``, the answer with the largest total
    weight. Ties go to the answer that appears first. None when every answer is None (a sample
    whose answer could not be parsed casts no vote)."""
    if weights is not None and len(weights) != len(answers):
        raise ValueError(f"majority_vote: {len(answers)} answers but {len(weights)} weights")
    totals: dict[str, float] = {}  # insertion order = first occurrence, which breaks ties
    for i, answer in enumerate(answers):
        if answer is not None:
            totals[answer] = totals.get(answer, 0.0) + (1.0 if weights is None else float(weights[i]))
    if not totals:
        return None
    return max(totals, key=totals.__getitem__)  # max keeps the first of equal totals


def maj_at_k(answers: Sequence[str | None], is_correct: Mapping[str, bool] | Callable[[str], bool], k: int,
             max_subsets: int = 20_000, seed: int = 0) -> float:
    """Expected correctness of the majority answer of k of the n samples (module docstring).

    ``is_correct`` says which answers are right: a dict (answers not in it are wrong) or a
    function of the answer string. An answer of None casts no vote; a subset with no vote at all
    counts as wrong."""
    n = len(answers)
    if k < 1 or n < k:
        raise ValueError(f"maj_at_k needs 1 <= k <= len(answers), got k={k} with {n} answers")
    ok = is_correct if callable(is_correct) else (lambda a: is_correct.get(a, False))
    right = {a: float(bool(ok(a))) for a in set(answers) if a is not None}
    if math.comb(n, k) <= max_subsets:
        subsets = itertools.combinations(range(n), k)
    else:  # uniform k-subsets, seeded: the same number every time
        rng = random.Random(seed)
        subsets = (rng.sample(range(n), k) for _ in range(max_subsets))
    total, count = 0.0, 0
    for subset in subsets:
        votes: dict[str, int] = {}
        for i in subset:
            if answers[i] is not None:
                votes[answers[i]] = votes.get(answers[i], 0) + 1
        if votes:
            best = max(votes.values())
            winners = [a for a, v in votes.items() if v == best]
            total += sum(right[a] for a in winners) / len(winners)
        count += 1
    return total / count


def best_of_n(scores: Sequence[float]) -> int:
    """Index of the highest score (a verifier's or reward model's), the first one on ties."""
    if len(scores) == 0:
        raise ValueError("best_of_n needs at least one score")
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def weighted_best_of_n(answers: Sequence[str | None], scores: Sequence[float]) -> str | None:
    """Weighted majority: the answer whose samples' scores sum highest (ties: first seen).

    Summing rather than taking the max is what lets many moderately scored samples of one
    answer beat a single lucky high score. Scores are assumed non-negative (PRM/ORM
    probabilities); a negative score would count against its answer."""
    if len(scores) != len(answers):
        raise ValueError(f"weighted_best_of_n: {len(answers)} answers but {len(scores)} scores")
    return majority_vote(answers, weights=scores)
