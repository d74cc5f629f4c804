"""Tasks from user data: rows of a JSONL / parquet file or a `datasets` folder become prompts.

A data row has a prompt column (``task.prompt_column``: a string, which becomes the user message,
or a list of chat messages) and an answer column (``task.answer_column``, copied to
``row['answer']``; a dotted name reads a nested field). verl's parquet rows load as they are:
``prompt`` holds the messages and, when there is no ``answer`` column, the answer is read from
``reward_model.ground_truth``. Every other column (``data_source``, ``extra_info``, ...) rides along in the row, so a
verifier or a TRL-style reward function can read it (TRL passes dataset columns to reward functions as keyword
arguments; so do we, see envs/worker.py). A row that does not fit is reported as ``file:line`` and either stops the
run (``task.on_bad_row=refuse``) or is skipped and counted (``skip``).

The held-out split is ``task.eval_data`` when given, else ``task.n_heldout`` rows of a seeded
shuffle of ``task.data`` (by default at most a tenth of it: a small dataset keeps most rows for training), so
before/after accuracy never sees training rows.
"""

from __future__ import annotations

import math
import random
import re
import string

from rlpost.console import say
from rlpost.sections import TaskConfig
from rlpost.envs.data import ROLES, DataError, check_rows, joined_text, read_rows, where

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
HELDOUT_SHARE = 10  # without task.eval_data, at most 1 / HELDOUT_SHARE of task.data is held out by default
DEFAULT_HELDOUT = TaskConfig.__dataclass_fields__["n_heldout"].default  # a task.n_heldout you set is kept as set


def exact_match(completion: str, row: dict) -> tuple[float, dict]:
    """The default verifier of a dataset task: the completion's last line (or its last number, for
    a numeric answer) equals the answer, both normalised as SQuAD's and TriviaQA's exact match
    normalises them (``normalise``); a list of answers: any of them."""
    found = NUMBER.findall(completion.replace(",", ""))
    lines = [s.strip() for s in completion.strip().splitlines() if s.strip()]
    correct = any(bool(found) and float(found[-1]) == float(answer.replace(",", ""))
                  if NUMBER.fullmatch(answer.replace(",", "")) else
                  bool(lines) and normalise(lines[-1]) == normalise(answer)
                  for answer in (a.strip() for a in answers(row)))
    return float(correct), {"correct": correct}


ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalise(text: str) -> str:
    """SQuAD's normalize_answer (TriviaQA's evaluation uses it too): lower case, punctuation and the
    articles a/an/the removed, runs of whitespace made one space. An answer that is all punctuation
    ('?', '...') is compared as it is, lower-cased, rather than as nothing."""
    lower = text.lower()
    words = ARTICLES.sub(" ", "".join(c for c in lower if c not in string.punctuation))
    return " ".join(words.split()) or lower.strip()


def chat(messages: list[dict], at: str) -> list[dict]:
    """A prompt's chat messages, checked: each a role of ROLES with text content (OpenAI's list of text
    parts joined), the last the user's; DataError naming the message (``at``: the row and column)."""
    out = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role is None and "from" in m:  # ShareGPT
            raise DataError(f"{at}[{i}]: a ShareGPT message ({{from, value}}); expected {{role, content}} with roles "
                            "system, user, assistant (ShareGPT's human and gpt)")
        if role not in ROLES:
            hint = " (ShareGPT's human and gpt are user and assistant)" if role in ("human", "gpt") else ""
            raise DataError(f"{at}[{i}]: role {str(role)[:20]!r}; expected one of {', '.join(ROLES)}{hint}")
        content = joined_text(content)  # OpenAI's content parts, text only
        if not isinstance(content, str):
            raise DataError(f"{at}[{i}].content: expected text (or a list of text parts), got "
                            f"{'null' if content is None else type(content).__name__}")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise DataError(f"{at}: must end with a user message (the prompt the model answers), got "
                        f"{out[-1]['role']!r} last")
    return out


def to_row(raw: dict, tcfg, source: str) -> dict:
    """One data row -> a task row: ``messages`` (ending with the user turn), ``answer``, the rest."""
    prompt = raw.get(tcfg.prompt_column)
    if isinstance(prompt, str) and prompt.strip():
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        messages = chat(prompt, f"{where(raw, source)}: '{tcfg.prompt_column}'")
    else:
        raise DataError(f"{where(raw, source)}: '{tcfg.prompt_column}' must be a non-empty string or a list of chat "
                        f"messages (task.prompt_column; columns here: {', '.join(k for k in raw if k != '_line')})")
    raw_text = isinstance(prompt, str) and tcfg.prompt_format == "raw"  # TRL's standard format: no chat template
    if tcfg.system_prompt and messages[0]["role"] != "system" and not raw_text:
        messages = [{"role": "system", "content": tcfg.system_prompt}, *messages]
    row = {k: v for k, v in raw.items() if k != tcfg.prompt_column}
    row.update(messages=messages, prompt=prompt, **({RAW_PROMPT: prompt} if raw_text else {}))
    name = tcfg.answer_column
    if name == "answer" and "answer" not in raw and column(raw, VERL_ANSWER) is not None:
        name = VERL_ANSWER  # a verl row: the reference answer sits in reward_model.ground_truth
    if name:
        answer = column(raw, name)
        blank = answer is None or (isinstance(answer, str) and not answer.strip())
        if blank and tcfg.name == "code" and isinstance(raw.get("tests"), list):
            pass  # a code row is graded by its tests; its reference solution is only shown beside the samples
        elif blank:
            raise DataError(f"{where(raw, source)}: missing '{name}' (task.answer_column; set it to '' if the verifier "
                            "needs none)")
        elif isinstance(answer, float) and not math.isfinite(answer):
            raise DataError(f"{where(raw, source)}: '{name}' is {answer}; expected an answer")
        elif isinstance(answer, dict) and tcfg.verifier:  # a verifier of your own reads it as it is
            row["answer"] = answer
        elif isinstance(answer, dict):  # TriviaQA's {value, aliases, ...}: which field is the answer is the user's call
            keys, first = ", ".join(list(answer)[:6]), next(iter(answer), "x")
            raise DataError(f"{where(raw, source)}: '{name}' is a mapping ({keys}); name the field that holds "
                            f"the answer with a dotted task.answer_column, e.g. task.answer_column={name}.{first}")
        elif isinstance(answer, list):  # several right answers (TriviaQA's aliases, verl's lists): any of them counts
            if not answer or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in answer):
                raise DataError(f"{where(raw, source)}: '{name}' is a list; expected one answer, or a non-empty "
                                f"list of right answers (strings or numbers), got {str(answer)[:80]}")
            row["answer"] = [str(a) for a in answer]
        else:
            row["answer"] = answer if isinstance(answer, str) else str(answer)
    return row


def answers(row: dict) -> list[str]:
    """The row's right answers: its one answer, or each of a list (to_row)."""
    gold = row["answer"]
    return [str(a) for a in gold] if isinstance(gold, list) else [str(gold)]


VERL_ANSWER = "reward_model.ground_truth"
RAW_PROMPT = "_prompt_text"  # task.prompt_format=raw: the text the sampler feeds as it is (roles/rollout_hf.py: render)


def column(raw: dict, name: str):
    """A column, or with a dotted name a field inside a nested one (verl's
    ``reward_model.ground_truth``); None when absent."""
    value = raw
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def load_rows(path: str, tcfg, raw: bool = False, convert=None) -> tuple[list[dict], int]:
    """(task rows, rows skipped as malformed) of one data file; raw: the rows as they are (an
    environment's rows, which its reset reads: they need no prompt); convert(row, source): a data
    row in another format -> one in this (the code sets' formats, envs/code_formats.py)."""
    if raw:
        return read_rows(path), 0
    parse = (lambda r, src: to_row(convert(r, src), tcfg, src)) if convert else (lambda r, src: to_row(r, tcfg, src))
    rows, skipped = check_rows(read_rows(path), parse, path, tcfg.on_bad_row)
    return [parse(r, path) for r in rows], skipped


def build_splits(tcfg, raw: bool = False, convert=None) -> tuple[list[dict], list[dict], int]:
    """(train rows, held-out rows, rows skipped); raw, convert: as load_rows."""
    if not tcfg.data:  # task.eval_data alone (`rlpost eval` of a whole file): held-out rows, nothing to train on
        heldout, skipped = load_rows(tcfg.eval_data, tcfg, raw, convert)
        if not heldout:
            raise DataError(f"{tcfg.eval_data}: no usable rows")
        return [], heldout[: tcfg.n_heldout] if tcfg.n_heldout != DEFAULT_HELDOUT else heldout, skipped
    rows, skipped = load_rows(tcfg.data, tcfg, raw, convert)
    if tcfg.eval_data:
        heldout, bad = load_rows(tcfg.eval_data, tcfg, raw, convert)
        skipped += bad
    else:
        random.Random(tcfg.seed).shuffle(rows)
        n = tcfg.n_heldout  # as set; the default (sized for the generated tasks) is capped at a tenth of the rows
        if n == DEFAULT_HELDOUT:
            n = min(n, max(1, len(rows) // HELDOUT_SHARE))
        if n < tcfg.n_heldout:
            say(f"held out {n} of the {len(rows)} rows of {tcfg.data} for evaluation (at most a tenth of them; "
                "task.eval_data names a split of your own)")
        heldout, rows = rows[:n], rows[n:]
    if not rows and heldout and not tcfg.eval_data:  # every row went to the held-out split
        raise DataError(f"task.n_heldout: {tcfg.n_heldout} held-out rows leave none of the {len(heldout)} usable rows "
                        f"of {tcfg.data} to train on; lower it, or name a held-out file in task.eval_data")
    if not rows or not heldout:
        raise DataError(f"{tcfg.data}: too few usable rows ({len(rows)} train, {len(heldout)} held-out)")
    return rows[: tcfg.n_train], heldout[: tcfg.n_heldout], skipped
