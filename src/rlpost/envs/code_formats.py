"""The public code sets' row formats, turned into code-task rows graded by the grading contract.

The code task grades ``row["tests"]`` (envs/grading.py) and decides every pass/fail outside the
sandbox from values. The public sets ship their tests in other shapes:

* **HumanEval** (``prompt``, ``test`` with ``def check(candidate)``, ``entry_point``,
  ``canonical_solution``): each statement of ``check`` must be an assert the grader accepts once
  ``candidate`` is read as the entry point (``assert candidate(1, 2) == 3`` becomes
  ``assert add(1, 2) == 3``); an assert's message is dropped, ``assert True`` and imports are
  no-ops, and arithmetic on number literals is folded here (``2.0/3.0``, ``str(7)``), as Python would.
  What check builds from constants before its asserts (names, loops, random draws) is computed here by
  envs/consts.py and written into the asserts (``_statements``, ``_Fold``), ``tuple(candidate(x)) ==
  tuple([...])`` is a sequence comparison (``_as_sequence``), and an assert of the candidate against itself,
  under the entry point's name, is dropped (``_self_compare``). Anything else (a helper call, an attribute,
  the candidate's output used to compute what is expected) would have to run in the program's
  interpreter, where the program decides what it sees, so the row is refused in one line naming it and
  the statement. HumanEval's harness runs ``prompt + completion``, so the prompt (its imports and helper
  functions) becomes ``program_prefix``, put before the model's program (envs/code.py).
* **APPS / TACO** (``question``, ``input_output`` as JSON ``{"inputs": [...], "outputs": [...],
  "fn_name": optional}``, ``starter_code``, ``solutions``): without ``fn_name`` each pair is a
  stdin/stdout test compared as whitespace tokens (APPS's comparison; a list of lines is joined
  by newlines, as its harness does); with it each pair is a call of ``fn_name`` with the listed
  arguments, passing when the value equals ``outputs[i]`` or, when that is a list, its one element
  (APPS accepts both), a returned tuple read as a list, and a method of ``Solution`` when the
  starter code defines that class (APPS's rule). An argument or output that is no literal value is
  refused, naming the row.

Any other row is left as it is (rlpost's own ``tests``). ``convert`` raises ``DataError`` naming
the row (``file:line``), which the data loader turns into a refusal or a skip (task.on_bad_row).
"""

from __future__ import annotations

import ast
import builtins
import copy
import json
import math
import zlib

from rlpost.envs.consts import BINARY, MAX_POWER, MAX_TEXT, Consts, NotConstant
from rlpost.envs.data import DataError, where
from rlpost.envs.grading import Refused, parse_test

MBPP_ASK = "{}\nYour code should pass these tests:\n\n{}\n\nReply with the code in a ```python block."
HUMANEVAL_ASK = "Complete the Python function `{}` below. Reply with the code in a ```python block.\n\n```python\n{}```"
APPS_ASK = "{}\n\nWrite a Python program that solves this{}. Reply with the code in a ```python block."
MAX_UNROLL = 1000  # a loop of asserts over more constants than this is not unrolled (refused)


def kind(raw: dict) -> str:
    """'humaneval', 'apps', 'mbpp' or '' (rlpost's own rows)."""
    if "tests" in raw:
        return ""
    if "entry_point" in raw or "canonical_solution" in raw or "def check(candidate)" in str(raw.get("test", "")):
        return "humaneval"  # a HumanEval row short of a field is refused naming it (from_humaneval)
    if "input_output" in raw:
        return "apps"
    if "test_list" in raw:
        return "mbpp"
    return ""


def convert(raw: dict, source: str) -> dict:
    """A data row in HumanEval's or APPS's format -> the code task's (prompt, tests, answer, and for
    HumanEval program_prefix); other rows unchanged. DataError naming the row for a test that
    cannot be graded outside the sandbox."""
    found = kind(raw)
    try:
        if found == "humaneval":
            return from_humaneval(raw)
        if found == "apps":
            return from_apps(raw)
        if found == "mbpp":
            return from_mbpp(raw)
    except Refused as e:
        name = raw.get("task_id") or raw.get("problem_id") or raw.get("id")
        label = f" ({name})" if name is not None else ""
        raise DataError(f"{where(raw, source)}{label}: {found} test refused: {e} (docs/environments.md, "
                        "the public code formats; task.on_bad_row=skip drops such rows and counts them)") from None
    return raw


def from_humaneval(raw: dict) -> dict:
    missing = [k for k in ("prompt", "test", "entry_point") if not isinstance(raw.get(k), str) or not raw[k].strip()]
    if missing:
        raise Refused(f"a HumanEval row needs 'prompt', 'test' (check(candidate)) and 'entry_point' as text; "
                      f"{', '.join(repr(k) for k in missing)} {'is' if len(missing) == 1 else 'are'} missing or empty")
    entry, prompt = raw["entry_point"], raw.get("prompt")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise Refused(f"entry_point {entry!r} is not a function name")
    if not isinstance(prompt, str) or not prompt.strip():
        raise Refused("'prompt' must be the function's signature and docstring")
    try:
        module = ast.parse(raw["test"])
    except SyntaxError:
        raise Refused("'test' is not valid Python") from None
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or [a.arg for a in checks[0].args.args] != ["candidate"]:
        raise Refused("'test' must define one check(candidate)")
    tests = graded_asserts(checks[0], zlib.crc32(raw["test"].encode()), entry, "check")
    row = {k: v for k, v in raw.items() if k not in ("prompt", "test")}
    solution = raw.get("canonical_solution")
    answer = prompt + solution if isinstance(solution, str) else ""
    return {**row, "prompt": HUMANEVAL_ASK.format(entry, prompt), "tests": tests, "answer": answer,
            "program_prefix": prompt}


def from_mbpp(raw: dict) -> dict:
    """MBPP (``text`` or, sanitized, ``prompt``; ``code``; ``test_list`` of asserts; ``test_setup_code``): the
    asserts graded as HumanEval's are, the task shown with its tests as MBPP's paper prompts it (the tests name
    the function to write)."""
    text = raw.get("text", raw.get("prompt"))
    if not isinstance(text, str) or not text.strip():
        raise Refused("'text' (or 'prompt') must be the task's description")
    asserts = raw["test_list"]
    if not isinstance(asserts, list) or not asserts or not all(isinstance(t, str) for t in asserts):
        raise Refused("'test_list' must be a non-empty list of assert strings")
    try:
        check = ast.parse("def check():\n" + "".join(f"    {t.strip()}\n" for t in asserts)).body[0]
    except SyntaxError:
        raise Refused("a 'test_list' entry is not valid Python") from None
    names = [n.func.id for n in ast.walk(check) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    entry = next((n for n in names if not hasattr(builtins, n)), "")  # the function the tests call, not set()
    tests = graded_asserts(check, zlib.crc32("\n".join(asserts).encode()), entry, "test_list")
    setup = raw.get("test_setup_code") or ""
    row = {k: v for k, v in raw.items() if k not in ("text", "prompt", "test_list")}
    shown = "\n".join(t.strip() for t in asserts)
    return {**row, "prompt": MBPP_ASK.format(text.strip(), shown), "tests": tests,
            "answer": raw["code"].replace("\r\n", "\n").rstrip() + "\n" if isinstance(raw.get("code"), str) else "",
            **({"program_prefix": setup + "\n"} if isinstance(setup, str) and setup.strip() else {})}


def graded_asserts(check: ast.FunctionDef, seed: int, entry: str, where_: str) -> list:
    """The asserts of a test function's body as tests the grader takes (envs/grading.py), with what the body
    builds from constants written in (``_statements``); Refused naming the first line that cannot be graded
    outside the sandbox. ``where_``: what the lines are counted in ('check', 'test_list')."""
    tests = []
    for stmt, line in _statements(check, seed, entry):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) or _no_op(stmt) or _self_compare(stmt, entry):
            continue  # an import serves only statements that would be refused; `assert True` tests nothing
        text = ast.unparse(stmt).splitlines()[0][:70]
        if not isinstance(stmt, ast.Assert):
            raise Refused(f"{where_} line {line} ({text!r}) is not an assert on the function: only those are graded "
                          "outside the sandbox")
        rewritten = _Rewrite(entry).visit(stmt.test)
        test = _as_sequence(rewritten) or ast.unparse(ast.Assert(rewritten))
        try:
            parse_test(test)
        except Refused as e:
            raise Refused(f"{where_} line {line} ({text!r}): {e}") from None
        tests.append(test)
        if len(tests) > MAX_UNROLL:
            raise Refused(f"{where_} makes more than {MAX_UNROLL} asserts")
    if not tests:
        raise Refused(f"{where_} has no assert to grade")
    return tests


def _statements(check: ast.FunctionDef, seed: int, entry: str):
    """(statement, its line within check) of check's body, with what it builds computed here (envs/consts.py):
    an assignment of a value computed from constants binds its names, a loop over such a value is unrolled, and
    each assert gets the bound names written as their values (``for x in range(2, 8): assert candidate(x, x + 1)
    == str(x)`` gives one assert a value; ``lst = list(range(3)); assert candidate(lst) == 3`` gives ``assert
    candidate([0, 1, 2]) == 3``). Whatever is not computed here is yielded as it is (and refused). The entry
    point's name is the candidate in HumanEval's harness, never a builtin of that name."""
    yield from _run(check.body, Consts(seed, hidden={entry}), check.lineno)


def _run(body: list, consts: Consts, base: int):
    for stmt in body:
        line = stmt.lineno - base
        try:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                consts.imported(stmt)
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                consts.bind(stmt.targets[0], consts.value(stmt.value))
                continue
            elif isinstance(stmt, ast.For) and not stmt.orelse:
                values = consts.value(stmt.iter)
                if not isinstance(values, (list, tuple, range, str)) or len(values) > MAX_UNROLL:
                    raise NotConstant("a loop over too many values, or over no sequence")
                for value in values:
                    consts.bind(stmt.target, value)
                    yield from _run(stmt.body, consts, base)
                continue
        except (NotConstant, RecursionError, MemoryError):
            pass  # yielded as it is: refused below, naming it
        yield (_Fold(consts).visit(copy.deepcopy(stmt)) if isinstance(stmt, ast.Assert) else stmt), line


class _Fold(ast.NodeTransformer):
    """In an assert, every part that does not call the candidate and is computed here (envs/consts.py: the names the
    check bound, arithmetic, ``str(x)``, ``pairs[k]``, ``tuple([1, 2])``) -> its value as a literal; a part with
    no literal form, or not computed here, stays as it is (and the assert is refused if it must be a literal)."""

    def __init__(self, consts: Consts):
        self.consts = consts

    def visit(self, node):
        if isinstance(node, ast.Constant):
            return node  # a literal already
        calls_candidate = any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(node))
        if isinstance(node, ast.expr) and not calls_candidate:
            try:
                literal = ast.parse(repr(self.consts.value(node)), mode="eval").body  # a negative number: a UnaryOp
                ast.literal_eval(literal)
                return ast.copy_location(literal, node)
            except (NotConstant, ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                pass
        return super().visit(node)


def _self_compare(stmt, entry: str) -> bool:
    """``assert tuple(candidate(X)) == tuple(ENTRY(X))``: in HumanEval's harness the entry point's name is the
    candidate itself (the completion defines it in check's namespace), so both sides are one call and the
    assert tests nothing (HumanEval/33's first three)."""
    if not (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1
            and isinstance(stmt.test.ops[0], ast.Eq)):
        return False
    left, right = (ast.dump(_Rewrite(entry).visit(copy.deepcopy(n))) for n in (stmt.test.left,
                                                                                 stmt.test.comparators[0]))
    return left == right and f"Name(id='{entry}'" in left


def _as_sequence(test) -> dict | None:
    """``tuple(f(ARGS)) == (LITERAL items)`` (``tuple([...])`` folded; or ``list(f(ARGS)) == [...]``) as a call test
    expecting the items as a list, a returned tuple read as a list (``tuple_is_list``): what comparing the two
    as tuples asks of a list or tuple result; None for any other assert. Only a flat literal (no tuple inside),
    since tuple() is shallow and tuple_is_list is not."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    for call, literal in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("tuple", "list")
                and len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.Call)
                and isinstance(call.args[0].func, ast.Name)):
            continue
        try:
            expected = ast.literal_eval(literal)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        if type(expected) is not {"tuple": tuple, "list": list}[call.func.id]:
            return None  # tuple(...) == [...] is never true: refused below as a test no value could pass
        if any(isinstance(v, (tuple, list, dict, set)) for v in expected):
            return None
        return {"call": ast.unparse(call.args[0]), "expected": list(expected), "tuple_is_list": True}
    return None


def _no_op(stmt) -> bool:
    """`assert True` (HumanEval's debugging lines) and a bare name or constant (`print` without a call)."""
    if isinstance(stmt, ast.Assert):
        return isinstance(stmt.test, ast.Constant) and stmt.test.value is True
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Constant, ast.Name))


class _Rewrite(ast.NodeTransformer):
    """candidate -> the entry point's name; arithmetic on number literals folded as Python computes it, within
    envs/consts.py's bounds on strings (MAX_TEXT) and exponents (MAX_POWER): the test text must not cost a hang."""

    def __init__(self, entry: str):
        self.entry = entry

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(self.entry, node.ctx), node) if node.id == "candidate" else node

    def visit_Call(self, node):
        """``str(NUMBER)`` of a number literal folded to the string Python makes (an unrolled loop's ``str(x)``)."""
        node = self.generic_visit(node)
        if (isinstance(node.func, ast.Name) and node.func.id == "str" and len(node.args) == 1 and not node.keywords
                and (value := _number(node.args[0])) is not None):
            return ast.copy_location(ast.Constant(str(value)), node)
        return node

    def visit_BinOp(self, node):
        node = self.generic_visit(node)
        left, right = (_number(n) for n in (node.left, node.right))
        strings = [_string(n) for n in (node.left, node.right)]
        if isinstance(node.op, ast.Add) and None not in strings and sum(map(len, strings)) <= MAX_TEXT:
            return ast.copy_location(ast.Constant(strings[0] + strings[1]), node)
        if left is None or right is None or type(node.op) not in BINARY:
            return node
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_POWER:
            return node
        try:
            value = BINARY[type(node.op)](left, right)
        except (ArithmeticError, ValueError):
            return node  # 1/0 stays unfolded, so the test is refused as not a literal
        if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
            return node
        return ast.copy_location(ast.Constant(value) if value >= 0 else
                                 ast.UnaryOp(ast.USub(), ast.Constant(-value)), node)


def _string(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _number(node):
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def from_apps(raw: dict) -> dict:
    spec = raw["input_output"]
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            raise Refused("'input_output' is not valid JSON") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("inputs"), list) or not isinstance(
            spec.get("outputs"), list) or len(spec["inputs"]) != len(spec["outputs"]) or not spec["inputs"]:
        raise Refused("'input_output' must hold equal, non-empty 'inputs' and 'outputs' lists")
    fn, starter = spec.get("fn_name"), raw.get("starter_code") or ""
    if fn is not None and not (isinstance(fn, str) and fn.isidentifier()):
        raise Refused(f"fn_name {fn!r} is not a function name")
    pairs = zip(spec["inputs"], spec["outputs"])
    tests = [_call(fn, args, out, "class Solution" in starter) for args, out in pairs] if fn else [
        _io(stdin, out) for stdin, out in pairs]
    for test in tests:
        parse_test(test)
    question = raw.get("question") or raw.get("prompt") or ""
    if not isinstance(question, str) or not question.strip():
        raise Refused("no 'question' text to prompt with")
    how = f", completing this starter code:\n```python\n{starter}```" if starter.strip() else (
        f" as a function `{fn}`" if fn else ", reading standard input and printing the answer")
    row = {k: v for k, v in raw.items() if k not in ("input_output", "question", "prompt")}
    return {**row, "prompt": APPS_ASK.format(question.strip(), how), "tests": tests, "answer": _first(raw)}


def _io(stdin, out) -> dict:
    join = lambda v: "\n".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731 - APPS's harness joins lines
    stdin, out = join(stdin), join(out)
    if not isinstance(stdin, str) or not isinstance(out, str):
        raise Refused("a stdin/stdout pair must be strings (or lists of lines)")
    return {"stdin": stdin, "stdout": out, "compare": "tokens"}


def _call(fn: str, args, out, method: bool) -> dict:
    if not isinstance(args, list):
        raise Refused(f"the inputs of a call test are the list of its arguments, got {str(args)[:40]!r}")
    test = {"call": f"{fn}({', '.join(map(repr, args))})", "expected": out, "tuple_is_list": True}
    if isinstance(out, list) and len(out) == 1:
        test["also_expected"] = [out[0]]
    return {**test, "method_of": "Solution"} if method else test


def _first(raw: dict) -> str:
    """The first reference solution (APPS keeps them as a JSON list in a string), or ''."""
    found = raw.get("solutions")
    if isinstance(found, str):
        try:
            found = json.loads(found)
        except ValueError:
            return found
    return found[0] if isinstance(found, list) and found and isinstance(found[0], str) else ""
