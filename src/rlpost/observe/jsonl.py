"""metrics.jsonl, written so that a crash or a full disk cannot leave it unreadable.

An append writes the whole line with one ``write`` on an ``O_APPEND`` descriptor, and if that
fails (no space, quota) the file is cut back to where it was: no half line stays behind. A file
torn anyway (the machine lost power mid-write) is still read: a last line that is not JSON is the
torn write of a step that never finished, and is dropped, which is also what a resume does.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from rlpost.types.errors import DataError, RunError, write_cause
from rlpost.types.schema import Where, check


def read_lines(path: str | Path, schema: dict | None = None) -> list[dict]:
    """Every line as a dict fitting ``schema`` (default: a metrics line, with its step); a torn last
    line is left out, a bad line elsewhere is a DataError naming the file, the line and the field."""
    schema = LINE if schema is None else schema
    path = Path(path)
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n") if path.exists() else []
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if all(not rest.strip() for rest in lines[i:]):  # the last line: a write cut short
                break
            raise DataError(f"{path}:{i}: not valid JSON; the file was edited or damaged") from None
        out.append(check(row, schema, f"{path}:{i}"))
    return out


LINE = {"step": Where(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a step number >= 1")}
SAMPLE = {"completion": str, "reward": (float, type(None))}  # samples/step_N.jsonl (observe/runlog.py)


def rewrite(path: Path, rows: list[dict]) -> None:
    """Replace the file's contents atomically (resume: drop the steps after the checkpoint)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RunError(f"cannot rewrite {path}: {write_cause(path, e)}") from None


def append(path: Path, row: dict) -> None:
    """Add one line, whole or not at all."""
    data = (json.dumps(row) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunError(f"cannot write {path}: {write_cause(path, e)}") from None
    try:
        size = os.fstat(fd).st_size
        written = os.write(fd, data)
        if written != len(data):
            # a short write: the disk filled up under it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    except OSError as e:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass
        raise RunError(f"cannot append to {path}: {write_cause(path, e)}; the steps before are intact") from None
    finally:
        os.close(fd)
