"""Who may write where: the one rule every command that writes follows.

A command that writes a folder (train, train --resume, sft/rsft/rm/dpo, pipeline, export,
``rlpost.Trainer``) writes only into

- a folder that does not exist yet (it creates it) or an empty one, or
- a folder it owns: one holding rlpost's marker file ``.rlpost`` of the same kind (``run``,
  ``pipeline``, ``export``). Run folders of an older rlpost, which hold a ``.lock``, count as owned.

A folder holding only ``.lock`` counts as empty, and one whose ``.lock`` another process holds is
refused as in use (naming its pid), whatever else is in it: a run claiming a folder creates and locks
``.lock`` before it writes its marker, so a second start racing it for the same name sees one of
those two states, never a folder of another kind (observe/runfolder.py lets the lock decide).

A command that writes one file (``rlpost eval --out``, ``rlpost report --out``) writes a new file,
or replaces one that the same command wrote (an eval's per-sample JSONL, an rlpost report).

Anything else (a folder holding a user's files, another kind of rlpost folder, a FIFO where a file
goes) is refused with one line naming the path and what is there (``ConfigError``, exit 2), before
anything is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path

from rlpost.types.errors import ConfigError, clip, writing

MARKER = ".rlpost"
LEGACY_LOCK = ".lock"  # every run folder an older rlpost claimed holds one


def kind_of(folder: Path) -> str | None:
    """The kind of rlpost folder this is ('run', 'pipeline', 'export'), None when it is not rlpost's."""
    marker = folder / MARKER
    if marker.is_file():
        try:
            kind = json.loads(marker.read_text()).get("kind")
        except (OSError, ValueError, AttributeError):
            kind = None
        return kind if isinstance(kind, str) else "damaged"
    if (folder / LEGACY_LOCK).is_file():
        return "run" if (folder / "config.yaml").exists() else "pipeline"
    return None


def held_by(folder: Path) -> str | None:
    """The pid in ``folder``'s ``.lock`` when another process holds that lock now (``?`` before it wrote
    its pid there); None when no one does, or this process does."""
    try:
        fd = os.open(folder / LEGACY_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            return None if pid == str(os.getpid()) else pid
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def marker_files(folder: Path) -> list[str]:
    """What an export marker lists as written by rlpost export."""
    try:
        files = json.loads((folder / MARKER).read_text()).get("files", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [f for f in files if isinstance(f, str)] if isinstance(files, list) else []


def mark(folder: Path, kind: str, **info) -> None:
    """Write the marker that makes ``folder`` this kind's (a no-op when it is already there)."""
    if kind_of(folder) != kind or info:
        with writing(folder / MARKER):
            (folder / MARKER).write_text(json.dumps({"kind": kind, **info}) + "\n")


def listing(names: list[str], most: int = 3) -> str:
    shown = ", ".join(sorted(names)[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def check_folder(folder: Path, kind: str, key: str, parent_key: str = "") -> bool:
    """Refuse (ConfigError naming ``key``, or ``parent_key`` for a parent that is a file) a folder
    this kind may not write; True when it exists."""
    for part in folder.parts:
        if len(os.fsencode(part)) > 255:
            raise ConfigError(f"{key}: a folder name of {len(os.fsencode(part))} bytes ({clip(part, 40)}); a name "
                              "holds at most 255")
    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.is_dir():
            what = "is a file" if parent.is_file() else "is not a folder"
            raise ConfigError(f"{parent_key if parent != folder and parent_key else key}: {parent} {what}, expected a "
                              "folder")
    if not folder.exists():
        return False
    entries = os.listdir(folder)
    if not entries:
        return True
    holder = held_by(folder)
    if holder is not None:
        raise ConfigError(f"{key}: {folder}: another rlpost command (pid {holder}) is using this folder; wait "
                          "for it to finish, or pick another")
    if entries == [LEGACY_LOCK]:  # all a start killed between creating its lock and its marker left
        return True
    owner = kind_of(folder)
    if owner is None:
        raise ConfigError(f"{key}: {folder} holds files rlpost did not write ({listing(entries)}); "
                          "pick a new or empty folder")
    if owner != kind:
        what = "a damaged rlpost marker (.rlpost)" if owner == "damaged" else f"an rlpost {owner} folder"
        raise ConfigError(f"{key}: {folder} is {what}, not a{'n' if kind[0] in 'aeiou' else ''} {kind} folder; "
                          "pick a new or empty folder")
    if kind == "export":  # an export owns only the files it wrote: a user's README added beside them stays
        foreign = [e for e in entries if e not in {MARKER, *marker_files(folder)}]
        if foreign:
            raise ConfigError(f"{key}: {folder} holds files rlpost export did not write ({listing(foreign)}); "
                              "pick a new or empty folder")
    return True


def run_path(out_dir: str, name: str) -> Path:
    """RUN = run.out_dir / run.name, where the name stays under out_dir (no '..', not absolute)."""
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ConfigError(f"run.name: {clip(repr(name), 80)} leaves run.out_dir; expected a folder name under it")
    return Path(out_dir) / name


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or anything under it (symbolic links resolved)."""
    p, f = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return p == f or f in p.parents


def _eval_records(head: bytes) -> bool:
    """An eval's per-sample JSONL: its first line a record with a prompt and a completion."""
    try:
        first = json.loads(head.split(b"\n", 1)[0])
    except ValueError:
        return False
    return isinstance(first, dict) and {"prompt", "completion"} <= set(first)


# What rlpost eval and rlpost report write, told by their first bytes (an empty file holds nothing to lose).
FILE_KINDS = {
    "eval": _eval_records,
    "report": lambda head: head.startswith(b"<!doctype html><html><head><meta charset='utf-8'><title>rlpost report"),
}


def check_file(path: Path, kind: str, key: str) -> bool:
    """Refuse (ConfigError naming ``key``) a file this command may not write; True when it exists
    (one this command wrote, which it may replace)."""
    if path.is_symlink() or path.exists():
        mode = os.stat(path).st_mode if path.exists() else 0
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise ConfigError(f"{key}: {path} is {what}; expected a file to write")
        with open(path, "rb") as f:
            head = f.read(1 << 16)
        if head and not FILE_KINDS[kind](head):
            raise ConfigError(f"{key}: {path} exists and is not a file rlpost {kind} wrote; pick another path")
        return True
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{key}: {parent} is not a folder")
            break
    return False


def regular_file(path: str | Path, key: str) -> None:
    """A data path must be a regular file (or a folder saved by `datasets`): a FIFO or a device
    would hang or never end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{key}: file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path} ({e.strerror})") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise ConfigError(f"{key}: {path} is {kind}; expected a data file (.jsonl, .parquet) or a `datasets` folder")
