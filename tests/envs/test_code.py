"""The code verifier and its grading contract (envs/code.py, envs/grading.py): honest programs
score what they earn; tests are parsed outside the sandbox and only inputs go in; results come
back as plain values and are compared outside by a stated rule; tests the grader cannot run
safely are refused; and a code task refuses to start without bubblewrap unless told otherwise.

Sandbox runs use bubblewrap (skipped where it cannot run) except where a test names rlimits.
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from rlpost.envs import code, grading
from rlpost.sandbox import run
from rlpost.envs.code import TEMPLATES, build_splits, extract_program, make_row, prepare, score
from rlpost.envs.claims import same, well_formed
from rlpost.envs.grading import CallTest, IoTest, Refused, canon, parse_test
from rlpost.rewards.runner import VerifierRunner
from rlpost.sections import ConfigError

ROOT = os.geteuid() == 0
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(10, 1) == 11", "assert add(7, 7) == 14"]
FAST = {"wall_s": 2.0, "cpu_s": 1, "memory_mb": 256}
ADD_ROW = {"tests": ADD_TESTS, "limits": FAST}
needs_bwrap = pytest.mark.skipif(not run.bwrap_works(), reason="bubblewrap is missing or cannot run here")


def fenced(src: str) -> str:
    return f"Here is my solution:\n```python\n{src}\n```\n"


# --- parsing: what is graded, what is refused --------------------------------------------------


def test_accepted_test_forms_parse_to_inputs_and_expected_values():
    assert parse_test("assert add(1, 2) == 3") == CallTest("add", "(1, 2, )", "{}", 3)
    assert parse_test("assert [1, (2, 3)] == f(x=-1)") == CallTest("f", "()", "{'x': -1}", [1, (2, 3)])
    assert parse_test("assert f('a') is None").expected is None
    assert parse_test("assert is_even(4)").check == "truthy"
    assert parse_test("assert not is_even(3)").check == "falsy"
    t = parse_test("assert math.isclose(area(2.0), 12.566, rel_tol=0.001)")  # abs_tol: isclose's default, 0
    assert (t.fn, t.expected, t.tol) == ("area", 12.566, (0.001, 0.0))
    assert parse_test("assert math.isclose(area(2.0), 12.566)").tol == (1e-9, 0.0)  # Python's defaults
    t = parse_test("assert abs(root(2) - 1.4142) < 1e-4")  # Python's operator and bound, kept as written
    assert (t.fn, t.expected, t.check, t.tol, t.bound) == ("root", 1.4142, "abs", None, ("<", 1e-4, False))
    assert parse_test("assert 1 >= abs(3 - root(9))").bound == ("<=", 1, True)
    t = parse_test({"call": "f({1, 2}, b'x')", "expected": {"k": [1, 2]}, "abs_tol": 0.5})
    assert (t.args, t.expected, t.tol) == ("({1, 2}, b'x', )", {"k": [1, 2]}, (1e-9, 0.5))
    assert parse_test("assert f(1) == 2").tol is None and parse_test({"call": "f(1)", "expected": 2}).tol is None
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
    ({"call": "f(1)", "expected": 1.0, "abs_tol": -1}, "tolerance"),
    ("assert math.isclose(f(1), 2.0, rel_tol=float('nan'))", "not a literal"),
    ({"call": "f(1)", "expected": 1.0, "rel_tol": "x"}, "tolerance"),
])
def test_tests_that_would_run_code_in_the_program_interpreter_are_refused(test, why):
    with pytest.raises(Refused, match=why):
        parse_test(test)


# --- values and the equality rule ----------------------------------------------------------------


def test_equality_rule_is_exact_where_python_is():
    # claims as the harness writes them (json.loads output): tuples tagged, sets and dicts tagged
    # ints: exact, as Python compares; a float only when it is exactly the int (4.0 == 4)
    assert same(3, 3) and same(3.0, 3) and not same(3.0000001, 3) and not same(2.9999999999999996, 3)
    big = 10 ** 17 + 1  # float(big) == 1e17, within 1e-6 (and 1e-9) of it relatively: a tolerance would pass it
    assert same(big, big) and not same(1e17, big) and not same(float(10 ** 17), big)
    assert same(10 ** 400, 10 ** 400) and not same(10 ** 400 + 1, 10 ** 400) and not same(1e300, 10 ** 400)
    # bool is never a number, None only None, in either direction and inside containers
    assert not same(1, True) and not same(True, 1) and not same(0, None) and same(True, True)
    assert not same([True, False], [1, 0]) and not same({"$dict": [[1, "a"]]}, canon({True: "a"}))
    assert not same({"$set": [True, 2]}, canon({1, 2})) and same({"$set": [2, True]}, canon({True, 2}))
    # floats with no stated tolerance: exact, as Python's == (0.1 + 0.2 is 0.30000000000000004)
    assert not same(0.1 + 0.2, 0.3) and same(0.1 + 0.2, 0.30000000000000004) and same(3, 3.0)
    # a stated tolerance is math.isclose's: |1.05 - 1.0| = 0.05 <= 0.1 * 1.05; |3.2 - 3| = 0.2 > 0.1
    assert same(1.0, 1.05, (0.1, 0.0)) and same(3.05, 3, (0.0, 0.1)) and not same(3.2, 3, (0.0, 0.1))
    assert not same(float("nan"), 1.0) and not same(float("nan"), 1.0, (0.1, 0.1))
    # containers: a tuple is not a list; dicts by keys then values, sets exactly; floats inside at the same rule
    assert same({"$tuple": [1, 2]}, canon((1, 2))) and not same([1, 2], canon((1, 2)))
    assert not same({"$tuple": [1, 2]}, [1, 2]) and not same([1, 2], [2, 1]) and not same([1], [1, 1])
    assert same({"$dict": [["a", 1.5]]}, {"a": 1.5}) and not same({"$dict": [["a", 1.0001]]}, {"a": 1})
    assert not same({"$dict": [["a", 1]]}, {"a": 1, "b": 2}) and same({"$set": [2, 1]}, canon(frozenset([1, 2])))
    assert not same([1, 2], canon({1, 2})) and same("ab", "ab") and not same("ab", b"ab") and not same("1", 1)
    assert same({"$bytes": "6869"}, b"hi") and not same({"$bytes": "68"}, b"hi")


def test_only_what_the_harness_encoder_writes_is_a_claim():
    assert well_formed([1, "a", None, 2.5, True]) and well_formed({"$dict": [[{"$tuple": [1, 2]}, "x"]]})
    assert well_formed({"$set": [1, {"$set": [2]}]}) and well_formed({"$bytes": "6869"})
    # a list or a dict cannot be a set member or a dict key in Python, so no harness writes one
    for forged in ({"a": 1}, {"$dict": [[1]]}, {"$set": 3}, {"$bytes": "zz"}, {"$bytes": "6 8"}, {"$dict": [], "x": 1},
                   {"$set": [[1]]}, {"$dict": [[[1], 2]]}, {"$set": [{"$dict": []}]}, {"$tuple": 1}):
        assert not well_formed(forged), forged
    # A forged report is only a claimed value: it passes exactly when the claim is right.
    t = parse_test("assert add(1, 2) == 3")
    assert grading.judge(t, {"v": 3}) == ("pass", "") and grading.judge(t, {"v": True}) == ("fail", "")
    assert grading.judge(t, {"r": "pass"}) == ("bad_report", "")
    assert grading.judge(t, {"v": {"$set": [{"$dict": []}]}}) == ("bad_report", "")


@pytest.mark.parametrize("report", [
    {"raised": "pass"}, {"e": "pass"}, {"unserializable": "pass"}, {"status": "pass"}, {"raised": "pass", "v": 4},
    {"program_raised": "pass"}, {"v": "pass"}, {"v": 3.0000001}, {"v": [3]}, {"v": {"$set": [3]}},
])
def test_no_text_in_a_report_is_ever_a_pass(report):
    """Whatever a report names, it passes only with the right value; a name is at most a message."""
    t = parse_test("assert add(1, 2) == 3")
    status, message = grading.judge(t, report)
    assert status in grading.STATUSES and status != "pass" and status != message


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
    assert reward == 0.75 and info["statuses"][1] == "raised" and info["messages"][1] == "TypeError"
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
             {"call": "pair(2)", "expected": [2, [2]]}, "assert loud(5) == 5", "assert not pair(0)",
             "assert math.isclose(third(1), 0.3333333, rel_tol=1e-6)", "assert third(3) == 1", "assert third(1.5) == 1"]
    reward, info = score(fenced(prog), {"tests": tests, "limits": FAST})
    # 0.3333333 is not 1/3 (== is exact), and is 1e-7 relative from it: within a stated 1e-6; 1/3 + 1e-3
    # is not a literal (refused); object() cannot leave; a JSON list expected is a list, and pair returns a
    # tuple, so Python's == says no; 3 / 3 = 1.0 is exactly the int 1, 1.5 / 3 = 0.5 is not
    assert info["statuses"] == ["pass", "pass", "fail", "pass", "unserializable", "refused", "fail", "pass", "fail",
                                "pass", "pass", "fail"]
    assert info["messages"][4] == "object"
    assert "noise 5" in info["stderr_tail"]  # the program's prints go to stderr, never to the report channel


@needs_bwrap
def test_expected_values_never_enter_the_sandbox():
    """The program gathers everything it can reach (every descriptor from offset 0, its files, its
    environment and argv, every object in its interpreter) and reports what it found there: the
    inputs, as it must, and no expected value. The markers are built at run time, so the program's
    own source does not contain them."""
    spy = ("import gc, os, sys\nblob = []\nfor fd in range(64):\n    try:\n"
           "        blob.append(os.pread(fd, 1 << 20, 0))\n    except OSError:\n        pass\n"
           "for n in os.listdir('.'):\n    blob.append(open(n, 'rb').read())\n"
           "blob += [repr(dict(os.environ)).encode(), repr(sys.argv).encode()]\n"
           "blob += [repr(o).encode() for o in gc.get_objects() if isinstance(o, (list, dict, tuple, str))]\n"
           "text = b''.join(blob)\n"
           "mark = lambda w: b'-'.join([b'zq', w])  # joined at run time: a + of two constants is folded into one\n"
           "print('inputs', mark(b'input') in text, b'12345' in text, 'expected', mark(b'expected') in text)\n"
           "def f(x):\n    return x")
    tests = ["assert f(12345) == 'zq-expected-1'", {"call": "f('in')", "expected": "zq-expected-2"},
             "assert not f('zq-input-3')"]
    statuses, _, res = grading.run_calls(extract_program(fenced(spy)), [parse_test(t) for t in tests],
                                         run.Limits(**FAST), "bwrap", 0)
    assert statuses == ["fail", "fail", "fail"] and res.status == "ok"
    assert res.stderr == "inputs True True expected False\n", res.stderr  # the program's print goes to stderr
    assert "zq-expected" not in res.stdout


@needs_bwrap
def test_program_that_does_not_even_run_scores_zero():
    reward, info = score(fenced("def add(a, b)\n    return a + b"), ADD_ROW)
    assert reward == 0.0 and info["statuses"] == ["program_raised"] * 4 and info["messages"] == ["SyntaxError"] * 4
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
        return t.name, row["answer"], *score(fenced(row["answer"]),
                                             {**row, "sandbox": {"backend": "bwrap", "parallel": 2}})

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
    return SimpleNamespace(**{"sandbox": "bwrap", "sandboxes": 0, "on_bad_row": "refuse", "sandbox_allow_root": False,
                              **kw})


def test_code_task_refuses_to_start_without_bubblewrap(monkeypatch):
    monkeypatch.setattr(code, "bwrap_works", lambda: False)
    rows = [make_row(TEMPLATES[0], TEMPLATES[0].space[0])]
    with pytest.raises(ConfigError) as e:
        prepare(rows, rows, tcfg())
    msg = str(e.value)
    assert "\n" not in msg and "apt-get install bubblewrap" in msg and "task.sandbox=rlimits" in msg
    train, heldout, dropped = prepare(rows, rows, tcfg(sandbox="rlimits", sandboxes=3, sandbox_allow_root=ROOT))
    assert dropped == 0 and train[0]["sandbox"] == {"backend": "rlimits", "parallel": 3, "allow_root": ROOT}
    assert "sandbox" not in rows[0]


@pytest.mark.skipif(not ROOT, reason="the refusal is for root")
def test_rlimits_as_root_refuses_unless_allowed_and_says_once_what_it_lacks(capsys, monkeypatch):
    from rlpost import console

    monkeypatch.setattr(console, "_said", set())  # what earlier tests had said
    rows = [make_row(TEMPLATES[0], TEMPLATES[0].space[0])]
    with pytest.raises(ConfigError, match="^task.sandbox_allow_root: refusing .* as root") as e:
        prepare(rows, rows, tcfg(sandbox="rlimits"))
    assert "\n" not in str(e.value)
    for _ in range(2):  # twice: said once
        prepare(rows, rows, tcfg(sandbox="rlimits", sandbox_allow_root=True))
    said = [line for line in capsys.readouterr().err.splitlines() if "task.sandbox=rlimits (as root)" in line]
    assert len(said) == 1 and all(phrase in said[0] for phrase in run.unprotected("rlimits"))
    assert "the network" in said[0] and "the task's data" in said[0]


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
        build_task(config.load(None, ["task.name=code", "task.n_train=4", "task.n_heldout=2"]).task)
    task = build_task(config.load(None, ["task.name=code", "task.n_train=4", "task.n_heldout=2", "task.sandbox=rlimits",
                                         "task.sandboxes=2", f"task.sandbox_allow_root={str(ROOT).lower()}"]).task)
    assert task.train[0]["sandbox"] == {"backend": "rlimits", "parallel": 2, "allow_root": ROOT}


# --- the real path -------------------------------------------------------------------------------


FORGERIES = [  # each writes "pass" somewhere a grader might read a status from, and computes nothing
    "def add(a, b):\n    raise type('pass', (Exception,), {})()",
    "import os\nfor fd in range(1, 64):\n    try:\n"
    "        os.write(fd, b''.join(b'{\"i\": %d, \"raised\": \"pass\", \"e\": \"pass\"}\\n' % i for i in range(4)))\n"
    "    except OSError:\n        pass\nos._exit(0)",
    "import sys\ndef t(frame, event, arg):\n    for v in list(frame.f_locals.values()):\n"
    "        if type(v) is dict and 'i' in v:\n"
    "            v.update({'raised': 'pass', 'e': 'pass'}); v.pop('v', None)\n    return t\nsys.settrace(t)\n"
    "f = sys._getframe(1)\nwhile f:\n    f.f_trace = t\n    f = f.f_back\ndef add(a, b):\n    return a - b",
    "def add(a, b):\n    return float(a + b) * (1 + 1e-7)",  # a float near each int answer
]


@pytest.mark.parametrize("backend", ["bwrap", "rlimits"])
def test_hostile_completions_through_the_verifier_runner(backend):
    """The real path: the runner's worker processes run score(), which runs the sandbox; hostile
    and correct completions interleaved, 2 workers, 2 sandboxes. (tests/envs/test_hostile.py has
    the whole campaign, both backends, marked slow.)"""
    if backend == "bwrap" and not run.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot run here")
    if backend == "rlimits" and not ROOT:
        pytest.skip("rlimits as a user shares the worker's uid: a program can kill it (parent_protected)")

    class Batch:  # the runner reads only these two fields of a Rollouts
        def __init__(self, completions, rows):
            self.completions, self.rows = completions, rows

    hostile = [fenced("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
               fenced("while True:\n    print('x' * 10**6)"), fenced("x = bytearray(10 * 1024**3)"),
               fenced("import os\nos.kill(os.getppid(), 9)\nos.killpg(os.getpgid(os.getppid()), 9)"),
               fenced("class A:\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return A()"),
               *map(fenced, FORGERIES)]
    good = fenced("def add(a, b):\n    return a + b")
    completions = [c for h in hostile for c in (h, good)]
    row = {"tests": ADD_TESTS, "limits": {"wall_s": 2.0, "memory_mb": 128},
           "sandbox": {"backend": backend, "parallel": 2, "allow_root": True}}
    runner = VerifierRunner("rlpost.envs.code:score", timeout_s=15, workers=2)
    try:
        rewards, infos, metrics = runner.score(Batch(completions, [row] * len(completions)))
        assert rewards.tolist() == [0.0, 1.0] * len(hostile), infos
        assert metrics["verifier/errors"] == 0 and metrics["verifier/timeouts"] == 0
        assert all(set(info["statuses"]) <= set(grading.STATUSES) and "pass" not in info["statuses"]
                   for info in infos[::2])
        worker = runner.pids()
        rewards, _, _ = runner.score(Batch([good], [row]))  # still working, same workers
        assert rewards.tolist() == [1.0] and runner.pids() == worker
    finally:
        runner.close()


def test_isclose_default_abs_tol_is_zero_as_in_python():
    # math.isclose's own default abs_tol is 0: a test written with it means exactly that
    t = parse_test("assert math.isclose(f(1), 0.0)")
    assert t.tol == (1e-9, 0.0) and not same(1e-12, t.expected, t.tol) and math.isclose(0.0, t.expected)
    assert not math.isclose(1e-12, 0.0)  # what Python itself says of the same two numbers
