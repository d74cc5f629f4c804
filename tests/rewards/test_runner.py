"""The verifier runner never crashes the step: raising, hanging, printing, dying verifiers."""

import time

import pytest

from rlpost.rewards.runner import VerifierRunner


class FakeBatch:
    def __init__(self, completions):
        self.completions = completions
        self.rows = [{"answer": "1"}] * len(completions)


def test_raising_verifier_scores_zero_and_is_counted():
    r = VerifierRunner("toy_verifiers:raises", timeout_s=5)
    rewards, infos, m = r.score(FakeBatch(["a", "b"]))
    assert rewards.tolist() == [0.0, 0.0] and m["verifier/errors"] == 2
    assert "RuntimeError: broken verifier" in infos[0]["error"]
    r.close()


def test_hanging_verifier_times_out_and_the_rest_still_score():
    r = VerifierRunner("toy_verifiers:hangs", timeout_s=0.5)
    t0 = time.perf_counter()
    rewards, infos, m = r.score(FakeBatch(["ok", "hang", "ok"]))
    assert time.perf_counter() - t0 < 10
    assert rewards.tolist() == [1.0, 0.0, 1.0]
    assert m["verifier/timeouts"] == 1 and infos[1] == {"timeout": True}
    r.close()


def test_printing_and_plain_float_verifiers():
    r = VerifierRunner("toy_verifiers:prints", timeout_s=5)
    assert r.score(FakeBatch(["x"]))[0].tolist() == [0.5]
    r.close()
    r = VerifierRunner("toy_verifiers:returns_float", timeout_s=5)
    assert r.score(FakeBatch(["x"]))[0].tolist() == [0.25]
    r.close()


def test_verifier_that_kills_its_worker():
    r = VerifierRunner("toy_verifiers:kills_itself", timeout_s=5)
    rewards, _, m = r.score(FakeBatch(["ok", "die", "ok"]))
    assert rewards.tolist() == [1.0, 0.0, 1.0] and m["verifier/errors"] == 1
    r.close()


def test_bad_import_path_fails_early_with_a_clear_message():
    with pytest.raises((ValueError, ImportError, AttributeError)):
        VerifierRunner("toy_verifiers:does_not_exist", timeout_s=1)
    with pytest.raises(ValueError, match="module:function"):
        VerifierRunner("no_colon_here", timeout_s=1)
