"""The errors that end a run with one line and exit status 2 (bad input), never a traceback.

Each message names what is wrong: the dotted config key, the ``file:line`` of a data row, the
model spec. They live at the bottom of the package so that every layer can raise them.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

LONG_WORD, LONG_MESSAGE = 160, 1000  # what a message shows of a value pasted into it (a 100 KB task.verifier)


def clip(text: str, limit: int = LONG_WORD) -> str:
    """``text``, or its start and end around '...[N characters]...' when longer than ``limit``."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-(limit // 4):]
    return f"{head}...[{len(text) - len(head) - len(tail)} characters]...{tail}"


def clip_message(message: str) -> str:
    """Every over-long word of an error message clipped, then the message itself: the key at its
    start and the hint at its end stay readable whatever value was echoed between them."""
    message = re.sub(rf"\S{{{LONG_WORD + 1},}}", lambda m: clip(m.group()), message)
    return clip(message, LONG_MESSAGE)


class _OneLine:
    """Errors whose message is shown to the user: long values in it are clipped (``clip_message``)."""

    def __init__(self, message="", *args):
        super().__init__(clip_message(str(message)), *args)


class ConfigError(_OneLine, ValueError):
    """A bad config value; str(error) is one line naming the key."""


class ConfigProblems(ConfigError):
    """Several bad config values found at once (config_check.py): str(error) is one line each,
    every line clipped as a one-line message is."""

    def __init__(self, problems: list[str]):
        self.problems = [clip_message(p) for p in problems]
        ValueError.__init__(self, "\n".join(self.problems))


class DataError(ConfigError):
    """A bad data file or row; str(error) names the file and line."""


class ModelLoadError(_OneLine, RuntimeError):
    """A model spec that cannot be loaded; the message says which spec and why."""


class RunError(_OneLine, RuntimeError):
    """A run stopped by a condition it cannot go on from: a full disk, a read-only folder,
    non-finite training, a reward function that keeps failing. One line naming the cause and the
    path or key; exit status 1. What was saved before it (checkpoints, metrics) is intact."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: the run stops with one line and exit status 128 + signum (130, 143).
    ``saved``: the step whose checkpoint was written on the way out (None: nothing was saved)."""

    def __init__(self, signum: int, message: str = "", saved: int | None = None):
        super().__init__(message)
        self.signum, self.message, self.saved = signum, message, saved


def write_cause(path: Path, e: BaseException) -> str:
    """One line saying why a write under ``path`` failed. torch.save reports a full disk as a
    RuntimeError ('unexpected pos'), and safetensors as its own error: the free space says it."""
    if isinstance(e, OSError) and e.errno:
        return f"{os.strerror(e.errno)} ({Path(e.filename or path)})"
    try:
        if shutil.disk_usage(path if path.exists() else path.parent).free < (1 << 20):
            return f"{os.strerror(errno.ENOSPC)} ({path})"
    except OSError:
        pass
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} ({path})"


def interrupt_in(e: BaseException | None) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (Ctrl-C, or a stop signal's ``Interrupted``) that ``e`` is, or was raised
    from or while handling. Libraries wrap one that lands inside them: transformers' lazy import as
    ModuleNotFoundError, torch.save's writer as RuntimeError ('unexpected pos'); the stop is what
    happened, so it is what the command reports (one line, 128 + signum)."""
    todo, seen = [e], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        todo += [e.__context__, e.__cause__]
    return None


# How the writers that are no Python file say that the disk refused a write: safetensors' Rust
# error carries the OS error, torch's zip writer only that its position went wrong.
_WRITER_FAILURES = ("unexpected pos", "PytorchStreamWriter failed", "I/O error")


def write_failure(path: Path, e: BaseException) -> str | None:
    """Why a write of ``path`` (a file, or a folder being written) failed, in a few words naming the
    file: for an OSError (a full disk, a quota, a read-only folder, an I/O error) or a writer's own
    error for one. None for anything else (a bug, an interrupt), which must propagate as it is."""
    if interrupt_in(e) is not None or isinstance(e, RunError) or not isinstance(e, Exception):
        return None
    text = str(e)
    code = e.errno if isinstance(e, OSError) else (int(m[1]) if (m := re.search(r"os error (\d+)", text)) else None)
    if code is None and not isinstance(e, OSError) and not any(w in text for w in _WRITER_FAILURES):
        return None
    if not code:
        return write_cause(Path(path), e)
    where = getattr(e, "filename", None)
    return os.strerror(code) + (f" ({where})" if where and Path(where) != Path(path) else "")


@contextmanager
def writing(path: str | Path):
    """Around every write of a run's files (checkpoints, the model folder, the report, samples,
    metrics, an export): a write the disk refuses ends with one line naming the file and the
    cause, ``RunError`` (exit 1), instead of a bare 'OSError: [Errno 28]' naming nothing."""
    try:
        yield
    except Exception as e:
        cause = write_failure(Path(path), e)
        if cause is None:
            raise
        raise RunError(f"cannot write {path}: {cause}") from None
