"""Where a run's checkpoints are, and what counts as one; no torch, so the CLI can look before
torch loads.

``RUN/checkpoints/`` holds ``step_NNNNNN/`` folders (model/checkpoint.py writes them), ``latest``
(the newest one's name) and, during a write, rlpost's own temporary names. Anything else there (a
``step_junk`` folder, a file named ``step_000003``, a user's notes) is not a checkpoint: it is
ignored, said once in a line, and never deleted by the rotation of old checkpoints.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlpost.console import say
from rlpost.types.schema import MapOf, Where, check

MANIFEST = "manifest.json"
FILES = ("model.safetensors", "trainer.pt", "state.pt")  # every checkpoint has these
EXTRA = ("metrics.jsonl",)  # and, since rlpost records the run's metrics in it, this (older ones lack it)
STEP = re.compile(r"step_(\d{6,})")
OWN = re.compile(r"(latest|\.latest\.tmp|\.(tmp|del)_step_\d{6,})")  # rlpost's own names beside the checkpoints

SHA256 = Where(lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None, "a SHA-256 hex digest")
MANIFEST_SCHEMA = {
    "step": Where(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a step number"),
    "files": MapOf({"bytes": Where(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                                   "a byte count"), "sha256": SHA256}),
}

_ignored: set[Path] = set()  # non-checkpoints already said, once per process


def step_of(ckpt: Path) -> int:
    return int(STEP.fullmatch(ckpt.name).group(1))


def candidates(run_dir: Path, quiet: bool = False) -> list[Path]:
    """Checkpoint folders, newest first (the ``latest`` pointer is a hint; the folders decide).
    What else is in checkpoints/ is passed over, with a line each the first time (unless ``quiet``)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if STEP.fullmatch(p.name) and p.is_dir():
            found.append(p)
        elif not OWN.fullmatch(p.name) and not quiet and p not in _ignored:
            _ignored.add(p)
            say(f"{p}: not a checkpoint ({'a folder' if p.is_dir() else 'a file'} that is not named step_NNNNNN/); "
                "ignored, and left as it is")
    return sorted(found, key=step_of, reverse=True)


def manifest_files(ckpt: Path, text: str) -> dict:
    """A manifest's {file: {bytes, sha256}}, checked against its schema (DataError naming the field)."""
    import json

    try:
        tree = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{MANIFEST} is not JSON ({e.msg})") from None
    check(tree, MANIFEST_SCHEMA, MANIFEST)
    files = tree["files"]
    unknown = [name for name in files if name not in FILES + EXTRA]
    missing = [name for name in FILES if name not in files]
    if unknown or missing:
        raise ValueError(f"{MANIFEST}: files: "
                         f"{'lists ' + repr(unknown[0]) if unknown else 'does not list ' + missing[0]}")
    if tree["step"] != step_of(ckpt):
        raise ValueError(f"{MANIFEST}: step: {tree['step']}, but the folder is {ckpt.name}")
    return files
