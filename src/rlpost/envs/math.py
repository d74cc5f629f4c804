"""Math answers checked for equivalence with Hugging Face's math-verify, plus the DeepSeek-R1
format reward and the R1 reward stack (accuracy + 0.2 x format).

Why math-verify rather than "last number": competition answers come as LaTeX (\\frac{1}{2},
\\sqrt{3}/2, 50\\%, intervals, sets), and a string or last-integer match scores most correct
answers 0. math-verify parses both sides to SymPy and compares them numerically and
symbolically; it is what TRL's ``accuracy_reward``, Open-R1 and verl use.

How answers are found:
- gold: the row's ``answer``. math-verify only reads LaTeX inside a maths environment, so a bare
  answer ("\\frac{1}{2}", "50\\%") is wrapped in ``\\boxed{}`` first, as verl does, and parsed with
  the LaTeX and expression configs.
- prediction, in order: the last ``\\boxed{}`` anywhere in the completion; else the content of
  the last ``<answer>...</answer>``; else the last expression in the whole completion.

Timeouts: math-verify bounds each parse and each comparison with ``signal.alarm``
(``parsing_timeout`` / ``timeout_seconds``). A pathological answer such as ``9^{9^{9^{9}}}`` or
300 nested \\frac is cut off after PARSE_TIMEOUT_S / VERIFY_TIMEOUT_S and scores 0 instead of
hanging. Two consequences:
- signals only work in a process's main thread; math-verify raises ValueError when called from
  any other thread. The verifier worker (rewards/runner.py) calls verifiers on its main thread.
- the alarms are whole seconds and one call may run up to ~2 parses and ~2 comparisons, so a
  worst-case call takes ~4 s. The runner's own per-call deadline (kill + restart the worker) is
  the backstop behind these.

Light at import: math_verify (and SymPy, ANTLR) is imported on first use, so ``format_score``
alone and a verifier worker's start-up (its dry import) do not pay for it.
"""

from __future__ import annotations

import functools
import re

from rlpost.envs.dataset import answers

PARSE_TIMEOUT_S = 1  # seconds per math-verify parse() call (signal.alarm takes whole seconds)
VERIFY_TIMEOUT_S = 1  # seconds per (gold, prediction) comparison inside verify()
ACCURACY_WEIGHT = 1.0  # R1 stack: reward = 1.0 * accuracy + 0.2 * format
FORMAT_WEIGHT = 0.2

# The DeepSeek-R1-Zero template (arXiv:2501.12948, Table 1), used as a system prompt the way
# Open-R1 and TRL's GRPO examples do.
R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>."
)

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# R1 format: think block, then answer block, nothing else but whitespace around them. The
# tempered dots forbid extra tags inside a block, so "<answer>1</answer> <answer>2</answer>" and
# a second <think> cannot ride along inside one lazy ".*?" (Open-R1's pattern allows that).
_NO_TAG = r"(?:(?!</?think>|</?answer>).)*"
R1_FORMAT = re.compile(rf"\s*<think>{_NO_TAG}</think>\s*<answer>{_NO_TAG}</answer>\s*", re.DOTALL)
# A maths environment math-verify's LaTeX extractor can see without help.
_MATH_ENV = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed|\\begin\{")  # a "\$" is a dollar sign (MATH's "\$18.90")
# A word of 2+ letters that is not a LaTeX command: prose ("The answer is 42") rather than a bare
# answer. Bare answers get wrapped in \boxed{}; prose is searched for its last expression instead.
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_TEXT_ARG = re.compile(r"\\(?:text|textbf|mathrm)\{[^{}]*\}")  # \text{...}: a word that is the answer, not prose


def score(completion: str, row: dict) -> tuple[float, dict]:
    """1.0 if the completion's final answer is mathematically equal to ``row["answer"]``.

    info: ``correct`` (bool) and ``parsed`` (the prediction math-verify read, as a string, or
    None when nothing could be parsed), and ``unevaluated`` when a prediction equal to the gold
    was an operation left undone, e.g. the question restated (``_unevaluated``: scored 0)."""
    from math_verify import verify

    pred = _parse_prediction(completion)
    correct = unevaluated = False
    for answer in answers(row):  # a list of right answers (envs/dataset.py: to_row): any of them
        gold = parse_gold(answer)
        # verify(gold, pred) is not symmetric (the gold decides e.g. how intervals are read):
        # math-verify's README insists on this order.
        if gold and pred and verify(list(gold), pred, timeout_seconds=VERIFY_TIMEOUT_S):
            correct, unevaluated = True, _unevaluated(pred[0], gold[0])
            if not unevaluated:
                break
    info = {"correct": correct and not unevaluated, "parsed": _as_text(pred)}
    return float(info["correct"]), {**info, "unevaluated": True} if unevaluated else info


def _unevaluated(pred, gold) -> bool:
    """Whether the prediction is an operation left undone where the gold is a number: "What is
    8/3 * 1/3?" answered "To find 8/3 * 1/3, we need to" parses to 8/3 * 1/3 (math-verify keeps
    it unevaluated), which equals the gold 8/9, so math-verify alone scores the restated question
    right; so it does "2/1 - 8/9 = (2/1) - " and "17 * 23". Where the gold is a number (SymPy
    Integer, Rational, Float), a prediction that is a sum, a power, or a product of more than one
    integer or with more than one division scores 0; a single fraction p/q (what "1/2" parses to)
    and a percentage stay values. A gold that is itself an
    expression (1 + \\sqrt{2}, \\sqrt{3}/2, 50\\%) is compared as math-verify does."""
    import sympy

    if not isinstance(gold, sympy.Number) or isinstance(pred, sympy.Number):
        return False
    # p/q parses to Mul(p, Pow(q, -1)), 50\\% to Mul(50, UnevaluatedExpr(1/100)): values
    if isinstance(pred, sympy.Mul):
        factors = [f for f in _factors(pred) if not (isinstance(f, sympy.Integer) and abs(f) == 1)]
        ints = sum(isinstance(f, sympy.Integer) for f in factors)
        divisions = sum((isinstance(f, sympy.Pow) and f.exp == -1)
                        or (isinstance(f, sympy.Rational) and not f.is_integer)
                        for f in factors)
        percent = sum(isinstance(f, sympy.UnevaluatedExpr) and f.args[0] == sympy.Rational(1, 100) for f in factors)
        # a value: at most one integer and one division (p/q, 1/q, 8/3), or an integer and a percent sign
        return ints > 1 or divisions > 1 or len(factors) > ints + divisions + percent or (percent and divisions > 0)
    return isinstance(pred, (sympy.Add, sympy.Pow))  # an assignment (x = 3) reads as its value


def _factors(expr) -> list:
    """The factors of a product, nested products flattened (LaTeX parses \\frac{8}{3} \\cdot ... as
    Mul(Mul(..), ..))."""
    import sympy

    return [f for a in expr.args for f in (_factors(a) if isinstance(a, sympy.Mul) else [a])]


def format_score(completion: str, row: dict) -> tuple[float, dict]:
    """R1 format reward: 1.0 when the completion is exactly <think>...</think> <answer>...</answer>
    (whitespace allowed around and between the blocks), else 0.0. ``row`` is unused."""
    ok = R1_FORMAT.fullmatch(completion) is not None
    return float(ok), {"format": ok}


def r1_score(completion: str, row: dict) -> tuple[float, dict]:
    """The DeepSeek-R1 rule-based reward: 1.0 x accuracy + 0.2 x format, so the values are
    1.2 (right, well formed), 1.0 (right), 0.2 (wrong, well formed) and 0.0."""
    accuracy, info = score(completion, row)
    fmt, _ = format_score(completion, row)
    reward = ACCURACY_WEIGHT * accuracy + FORMAT_WEIGHT * fmt
    return reward, {**info, "accuracy": accuracy, "format": fmt}


# --- parsing ------------------------------------------------------------------------------------


def _configs(boxed_first: bool = False):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    # boxed_match_priority 0 makes \boxed{} win over "final answer is ..." anchors (default 50).
    latex = LatexExtractionConfig(boxed_match_priority=0) if boxed_first else LatexExtractionConfig()
    return [latex, ExprExtractionConfig()]


def _parse(text: str, boxed_first: bool = False) -> list:
    """math-verify parse with our timeout; [] when nothing parses (it never raises on bad input)."""
    from math_verify import parse

    return parse(text, extraction_config=_configs(boxed_first), parsing_timeout=PARSE_TIMEOUT_S)


@functools.lru_cache(maxsize=4096)
def parse_gold(answer: str) -> tuple:
    """Parsed gold answer, cached: a group of G completions shares one gold string. A tuple, so
    the cached value cannot be mutated by a caller."""
    return tuple(_parse_bare(answer))


def _parse_bare(text: str) -> list:
    """Parse a short answer (a gold answer, or what is inside <answer> tags)."""
    text = text.strip()
    if not text:
        return []
    if _MATH_ENV.search(text):  # already "$...$" or "\boxed{...}": math-verify reads it as is
        return _parse(text, boxed_first=True)
    # a bare formula, or a bare \text{} answer (MATH-500's "\text{Evelyn}", "\text{(C)}"): make it LaTeX math so it
    # parses whole
    if not _PROSE_WORD.search(_TEXT_ARG.sub("", text)):
        found = _parse(f"\\boxed{{{text}}}", boxed_first=True)
        if found:
            return found
    return _parse(text)  # prose: take its last expression, as for a whole completion


def _parse_prediction(completion: str) -> list:
    """The completion's final answer: last \\boxed{}, else last <answer> block, else last expression."""
    if "\\boxed" in completion:
        found = _parse(completion, boxed_first=True)
        if found:
            return found
    tagged = ANSWER_TAG.findall(completion)
    if tagged:
        found = _parse_bare(tagged[-1])
        if found:
            return found
    return _parse(completion)


def _as_text(parsed: list) -> str | None:
    """What the prediction was read as: the text math-verify extracted (it returns [SymPy value,
    extracted string]). Never str() of the SymPy value: printing an evaluated huge number such
    as 9^(9^9) runs outside any timeout (math-verify's own code avoids it for the same reason)."""
    return next((p for p in parsed if isinstance(p, str)), None)
