"""Code tasks: a verifier that runs the model's program against hidden tests, and a small
built-in task family.

``score(completion, row)`` takes the program from the last ```python block (or the whole
completion when it has no fence), grades it against ``row["tests"]`` (envs/grading.py: the
grading contract; tests are parsed here, only their inputs enter the sandbox, results come back as
plain JSON and are compared here) and returns the fraction that pass. ``row["program_prefix"]``
(HumanEval's prompt, envs/code_formats.py) goes before the program, as HumanEval's harness runs it.

Per-run limits come from ``row["limits"]`` (fields of ``sandbox.Limits``); the backend and the
parallelism from ``row["sandbox"]`` (``{"backend": "bwrap" | "rlimits", "parallel": N, "allow_root": bool}``), which
``prepare`` writes into every row from ``task.sandbox`` / ``task.sandboxes``, so the verifier
worker needs no config. A row without it is graded under bubblewrap: nothing falls back to the
weaker sandbox unless asked. Give the verifier runner a deadline above
``(1 + stdin/stdout tests) * wall_s``. This module imports nothing heavy, so the verifier worker
process starts fast.
"""

from __future__ import annotations

import itertools
import os
import random
import re
from dataclasses import dataclass
from typing import Callable

from rlpost.console import say_once
from rlpost.envs.grading import Refused, grade, parse_test
from rlpost.sandbox import BACKENDS, INSTALL_HINT, Limits, bwrap_works, unprotected
from rlpost.sandbox.run import ROOT_REFUSAL
from rlpost.types.errors import ConfigError


def extract_program(completion: str, names: tuple[str, ...] = ()) -> str:
    """The last ```python (or ```py / ```python3) block, else the last untagged ``` block, else
    the whole completion when it has no fence at all. An unclosed final fence (a generation cut
    at max_new_tokens) counts as a block up to the end. ``names``: the functions the tests call;
    the last block that defines one of them is taken before a later one that does not (a usage
    example after the solution, as evalplus's sanitizer does)."""
    blocks, tag, lines = [], None, []
    for line in completion.splitlines():
        if line.strip().startswith("```"):
            if tag is None:
                tag, lines = line.strip()[3:].strip().lower(), []
            else:
                blocks.append((tag, "\n".join(lines)))
                tag = None
        elif tag is not None:
            lines.append(line)
    if tag is not None:
        blocks.append((tag, "\n".join(lines)))
    for wanted in (("python", "py", "python3"), ("",)):
        found = [code for t, code in blocks if t in wanted]
        defining = [code for code in found if any(re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(n)}\s*\(", code, re.M)
                                                  for n in names)]
        if found:
            return (defining or found)[-1] + "\n"
    return "" if blocks else completion


def called(row: dict) -> tuple[str, ...]:
    """The functions a code row's tests call: its entry point (HumanEval's), else each assert's outermost call."""
    if row.get("entry_point"):
        return (str(row["entry_point"]),)
    found = (re.match(r"\s*assert\s+(?:not\s+)?\(*\s*([A-Za-z_]\w*)\s*\(", t) for t in row.get("tests") or []
             if isinstance(t, str))
    return tuple(dict.fromkeys(m.group(1) for m in found if m))


def score(completion: str, row: dict) -> tuple[float, dict]:
    """Reward = fraction of row["tests"] passed; info has passed, total, per-test statuses (one of
    grading.STATUSES, never text the program wrote), messages and the sandbox backend. Raises (a
    verifier error) only when the named sandbox cannot run here."""
    box = row.get("sandbox") or {}
    backend = box.get("backend", "bwrap")
    if backend not in BACKENDS:
        raise ValueError(f"row['sandbox']['backend'] = {backend!r}: expected one of {BACKENDS}")
    limits = Limits(**row.get("limits", {}))
    # HumanEval's harness runs prompt + completion: its imports and helpers come before the program
    # (a whole function written again after it replaces the prompt's stub)
    program = str(row.get("program_prefix", "")) + extract_program(completion, called(row))
    return grade(program, list(row["tests"]), limits, backend, int(box.get("parallel", 0)),
                 allow_root=box.get("allow_root") is True)


def prepare(train: list[dict], heldout: list[dict], tcfg) -> tuple[list[dict], list[dict], int]:
    """At task build: refuse to start without bubblewrap (unless task.sandbox=rlimits), refuse
    rlimits as root (unless task.sandbox_allow_root=true), say on the console once what the
    sandbox does not protect against here, check that every test is one the grader accepts, and
    stamp each row with the sandbox settings. A row with a refused test stops the run
    (task.on_bad_row=refuse) or is dropped (skip); returns (train, heldout, rows dropped)."""
    if tcfg.sandbox == "bwrap" and not bwrap_works():
        raise ConfigError(f"task.name=code runs model-written code, and bubblewrap is missing or cannot create "
                          f"namespaces here: {INSTALL_HINT}, or set task.sandbox=rlimits to accept a weaker sandbox")
    allow_root = getattr(tcfg, "sandbox_allow_root", False) is True
    if tcfg.sandbox == "rlimits" and os.geteuid() == 0 and not allow_root:
        raise ConfigError(f"task.sandbox_allow_root: {ROOT_REFUSAL}")
    if missing := unprotected(tcfg.sandbox):
        who = "as root" if os.geteuid() == 0 else f"as uid {os.geteuid()}"
        say_once(f"task.sandbox={tcfg.sandbox} ({who}) does not protect against: {'; '.join(missing)}. "
                 "docs/environments.md says what each backend holds")
    stamp = {"backend": tcfg.sandbox, "parallel": tcfg.sandboxes, "allow_root": allow_root}
    dropped, kept = 0, []
    for rows in (train, heldout):
        good = []
        for n, row in enumerate(rows):
            why = _refusal(row)
            if why and tcfg.on_bad_row == "refuse":
                where = f"line {row['_line']}" if "_line" in row else f"row {n}"
                raise ConfigError(f"task.data {where}: {why} (see docs/environments.md, the grading contract)")
            dropped += bool(why)
            if not why:
                good.append({**row, "sandbox": stamp})
        kept.append(good)
    return kept[0], kept[1], dropped


def _refusal(row: dict) -> str:
    """Why the grader would not run this row's tests, or ''."""
    tests = row.get("tests")
    if not isinstance(tests, list) or not tests:
        return "no 'tests' list"
    for j, test in enumerate(tests):
        try:
            parse_test(test)
        except Refused as e:
            return f"test {j} ({str(test)[:60]!r}) refused: {e}"
    return ""


# --- built-in task family -------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """One problem family. sig "" means a stdin -> stdout program instead of a function.
    doc and body are str.format templates over one point of `space` (a dict of parameters);
    ref(**params) is the same solution in Python, used to compute the expected outputs (the
    tests check that the two agree)."""
    name: str
    sig: str
    doc: str
    body: str
    ref: Callable
    space: tuple[dict, ...]
    inputs: tuple


def _grid(**axes) -> tuple[dict, ...]:
    """Every combination of the axes' values: _grid(a=range(2), c="xy") -> 4 dicts."""
    return tuple(dict(zip(axes, values)) for values in itertools.product(*axes.values()))


WORDS = ("banana", "", "abracadabra", "Mississippi River", "the quick brown fox")
LISTS = ([1, 2, 3, 4, 5], [], [9], [6, -2, 6, 0], list(range(10)))
LONG_LISTS = ([1, 2, 3, 4, 5], [5, -1, -1, 5, 0], [0, 0, 0, 0], [-3, -2, -1, -4, -5], [10, 1, 1, 1, 10, 1])
EXTREME = ({"c": "largest", "f": "max", "r": True}, {"c": "smallest", "f": "min", "r": False})
MINMAX = {"max": max, "min": min}

TEMPLATES = (
    Template("add_k", "add_k(x)", "returns `x` plus {a}", "return x + {a}", lambda a: lambda x: x + a,
             _grid(a=range(2, 100)), ((0,), (5,), (-7,), (123,))),
    Template("scale", "scale(x)", "returns `x` multiplied by {a}", "return x * {a}", lambda a: lambda x: x * a,
             _grid(a=range(2, 31)), ((0,), (3,), (-4,), (11,))),
    Template("is_multiple", "is_multiple(n)", "returns True if the integer `n` is divisible by {a}, else False",
             "return n % {a} == 0", lambda a: lambda n: n % a == 0, _grid(a=range(2, 21)),
             ((0,), (7,), (12,), (60,), (-9,), (35,))),
    Template("power_plus", "power_plus(x)", "returns `x` raised to the power {a}, plus {b}", "return x ** {a} + {b}",
             lambda a, b: lambda x: x ** a + b, _grid(a=range(2, 6), b=range(-5, 6)), ((2,), (3,), (-2,), (0,), (10,))),
    Template("clamp", "clamp(x)", "returns `x` limited to the range [{a}, {b}]: values below {a} become {a}, "
             "values above {b} become {b}", "return min(max(x, {a}), {b})", lambda a, b: lambda x: min(max(x, a), b),
             tuple({"a": a, "b": a + w} for a in range(-20, 11) for w in (1, 5, 10, 20)),
             ((-50,), (0,), (5,), (100,), (12,))),
    Template("count_char", "count_char(s)", "returns how many times the character '{c}' occurs in the string `s`",
             "return s.count({c!r})", lambda c: lambda s: s.count(c), _grid(c="abdeiklnoqrstu"),
             tuple((w,) for w in WORDS)),
    Template("repeat_str", "repeat_str(s)", "returns the string `s` repeated {a} times with '{c}' between the "
             "copies", "return {c!r}.join([s] * {a})", lambda a, c: lambda s: c.join([s] * a),
             _grid(a=range(2, 7), c="-,|+ "), (("ab",), ("",), ("xyz",), ("q",))),
    Template("sum_multiples", "sum_multiples(n)", "returns the sum of all positive integers below `n` that are "
             "divisible by {a}", "return sum(i for i in range(1, n) if i % {a} == 0)",
             lambda a: lambda n: sum(i for i in range(1, n) if i % a == 0), _grid(a=range(2, 21)),
             ((1,), (10,), (50,), (100,), (37,))),
    Template("fib_like", "fib_like(n)", "returns term number `n` (counting from 0) of the sequence that starts {a}, "
             "{b} and where every later term is the sum of the two before it",
             "x, y = {a}, {b}\n    for _ in range(n):\n        x, y = y, x + y\n    return x",
             lambda a, b: lambda n: _fib(a, b, n), _grid(a=range(0, 6), b=range(1, 10)),
             ((0,), (1,), (2,), (5,), (10,))),
    Template("digit_sum_base", "digit_sum_base(n)", "returns the sum of the digits of the non-negative integer `n` "
             "written in base {a}", "s = 0\n    while n:\n        s += n % {a}\n        n //= {a}\n    return s",
             lambda a: lambda n: sum(_digits(n, a)), _grid(a=range(2, 11)), ((0,), (7,), (100,), (255,), (12345,))),
    Template("to_base", "to_base(n)", "returns the non-negative integer `n` written in base {a} as a string of "
             "digits (0 gives '0')", "d = ''\n    while n:\n        d = str(n % {a}) + d\n        n //= {a}\n"
             "    return d or '0'", lambda a: lambda n: "".join(map(str, _digits(n, a)[::-1])) or "0",
             _grid(a=range(2, 10)), ((0,), (1,), (10,), (64,), (1000,))),
    Template("rotate_left", "rotate_left(xs)", "returns a new list equal to the list `xs` rotated left by {a} "
             "positions, wrapping around (an empty list stays empty)",
             "if not xs:\n        return []\n    k = {a} % len(xs)\n    return xs[k:] + xs[:k]",
             lambda a: lambda xs: xs[a % len(xs):] + xs[:a % len(xs)] if xs else [], _grid(a=range(1, 10)),
             tuple((x,) for x in LISTS)),
    Template("every_nth", "every_nth(xs)", "returns a list of every {a}-th element of the list `xs`, starting "
             "with the one at index {b}", "return xs[{b}::{a}]", lambda a, b: lambda xs: xs[b::a],
             _grid(a=range(2, 6), b=range(3)), tuple((x,) for x in LISTS)),
    Template("count_greater", "count_greater(xs)", "returns how many numbers in the list `xs` are strictly greater "
             "than {a}", "return sum(1 for x in xs if x > {a})", lambda a: lambda xs: sum(1 for x in xs if x > a),
             _grid(a=range(-3, 9)), tuple((x,) for x in LISTS)),
    Template("keep_multiples", "keep_multiples(xs)", "returns a list of the numbers in `xs` that are divisible by "
             "{a}, in their original order", "return [x for x in xs if x % {a} == 0]",
             lambda a: lambda xs: [x for x in xs if x % a == 0], _grid(a=range(2, 10)), tuple((x,) for x in LISTS)),
    Template("caesar", "caesar(s)", "returns the string `s` with every lowercase letter a-z shifted forward by {a} "
             "places in the alphabet, wrapping from z to a; all other characters stay unchanged",
             "return ''.join(chr((ord(c) - 97 + {a}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
             lambda a: lambda s: "".join(chr((ord(c) - 97 + a) % 26 + 97) if "a" <= c <= "z" else c for c in s),
             _grid(a=range(1, 26)), (("abc",), ("xyz",), ("Hello, world!",), ("",), ("zebra",))),
    Template("pad_left", "pad_left(s)", "returns the string `s` padded on the left with '{c}' characters to a "
             "length of at least {a}", "return s.rjust({a}, {c!r})", lambda a, c: lambda s: s.rjust(a, c),
             _grid(a=range(3, 11), c="*#.-"), (("",), ("ab",), ("abcdefghijkl",), ("x",))),
    Template("first_k", "first_k(s)", "returns the first {a} characters of the string `s` (all of `s` if it is "
             "shorter)", "return s[:{a}]", lambda a: lambda s: s[:a], _grid(a=range(1, 10)),
             tuple((w,) for w in WORDS)),
    Template("gcd_with", "gcd_with(n)", "returns the greatest common divisor of the positive integer `n` and {a}",
             "a, b = n, {a}\n    while b:\n        a, b = b, a % b\n    return a", lambda a: lambda n: _gcd(n, a),
             _grid(a=range(2, 61)), ((1,), (12,), (18,), (100,), (97,))),
    Template("poly", "poly(x)", "returns the value of {a}*x*x + {b}*x + {c}", "return {a} * x * x + {b} * x + {c}",
             lambda a, b, c: lambda x: a * x * x + b * x + c, _grid(a=range(1, 6), b=range(-9, 10), c=range(-9, 10)),
             ((0,), (1,), (-2,), (7,))),
    Template("scaled_triangle", "scaled_triangle(n)", "returns {a} times the sum 1 + 2 + ... + n for a "
             "non-negative integer `n` (0 when n is 0)", "return {a} * n * (n + 1) // 2",
             lambda a: lambda n: a * n * (n + 1) // 2, _grid(a=range(2, 26)), ((0,), (1,), (4,), (10,))),
    Template("window_sum", "window_sum(xs)", "returns the {c} sum of {a} consecutive numbers in the list `xs` "
             "(you may assume it has at least {a} numbers)",
             "return {f}(sum(xs[i:i + {a}]) for i in range(len(xs) - {a} + 1))",
             lambda a, c, f, r: lambda xs: MINMAX[f](sum(xs[i:i + a]) for i in range(len(xs) - a + 1)),
             tuple({"a": a, **e} for a in range(1, 5) for e in EXTREME), tuple((x,) for x in LONG_LISTS)),
    Template("chunks", "chunks(xs)", "returns the list `xs` split into consecutive lists of length {a}; the last "
             "one may be shorter", "return [xs[i:i + {a}] for i in range(0, len(xs), {a})]",
             lambda a: lambda xs: [xs[i:i + a] for i in range(0, len(xs), a)], _grid(a=range(1, 7)),
             tuple((x,) for x in LISTS)),
    Template("replace_vowels", "replace_vowels(s)", "returns the string `s` with every vowel (a, e, i, o, u, in "
             "either case) replaced by '{c}'", "return ''.join({c!r} if ch in 'aeiouAEIOU' else ch for ch in s)",
             lambda c: lambda s: "".join(c if ch in "aeiouAEIOU" else ch for ch in s), _grid(c="*#_-+.!?"),
             tuple((w,) for w in WORDS)),
    Template("count_long_words", "count_long_words(s)", "returns how many whitespace-separated words in the string "
             "`s` have more than {a} characters", "return sum(1 for w in s.split() if len(w) > {a})",
             lambda a: lambda s: sum(1 for w in s.split() if len(w) > a), _grid(a=range(1, 7)),
             tuple((w,) for w in WORDS)),
    Template("running_total", "running_total(xs)", "returns the list of running sums of `xs`, each plus {a} "
             "(so [1, 2] gives [1 + {a}, 3 + {a}])",
             "out, t = [], 0\n    for x in xs:\n        t += x\n        out.append(t + {a})\n    return out",
             lambda a: lambda xs: [sum(xs[:i + 1]) + a for i in range(len(xs))], _grid(a=range(0, 21)),
             tuple((x,) for x in LISTS)),
    Template("kth_extreme", "kth_extreme(xs)", "returns the {a}-th {c} number in the list `xs`, counting "
             "duplicates separately (you may assume it has at least {a} numbers)",
             "return sorted(xs, reverse={r})[{a} - 1]", lambda a, c, f, r: lambda xs: sorted(xs, reverse=r)[a - 1],
             tuple({"a": a, **e} for a in range(1, 4) for e in EXTREME), tuple((x,) for x in LONG_LISTS)),
    Template("pairs_summing", "pairs_summing(xs)", "returns the number of index pairs i < j with "
             "xs[i] + xs[j] == {a}",
             "return sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[i] + xs[j] == {a})",
             lambda a: lambda xs: sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[i] + xs[j] == a),
             _grid(a=range(2, 13)), tuple((x,) for x in LISTS)),
    Template("count_digit", "count_digit(n)", "returns how many times the digit {a} appears in the decimal form "
             "of the integer `n`, ignoring the sign", "return str(abs(n)).count('{a}')",
             lambda a: lambda n: str(abs(n)).count(str(a)), _grid(a=range(10)),
             ((0,), (-1001,), (123456789,), (777,), (9090,))),
    Template("factorial_mod", "factorial_mod(n)", "returns n! (the factorial of the non-negative integer `n`) "
             "modulo {a}", "r = 1\n    for i in range(2, n + 1):\n        r = r * i % {a}\n    return r % {a}",
             lambda a: lambda n: _factorial_mod(n, a), _grid(a=range(7, 1001)), ((0,), (1,), (5,), (10,), (20,))),
    Template("sum_times", "", "reads whitespace-separated integers from standard input and prints their sum "
             "multiplied by {a}", "import sys\nprint(sum(map(int, sys.stdin.read().split())) * {a})",
             lambda a: lambda t: str(sum(map(int, t.split())) * a), _grid(a=range(2, 21)),
             ("1 2 3\n", "", "10\n-4 4\n", "7 7 7 7\n")),
    Template("lines_with", "", "reads lines from standard input and prints how many of them contain the "
             "character '{c}'", "import sys\nprint(sum({c!r} in line for line in sys.stdin))",
             lambda c: lambda t: str(sum(c in line for line in t.splitlines())), _grid(c="aeinor#"),
             ("apple\nbanana\ncherry\n", "", "#x\n\n#\nzzz\n", "one\ntwo\nthree\n")),
    Template("reverse_words", "", "reads one line from standard input and prints its whitespace-separated words "
             "in reverse order, joined by '{c}'", "print({c!r}.join(input().split()[::-1]))",
             lambda c: lambda t: c.join(t.split()[::-1]), _grid(c=("-", "|", ", ", " ", "/", ";", "+")),
             ("a b c\n", "hello\n", "the quick  brown fox\n")),
)


def _fib(a: int, b: int, n: int) -> int:
    for _ in range(n):
        a, b = b, a + b
    return a


def _digits(n: int, base: int) -> list[int]:  # least significant first
    out = []
    while n:
        out.append(n % base)
        n //= base
    return out


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _factorial_mod(n: int, m: int) -> int:
    r = 1
    for i in range(2, n + 1):
        r = r * i % m
    return r % m


def make_row(t: Template, params: dict) -> dict:
    """A task row: chat messages, hidden tests, a reference answer and per-run sandbox limits."""
    fn = t.ref(**params)
    if t.sig:
        answer = f"def {t.sig}:\n    {t.body.format(**params)}\n"
        ask = f"Write a Python function `{t.sig}` that {t.doc.format(**params)}."
        tests = [f"assert {t.name}({', '.join(map(repr, args))}) == {fn(*args)!r}" for args in t.inputs]
    else:
        answer = t.body.format(**params) + "\n"
        ask = f"Write a Python program that {t.doc.format(**params)}."
        tests = [{"stdin": text, "stdout": fn(text)} for text in t.inputs]
    user = f"{ask} Reply with the code in a ```python block."
    return {"messages": [{"role": "user", "content": user}], "tests": tests, "answer": answer,
            "task": t.name, "params": params, "limits": {"wall_s": 2.0, "cpu_s": 2, "memory_mb": 256}}


def build_splits(n_train: int, n_heldout: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows). Held-out prompts are taken round-robin over the templates,
    never more than half of one template's parameter space, so every template stays in both
    splits; training rows are drawn (with repeats) from the rest, so no held-out prompt is ever
    trained on and held-out reward measures generalisation to new parameters."""
    rng = random.Random(seed)
    pools = [list(t.space) for t in TEMPLATES]
    for pool in pools:
        rng.shuffle(pool)
    caps = [len(pool) // 2 for pool in pools]
    heldout: list[dict] = []
    for k in range(max(caps)):  # round k takes the k-th held-out point of every template
        for t, pool, cap in zip(TEMPLATES, pools, caps):
            if k < cap and len(heldout) < n_heldout:
                heldout.append(make_row(t, pool[k]))
    train_pools = [(t, pool[cap:]) for t, pool, cap in zip(TEMPLATES, pools, caps)]
    train = []
    for _ in range(n_train):
        t, pool = rng.choice(train_pools)
        train.append(make_row(t, rng.choice(pool)))
    return train, heldout
