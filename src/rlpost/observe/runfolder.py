"""The life of a run folder: claimed by one command at a time, never overwritten, never left as a
husk.

Every command that writes a run folder (train, train --resume, sft, rm, dpo, pipeline) holds it
through ``claim``:

- an exclusive ``fcntl.flock`` on ``RUN_DIR/.lock`` for as long as the command runs, so a second
  run on the same folder (two starts with one ``run.name``, a resume while it still trains) is
  refused in one line naming the holder's pid. The kernel drops the lock when its holder dies,
  however it dies: a SIGKILLed run never leaves a stale lock behind.
- a new run refuses a folder that already holds a run (checkpoints, metrics, a summary, a model);
  it may use a folder with nothing of value in it, which is what a start killed by SIGKILL leaves.
  The check is made again once the lock is held, so of two starts racing for one name exactly one
  runs.
- a start that fails (bad input, a missing model, Ctrl-C) before the run produced anything removes
  what it wrote: the folder it created, or, for a resume, the ``config.resume-N.yaml`` it added.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rlpost import config
from rlpost.types.errors import ConfigError

LOCK = ".lock"


def has_run_data(run_dir: Path) -> bool:
    """Whether the folder holds anything a run produced (what must never be overwritten)."""
    metrics = run_dir / "metrics.jsonl"
    return (any((run_dir / "checkpoints").glob("step_*")) or (run_dir / "summary.json").exists()
            or (run_dir / "model").exists() or (metrics.exists() and metrics.stat().st_size > 0)
            or (run_dir / "pipeline.json").exists())


def progress(run_dir: Path) -> tuple:
    """What a resume adds to: its newest checkpoint, its summary."""
    steps = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    return steps[-1:], (run_dir / "summary.json").exists()


class RunFolder:
    """A claimed run folder (``claim``); ``write_config`` records the configs it writes."""

    def __init__(self, path: Path, mode: str):
        self.path, self.mode = path, mode
        self.created = False  # this command made the folder (a failed start removes it)
        self.written: list[Path] = []  # configs this command wrote (a failed resume removes them)
        self.fd: int | None = None

    def write_config(self, cfg: config.Config) -> Path:
        """config.yaml for a new run; for a resume, config.resume-N.yaml when the config changed
        (config.yaml itself is never rewritten, so the history of changes stays)."""
        path = self.path / "config.yaml" if self.mode != "resume" else config.next_resume_config_path(self.path)
        try:
            config.save(cfg, path)
        except OSError as e:
            raise ConfigError(f"{self.path}: cannot write {path.name} ({e.strerror})") from None
        self.written.append(path)
        return path


def _make(path: Path, key: str) -> bool:
    """Create the folder (and its parents); True if this call created it."""
    if path.is_dir():
        return False
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{key}: {parent} is a file, expected a folder")
    try:
        path.mkdir(parents=True)
        return True
    except FileExistsError:  # made by a run racing this one: the lock decides between us
        return False
    except OSError as e:
        raise ConfigError(f"{key}: cannot create {path} ({e.strerror})") from None


def _lock(path: Path) -> int:
    try:
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(f"{path}: cannot lock the run folder ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConfigError(f"{path}: another rlpost command (pid {holder}) is using this run folder; "
                          "wait for it to finish, or pick another run.name") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@contextmanager
def claim(path: str | Path, mode: str, refuse_hint: str = "pick another run.name") -> Iterator[RunFolder]:
    """Hold ``path`` for the command's life. ``mode``: 'new' (a new run: refuses a folder holding
    a run, with ``refuse_hint``), 'resume' (an existing run folder), 'reuse' (create if needed,
    continue what is there: a pipeline's folder)."""
    rf = RunFolder(Path(path), mode)
    if mode == "resume":
        if not (rf.path / "config.yaml").is_file():
            raise ConfigError(f"--resume {rf.path}: no config.yaml there; is it a run folder?")
    else:
        rf.created = _make(rf.path, "run.out_dir")
    try:
        rf.fd = _lock(rf.path)
        if mode == "new" and has_run_data(rf.path):
            raise ConfigError(f"run.name: {rf.path} already holds a run; {refuse_hint}")
    except BaseException:
        _release(rf)
        if rf.created and not _other_files(rf.path):
            shutil.rmtree(rf.path, ignore_errors=True)
        raise
    before = progress(rf.path)
    try:
        yield rf
    except BaseException:
        _undo_failed_start(rf, before)
        raise
    finally:
        _release(rf)


def _undo_failed_start(rf: RunFolder, before: tuple) -> None:
    """After a failure: remove what this command wrote if the run got nowhere (no step's
    metrics, no checkpoint, no summary); a run that did get somewhere keeps everything."""
    if rf.mode == "resume":
        if progress(rf.path) == before:
            for path in rf.written:
                path.unlink(missing_ok=True)
        return
    if not has_run_data(rf.path) and not _other_files(rf.path):
        shutil.rmtree(rf.path, ignore_errors=True)


# What a start writes before its first step; anything else in a folder (a user's file, a pipeline's
# stage folders, the tracebacks of a reward function that failed in verifier.log) keeps it.
STARTUP_FILES = {LOCK, "config.yaml", "samples", "verifier.log", "metrics.jsonl", "checkpoints", "tensorboard",
                 "wandb", "mlruns"}


def _other_files(path: Path) -> list[str]:
    if not path.is_dir():
        return []
    log = path / "verifier.log"
    return [p.name for p in path.iterdir() if p.name not in STARTUP_FILES or (p == log and log.stat().st_size)]


def _release(rf: RunFolder) -> None:
    if rf.fd is not None:
        os.close(rf.fd)  # closing the descriptor drops the flock
        rf.fd = None

