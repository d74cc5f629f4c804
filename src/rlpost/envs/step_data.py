"""Step-labelled solutions, the data ``rlpost prm DATA`` trains a process reward model on.

One row a solution (JSONL, parquet or a ``datasets`` folder, as ``task.data`` reads):

    {"prompt": "Compute 5 + 3 + 4.", "steps": ["5 + 3 = 8", "8 + 4 = 13", "Answer: 13"], "labels": [1, 0, 0]}

- ``prompt``: a string (the user message) or a list of chat messages ending with the user turn;
- ``steps``: the solution, one string a step. A step is a line (rewards/prm.py, point 1), so a step
  holds no newline and is not blank: the solution the PRM reads is the steps joined by newlines;
- ``labels``: one a step, each a number in [0, 1] or true/false: whether the solution is still on a
  path to a right answer after that step. Soft labels are kept as they are (Math-Shepherd's "SE"
  estimate, the fraction of Monte-Carlo continuations that ended right); PRM800K's human ratings
  go in as 1 for a good step and 0 for a bad one (a neutral step is the user's call: PRM800K's
  authors tried both).

Why this shape rather than Math-Shepherd's released one (one string with a tag after each step):
a list of steps and a list of labels cannot disagree on where a step ends, and the tag tokens
never reach the model. A row that breaks a rule is one DataError naming ``file:line`` and the
field.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.envs.data import prompt_messages, read_rows, where
from rlpost.types.errors import DataError


@dataclass
class StepRow:
    messages: list[dict]  # the prompt as chat messages
    steps: list[str]  # one line each
    labels: list[float]  # one per step, in [0, 1]
    where: str  # file:line, for errors found later (the tokenizer's view of the steps)


def parse(row: dict, source: str) -> StepRow:
    """One data row as a StepRow; a DataError naming the row and the field otherwise."""
    at = where(row, source)
    messages = prompt_messages(row, source)
    steps, labels = row.get("steps"), row.get("labels")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise DataError(f"{at}: 'steps' must be a non-empty list of strings (one a step), got {steps!r:.80}")
    for k, s in enumerate(steps):
        if "\n" in s or not s.strip():
            raise DataError(f"{at}: steps[{k}] is {'blank' if not s.strip() else 'more than one line'} ({s!r:.60}); "
                            "a step is one line of text")
    if not isinstance(labels, list) or len(labels) != len(steps):
        raise DataError(f"{at}: 'labels' must be a list of one label a step ({len(steps)}), got {labels!r:.80}")
    out = []
    for k, y in enumerate(labels):
        ok = isinstance(y, (bool, int, float)) and 0 <= float(y) <= 1  # NaN fails both comparisons
        if not ok:
            raise DataError(f"{at}: labels[{k}] must be a number in [0, 1] or true/false, got {y!r:.40}")
        out.append(float(y))
    return StepRow(messages, steps, out, at)


def read(path: str) -> list[StepRow]:
    """Every row of the file, parsed; the first bad one stops it in one line (no row is skipped silently)."""
    rows = [parse(r, str(path)) for r in read_rows(path)]
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows
