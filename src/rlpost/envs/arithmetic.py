"""Arithmetic task family: procedurally generated problems with difficulty knobs, a fixed
held-out split, and a verifier.

Problems are drawn from one seeded generator; the held-out split is drawn first and every
training problem whose expression also appears in it is dropped, so held-out accuracy measures
generalisation, not recall. This module imports nothing heavy: the verifier runs in a separate
worker process (rewards/runner.py) that imports only this file.
"""

from __future__ import annotations

import random
import re

INT = re.compile(r"-?\d+")


def score(completion: str, row: dict) -> tuple[float, dict]:
    """Reward 1.0 if the last integer in the completion equals the answer, else 0.0.

    'Last integer' follows nanochat and TRL's arithmetic examples: it tolerates a short working
    ("12 + 7 = 19") and is strict about the final value."""
    found = INT.findall(completion.replace(",", ""))
    pred = found[-1] if found else None
    correct = pred is not None and int(pred) == int(row["answer"])
    return float(correct), {"correct": correct, "parsed": pred is not None, "pred": pred}


EQUATION = re.compile(r"(-?\d+)\s*([+-])\s*(-?\d+)\s*=\s*(-?\d+)")


def score_steps(completion: str, row: dict) -> tuple[float, dict]:
    """Reward for the written working of a +/- expression: 1.0 when every running total is written
    as an equation, in order ("3 + 8 = 11", then "11 + 7 = 18"), and no equation is wrong; 0.5 when
    the chain is whole but a wrong equation is there too (a guessed "3 + 8 + 7 = 21" first ends in
    the wrong "8 + 7 = 21"); 0 otherwise.

    Stacked beside score() (task.reward_funcs), it pays for the chain of thought itself, so a short
    guess that happens to be right no longer earns what a worked answer does. All or nothing on
    purpose: a reward per running total was collected by writing the first one and stopping ("4 + 8
    = 12. Answer: 12", measured in recipes/grpo_cot_short.yaml's header). Expressions with '*'
    (precedence, no left-to-right chain) score 0."""
    found, steps, wrong = _chain(completion, row["expr"])
    reward = 0.0 if not steps or found < steps else 0.5 if wrong else 1.0
    return reward, {"steps": found, "whole_chain": bool(steps) and found == steps, "wrong_equations": wrong}


def _chain(completion: str, expr: str) -> tuple[int, int, int]:
    """(running totals of ``expr`` written as equations in order, counted from the first until one
    is missing; the chain's length; arithmetically wrong equations written). '*' has no chain: 0."""
    first, operations = _operations(expr)
    if any(op == "*" for op, _ in operations):
        return 0, 0, 0
    total, want = first, []
    for op, num in operations:
        after = _apply(total, op, num)
        want.append((total, op, num, after))
        total = after
    written = [(int(a), op, int(b), int(c)) for a, op, b, c in EQUATION.findall(completion.replace(",", ""))]
    wrong = sum(c != _apply(a, op, b) for a, op, b, c in written)
    rest = iter(written)  # `w in rest` consumes rest up to w, so a missing step ends the count: a prefix
    return sum(w in rest for w in want), len(want), wrong


def score_worked(completion: str, row: dict) -> tuple[float, dict]:
    """score_steps x (1 + score): a right answer counts only after the whole chain of running totals.

    0 for a bare guess, right or wrong; 1 (0.5 with a wrong equation) for the whole chain ending in
    a wrong answer; 2 (1) for the whole chain and the right answer. recipes/grpo_cot_short.yaml
    measured why the answer may not pay alone: stacked as a sum beside score_steps, a right guess
    still collected more often than the rarer whole chain, and GRPO collapsed the working into
    guesses. recipes/grpo_cot.yaml uses it on a ten-term chain (~130 tokens)."""
    steps, info = score_steps(completion, row)
    correct, answer_info = score(completion, row)
    return steps * (1.0 + correct), {**info, **answer_info}


def make_problem(rng: random.Random, ops: str, a_range, b_range, n_terms: int) -> tuple[str, int]:
    """One expression and its value; subtraction never goes below zero."""
    value = rng.randint(*a_range)
    expr = str(value)
    for _ in range(n_terms - 1):
        op = rng.choice(ops)
        b = rng.randint(*b_range)
        if op == "-" and b > value:  # keep results non-negative: swap in a b that fits
            b = rng.randint(min(b_range[0], value), value)
        value = _apply(value, op, b)
        expr += f" {op} {b}"
    # Operator precedence: with '*' after '+' the string's value differs from left-to-right;
    # evaluate the string itself (digits and + - * only, so this is plain arithmetic).
    return expr, evaluate(expr)


def evaluate(expr: str) -> int:
    """Evaluate 'a op b op c' with * before + and -, without eval()."""
    first, operations = _operations(expr)
    terms, ops = [first], []
    for op, num in operations:
        if op == "*":
            terms[-1] *= num
        else:
            terms.append(num)
            ops.append(op)
    total = terms[0]
    for op, t in zip(ops, terms[1:]):
        total = _apply(total, op, t)
    return total


def _operations(expr: str) -> tuple[int, list[tuple[str, int]]]:
    """'4 + 7 * 2' as (4, [('+', 7), ('*', 2)]): the first operand and each operation after it."""
    tokens = expr.split()
    return int(tokens[0]), [(op, int(num)) for op, num in zip(tokens[1::2], tokens[2::2])]


def _apply(a: int, op: str, b: int) -> int:
    """a op b for one of the family's operators: + - *."""
    return a + b if op == "+" else a - b if op == "-" else a * b


def disjoint_splits(draw, n_train: int, n_heldout: int, draw_train=None) -> tuple[list[tuple], list[tuple]]:
    """(train, held-out) lists of (expr, value) from ``draw()``: the held-out split is drawn first,
    distinct, and every training draw whose expression is held out is dropped. Each loop makes at
    most 20x its target draws, so a small problem space gives fewer rows instead of hanging.
    ``draw_train`` (default ``draw``) draws the training problems when they come from a wider
    distribution than the held-out ones (arithmetic's task.min_terms curriculum).
    Shared by every generated task family (arithmetic, mathgen, tools)."""
    draw_train = draw_train or draw
    heldout: dict = {}
    for _ in range(n_heldout * 20):
        if len(heldout) == n_heldout:
            break
        expr, value = draw()
        heldout.setdefault(expr, value)
    train = []
    for _ in range(n_train * 20):
        if len(train) == n_train:
            break
        expr, value = draw_train()
        if expr not in heldout:
            train.append((expr, value))
    return train, list(heldout.items())


def build_splits(tcfg) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows); rows carry chat messages and the answer.

    With task.min_terms each training problem draws its operand count from min_terms..n_terms with
    weights 1, 1/2, 1/3, ... (min_terms the most often), so one run mixes short chains, which the
    base model sometimes works out (a learning signal from the first step), with long ones, which
    it does not yet; the held-out problems all have n_terms operands, so held-out accuracy is
    measured on the longest chain."""
    rng = random.Random(tcfg.seed)
    ranges = (tcfg.min_a, tcfg.max_a), (tcfg.min_b, tcfg.max_b)
    def draw():
        return make_problem(rng, tcfg.ops, *ranges, tcfg.n_terms)
    mixed = None
    if tcfg.min_terms:
        counts = range(tcfg.min_terms, tcfg.n_terms + 1)
        weights = [1 / (i + 1) for i in range(len(counts))]
        def mixed():
            return make_problem(rng, tcfg.ops, *ranges, rng.choices(counts, weights)[0])
    train, heldout = disjoint_splits(draw, tcfg.n_train, tcfg.n_heldout, mixed)
    def to_row(e, v):
        return {"messages": _messages(tcfg, e), "answer": str(v), "expr": e}
    return [to_row(e, v) for e, v in train], [to_row(e, v) for e, v in heldout]


def numbered_steps(expr: str) -> str:
    """'4 + 7 - 2' as a worksheet, one operation per numbered line: 'Start with 4.', 'Step 1: + 7',
    'Step 2: - 2' (task.prompt's {steps}). A long chain is easier to keep in order this way: the
    number of the step being written points at its line, where '4 + 7 + 7 + 2 + ...' on one line
    leaves a small model to find its place among repeated terms (it skips and repeats them)."""
    first, operations = _operations(expr)
    lines = [f"Start with {first}."]
    lines += [f"Step {i}: {op} {num}" for i, (op, num) in enumerate(operations, 1)]
    return "\n".join(lines)


def _messages(tcfg, expr: str) -> list[dict]:
    user = {"role": "user", "content": tcfg.prompt.format(expr=expr, steps=numbered_steps(expr))}
    return ([{"role": "system", "content": tcfg.system_prompt}] if tcfg.system_prompt else []) + [user]
