"""The code verifier and its grading contract (envs/code.py, envs/grading.py): honest programs
score what they earn; tests are parsed outside the sandbox and only inputs go in; results come
back as plain values and are compared outside by a stated rule; tests the grader cannot run
safely are refused; and a code task refuses to start without bubblewrap unless told otherwise.

Sandbox runs use bubblewrap (skipped where it cannot run) except where a test names rlimits.
"""

import math
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from rlpost.envs import code, grading
from rlpost.sandbox import run
from rlpost.envs.code import TEMPLATES, build_splits, extract_program, make_row, prepare, score
from rlpost.envs.grading import CallTest, IoTest, Refused, canon, decode, parse_test, same
from rlpost.rewards.runner import VerifierRunner
from rlpost.sections import ConfigError

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(10, 1) == 11", "assert add(7, 7) == 14"]
FAST = {"wall_s": 2.0, "cpu_s": 1, "memory_mb": 256}
ADD_ROW = {"tests": ADD_TESTS, "limits": FAST}
needs_bwrap = pytest.mark.skipif(not run.bwrap_works(), reason="bubblewrap is missing or cannot run here")


def fenced(src: str) -> str:
    return f"Here is my solution:\n```python\n{src}\n```\n"


# --- parsing: what is graded, what is refused --------------------------------------------------


def test_accepted_test_forms_parse_to_inputs_and_expected_values():
    assert parse_test("assert add(1, 2) == 3") == CallTest("add", "(1, 2, )", "{}", 3)
    assert parse_test("assert [1, (2, 3)] == f(x=-1)") == CallTest("f", "()", "{'x': -1}", [1, [2, 3]])
    assert parse_test("assert f('a') is None").expected is None
    assert parse_test("assert is_even(4)").check == "truthy"
    assert parse_test("assert not is_even(3)").check == "falsy"
    t = parse_test("assert math.isclose(area(2.0), 12.566, rel_tol=0.001)")
    assert (t.fn, t.expected, t.rel_tol, t.abs_tol) == ("area", 12.566, 0.001, 0.0)
    t = parse_test("assert abs(root(2) - 1.4142) < 1e-4")
    assert (t.fn, t.expected, t.rel_tol, t.abs_tol) == ("root", 1.4142, 0.0, 1e-4)
    t = parse_test({"call": "f({1, 2}, b'x')", "expected": {"k": [1, 2]}, "abs_tol": 0.5})
    assert (t.args, t.expected, t.abs_tol) == ("({1, 2}, b'x', )", {"k": [1, 2]}, 0.5)
    assert parse_test({"stdin": "1 2\n", "stdout": "3"}) == IoTest("1 2\n", "3")


@pytest.mark.parametrize("test, why", [
    ("xs = [3, 1]; sort_in_place(xs); assert xs == [1, 3]", "single assert"),  # a side effect
    ("assert Solution().f(1) == 2", "by name"),  # a method call
    ("assert f(g(1)) == 2", "not a literal"),  # a computed argument
    ("assert f(*args) == 2", r"\*args"),
    ("assert f(1) == g(1)", "not a literal"),  # a computed expected value
    ("assert f(1) > 2", "unsupported assert"),
    ("assert f(1) == 2 == g(1)", "unsupported assert"),
    ("assert len(f(1)) == 2", "not a literal"),
    ("assert isinstance(f(1), int)", "not a literal"),
    ("def f(): pass", "single assert"),
    ("assert f(1) ==", "not valid Python"),
    ({"call": "f(1)"}, "expected"),
    ({"stdin": 3, "stdout": "3"}, "strings"),
    (42, "a test is"),
])
def test_tests_that_would_run_code_in_the_program_interpreter_are_refused(test, why):
    with pytest.raises(Refused, match=why):
        parse_test(test)


# --- values and the equality rule ----------------------------------------------------------------


def test_equality_rule():
    # floats by tolerance: |0.1 + 0.2 - 0.3| = 5.6e-17 <= max(1e-6 * 0.3, 1e-9)
    assert same(0.1 + 0.2, 0.3) and same(3, 3.0) and same(3.0000001, 3)  # 1e-7 <= 1e-6 * 3
    assert not same(3.00001, 3)  # 1e-5 > 1e-6 * 3 = 3e-6
    assert same(1e-10, 0.0) and not same(1e-8, 0.0)  # near zero only abs_tol = 1e-9 applies
    assert same(1.0, 1.05, rel_tol=0.1) and same(float("nan"), float("nan")) and not same(float("nan"), 1.0)
    # bool is not a number, None is only None; ints exactly, even beyond float range
    assert not same(1, True) and not same(True, 1) and not same(0, None) and same(True, True)
    assert same(10 ** 400, 10 ** 400) and not same(10 ** 400 + 1, 10 ** 400) and not same(10 ** 400, 1e300)
    # containers: tuples are lists, dicts by keys then values, sets exactly
    assert same(canon((1, 2)), canon([1, 2])) and not same([1, 2], [2, 1]) and not same([1], [1, 1])
    assert same({"a": 1.0000000001}, {"a": 1}) and not same({"a": 1}, {"a": 1, "b": 2}) and not same([1], {1: 1})
    assert same(canon({1, 2}), canon(frozenset([2, 1]))) and not same(canon({1, 2}), [1, 2])
    assert same("ab", "ab") and not same("ab", b"ab") and not same("1", 1)


def test_decode_accepts_only_what_the_harness_encoder_writes():
    assert decode([1, "a", None, 2.5, True]) == [1, "a", None, 2.5, True]
    assert decode({"$dict": [[[1, 2], "x"]]}) == {(1, 2): "x"}  # list keys come back hashable, as tuples
    assert decode({"$set": [1, 2]}) == frozenset({1, 2}) and decode({"$bytes": "6869"}) == b"hi"
    for forged in ({"a": 1}, {"$dict": [[1]]}, {"$set": 3}, {"$bytes": "zz"}, {"$dict": [], "x": 1}):
        with pytest.raises((ValueError, TypeError)):
            decode(forged)
    # A forged report is only a claimed value: it passes exactly when the claim is right.
    t = parse_test("assert add(1, 2) == 3")
    assert grading.judge(t, {"v": 3}) == "pass" and grading.judge(t, {"v": True}) == "fail"
    assert grading.judge(t, {"r": "pass"}) == "fail" and grading.judge(t, {"v": {"$set": [{"$dict": []}]}}) == "bad_report"


# --- grading through the sandbox ----------------------------------------------------------------


@needs_bwrap
def test_correct_wrong_and_partial_programs():
    reward, info = score(fenced("def add(a, b):\n    return a + b"), ADD_ROW)
    assert reward == 1.0 and info["passed"] == 4 and info["statuses"] == ["pass"] * 4 and info["backend"] == "bwrap"
    assert score(fenced("def add(a, b):\n    return a - b"), ADD_ROW)[0] == 0.0  # 1-2, 2-2, 10-1, 7-7: none match
    # a < 5 adds, else returns 0: add(1,2)=3 and add(2,2)=4 pass, add(10,1) and add(7,7) fail -> 2/4
    reward, info = score(fenced("def add(a, b):\n    return a + b if a < 5 else 0"), ADD_ROW)
    assert reward == 0.5 and info["statuses"] == ["pass", "pass", "fail", "fail"]
    # one call raising does not hide the others: 3/4, the second reports its exception name
    row = {"tests": [ADD_TESTS[0], "assert add('a', 1) == 2", *ADD_TESTS[2:]], "limits": FAST}
    reward, info = score(fenced("def add(a, b):\n    return a + b"), row)
    assert reward == 0.75 and info["statuses"][1] == "TypeError"
    # a refused test is never passed, whatever the program does
    row = {"tests": [ADD_TESTS[0], "xs = [1]; assert add(*xs) == 1"], "limits": FAST}
    assert score(fenced("def add(a, b=0):\n    return a + b"), row)[1]["statuses"] == ["pass", "refused"]


@needs_bwrap
def test_result_types_and_tolerances_end_to_end():
    prog = ("def pair(a):\n    return (a, [a])\ndef counts(s):\n    return {c: s.count(c) for c in set(s)}\n"
            "def third(x):\n    return x / 3\ndef uniq(xs):\n    return set(xs)\ndef obj(x):\n    return object()\n"
            "def loud(x):\n    print('noise', x)\n    return x")
    tests = ["assert pair(1) == (1, [1])", "assert counts('aab') == {'a': 2, 'b': 1}", "assert third(1) == 0.3333333",
             "assert uniq([2, 1, 2]) == {1, 2}", "assert obj(1) == 1", "assert third(1) == 1 / 3 + 1e-3",
             {"call": "pair(2)", "expected": [2, [2]]}, "assert loud(5) == 5", "assert not pair(0)"]
    reward, info = score(fenced(prog), {"tests": tests, "limits": FAST})
    # 0.3333333 is within 1e-6 relative of 1/3; 1/3 + 1e-3 is not a literal (refused); object() cannot leave
    assert info["statuses"] == ["pass", "pass", "pass", "pass", "unserializable:object", "refused", "pass", "pass", "fail"]
    assert "noise 5" in info["stderr_tail"]  # the program's prints go to stderr, never to the report channel


@needs_bwrap
def test_expected_values_never_enter_the_sandbox():
    """The program gathers everything it can reach (every descriptor from offset 0, its files, its
    environment and argv, every object in its interpreter) and reports what it found there: the
    inputs, as it must, and no expected value. The markers are built at run time, so the program's
    own source does not contain them."""
    spy = ("import gc, os, sys\nblob = []\nfor fd in range(64):\n    try:\n        blob.append(os.pread(fd, 1 << 20, 0))\n"
           "    except OSError:\n        pass\nfor n in os.listdir('.'):\n    blob.append(open(n, 'rb').read())\n"
           "blob += [repr(dict(os.environ)).encode(), repr(sys.argv).encode()]\n"
           "blob += [repr(o).encode() for o in gc.get_objects() if isinstance(o, (list, dict, tuple, str))]\n"
           "text = b''.join(blob)\n"
           "mark = lambda w: b'-'.join([b'zq', w])  # joined at run time: a + of two constants is folded into one\n"
           "print('inputs', mark(b'input') in text, b'12345' in text, 'expected', mark(b'expected') in text)\n"
           "def f(x):\n    return x")
    tests = ["assert f(12345) == 'zq-expected-1'", {"call": "f('in')", "expected": "zq-expected-2"}, "assert not f('zq-input-3')"]
    statuses, res = grading.run_calls(extract_program(fenced(spy)), [parse_test(t) for t in tests],
                                      run.Limits(**FAST), "bwrap", 0)
    assert statuses == ["fail", "fail", "fail"] and res.status == "ok"
    assert res.stderr == "inputs True True expected False\n", res.stderr  # the program's print goes to stderr
    assert "zq-expected" not in res.stdout


@needs_bwrap
def test_program_that_does_not_even_run_scores_zero():
    reward, info = score(fenced("def add(a, b)\n    return a + b"), ADD_ROW)
    assert reward == 0.0 and info["statuses"] == ["program:SyntaxError"] * 4
    assert score("I don't know.", ADD_ROW)[0] == 0.0


@needs_bwrap
def test_stdin_stdout_form_and_the_skip_rule_at_any_parallelism():
    row = {"tests": [{"stdin": "1 2 3\n", "stdout": "6"}, {"stdin": "5\n-5\n", "stdout": "0\n"},
                     {"stdin": "", "stdout": "0"}], "limits": FAST}
    good = "import sys\nprint(sum(map(int, sys.stdin.read().split())))"
    assert score(fenced(good), row)[0] == 1.0
    reward, info = score(fenced("print(6)"), row)  # right only for the first input
    assert reward == pytest.approx(1 / 3) and info["statuses"] == ["pass", "fail", "fail"]
    # hangs on the first input only; after the first timeout every later test is skipped, whether
    # or not it ran, so 1 or 3 sandboxes at once give the same statuses
    hang_first = "import sys\nif sys.stdin.read().startswith('1'):\n    while True: pass\nprint(0)"
    for parallel in (1, 3):
        r = {**row, "limits": {"wall_s": 1.0, "cpu_s": 1}, "sandbox": {"backend": "bwrap", "parallel": parallel}}
        reward, info = score(fenced(hang_first), r)
        assert reward == 0.0 and info["statuses"] == ["timeout", "skipped", "skipped"], parallel


@needs_bwrap
def test_every_template_reference_answer_scores_one():
    def grade(t):
        row = make_row(t, t.space[len(t.space) // 2])
        return t.name, row["answer"], *score(fenced(row["answer"]), {**row, "sandbox": {"backend": "bwrap", "parallel": 2}})

    with ThreadPoolExecutor(2) as pool:  # two at a time, as the 2 sandbox slots allow: ~0.1 s a run
        for name, answer, reward, info in pool.map(grade, TEMPLATES):
            assert reward == 1.0, (name, answer, info)


def test_extract_program():
    two = "```python\nx = 1\n```\ntext\n```python\nx = 2\n```\n```bash\nls\n```"
    assert extract_program(two) == "x = 2\n"  # the last python block, not the bash one
    assert extract_program("x = 3") == "x = 3"  # no fence: the whole completion
    assert extract_program("```\nx = 4\n```") == "x = 4\n"  # an untagged fence
    assert extract_program("```py\nx = 5\ny = 6") == "x = 5\ny = 6\n"  # cut off before the closing fence
    assert extract_program("```bash\nrm -rf /\n```") == ""  # fenced, but nothing that is Python


def test_splits_are_fixed_disjoint_and_cover_every_template():
    train, heldout = build_splits(500, 100, seed=0)
    assert len(train) == 500 and len(heldout) == 100 and heldout == build_splits(10, 100, seed=0)[1]
    prompt = lambda r: r["messages"][-1]["content"]
    assert not {prompt(r) for r in train} & {prompt(r) for r in heldout}
    assert {r["task"] for r in train} == {r["task"] for r in heldout} == {t.name for t in TEMPLATES}
    assert len(TEMPLATES) >= 30 and "```python block" in prompt(train[0])
    assert all(parse_test(t) for r in train[:50] for t in r["tests"])  # every built-in test is gradable


# --- no silent fallback ------------------------------------------------------------------------------


def tcfg(**kw):
    return SimpleNamespace(**{"sandbox": "bwrap", "sandboxes": 0, "on_bad_row": "refuse", **kw})


def test_code_task_refuses_to_start_without_bubblewrap(monkeypatch):
    monkeypatch.setattr(code, "bwrap_works", lambda: False)
    rows = [make_row(TEMPLATES[0], TEMPLATES[0].space[0])]
    with pytest.raises(ConfigError) as e:
        prepare(rows, rows, tcfg())
    msg = str(e.value)
    assert "\n" not in msg and "apt-get install bubblewrap" in msg and "task.sandbox=rlimits" in msg
    train, heldout, dropped = prepare(rows, rows, tcfg(sandbox="rlimits", sandboxes=3))  # asked for: allowed
    assert dropped == 0 and train[0]["sandbox"] == {"backend": "rlimits", "parallel": 3} and "sandbox" not in rows[0]


def test_a_row_without_sandbox_settings_is_graded_under_bwrap_or_not_at_all(monkeypatch):
    monkeypatch.setattr(run, "bwrap_works", lambda: False)
    with pytest.raises(run.SandboxUnavailable, match="apt-get install bubblewrap"):
        score(fenced("def add(a, b):\n    return a + b"), ADD_ROW)


def test_rows_with_ungradable_tests_are_refused_or_skipped(monkeypatch):
    monkeypatch.setattr(code, "bwrap_works", lambda: True)
    good = {"tests": ADD_TESTS, "_line": 1}
    bad = {"tests": ["xs = []; fill(xs); assert xs == [1]"], "_line": 7}
    with pytest.raises(ConfigError, match="line 7: test 0 .* refused: not a single assert"):
        prepare([good, bad], [good], tcfg())
    train, heldout, dropped = prepare([good, bad, {"_line": 9}], [good], tcfg(on_bad_row="skip"))
    assert [r["_line"] for r in train] == [1] and dropped == 2  # the refused test, and no tests at all


def test_build_task_code_refuses_without_bubblewrap(monkeypatch):
    from rlpost import config
    from rlpost.envs import build_task

    monkeypatch.setattr(code, "bwrap_works", lambda: False)
    with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
        build_task(config.load(None, ["task.name=code", "task.n_train=4", "task.n_heldout=2"]))
    task = build_task(config.load(None, ["task.name=code", "task.n_train=4", "task.n_heldout=2", "task.sandbox=rlimits",
                                         "task.sandboxes=2"]))
    assert task.train[0]["sandbox"] == {"backend": "rlimits", "parallel": 2}


# --- the real path -------------------------------------------------------------------------------


@needs_bwrap
def test_hostile_completions_through_the_verifier_runner():
    """The real path: the runner's worker process runs score(), which runs the sandbox."""
    class Batch:  # the runner reads only these two fields of a Rollouts
        def __init__(self, completions, rows):
            self.completions, self.rows = completions, rows

    hostile = [fenced("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
               fenced("while True:\n    print('x' * 10**6)"), fenced("x = bytearray(10 * 1024**3)"),
               fenced("import os\nos.kill(os.getppid(), 9)\nos.killpg(os.getpgid(os.getppid()), 9)"),
               fenced("class A:\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return A()")]
    good = fenced("def add(a, b):\n    return a + b")
    row = {"tests": ADD_TESTS, "limits": {"wall_s": 2.0, "memory_mb": 128}, "sandbox": {"backend": "bwrap", "parallel": 2}}
    runner = VerifierRunner("rlpost.envs.code:score", timeout_s=15)
    try:
        rewards, infos, metrics = runner.score(Batch([*hostile, good], [row] * (len(hostile) + 1)))
        assert rewards.tolist() == [0.0] * len(hostile) + [1.0]
        assert metrics["verifier/errors"] == 0 and metrics["verifier/timeouts"] == 0
        worker = runner.pids()
        rewards, _, _ = runner.score(Batch([good], [row]))  # still working, same worker
        assert rewards.tolist() == [1.0] and runner.pids() == worker
    finally:
        runner.close()


def test_isclose_default_abs_tol_is_zero_as_in_python():
    # math.isclose's own default abs_tol is 0: a test written with it means exactly that
    t = parse_test("assert math.isclose(f(1), 0.0)")
    assert t.abs_tol == 0.0 and not same(1e-12, t.expected, t.rel_tol, t.abs_tol) and math.isclose(0.0, t.expected)
