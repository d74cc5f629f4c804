"""Metrics at a fixed sampling budget: pass@k, majority vote / maj@k, best-of-n and weighted
majority. Pure Python on plain lists, so they serve evaluation scripts and test-time search
alike without torch.

Which variant each one is:
- pass@k: the unbiased estimator of Chen et al. 2021 (arXiv:2107.03374, Eq. 1) from n >= k
  samples of which c are correct, not the biased 1 - (1 - c/n)^k.
- maj@k: the majority answer over the FIRST k samples (self-consistency, Wang et al. 2022).
  With n > k samples this is one draw of the estimate, not its expectation over subsets; take
  k = n, or average over shuffles, when that variance matters.
- weighted majority: the answer with the largest summed score (Uesato et al. 2022's
  verifier-weighted majority; Math-Shepherd's "self-consistency + reward model"); best-of-n: the
  single highest-scored sample.
Ties always go to the answer (or sample) seen first, so results do not depend on dict order.
"""

from __future__ import annotations

import math
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
    best = max(totals.values())
    return next(a for a, t in totals.items() if t == best)


def maj_at_k(answers: Sequence[str | None], is_correct: Mapping[str, bool] | Callable[[str], bool], k: int) -> float:
    """1.0 if the majority answer of the first k samples is correct, else 0.0.

    ``is_correct`` says which answers are right: a dict (answers not in it are wrong) or a
    function of the answer string. No majority (all k answers None) counts as wrong."""
    if k < 1 or len(answers) < k:
        raise ValueError(f"maj_at_k needs 1 <= k <= len(answers), got k={k} with {len(answers)} answers")
    winner = majority_vote(answers[:k])
    if winner is None:
        return 0.0
    ok = is_correct(winner) if callable(is_correct) else is_correct.get(winner, False)
    return float(bool(ok))


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
