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

from rlpost.types.errors import DataError


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a .jsonl / .parquet file or a `datasets` folder saved to disk; a file that is not
    what it claims (not UTF-8, a damaged parquet, a folder that is no dataset) is one DataError."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"data: file not found: {path}")
    if path.is_dir() or path.suffix == ".parquet":
        return _read_dataset(path)
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror})") from None
    rows = []
    for i, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{i}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{i}: expected a JSON object per line")
        row["_line"] = i
        rows.append(row)
    return rows


def _read_dataset(path: Path) -> list[dict]:
    import datasets

    try:
        if path.is_dir():
            return [dict(r) for r in datasets.load_from_disk(str(path))]
        return [dict(r) for r in datasets.Dataset.from_parquet(str(path))]
    except Exception as e:  # noqa: BLE001 - arrow and datasets raise many types for a bad file
        what = "a folder, but not one saved by `datasets` (save_to_disk)" if path.is_dir() else "not a readable parquet file"
        first = str(e).splitlines()[0][:200] if str(e) else ""
        raise DataError(f"{path}: {what} ({type(e).__name__}: {first})") from None


def where(row: dict, source: str) -> str:
    return f"{source}:{row['_line']}" if "_line" in row else f"{source} row"


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


def prompt_messages(row: dict, source: str) -> list[dict]:
    p = row.get("prompt")
    if isinstance(p, str):
        return [{"role": "user", "content": p}]
    if isinstance(p, list) and p and all(isinstance(m, dict) and "role" in m and "content" in m for m in p):
        return p
    raise DataError(f"{where(row, source)}: 'prompt' must be a string or a list of chat messages")


def sft_pair(row: dict, source: str) -> tuple[list[dict], str]:
    """(prompt messages, completion text) of an SFT row."""
    if "messages" in row:
        msgs = row["messages"]
        if not (isinstance(msgs, list) and msgs and msgs[-1].get("role") == "assistant"):
            raise DataError(f"{where(row, source)}: 'messages' must end with an assistant message")
        return msgs[:-1], str(msgs[-1]["content"])
    if not isinstance(row.get("completion"), str):
        raise DataError(f"{where(row, source)}: expected 'completion' (a string) or 'messages'")
    return prompt_messages(row, source), row["completion"]


def preference_triple(row: dict, source: str) -> tuple[list[dict], str, str]:
    for key in ("chosen", "rejected"):
        if not isinstance(row.get(key), str):
            raise DataError(f"{where(row, source)}: expected '{key}' (a string)")
    return prompt_messages(row, source), row["chosen"], row["rejected"]


class PromptStream:
    def __init__(self, rows: list[dict], batch_size: int, seed: int):
        if not rows:
            raise ValueError("the training split is empty")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.epoch, self.pos = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)  # one fixed order per epoch
        return order

    def next(self) -> list[dict]:
        out = []
        while len(out) < self.batch_size:
            if self.pos == len(self.rows):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.rows[self._order[self.pos]])
            self.pos += 1
        return out

    def peek(self, ahead: int = 0) -> list[dict]:
        """The batch ``next()`` will return after ``ahead`` more calls, without moving the stream
        (an async rollout samples the coming steps' prompts early: distributed/pool.py)."""
        probe = PromptStream.__new__(PromptStream)
        probe.rows, probe.batch_size, probe.seed = self.rows, self.batch_size, self.seed
        probe.load_state_dict(self.state_dict())
        for _ in range(ahead):
            probe.next()
        return probe.next()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation(self.epoch)
