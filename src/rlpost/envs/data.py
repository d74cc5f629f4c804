"""Data rows in, prompts out: reading row files, and the prompt stream.

``read_rows`` reads JSONL, parquet or a ``datasets.save_to_disk`` folder; a JSONL row remembers
its line number (``_line``) so that any later complaint about it can name ``file:line``.

The prompt stream is an endless, resumable walk over training rows, reshuffled every epoch. Its
whole state is (epoch, position), saved in every checkpoint, so a resumed run draws exactly the
prompts the uninterrupted run would have drawn.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from rlpost.types.errors import ConfigError, DataError
from rlpost.types.folders import regular_file
from rlpost.types.schema import ListOf, MapOf, Where, check


def read_rows(path: str | Path, what: str = "data") -> list[dict]:
    """Rows of a .jsonl / .parquet file or a `datasets` folder saved to disk; a file that is not
    what it claims (not UTF-8, a damaged parquet, a folder that is no dataset, JSON nested past
    Python's recursion limit) is one DataError. ``what``: the option that named the file."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{what}: file not found: {path}")
    try:
        regular_file(path, what)  # a FIFO would block forever, /dev/zero fill the memory
    except ConfigError as e:
        raise DataError(str(e)) from None
    if path.is_dir() or path.suffix == ".parquet":
        return _read_dataset(path)
    if path.suffix.lower() in (".csv", ".tsv"):  # read as JSON it would fail at line 1 with a JSON parser's message
        raise DataError(f"{path}: a {path.suffix[1:].upper()} file; rlpost reads JSONL (a JSON object a line), "
                        "parquet or a `datasets` folder: convert it, e.g. "
                        "datasets.Dataset.from_csv(path).to_json('rows.jsonl')")
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror})") from None
    rows = []
    for i, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8-sig" if i == 1 else "utf-8")  # a byte-order mark first (Windows') is no text
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{i}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        except RecursionError:  # json's decoder recurses per bracket: ~1000 deep ends it
            raise DataError(f"{path}:{i}: JSON nested too deeply to read") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{i}: expected a JSON object per line")
        row["_line"] = i
        rows.append(row)
    return rows


def _read_dataset(path: Path) -> list[dict]:
    import datasets

    if path.is_dir() and (path / "dataset_dict.json").is_file():  # load_dataset(...).save_to_disk(): its splits
        splits = [p.name for p in sorted(path.iterdir()) if (p / "dataset_info.json").is_file()]
        raise DataError(f"{path}: a DatasetDict folder (splits {', '.join(splits)}); name one split's folder, e.g. "
                        f"{path / (splits[0] if splits else 'train')}")
    try:
        if path.is_dir():
            rows = [dict(r) for r in datasets.load_from_disk(str(path))]
        else:  # pyarrow: datasets' own reader refuses a table of no rows, and caches a copy of every file read
            import pyarrow.parquet

            rows = pyarrow.parquet.read_table(str(path)).to_pylist()
    except Exception as e:  # noqa: BLE001 - arrow and datasets raise many types for a bad file
        what = ("a folder, but not one saved by `datasets` (save_to_disk)" if path.is_dir()
                else "not a readable parquet file")
        first = str(e).splitlines()[0][:200] if str(e) else ""
        raise DataError(f"{path}: {what} ({type(e).__name__}: {first})") from None
    for i, row in enumerate(rows, 1):  # a complaint names the row, as a JSONL row's names its line (``where``)
        row["_line"] = i
    return rows


def where(row: dict, source: str) -> str:
    """Where a row came from, for a complaint about it: FILE:LINE for JSONL, FILE row N for a parquet file or a
    `datasets` folder (a table's rows are counted from 1), SOURCE row for a row of no file."""
    if "_line" not in row:
        return f"{source} row"
    table = str(source).endswith(".parquet") or Path(str(source)).is_dir()
    return f"{source} row {row['_line']}" if table else f"{source}:{row['_line']}"


def check_rows(rows: list[dict], parse, source: str, on_error: str = "refuse") -> tuple[list[dict], int]:
    """(the rows that parse, number skipped). on_error='refuse' raises on the first bad row
    (naming its line), 'skip' drops it and counts it."""
    keep, skipped = [], 0
    for r in rows:
        try:
            parse(r, source)
            keep.append(r)
        except DataError:
            if on_error == "refuse":
                raise
            skipped += 1
    return keep, skipped


ROLES = ("system", "user", "assistant", "tool")  # a chat message's roles (OpenAI's), in data rows and requests alike
# A chat message as SFT and preference rows hold them (OpenAI's and TRL's conversational format).
MESSAGE = {"role": Where(lambda v: v in ROLES, "system, user, assistant or tool"), "content": str}


def joined_text(content):
    """OpenAI's content as a list of text parts ([{"type": "text", "text": ...}]) as one string; any other
    content as it is."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return content


def prompt_messages(row: dict, source: str) -> list[dict]:
    p = row.get("prompt")
    if isinstance(p, str):
        return [{"role": "user", "content": p}]
    if isinstance(p, list) and p and all(isinstance(m, dict) and "role" in m and "content" in m for m in p):
        return p
    raise DataError(f"{where(row, source)}: 'prompt' must be a string or a list of chat messages")


def completion_text(value, key: str, row: dict, source: str) -> str:
    """A completion as text: a string, or (TRL's conversational format) a list holding one
    assistant message."""
    if isinstance(value, str):
        return value
    if (isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict)
            and value[0].get("role") == "assistant" and isinstance(value[0].get("content"), str)):
        return value[0]["content"]
    raise DataError(f"{where(row, source)}: expected '{key}' as a string or a list of one assistant message")


def sft_pair(row: dict, source: str) -> tuple[list[dict], str]:
    """(prompt messages, completion text) of an SFT row: ``messages`` ending with the assistant
    turn, or ``prompt`` + ``completion`` (strings, or TRL's conversational lists)."""
    if "messages" in row:
        msgs = check(row["messages"], ListOf(MESSAGE), f"{where(row, source)}: messages")
        if not msgs or msgs[-1]["role"] != "assistant":
            raise DataError(f"{where(row, source)}: 'messages' must end with an assistant message")
        if not any(m["role"] in ("user", "system") for m in msgs[:-1]):
            raise DataError(f"{where(row, source)}: 'messages' needs a user turn before the assistant's (the prompt)")
        return msgs[:-1], msgs[-1]["content"]
    if "completion" not in row:
        plain = (" (a plain 'text' row, TRL's language-modelling format, has no prompt: rlpost sft trains a completion "
                 "after a prompt, so split each text into 'prompt' and 'completion')" if "text" in row else "")
        raise DataError(f"{where(row, source)}: expected 'completion' (a string) or 'messages'{plain}")
    return prompt_messages(row, source), completion_text(row["completion"], "completion", row, source)


def extract_prompt(chosen, rejected):
    """TRL's implicit prompt (``trl.data_utils.extract_prompt``): the longest common prefix of
    chosen and rejected (strings, or lists of messages) is the prompt; a space right before the
    split stays with the completions. Returns (prompt, chosen rest, rejected rest)."""
    idx = min(len(chosen), len(rejected))
    for i in range(idx):
        if chosen[i] != rejected[i]:
            idx = i - 1 if i > 0 and isinstance(chosen, str) and chosen[i - 1] == " " else i
            break
    return chosen[:idx], chosen[idx:], rejected[idx:]


def standard_prompt(row: dict) -> str | None:
    """The prompt text of a row in TRL's standard format (strings, not chat messages): its ``prompt``, or
    (implicit) the shared prefix of ``chosen`` and ``rejected``; None for a conversational row."""
    p = row.get("prompt")
    if "messages" in row:
        return None
    if isinstance(p, str):
        return p if all(isinstance(row[k], str) for k in ("completion", "chosen", "rejected") if k in row) else None
    if p is None and isinstance(row.get("chosen"), str) and isinstance(row.get("rejected"), str):
        return extract_prompt(row["chosen"], row["rejected"])[0] or None
    return None


def preference_triple(row: dict, source: str) -> tuple[list[dict], str, str]:
    """(prompt messages, chosen text, rejected text) of a preference row, in any of TRL's four
    layouts: explicit ``prompt`` or implicit (the shared prefix of chosen and rejected is the
    prompt), each as plain strings or as chat messages."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if chosen is None and rejected is None and "completion" in row and "label" in row:
        raise DataError(f"{where(row, source)}: an unpaired row (prompt, completion, label: KTOTrainer's format); "
                        "rlpost's losses, kto too, train on pairs: 'chosen' (desirable) and 'rejected' (undesirable) "
                        "for one prompt")
    for key, value in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(value, (str, list)):
            raise DataError(f"{where(row, source)}: expected '{key}' (a string or a list of chat messages)")
    # UltraFeedback-binarized: a string prompt beside whole conversations, which hold it as their user turn; TRL's
    # maybe_extract_prompt takes the prompt from the conversations' shared prefix then, and so does this
    whole = isinstance(row.get("prompt"), str) and isinstance(chosen, list) and isinstance(rejected, list)
    if whole and chosen and isinstance(chosen[0], dict) and chosen[0].get("role") != "assistant":
        row = {k: v for k, v in row.items() if k != "prompt"}
    if "prompt" not in row:  # implicit prompt
        if type(chosen) is not type(rejected):
            raise DataError(f"{where(row, source)}: 'chosen' and 'rejected' must both be strings or both message lists")
        prompt, chosen, rejected = extract_prompt(chosen, rejected)
        if not prompt:
            raise DataError(f"{where(row, source)}: no 'prompt', and 'chosen' and 'rejected' share no prefix to take "
                            "it from")
        row = {**row, "prompt": prompt}
    return (prompt_messages(row, source), completion_text(chosen, "chosen", row, source),
            completion_text(rejected, "rejected", row, source))


class PromptStream:
    """Training prompts in a fixed shuffled order per epoch, ``batch_size`` at a time.

    Online curriculum (``curriculum`` = (window, lo, hi), rollout.curriculum_window): the loop
    reports each prompt's pass rate after scoring it (``observe``); a prompt whose mean pass rate
    over its last ``window`` visits is 0, 1, or outside [lo, hi] is passed over while drawing, so
    batches stay in the learnable band (ProRL, Liu et al. 2025, arXiv:2505.24864; verl's curriculum
    samplers). A pass-over forgets the prompt's oldest record, so at its next turn (the next epoch)
    it is drawn again and re-measured: it stays out only while its new scores keep it out, and a
    prompt the policy has since forgotten, or grown into, comes back. At most one epoch's worth of prompts is passed
    over per batch, so a stream whose every prompt is out of band still yields batches."""

    def __init__(self, rows: list[dict], batch_size: int, seed: int,
                 curriculum: tuple[int, float, float] | None = None):
        if not rows:
            raise ValueError("the training split is empty")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.epoch, self.pos = 0, 0
        self._order = self.permutation(0)
        self.curriculum = curriculum if curriculum and curriculum[0] > 0 else None
        self.history: dict[str, list[float]] = {}  # prompt -> its last `window` pass rates
        self.skipped = 0  # prompts passed over so far (the curriculum/skipped metric)

    def permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)  # one fixed order per epoch
        return order

    def next(self, n: int | None = None) -> list[dict]:
        """The next ``n`` prompts (default ``batch_size``)."""
        out, passed_over, want = [], 0, self.batch_size if n is None else n
        while len(out) < want:
            if self.pos == len(self.rows):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self.permutation(self.epoch)
            row = self.rows[self._order[self.pos]]
            self.pos += 1
            if passed_over < len(self.rows) and not self.learnable(row):
                passed_over += 1
                self.history[prompt_key(row)].pop(0)  # re-measured after `window` pass-overs
                continue
            out.append(row)
        self.skipped += passed_over
        return out

    def learnable(self, row: dict) -> bool:
        """False when the curriculum's record of this prompt is full and its mean lies outside the band."""
        if self.curriculum is None:
            return True
        window, lo, hi = self.curriculum
        seen = self.history.get(prompt_key(row), [])
        if len(seen) < window:
            return True
        p = sum(seen) / window
        return 0 < p < 1 and lo <= p <= hi

    def observe(self, rows: list[dict], pass_rates: list[float]) -> dict:
        """Record each prompt's pass rate of this step (one row per prompt); the curriculum's metrics."""
        if self.curriculum is None:
            return {}
        for row, p in zip(rows, pass_rates):
            seen = self.history.setdefault(prompt_key(row), [])
            seen.append(float(p))
            del seen[: -self.curriculum[0]]
        return {"curriculum/skipped": self.skipped, "curriculum/tracked_prompts": len(self.history)}

    def peek(self, ahead: int = 0) -> list[dict]:
        """The batch ``next()`` will return after ``ahead`` more calls, without moving the stream
        (an async rollout samples the coming steps' prompts early: distributed/pool.py)."""
        probe = self.fork()
        for _ in range(ahead):
            probe.next()
        return probe.next()

    def fork(self) -> PromptStream:
        """A copy at the same position that moves on its own (peek's probe; envs/mix.py)."""
        probe = PromptStream.__new__(PromptStream)
        probe.rows, probe.batch_size, probe.seed, probe.curriculum = (self.rows, self.batch_size, self.seed,
                                                                      self.curriculum)
        probe.load_state_dict(self.state_dict())
        return probe

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "history": self.history, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        count = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
        check(state, {"epoch": Where(count, "a whole number >= 0"),
                      "pos": Where(lambda v: count(v) and v <= len(self.rows),
                                   f"a position in the {len(self.rows)} rows"),
                      "history?": MapOf(ListOf(float)), "skipped?": Where(count, "a whole number >= 0")},
              "state.pt: stream")
        self.epoch, self.pos = state["epoch"], state["pos"]
        # copies: a peek's probe passes prompts over too (older checkpoints have no history)
        self.history, self.skipped = {k: list(v) for k, v in state.get("history", {}).items()}, state.get("skipped", 0)
        self._order = self.permutation(self.epoch)


def prompt_key(row: dict) -> str:
    """A prompt's identity across processes (rows are pickled to Ray workers): its messages as JSON."""
    return json.dumps(row.get("messages"), sort_keys=True)
