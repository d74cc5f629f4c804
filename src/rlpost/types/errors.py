"""The errors that end a run with one line and exit status 2 (bad input), never a traceback.

Each message names what is wrong: the dotted config key, the ``file:line`` of a data row, the
model spec. They live at the bottom of the package so that every layer can raise them.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


class ConfigError(ValueError):
    """A bad config value; str(error) is one line naming the key."""


class DataError(ConfigError):
    """A bad data file or row; str(error) names the file and line."""


class ModelLoadError(RuntimeError):
    """A model spec that cannot be loaded; the message says which spec and why."""


class RunError(RuntimeError):
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
