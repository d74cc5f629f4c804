"""Generated math problems with LaTeX answers, for ``task.name=math`` without ``task.data``.

Fraction arithmetic ("What is 1/2 + 1/3?") has answers that only an equivalence checker scores
fairly: 5/6, \\frac{5}{6} and \\boxed{\\frac{5}{6}} are one answer, 10/12 is too, 0.83 is not.
That is what math-verify (envs/math.py) is for, and it makes a runnable demo with no download.
"""

from __future__ import annotations

import random
from fractions import Fraction

from rlpost.envs.arithmetic import disjoint_splits

PROMPT = "What is {expr}? Give the answer as a fraction in lowest terms, inside \\boxed{{}}."


def problem(rng: random.Random) -> tuple[str, Fraction]:
    a, b = Fraction(rng.randint(1, 9), rng.randint(2, 9)), Fraction(rng.randint(1, 9), rng.randint(2, 9))
    op = rng.choice("+-*")
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return f"{a.numerator}/{a.denominator} {op} {b.numerator}/{b.denominator}", value


def latex(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def build_splits(tcfg) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows), disjoint by expression, fixed by task.seed."""
    rng = random.Random(tcfg.seed)
    train, heldout = disjoint_splits(lambda: problem(rng), tcfg.n_train, tcfg.n_heldout)

    def row(expr: str, value: Fraction) -> dict:
        user = {"role": "user", "content": PROMPT.format(expr=expr)}
        system = [{"role": "system", "content": tcfg.system_prompt}] if tcfg.system_prompt else []
        return {"messages": system + [user], "answer": latex(value), "expr": expr}

    return [row(e, v) for e, v in train], [row(e, v) for e, v in heldout]
