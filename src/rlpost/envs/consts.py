"""The values a HumanEval ``check`` builds before its asserts, computed here, in the trusted process, without running
its code (envs/code_formats.py).

Why. Some checks build their inputs and expected values first: ``lst = list(range(-99, 100, 2))`` then
``odd_sum = sum([i**2 for i in lst if i%2!=0 and i > 0])``, or ``x, y = random.randint(0, 1000), ...`` in a loop.
Running that code in the program's interpreter would let the program rewrite what the test sees; running it
here with ``eval`` would run a data file's code in the trainer. So it is *evaluated* here by a small interpreter
of pure expressions: literals, names bound earlier, arithmetic, comparisons, displays, comprehensions, indexing
and a fixed list of pure builtins (``SAFE``), and ``random``'s draws from a generator seeded by the row (the
same inputs on every load, drawn as HumanEval's harness draws them, from a distribution, not the same values).
Anything else (a helper function, an attribute, a lambda, the candidate) is ``NotConstant``, and the row is
refused as before. Every evaluation is bounded: at most ``STEPS`` nodes and ``MAX_ITEMS`` items a value, numbers
of at most ``MAX_DIGITS`` digits, strings of at most ``MAX_TEXT`` characters, so a data file cannot make loading
hang or fill memory.
"""

from __future__ import annotations

import ast
import math
import operator
import random

STEPS = 200_000  # nodes evaluated in one check, comprehension items included
MAX_ITEMS = 10_000  # items in one list, tuple, set, dict or range
MAX_TEXT = 1 << 16  # characters in one string
MAX_DIGITS = 100  # digits in one integer
MAX_POWER = 64  # the largest exponent of a ** computed here
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
           ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
SAFE = {"range": range, "len": len, "str": str, "int": int, "float": float, "bool": bool, "abs": abs, "min": min,
        "max": max, "sum": sum, "sorted": sorted, "list": list, "tuple": tuple, "set": set, "round": round}
RANDOM = ("randint", "choice", "random", "uniform", "randrange")  # random's draws a check may make


class NotConstant(Exception):
    """An expression this interpreter does not compute (the row is then refused, as before)."""


class Consts:
    """Names a check has bound (``env``), the random module's names it imported, and the row's generator."""

    def __init__(self, seed: int, hidden: set[str] = frozenset()):
        """hidden: names that are never computed here, whatever SAFE or the check's own names say: ``candidate``
        always, and these (in HumanEval the entry point, which the completion defines)."""
        self.hidden = {"candidate", *hidden}
        self.env: dict[str, object] = {}
        self.random_module: set[str] = set()  # `import random` (as ...)
        self.random_names: dict[str, str] = {}  # `from random import randint as r`: r -> randint
        self.rng = random.Random(seed)
        self.steps = 0

    def imported(self, stmt) -> None:
        """Note what an import of the check makes available (only random's names are ever called)."""
        if isinstance(stmt, ast.Import):
            self.random_module |= {a.asname or a.name for a in stmt.names if a.name == "random"}
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "random":
            self.random_names.update({a.asname or a.name: a.name for a in stmt.names if a.name in RANDOM})

    def bind(self, target, value) -> None:
        """``NAME = value`` or ``A, B = value`` (NotConstant for any other target, or a count that differs)."""
        if isinstance(target, ast.Name) and target.id not in self.hidden:
            self.env[target.id] = value
        elif isinstance(target, ast.Tuple) and isinstance(value, (tuple, list)) and len(value) == len(target.elts):
            for t, v in zip(target.elts, value):
                self.bind(t, v)
        else:
            raise NotConstant("an assignment this check makes")

    def value(self, node):
        """The value of expression ``node`` (NotConstant where it is not computed here)."""
        self.steps += 1
        if self.steps > STEPS:
            raise NotConstant("too much to compute")
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise NotConstant(type(node).__name__)
        value = _checked(method(node))
        if isinstance(value, (list, tuple, set, dict)):
            self._measure(value)
        return value

    def _measure(self, value) -> None:
        """A container's whole size, nested values and their characters included, within the bounds: ``[[0] *
        9000] * 9000`` holds few objects but prints as 160 million characters. The walk is paid from STEPS."""
        todo, leaves, chars = [value], 0, 0
        while todo:
            v = todo.pop()
            self.steps += 1
            if isinstance(v, dict):
                todo.extend(v.keys())
                todo.extend(v.values())
            elif isinstance(v, (list, tuple, set)):
                todo.extend(v)
            else:
                leaves += 1
                chars += len(v) if isinstance(v, str) else 0
            if leaves > MAX_ITEMS or chars > MAX_TEXT or self.steps > STEPS:
                raise NotConstant("a value too large")

    # --- one method a node type ------------------------------------------------------------------

    def _Constant(self, node):
        if isinstance(node.value, (int, float, str, bool, type(None))):
            return node.value
        raise NotConstant("a constant of another type")

    def _Name(self, node):
        if node.id not in self.env:  # bind never binds a hidden name
            raise NotConstant(f"name {node.id!r}")
        return self.env[node.id]

    def _List(self, node):
        return [self.value(e) for e in node.elts]

    def _Tuple(self, node):
        return tuple(self.value(e) for e in node.elts)

    def _Set(self, node):
        return _hashed(set, [self.value(e) for e in node.elts])

    def _Dict(self, node):
        if None in node.keys:
            raise NotConstant("a ** in a dict display")
        return _hashed(dict, [(self.value(k), self.value(v)) for k, v in zip(node.keys, node.values)])

    def _BinOp(self, node):
        left, right, op = self.value(node.left), self.value(node.right), type(node.op)
        if op not in BINARY:
            raise NotConstant("an operator")
        if op is ast.Pow and (not isinstance(right, (int, float)) or abs(right) > MAX_POWER):
            raise NotConstant(f"a power above {MAX_POWER}")
        if op is ast.Mult and isinstance(left, (str, list, tuple)) != isinstance(right, (str, list, tuple)):
            n, seq = (right, left) if isinstance(left, (str, list, tuple)) else (left, right)
            if not isinstance(n, int) or n * len(seq) > MAX_TEXT:
                raise NotConstant("a repetition too long")
        try:
            return BINARY[op](left, right)
        except (ArithmeticError, TypeError, ValueError) as e:
            raise NotConstant(str(e)) from None

    def _UnaryOp(self, node):
        operand = self.value(node.operand)
        ops = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
        if type(node.op) not in ops:
            raise NotConstant("an operator")
        try:
            return ops[type(node.op)](operand)
        except TypeError as e:
            raise NotConstant(str(e)) from None

    def _BoolOp(self, node):
        result = None
        for v in node.values:
            result = self.value(v)
            if bool(result) is isinstance(node.op, ast.Or):  # `or` stops at a true value, `and` at a false one
                return result
        return result

    def _Compare(self, node):
        left = self.value(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.value(right_node)
            try:
                if not COMPARE[type(op)](left, right):
                    return False
            except (KeyError, TypeError) as e:
                raise NotConstant(f"a comparison ({e})") from None
            left = right
        return True

    def _IfExp(self, node):
        return self.value(node.body) if self.value(node.test) else self.value(node.orelse)

    def _Subscript(self, node):
        target = self.value(node.value)
        index = self._slice(node.slice) if isinstance(node.slice, ast.Slice) else self.value(node.slice)
        try:
            return target[index]
        except (IndexError, KeyError, TypeError) as e:
            raise NotConstant(f"an index ({e})") from None

    def _slice(self, node) -> slice:
        return slice(*(None if part is None else self.value(part) for part in (node.lower, node.upper, node.step)))

    def _Call(self, node):
        if node.keywords:
            raise NotConstant("a call with keywords")
        draw = self._random_name(node.func)
        if draw is None and not (isinstance(node.func, ast.Name) and node.func.id in SAFE
                                 and not self._taken(node.func.id)):
            raise NotConstant(f"a call of {ast.unparse(node.func)}")
        args = [self.value(a) for a in node.args]
        try:
            if draw is None and node.func.id == "range" and len(range(*args)) > MAX_ITEMS:
                raise NotConstant("a range too long")
            return getattr(self.rng, draw)(*args) if draw else SAFE[node.func.id](*args)
        except (ArithmeticError, TypeError, ValueError, IndexError) as e:
            raise NotConstant(f"a call ({e})") from None

    def _random_name(self, func) -> str | None:
        """``random.randint`` (random imported) or ``randint`` (imported from random): the draw's name."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr in RANDOM:
            name = func.value.id
            return func.attr if name in self.random_module and not self._taken(name) else None
        if isinstance(func, ast.Name) and func.id in self.random_names and not self._taken(func.id):
            return self.random_names[func.id]
        return None

    def _taken(self, name: str) -> bool:
        """Does `name` mean something else than an import's here (a name the check bound, or a hidden one)?"""
        return name in self.env or name in self.hidden

    def _ListComp(self, node):
        return list(self._generate(node.elt, node.generators))

    def _GeneratorExp(self, node):
        return list(self._generate(node.elt, node.generators))  # consumed at once: sum(...), sorted(...)

    def _SetComp(self, node):
        return _hashed(set, self._generate(node.elt, node.generators))

    def _generate(self, elt, generators):
        """The items of a comprehension, its variables bound in a copy of the names (they do not leak)."""
        saved = dict(self.env)
        try:
            out: list = []
            self._loop(elt, generators, out)
            return out
        finally:
            self.env = saved

    def _loop(self, elt, generators, out: list) -> None:
        first, rest = generators[0], generators[1:]
        if first.is_async:
            raise NotConstant("an async comprehension")
        items = self.value(first.iter)
        if not isinstance(items, (list, tuple, set, dict, range, str)):
            raise NotConstant("a loop over a value that is no sequence")
        for item in items:
            self.bind(first.target, item)
            if all(self.value(cond) for cond in first.ifs):
                if rest:
                    self._loop(elt, rest, out)
                else:
                    out.append(self.value(elt))
                    if len(out) > MAX_ITEMS:
                        raise NotConstant("a comprehension too long")


def _hashed(kind, items: list):
    """set(items) or dict(items), NotConstant where an item cannot be hashed."""
    try:
        return kind(items)
    except TypeError as e:
        raise NotConstant(str(e)) from None


def _checked(value):
    """``value`` if it is within the bounds (module docstring), else NotConstant."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_DIGITS * 3.33:
            raise NotConstant("a number too large")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotConstant("a number that is not finite")
        return value
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise NotConstant("a string too long")
        return value
    if isinstance(value, (list, tuple, set, dict, range)):
        if len(value) > MAX_ITEMS:
            raise NotConstant("a value with too many items")
        return value
    raise NotConstant(f"a value of type {type(value).__name__}")
