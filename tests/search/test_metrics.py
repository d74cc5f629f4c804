"""Hand-worked numbers for the fixed-budget metrics: the arithmetic is in each comment."""

import math

import pytest

from rlpost.search.metrics import best_of_n, maj_at_k, majority_vote, pass_at_k, weighted_best_of_n


def test_pass_at_1_is_the_fraction_correct():
    # 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)


def test_pass_at_2_counts_pairs():
    # 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7   (product form: 1 - (1 - 2/4)(1 - 2/5) = 1 - 0.5 * 0.6)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)


def test_pass_at_k_edges():
    assert pass_at_k(4, 0, 2) == 0.0  # no correct sample: C(4,2)/C(4,2) = 1, so 1 - 1 = 0
    assert pass_at_k(4, 4, 2) == 1.0  # n - c = 0 < k: every pair holds a correct sample
    assert pass_at_k(4, 3, 2) == 1.0  # one wrong sample cannot fill a pair on its own
    # n = k: pass@n is 1 as soon as one sample is correct
    assert pass_at_k(3, 1, 3) == 1.0


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 100) overflows a float; the product form does not. Check against exact integers.
    exact = 1 - math.comb(990, 100) / math.comb(1000, 100)
    assert pass_at_k(1000, 10, 100) == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="n >= k"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)  # c > n
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 0)


def test_majority_vote_counts_and_skips_none():
    # "4": 2 votes, "5": 1 vote, None: no vote
    assert majority_vote(["4", None, "5", "4", None]) == "4"
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_majority_vote_tie_goes_to_first_seen():
    # "b" and "a" both have 2 votes; "b" appeared first
    assert majority_vote(["b", "a", "a", "b"]) == "b"
    assert majority_vote([None, "a", "b"]) == "a"


def test_a_weighted_vote_with_a_nan_weight_still_answers():
    # a scorer gone NaN must not stop the search with StopIteration: an answer comes back (the scorer's own checks
    # say it diverged); NaN compares false, so it neither wins nor loses a comparison
    assert majority_vote(["x", "y"], weights=[float("nan"), float("nan")]) in ("x", "y")
    assert majority_vote(["x", "y", "x"], weights=[0.5, float("nan"), 0.5]) in ("x", "y")


def test_weighted_vote():
    # "x": 0.2 + 0.3 = 0.5, "y": 0.9  ->  "y" wins although "x" has more votes
    assert majority_vote(["x", "y", "x"], weights=[0.2, 0.9, 0.3]) == "y"
    # "x": 0.5 + 0.5 = 1.0 ties "y": 1.0 -> first seen ("x")
    assert majority_vote(["x", "y", "x"], weights=[0.5, 1.0, 0.5]) == "x"
    with pytest.raises(ValueError):
        majority_vote(["x"], weights=[1.0, 2.0])


def test_weighted_vote_sums_from_zero():
    # "x" 1e-20 beats "y" 0; sums started at 1.0 would both round to 1.0 and tie ("y", first seen)
    assert majority_vote(["y", "x"], weights=[0.0, 1e-20]) == "x"


def test_maj_at_k_is_the_expectation_over_k_subsets():
    answers, right = ["4", "5", "4", "6"], {"4": True}
    # k=1: each sample alone; 2 of 4 right = 0.5, which is pass@1
    assert maj_at_k(answers, right, k=1) == pytest.approx(0.5) == pass_at_k(4, 2, 1)
    # k=2, the C(4,2) = 6 pairs: {4,4} -> 1; {4,5} x2, {4,6} x2 -> ties, 1/2 each; {5,6} -> 0: 3/6
    assert maj_at_k(answers, right, k=2) == pytest.approx(0.5)
    # k=3, 4 triples: {4,5,4} -> 1, {4,4,6} -> 1, {4,5,6} x2 -> 3-way ties, 1/3 each: (2 + 2/3) / 4
    assert maj_at_k(answers, right, k=3) == pytest.approx((2 + 2 / 3) / 4)
    # k=n: the plain majority, "4" with 2 votes
    assert maj_at_k(answers, lambda a: a == "4", k=4) == 1.0
    # the first-k vote would say 0.5 here ({4,5} tie); the expectation does not depend on order
    assert maj_at_k(["5", "4", "4", "6"], right, k=3) == maj_at_k(answers, right, k=3)
    assert maj_at_k([None, None, "3"], {"3": True}, k=2) == pytest.approx(2 / 3)  # {None,None} has no vote
    with pytest.raises(ValueError):
        maj_at_k(answers, right, k=5)


def test_maj_at_k_samples_subsets_when_there_are_too_many():
    # 30 answers, 18 right: C(30, 15) ~ 1.6e8 subsets -> 20000 seeded ones; the exact value is the
    # chance that "r" has > 7.5 votes among 15 (hypergeometric), computed by enumeration of counts
    import math

    answers = ["r"] * 18 + ["w"] * 12
    exact = sum(math.comb(18, j) * math.comb(12, 15 - j) for j in range(8, 16)) / math.comb(30, 15)
    est = maj_at_k(answers, {"r": True}, k=15)
    assert abs(est - exact) < 0.02 and est == maj_at_k(answers, {"r": True}, k=15)  # seeded: repeatable


def test_best_of_n_first_on_ties():
    assert best_of_n([0.1, 0.9, 0.3]) == 1
    assert best_of_n([0.5, 0.9, 0.9]) == 1
    assert best_of_n([-2.0]) == 0
    with pytest.raises(ValueError):
        best_of_n([])


def test_weighted_best_of_n_sums_scores_per_answer():
    # best single sample is "12" (0.8), but "10" sums to 0.6 + 0.5 + 0.4 = 1.5 > 0.8
    answers, scores = ["10", "12", "10", None, "10"], [0.6, 0.8, 0.5, 1.0, 0.4]
    assert best_of_n(scores) == 3 and answers[best_of_n(scores)] is None  # the unparsed sample
    assert weighted_best_of_n(answers, scores) == "10"
    with pytest.raises(ValueError):
        weighted_best_of_n(["a"], [])


def test_maj_at_1_is_pass_at_1_whatever_the_order():
    # over every 1-subset: one sample's majority is that sample, so maj@1 = the fraction correct
    assert maj_at_k(["3", "7"], {"3": True}, k=1) == 0.5
    assert maj_at_k(["7", "3"], {"3": True}, k=1) == 0.5
    assert maj_at_k(["3", "3", "7", None], {"3": True}, k=1) == 0.5  # None casts no vote: a wrong subset
    # k=2 of ["3", "3", "7"]: subsets {3,3} -> right, {3,7} twice -> a tie, half right: (1 + 0.5 + 0.5) / 3
    assert maj_at_k(["3", "3", "7"], {"3": True}, k=2) == pytest.approx(2 / 3)


def test_weighted_best_of_n_differs_from_the_plain_vote():
    # "b" has more votes (2 vs 1) but "a" the larger summed score (0.9 vs 0.2 + 0.3 = 0.5)
    answers, scores = ["a", "b", "b"], [0.9, 0.2, 0.3]
    assert majority_vote(answers) == "b" and weighted_best_of_n(answers, scores) == "a"
