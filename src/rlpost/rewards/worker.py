"""The verifier worker process: reads requests on stdin, writes results on stdout.

Kept free of torch and of the rest of rlpost so that starting (or restarting) a worker takes
tens of milliseconds. Frames are a 4-byte little-endian length followed by a pickle.
"""

from __future__ import annotations

import inspect
import math
import pickle
import struct
import sys

from rlpost.envs import import_function

# --- framing: 4-byte length + pickle, over the worker's stdin/stdout -------------------------


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _recv(stream):
    head = stream.read(4)
    if len(head) < 4:
        raise EOFError
    (n,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(n))


def is_trl_style(fn) -> bool:
    """TRL reward functions take lists: fn(prompts, completions, **columns) -> list[float | None]."""
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def call(fn, completion: str, row: dict) -> tuple[float, dict]:
    """Score one completion with a verifier-style or a TRL-style function.

    TRL-style functions get what TRL's GRPOTrainer passes, for a batch of one: ``prompts`` and
    ``completions`` (chat messages when the dataset prompt was a list of messages, else strings)
    and every other dataset column as a keyword list. None (TRL: 'not applicable to this row')
    becomes NaN, which the reward stack leaves out of the weighted sum, as TRL's nansum does."""
    if not is_trl_style(fn):
        out = fn(completion, row)
        reward, info = out if isinstance(out, tuple) else (out, {})
        return float(reward), dict(info)
    prompt = row.get("prompt", row.get("messages"))
    conversational = isinstance(prompt, list)
    comp = [{"role": "assistant", "content": completion}] if conversational else completion
    columns = {k: [v] for k, v in row.items() if k not in ("prompt", "messages", "_line")}
    value = fn(prompts=[prompt], completions=[comp], **columns)[0]
    return (math.nan if value is None else float(value)), {}


def serve() -> None:
    """Worker loop: read (fn_path, completion, row), write ('ok', reward, info) or ('error', msg)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a verifier that prints must not corrupt the result stream
    cache = {}
    while True:
        try:
            path, completion, row = _recv(stdin)
        except EOFError:
            return
        try:
            fn = cache.get(path) or cache.setdefault(path, import_function(path))
            reply = ("ok", *call(fn, completion, row))
        except BaseException as e:  # noqa: BLE001 - any failure of user code is a scored 0
            reply = ("error", f"{type(e).__name__}: {e}")
        _send(stdout, reply)


