"""Grading a program against tests so that only a correct program can score: the grading contract.

A code-RL run optimises whatever the grader rewards, so the grader must not be foolable. The
program runs in the sandbox and controls everything there: its interpreter, the builtins, every
object it returns, every byte it writes. So nothing that decides the reward is done there:

1. Each test is parsed *here*, in the trusted process (``parse_test``), into its inputs and its
   expected result. Accepted forms (anything else is refused, see below):

   * ``"assert f(ARGS) == EXPECTED"`` (either side), ``"assert f(ARGS) is True|False|None"``,
     ``"assert f(ARGS)"`` (truthy), ``"assert not f(ARGS)"`` (falsy),
     ``"assert math.isclose(f(ARGS), EXPECTED, rel_tol=R, abs_tol=A)"`` and
     ``"assert abs(f(ARGS) - EXPECTED) < TOL"`` (``<=`` too, ``abs(EXPECTED - f(ARGS))``, and
     ``TOL > abs(...)`` / ``>=``), where f is a plain name and ARGS and EXPECTED are Python
     literals (numbers, strings, bytes, None, True/False, and tuples, lists, dicts and sets of
     those; ``ast.literal_eval``);
   * ``{"call": "f(ARGS)", "expected": VALUE}`` with optional ``"rel_tol"`` / ``"abs_tol"``:
     the same, with the expected value as data (JSON, so a list is a list), and APPS's options
     ``also_expected``, ``tuple_is_list`` and ``method_of`` (``_call_extras``);
   * ``{"stdin": "...", "stdout": "..."}``: the program reads stdin and must exit 0 printing
     stdout (compared after stripping the ends and trailing spaces per line; ``"compare": "tokens"``: APPS's tokens).

2. Only inputs enter the sandbox: the function name and the *source* of the literal arguments
   (which the harness reads with ``ast.literal_eval``), or the stdin text. No expected value is
   in any file, descriptor, environment variable or argument the program can reach, and the
   parent's memory is out of reach (pid namespace, another uid, no ptrace).

3. The harness (inside, running as main.py next to the program's solution.py) calls each
   function and writes back what happened as JSON: ``{"i": N, "v": VALUE}`` with the return value
   as plain values (None, bool, int, float, str, list, and tagged ``{"$tuple": [...]}``,
   ``{"$dict": [[k, v], ...]}``, ``{"$set": [...]}``, ``{"$bytes": "hex"}``), or ``{"i": N,
   "raised": TYPE}`` / ``{"i": N, "unserializable": TYPE}``. An object whose ``__eq__`` always says
   yes never leaves the sandbox. The program shares the harness's process, so it can write or
   rewrite any of these lines (trace hooks, patched builtins, exit hooks, the channel's
   descriptor): nothing in them is trusted. A line is at most a claimed return value, and a
   claim passes only if it equals the expected value, which the program never sees.

4. The decision happens here (``judge``, and ``same`` in envs/claims.py), from values: a test's status comes from a
   fixed list (``STATUSES``) and is "pass" only for a claimed value that the test, evaluated by
   Python on that value, would pass (``==`` exact, ``abs(...) < t`` with Python's arithmetic and
   operator, ``math.isclose`` itself), except that bool is never a number here
   (docs/environments.md has the table). The claim is read against the expected value's shape:
   a claim of another type or size fails before anything is built from it, and set members and
   dict keys are looked up in the expected value's table, so no claim costs more than its size.
   What the program names (an exception's type) is kept as a message, never as a status.

Refused: any other assert, e.g. one on a side effect (``f(xs); assert xs == [...]``), a method
call, or arguments that are not literals; and a test no value could pass (``abs(...) < 0``, an
expected NaN, a tolerance test against a non-number). Running such a test means running test
code in the program's interpreter, where the program can rewrite what the test sees (that is how
8 of 55 hostile programs once earned full reward), so it is not run at all: the code task refuses
the row when it is built (or skips it, ``task.on_bad_row=skip``), and ``score`` marks such a test
``refused`` (never passed). Rewrite a side-effect test as a stdin/stdout test (print the state)
or as a call whose return value shows it.
"""

from __future__ import annotations

import ast
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rlpost.envs.claims import Flag, is_number, same, truth, tuples_as_lists, well_formed, within
from rlpost.sandbox import Limits, Result, run_python

ISCLOSE_REL_TOL = 1e-9  # math.isclose's own defaults: what a test that states no tolerance gets for floats
ISCLOSE_ABS_TOL = 0.0

# Statuses a test can get. Every one is chosen here, from values; none is text the program wrote.
STATUSES = ("pass", "fail", "raised", "unserializable", "bad_report", "no_result", "program_raised", "refused",
            "skipped", "timeout", "memory", "output_limit", "killed", "error")

# Runs inside the sandbox as main.py, next to the model's program in solution.py. It reads the
# calls (name, argument source, keyword source) from its first stdin line and reports one JSON
# line per call on the original stdout; the program's own prints go to stderr. Every line it
# writes is a claim the program could have written itself: the grader trusts none of it but a
# claimed return value, which it compares with the expected value it alone holds.
HARNESS = r'''import ast, json, os, sys
def plain(v, depth=0):
    if depth > 200:
        raise ValueError("nested too deeply")
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, list):
        return [plain(x, depth + 1) for x in v]
    if isinstance(v, tuple):
        return {"$tuple": [plain(x, depth + 1) for x in v]}
    if isinstance(v, dict):
        return {"$dict": [[plain(k, depth + 1), plain(x, depth + 1)] for k, x in v.items()]}
    if isinstance(v, (set, frozenset)):
        return {"$set": [plain(x, depth + 1) for x in v]}
    if isinstance(v, (bytes, bytearray)):
        return {"$bytes": bytes(v).hex()}
    raise TypeError(type(v).__name__)
def main():
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    calls = json.loads(sys.stdin.readline())
    report = lambda d: (out.write(json.dumps(d) + "\n"), out.flush())
    ns = {"__name__": "solution"}
    try:
        exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
    except SystemExit:
        pass
    except BaseException as e:
        report({"program_raised": type(e).__name__})
        return
    for i, (name, args, kwargs) in enumerate(calls):
        try:
            owner, _, name = name.rpartition(".")
            fn = getattr(ns[owner](), name, None) if owner else ns.get(name)
            if not callable(fn):
                raise NameError(name)
            value = fn(*ast.literal_eval(args), **ast.literal_eval(kwargs))
        except BaseException as e:
            report({"i": i, "raised": type(e).__name__})
            continue
        try:
            report({"i": i, "v": plain(value)})
        except BaseException:
            report({"i": i, "unserializable": type(value).__name__})
main()
'''


class Refused(ValueError):
    """A test this grader will not run, because running it would mean trusting the program."""


@dataclass(frozen=True)
class CallTest:
    fn: str  # the function the program must define
    args: str  # literal source of the positional arguments, as a tuple: "(1, [2, 3])"
    kwargs: str  # literal source of the keyword arguments, as a dict: "{'k': 1}"
    expected: object  # canonical plain value (canon); only this process ever holds it
    check: str = "eq"  # "eq" | "truthy" | "falsy" | "abs" (abs(f(x) - expected) against `bound`)
    tol: tuple[float, float] | None = None  # (rel_tol, abs_tol) for math.isclose; None: `==`, exact
    bound: tuple[str, int | float, bool] | None = None  # check "abs": ("<" or "<=", t, written abs(v - f(x)))
    also: tuple = ()  # further expected values, any of which passes (APPS: outputs[i] or outputs[i][0])
    tuple_is_list: bool = False  # a claimed tuple reads as a list (APPS's harness converts a returned tuple)


@dataclass(frozen=True)
class IoTest:
    stdin: str
    stdout: str
    tokens: bool = False  # compare whitespace-separated tokens (APPS), not lines


# --- parsing (trusted side) -----------------------------------------------------------------


def parse_test(test) -> CallTest | IoTest:
    """One test of a row -> what to run and what to expect; raises Refused with the reason."""
    if isinstance(test, str):
        return _parse_assert(test)
    if isinstance(test, dict) and "call" in test:
        if not isinstance(test["call"], str) or "expected" not in test:
            raise Refused('a call test needs "call" (source text, e.g. "f(1, 2)") and "expected"')
        try:
            node = ast.parse(test["call"], mode="eval").body
        except SyntaxError:
            raise Refused(f"call {test['call']!r} is not valid Python") from None
        stated = {k: _tolerance(test[k], k) for k in ("rel_tol", "abs_tol") if k in test}
        parsed = _call_test(node, canon(test["expected"]), tol=_isclose_tol(**stated) if stated else None)
        return _call_extras(parsed, test)
    if isinstance(test, dict) and {"stdin", "stdout"} <= set(test):
        if not all(isinstance(test[k], str) for k in ("stdin", "stdout")):
            raise Refused("stdin and stdout must be strings")
        if test.get("compare", "lines") not in ("lines", "tokens"):
            raise Refused(f"compare = {test['compare']!r}: expected 'lines' (the default) or 'tokens'")
        return IoTest(test["stdin"], test["stdout"], test.get("compare") == "tokens")
    raise Refused('a test is an assert string, {"call": ..., "expected": ...} or {"stdin": ..., "stdout": ...}')


def _call_extras(parsed: CallTest, test: dict) -> CallTest:
    """A structured call test's APPS/TACO options (envs/code_formats.py): ``also_expected`` (values any of which
    passes, as APPS takes outputs[i] or outputs[i][0]), ``tuple_is_list`` (a returned tuple reads as a list, as
    APPS's harness converts it), ``method_of`` (a class name: ``Solution().f(ARGS)``, LeetCode-style)."""
    also = test.get("also_expected", [])
    if not isinstance(also, list):
        raise Refused("also_expected must be a list of values")
    owner = test.get("method_of", "")
    if not isinstance(owner, str) or (owner and not owner.isidentifier()):
        raise Refused(f"method_of = {owner!r}: expected a class name, e.g. 'Solution'")
    if not isinstance(test.get("tuple_is_list", False), bool):
        raise Refused("tuple_is_list must be true or false")
    fn = f"{owner}.{parsed.fn}" if owner else parsed.fn
    return CallTest(fn, parsed.args, parsed.kwargs, parsed.expected, parsed.check, parsed.tol, parsed.bound,
                    tuple(canon(v) for v in also), test.get("tuple_is_list", False))


def _parse_assert(src: str) -> CallTest:
    try:
        body = ast.parse(src).body
    except SyntaxError:
        raise Refused("not valid Python") from None
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        raise Refused("not a single assert statement")
    e = body[0].test
    if isinstance(e, ast.Compare) and len(e.ops) == 1:
        left, op, right = e.left, e.ops[0], e.comparators[0]
        if isinstance(op, ast.Eq):  # f(x) == v, or v == f(x)
            if not (_is_call(left) or _is_call(right)):
                raise Refused("the tested expression must call a function by name, e.g. f(1, 2)")
            # set() is a call by name too: the tested call is the side that is not a literal
            call, value = (left, right) if _is_call(left) and not _is_literal(left) else (right, left)
            return _call_test(call, canon(_literal(value)))
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (True, False, None):
            if right.value is None or isinstance(right.value, bool):
                return _call_test(left, right.value)
        if _is_abs_diff(left) or _is_abs_diff(right):
            return _abs_test(left, op, right)
    if isinstance(e, ast.Call) and _is_isclose(e.func) and len(e.args) == 2:
        stated = {k.arg: _tolerance(_literal(k.value), k.arg) for k in e.keywords if k.arg in ("rel_tol", "abs_tol")}
        if len(stated) != len(e.keywords):
            raise Refused("math.isclose takes only rel_tol and abs_tol here")
        call, value = (e.args[0], e.args[1]) if _is_call(e.args[0]) else (e.args[1], e.args[0])
        return _call_test(call, _number(_literal(value), "math.isclose"), tol=_isclose_tol(**stated))
    if _is_call(e):
        return _call_test(e, True, check="truthy")
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not) and _is_call(e.operand):
        return _call_test(e.operand, False, check="falsy")
    raise Refused("unsupported assert: only f(args) == value, is True/False/None, truthy, not, "
                  "math.isclose and abs(f(args) - value) < tol are graded outside the sandbox")


# abs(...) < t and abs(...) <= t as written; t > abs(...) is abs(...) < t (Python's number comparisons are exact
# and two-sided, NaN included), so the operator kept is the one Python applies.
_BOUND_OPS = {ast.Lt: "<", ast.LtE: "<="}
_MIRRORED_OPS = {ast.Gt: "<", ast.GtE: "<="}


def _abs_test(left, op, right) -> CallTest:
    """abs(f(x) - v) < t (or <=, abs(v - f(x)), t > abs(...), t >= abs(...)): graded as Python evaluates it."""
    if _is_abs_diff(left) and type(op) in _BOUND_OPS:
        diff, name, limit = left.args[0], _BOUND_OPS[type(op)], right
    elif _is_abs_diff(right) and type(op) in _MIRRORED_OPS:
        diff, name, limit = right.args[0], _MIRRORED_OPS[type(op)], left
    else:
        raise Refused("unsupported assert: a distance is bounded as abs(f(args) - value) < tol (or <=)")
    flipped = not _is_call(diff.left)
    call, value = (diff.right, diff.left) if flipped else (diff.left, diff.right)
    t = _literal(limit)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or (isinstance(t, float) and not math.isfinite(t)):
        raise Refused(f"tol = {t!r}: a bound on abs(...) is a finite number")
    if t < 0 or (t == 0 and name == "<"):
        raise Refused(f"abs(...) {name} {t!r} is never true: no answer could pass")
    return _call_test(call, _number(_literal(value), "abs(f(args) - value)"), check="abs", bound=(name, t, flipped))


def _number(value, form: str):
    """The expected value of a tolerance test: Python subtracts or isclose()s only numbers (bool is none here)."""
    if isinstance(value, bool):
        raise Refused(f"{form} against {value!r}: a tolerance compares numbers, and bool is none here")
    if not isinstance(value, (int, float)):
        raise Refused(f"{form} against {value!r}: Python's {form} takes numbers, so no answer could pass")
    return canon(value)


def _isclose_tol(rel_tol: float = ISCLOSE_REL_TOL, abs_tol: float = ISCLOSE_ABS_TOL) -> tuple[float, float]:
    """What math.isclose uses when a test names only some of its tolerances: Python's defaults for the rest."""
    return rel_tol, abs_tol


def _tolerance(value, name: str) -> float:
    """A math.isclose tolerance, as isclose takes it (a float); one it would reject, or inf, is refused."""
    try:
        ok = is_number(value) and 0 <= float(value) < math.inf  # NaN fails the comparison
    except OverflowError:  # an int past the floats: isclose would raise
        ok = False
    if not ok:
        raise Refused(f"{name} = {value!r}: a tolerance is a finite number >= 0")
    return float(value)


def _is_call(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name)


def _is_isclose(func) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "isclose" and isinstance(func.value, ast.Name)
            and func.value.id == "math") or (isinstance(func, ast.Name) and func.id == "isclose")


def _is_abs_diff(node) -> bool:
    """abs(A - B) with A or B a call by name (the other must then be a literal)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "abs"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.BinOp)
            and isinstance(node.args[0].op, ast.Sub) and (_is_call(node.args[0].left) or _is_call(node.args[0].right)))


def _is_literal(node) -> bool:
    try:
        _literal(node)
    except Refused:
        return False
    return True


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Refused(f"{ast.unparse(node)[:60]!r} is not a literal") from None


def _call_test(call, expected, check: str = "eq", tol: tuple[float, float] | None = None,
               bound: tuple[str, int | float, bool] | None = None) -> CallTest:
    if not _is_call(call):
        raise Refused("the tested expression must call a function by name, e.g. f(1, 2)")
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise Refused("*args / **kwargs in a test call")
    for node in [*call.args, *(k.value for k in call.keywords)]:
        _literal(node)  # each argument must be a literal: the harness rebuilds it with literal_eval
    args = "(" + "".join(ast.unparse(a) + ", " for a in call.args) + ")"
    kwargs = "{" + ", ".join(f"{k.arg!r}: {ast.unparse(k.value)}" for k in call.keywords) + "}"
    return CallTest(call.func.id, args, kwargs, expected, check, tol, bound)


# --- expected values (trusted side; envs/claims.py reads the claims against them) ------------


def canon(v):
    """A literal or JSON value as the expected value is held: Python's own types (a tuple stays a
    tuple, a set becomes a frozenset, which Python finds equal), with dict keys and set members
    frozen (bools as Flags). NaN is refused: Python finds it equal to nothing, so no answer could pass."""
    if isinstance(v, float) and math.isnan(v):
        raise Refused("an expected NaN: Python's == finds NaN equal to nothing, so no answer could pass")
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v
    if isinstance(v, list):
        return [canon(x) for x in v]
    if isinstance(v, tuple):
        return tuple(canon(x) for x in v)
    if isinstance(v, (set, frozenset)):
        return frozenset(_freeze(canon(x)) for x in v)
    if isinstance(v, dict):
        return {_freeze(canon(k)): canon(x) for k, x in v.items()}
    raise Refused(f"values of type {type(v).__name__} cannot be compared")


def _freeze(v):
    if isinstance(v, bool):
        return Flag(v)
    return tuple(_freeze(x) for x in v) if isinstance(v, tuple) else v


def _message(text) -> str:
    """What the program named (an exception's type, an unserializable type): shown, never a status."""
    return "".join(c for c in str(text)[:80] if c.isprintable())


def judge(test: CallTest, report: dict) -> tuple[str, str]:
    """(status, message) of one call test from its report. The status is "pass" only when the
    report carries a value "v" that the rule finds equal to the expected value; whatever else a
    report says (an exception's or a type's name, any other key) can only fail the test, and is
    kept as the message. A value the harness could not have written is a bad_report."""
    if "v" not in report:
        for key in ("raised", "unserializable"):
            if key in report:
                return key, _message(report[key])
        return "bad_report", ""
    claim = report["v"]
    try:
        if not well_formed(claim):
            return "bad_report", ""
        if test.check == "truthy":
            ok = truth(claim)
        elif test.check == "falsy":
            ok = not truth(claim)
        elif test.check == "abs":
            ok = within(claim, test.expected, test.bound)
        else:
            claim = tuples_as_lists(claim) if test.tuple_is_list else claim
            ok = any(same(claim, e, test.tol) for e in (test.expected, *test.also))
    except (ValueError, TypeError, RecursionError, OverflowError):
        return "bad_report", ""
    return ("pass" if ok else "fail"), ""


# --- running (untrusted side, through the sandbox) ------------------------------------------


def run_calls(program: str, tests: list[CallTest], limits: Limits, backend: str, parallel: int,
              allow_root: bool = False) -> tuple[list[str], list[str], Result]:
    """One sandbox run for all call tests: the program's set-up runs once, and a test that hangs
    or crashes the process costs only itself and the tests after it (reports stream out).
    Returns (statuses, messages, the run's result)."""
    spec = json.dumps([[t.fn, t.args, t.kwargs] for t in tests]) + "\n"
    res = run_python(HARNESS, stdin=spec, limits=limits, files={"solution.py": program}, backend=backend,
                     parallel=parallel, allow_root=allow_root)
    statuses = [res.status if res.status != "ok" else "no_result"] * len(tests)
    messages = [""] * len(tests)
    seen: set[int] = set()
    for line in res.stdout.splitlines():
        try:
            report = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(report, dict):
            continue
        if "program_raised" in report:  # the program itself raised: every test fails
            return ["program_raised"] * len(tests), [_message(report["program_raised"])] * len(tests), res
        i = report.get("i")
        if type(i) is int and 0 <= i < len(tests) and i not in seen:  # the first report counts
            seen.add(i)
            statuses[i], messages[i] = judge(tests[i], report)
    return statuses, messages, res


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def run_io(program: str, test: IoTest, limits: Limits, backend: str, parallel: int,
           allow_root: bool = False) -> tuple[str, Result]:
    res = run_python(program, stdin=test.stdin, limits=limits, backend=backend, parallel=parallel,
                     allow_root=allow_root)
    if res.status != "ok":
        return res.status, res
    same_text = (res.stdout.split() == test.stdout.split() if test.tokens
                 else _normalise(res.stdout) == _normalise(test.stdout))
    return ("pass" if same_text else "fail"), res


def grade(program: str, tests: list, limits: Limits, backend: str, parallel: int,
          allow_root: bool = False) -> tuple[float, dict]:
    """Reward = fraction of `tests` passed; info: passed, total, per-test statuses (STATUSES) and
    messages (what the program named, e.g. the type of an exception it raised), backend, refused,
    peak memory and cleanup problems of the runs.

    Call tests share one sandbox run; each stdin/stdout test has its own. Runs go in parallel,
    up to `parallel` (0 = CPU cores). After the first stdin/stdout test that times out, every
    later one is marked skipped (and those not yet started are not run): a program that hangs on
    one input usually hangs on all, which bounds the verifier's time, and the rule depends only
    on test order, so the reward does not depend on how many ran at once."""
    parsed = []
    for t in tests:
        try:
            parsed.append(parse_test(t))
        except Refused:
            parsed.append(None)
    statuses = ["refused" if p is None else "" for p in parsed]
    messages = [""] * len(tests)
    calls = [i for i, p in enumerate(parsed) if isinstance(p, CallTest)]
    ios = [i for i, p in enumerate(parsed) if isinstance(p, IoTest)]
    first_timeout = [len(tests)]  # index of the first timed-out stdin/stdout test, shared by the jobs

    def call_job():
        got, said, res = run_calls(program, [parsed[i] for i in calls], limits, backend, parallel, allow_root)
        for i, status, message in zip(calls, got, said):
            statuses[i], messages[i] = status, message
        return res

    def io_job(i):
        if i > first_timeout[0]:
            return None
        status, res = run_io(program, parsed[i], limits, backend, parallel, allow_root)
        statuses[i] = status
        if status == "timeout":
            first_timeout[0] = min(first_timeout[0], i)
        return res

    jobs = ([call_job] if calls else []) + [lambda i=i: io_job(i) for i in ios]
    width = max(1, min(len(jobs), parallel or os.cpu_count() or 1))
    if width == 1:
        results = [job() for job in jobs]
    else:
        with ThreadPoolExecutor(width) as pool:
            results = list(pool.map(lambda job: job(), jobs))
    for i in ios:
        if i > first_timeout[0]:
            statuses[i] = "skipped"
    runs = [r for r in results if r is not None]
    statuses = [s if s in STATUSES else "error" for s in statuses]  # the sandbox's statuses are a fixed list too
    passed = statuses.count("pass")
    info = {"passed": passed, "total": len(tests), "statuses": statuses, "messages": messages,
            "refused": statuses.count("refused"),
            "backend": backend, "runs": len(runs),
            "peak_memory_mb": max((r.peak_memory_mb for r in runs if r.peak_memory_mb is not None), default=None)}
    call_res = results[0] if calls else None
    if call_res is not None:
        info.update(call_run=call_res.status, stderr_tail=call_res.stderr[-300:])
    if problems := "; ".join(r.cleanup for r in runs if r.cleanup):
        info["cleanup"] = problems
    # A run the sandbox never started is a grading error, not the program's: a bool, so its share is
    # logged each step (reward_extra/grading_error) and the health check grading_errors sees it rise.
    info["grading_error"] = any(r.sandbox_error for r in runs)
    if info["grading_error"]:
        info["sandbox_error"] = next(r.sandbox_error for r in runs if r.sandbox_error)
    return (passed / len(tests) if tests else 0.0), info
