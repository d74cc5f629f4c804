"""The grading rule (envs/grading.py) against CPython itself: a call test passes exactly when Python,
running the same assert with the function returning the same value, would pass it (bool is never a
number here: the one documented exception); a test no answer could pass is refused; and a claim is
read against the expected value's shape, so none costs more than its size (no hash flooding).

The claims are what the sandbox's harness writes: its own encoder (`plain`, from grading.HARNESS)
turns each value into a report here, without a sandbox run.
"""

import json
import math
import random
import time

import pytest

from rlpost.envs import grading
from rlpost.envs.grading import Refused, judge, parse_test

_HARNESS = {}
exec(grading.HARNESS.split("\ndef main")[0], _HARNESS)  # the encoder the sandbox runs, and nothing else
P = 2 ** 61 - 1  # CPython hashes an int modulo this on 64-bit builds: its multiples all hash to 0


def claim(value):
    """The report's value as the grader reads it: the harness's encoding, through JSON."""
    return json.loads(json.dumps(_HARNESS["plain"](value)))


def graded(test, value) -> bool:
    status, _ = judge(parse_test(test), {"v": claim(value)})
    assert status in ("pass", "fail"), (test, value, status)
    return status == "pass"


def python(test: str, value) -> bool:
    """CPython's verdict on the assert, with f returning `value`: an assert that raises fails too."""
    try:
        exec(test, {"f": lambda *args: value, "math": math, "isclose": math.isclose})
    except (AssertionError, TypeError, OverflowError, ValueError):
        return False
    return True


def lit(v) -> str:
    """Python source of a literal (repr, but inf as 1e999: repr writes a name literal_eval refuses)."""
    if isinstance(v, float) and math.isinf(v):
        return "1e999" if v > 0 else "-1e999"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(map(lit, v)) + ("," if isinstance(v, tuple) and len(v) == 1 else "")
        return f"[{inner}]" if isinstance(v, list) else f"({inner})"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{lit(k)}: {lit(x)}" for k, x in v.items()) + "}"
    if isinstance(v, set):
        return "{" + ", ".join(map(lit, v)) + "}" if v else "set()"
    return repr(v)


# --- abs(f(x) - v) < t: Python's arithmetic and Python's operator --------------------------------


def test_the_issue_examples_get_pythons_verdict():
    # 2 * 3 + 1 = 7 is 1 off 6: abs(7 - 6) < 1 is False, <= 1 True; the old float rule took <= for both
    assert not graded("assert abs(f(3) - 6) < 1", 7) and graded("assert abs(f(3) - 6) <= 1", 7)
    # 2 * 10**17 + 8 is 8 off, exactly, in ints; as floats both are 2e17 and the old rule passed it
    assert not graded("assert abs(f(100000000000000000) - 200000000000000000) < 1", 2 * 10 ** 17 + 8)
    assert graded("assert abs(f(100000000000000000) - 200000000000000000) < 9", 2 * 10 ** 17 + 8)
    # Python rounds a float subtraction before comparing: 1e17 - (10**17 + 1) is 1e17 - 1e17 = 0.0 in floats
    assert python("assert abs(f(0) - 100000000000000001) < 1", 1e17)
    assert graded("assert abs(f(0) - 100000000000000001) < 1", 1e17)
    # an int past the floats against a float: Python's subtraction raises, so the test fails
    assert not python("assert abs(f(0) - 1.5) < 1e999", 10 ** 400)
    assert not graded("assert abs(f(0) - 1.5) < 1" + "0" * 500, 10 ** 400)
    # a claim that is no number fails, as str - int raises in Python
    assert not graded("assert abs(f(0) - 1) < 1", "1") and not python("assert abs(f(0) - 1) < 1", "1")


def _numbers(rng) -> tuple:
    """(claimed, expected) pairs near each other at the scales where floats round: small, 2**53, 10**17."""
    scale = rng.choice([1, 100, 2 ** 53, 10 ** 17, 3 * 10 ** 18])
    base = rng.randrange(-scale, scale + 1)
    off = rng.choice([0, 1, -1, 2, 7, 8, 9, rng.randrange(-1000, 1000)])
    exp = rng.choice([base, float(base), base + rng.random(), float(base) * (1 + rng.uniform(-1e-15, 1e-15))])
    got = rng.choice([base + off, float(base + off), exp, exp + off, float(exp) + rng.uniform(-2, 2)])
    return got, exp


def _bounds(got, exp) -> list:
    """Bounds at and around the exact distance and Python's float one: where < and <= part."""
    out = [1, 8, 9, 0.5, 1e-9]
    try:
        d = abs(got - exp)
    except OverflowError:
        return out
    out += [d, math.nextafter(float(d), math.inf), math.nextafter(float(d), 0.0), int(d), int(d) + 1]
    return [t for t in out if t >= 0 and math.isfinite(t)]


def test_abs_bounds_agree_with_cpython_on_random_and_boundary_values():
    rng = random.Random(51)
    forms = ["assert abs(f(0) - {v}) < {t}", "assert abs(f(0) - {v}) <= {t}", "assert abs({v} - f(0)) < {t}",
             "assert {t} > abs(f(0) - {v})", "assert {t} >= abs({v} - f(0))"]
    seen, split = 0, 0
    for _ in range(200):
        got, exp = _numbers(rng)
        for t in _bounds(got, exp):
            verdicts = set()
            for form in forms:
                test = form.format(v=f"({lit(exp)})", t=lit(t))
                if t == 0 and "<=" not in test and ">=" not in test:
                    with pytest.raises(Refused, match="never true"):
                        parse_test(test)
                    continue
                want = python(test, got)
                assert graded(test, got) == want, (test, got)
                verdicts.add(want)
                seen += 1
            split += len(verdicts) == 2
    assert seen > 3000 and split > 150  # many tests, and many where < and <= part at the boundary


# --- ==, math.isclose, truth: Python's rules, containers included --------------------------------


def _value(rng, depth=0, hashable=False):
    """A random plain value without bools (bool is never a number here: tested on its own below)."""
    kinds = ["int", "big", "float", "str", "bytes", "none", "tuple"]
    if not hashable and depth < 3:
        kinds += ["list", "dict", "set"]
    k = rng.choice(kinds)
    if k == "int":
        return rng.randrange(-5, 6)
    if k == "big":
        return rng.choice([10 ** 17 + rng.randrange(3), 2 ** 53 + 1, -(10 ** 30)])
    if k == "float":
        return rng.choice([0.5, -0.0, 0.1 + 0.2, 0.3, 1e17, 3.0, math.inf, 1 / 3])
    if k == "str":
        return rng.choice(["", "a", "ab"])
    if k == "bytes":
        return rng.choice([b"", b"a", b"ab"])
    if k == "none":
        return None
    items = [_value(rng, depth + 1, hashable or k in ("set",)) for _ in range(rng.randrange(3))]
    if k == "tuple":
        return tuple(items)
    if k == "list":
        return items
    if k == "set":
        return set(items)
    return {_value(rng, depth + 1, True): x for x in items}


def _near(rng, v):
    """A value Python may or may not find equal to v: a list for a tuple, a float for an int, one ulp off."""
    if isinstance(v, tuple) and rng.random() < 0.5:
        return list(v)
    if isinstance(v, list) and rng.random() < 0.5:
        return tuple(v)
    if isinstance(v, int) and abs(v) < 2 ** 63:
        return rng.choice([float(v), v + 1, v])
    if isinstance(v, float) and math.isfinite(v):
        return rng.choice([math.nextafter(v, math.inf), v, v * (1 + 1e-10), int(v)])
    if isinstance(v, list):
        return [_near(rng, x) for x in v]
    if isinstance(v, dict):
        return {k: _near(rng, x) for k, x in v.items()}
    if isinstance(v, set):
        return {rng.choice([x, float(x)]) if isinstance(x, int) and abs(x) < 2 ** 53 else x for x in v}
    return v


def test_equality_and_truth_agree_with_cpython_on_random_values():
    rng = random.Random(7)
    passed = failed = 0
    for _ in range(1500):
        exp = _value(rng)
        got = rng.choice([exp, _near(rng, exp), _value(rng)])
        for test in (f"assert f(0) == {lit(exp)}", f"assert {lit(exp)} == f(0)", "assert f(0)", "assert not f(0)"):
            want = python(test, got)
            assert graded(test, got) == want, (test, got)
            passed, failed = passed + want, failed + (not want)
    assert passed > 1000 and failed > 1000


def test_isclose_agrees_with_cpython():
    rng = random.Random(3)
    for _ in range(600):
        got, exp = _numbers(rng)
        got = rng.choice([got, 10 ** 400, exp * (1 + 1e-9), exp + 1e-9])
        exp = rng.choice([exp, exp, got])  # the claim itself: an int past the floats makes isclose raise
        for tol in ("", ", rel_tol=1e-9", ", abs_tol=1", ", rel_tol=0.0, abs_tol=0.5", ", rel_tol=1e-17"):
            test = f"assert math.isclose(f(0), {lit(exp)}{tol})"
            assert graded(test, got) == python(test, got), (test, got)


def test_the_rules_python_once_broke_here():
    # float == is exact: 0.1 + 0.2 is not 0.3 (the old rule took math.isclose's 1e-9 for ==)
    assert not graded("assert f(0) == 0.3", 0.1 + 0.2) and graded("assert f(0) == 0.30000000000000004", 0.1 + 0.2)
    # a list is not a tuple, in either direction and nested
    assert not graded("assert f(0) == (1, 2)", [1, 2]) and not graded("assert f(0) == [1, 2]", (1, 2))
    assert not graded("assert f(0) == {'k': [(1, 2)]}", {"k": [[1, 2]]}) and graded("assert f(0) == (1, [2])", (1, [2]))
    # as Python has it: 4.0 == 4, {1.0} == {1}, {1: 'a'} == {1.0: 'a'}, a frozenset equals a set
    assert graded("assert f(0) == 4", 4.0) and graded("assert f(0) == {1}", {1.0})
    assert graded("assert f(0) == {1: 'a'}", {1.0: "a"}) and graded("assert f(0) == {1, 2}", frozenset({2, 1}))
    # math.isclose on an int past the floats raises in Python, even when it is the expected int: the test fails
    huge = "1" + "0" * 400
    assert not graded(f"assert math.isclose(f(0), {huge})", 10 ** 400) and graded(f"assert f(0) == {huge}", 10 ** 400)


def test_bool_is_never_a_number_where_python_says_it_is():
    """The one rule stricter than Python's (docs/environments.md): True == 1 there, not here."""
    for test, value in [("assert f(0) == 1", True), ("assert f(0) == [0]", [False]), ("assert f(0) == {1}", {True}),
                        ("assert f(0) == {1: 'a'}", {True: "a"}), ("assert abs(f(0) - 1) < 0.5", True),
                        ("assert math.isclose(f(0), 0.0)", False), ("assert f(0) is True", 1)]:
        assert not graded(test, value) and (python(test, value) or test.endswith("is True"))


@pytest.mark.parametrize("test, why", [
    ("assert abs(f(0) - 2) < 0", "never true"),  # no distance is below 0
    ("assert abs(f(0) - 2) <= -1", "never true"),
    ("assert 0 > abs(2 - f(0))", "never true"),
    ("assert abs(f(0) - 'a') < 1", "no answer could pass"),  # str - str raises in Python
    ("assert math.isclose(f(0), [1.0])", "no answer could pass"),
    ("assert math.isclose(f(0), 1.0, abs_tol=1" + "0" * 400 + ")", "tolerance"),  # isclose raises OverflowError
    ({"call": "f(0)", "expected": float("nan")}, "NaN"),  # Python's == finds NaN equal to nothing
    ({"call": "f(0)", "expected": [1, float("nan")]}, "NaN"),
])
def test_tests_no_answer_could_pass_are_refused(test, why):
    with pytest.raises(Refused, match=why):
        parse_test(test)
    if isinstance(test, str):  # and Python agrees that no value passes them
        assert not any(python(test, v) for v in (2, 2.0, 1.5, 0, -1, True, "a", [1.0], 1.0, float("nan")))


@pytest.mark.parametrize("test, why", [
    ("assert abs(f(0) - 2) > 1", "unsupported"),  # far from 2: every wrong answer passes it
    ("assert abs(f(0) - 2) != 1", "unsupported"),
    ("assert abs(f(0) - 2) < 1e999", "finite"),  # every finite answer passes it
    ("assert abs(f(0) - 2) < True", "finite"),  # bool is never a number here
    ("assert abs(f(0) - True) < 1", "bool is none here"),
])
def test_tests_that_say_nothing_or_use_a_bool_as_a_number_are_refused(test, why):
    with pytest.raises(Refused, match=why):
        parse_test(test)


# --- the cost of a claim: read against the expected shape ----------------------------------------


def test_a_hash_flooded_claim_costs_its_size_not_its_square():
    """~1 MiB of ints that all hash alike, as a set, a dict and a list of sets: built into a set,
    they cost 27-59 s (quadratic). Read against the expected shape they fail (or pass) in one pass."""
    members = [P * k for k in range(1, 48_001)]
    flood = {"$set": members}
    assert len(json.dumps(flood)) > 1_000_000
    tests = {"assert f(0) == {1, 2, 3}": flood, "assert f(0) == 3": flood, "assert f(0) == [{1}]": [flood],
             "assert f(0) == {(1, 2)}": {"$set": [{"$tuple": [flood]}]},
             "assert f(0) == {" + ", ".join(map(str, range(48_000))) + "}": flood,
             "assert f(0) == {" + ", ".join(f"{k}: 0" for k in range(48_000)) + "}":
                 {"$dict": [[m, 0] for m in members]},
             "assert f(0)": flood}
    parsed = {test: parse_test(test) for test in tests}
    start = time.perf_counter()
    statuses = [judge(parsed[test], {"v": v})[0] for test, v in tests.items()]
    took = time.perf_counter() - start
    assert statuses == ["fail"] * 6 + ["pass"] and took < 5.0, (statuses, took)
    # the right answer, members in another order, still passes
    right = {"$set": list(range(48_000))[::-1]}
    assert judge(parsed[list(tests)[4]], {"v": right})[0] == "pass"
