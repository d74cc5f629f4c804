"""One line to the user, on stderr: ``rlpost: <message>``. Every layer prints through here, so
that stdout stays free for machine-readable output (``rlpost eval`` prints JSON there)."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    print(f"rlpost: {message}", file=sys.stderr, flush=True)
