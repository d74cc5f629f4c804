"""The life of a run folder: claimed by one command at a time, never overwritten, never left as a
husk.

Every command that writes a run folder (train, train --resume, sft, rsft, rm, dpo, pipeline,
``rlpost.Trainer``) holds it through ``claim``:

- the folder must be new, empty, or rlpost's own of that kind (types/folders.py: the marker file
  ``.rlpost``); a folder holding a user's files, or an export, is refused in one line.
- an exclusive ``fcntl.flock`` on ``RUN_DIR/.lock`` for as long as the command runs, so a second
  run on the same folder (two starts with one ``run.name``, a resume while it still trains) is
  refused in one line naming the holder's pid. The kernel drops the lock when its holder dies,
  however it dies: a SIGKILLed run never leaves a stale lock behind.
- a new run refuses a folder that already holds a run (checkpoints, metrics, a summary, a model);
  it may use its own folder with nothing of value in it, which is what a start killed by SIGKILL
  leaves. The check is made again once the lock is held, so of two starts racing for one name
  exactly one runs.
- every path a run writes that is already there must be of the kind the run writes (a file where
  it writes a file, a folder where it writes one): a ``checkpoints/.latest.tmp`` folder is refused
  before anything is written, not found at the first checkpoint.
- a start that fails (bad input, a missing model, Ctrl-C, its first rollout or held-out evaluation)
  before the run produced anything removes exactly what it added: the folder it created, or the
  entries that were not there before (the marker, config.yaml, data/, samples/, pickled functions;
  for a resume, its ``config.resume-N.yaml``). One exception, kept on purpose: the log its error
  line names (``verifier.log`` for a reward function or verifier, ``env.log`` for an environment)
  stays, with the marker, when it holds that code's output, so the traceback can be read.
- a new start in a folder such a start left (a failed one's log, or whatever a start killed by
  SIGKILL wrote) first removes those leftovers, said in one line: no stale config, rows, pickled
  functions or log of the earlier start mixes with this one's. Only names a run writes go; a
  folder left holding nothing else is this start's to remove if it fails too.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rlpost import config
from rlpost.console import say
from rlpost.model.layout import candidates
from rlpost.types import folders
from rlpost.types.errors import ConfigError

LOCK = folders.LEGACY_LOCK
ROUNDS = "rounds.json"  # where a run in rounds (rsft, online DPO) stands: recipes/round_state.py


class HeldElsewhere(ConfigError):
    """The run folder's lock is held by another command (one line, as every ConfigError)."""


def has_run_data(run_dir: Path) -> bool:
    """Whether the folder holds anything a run produced (what must never be overwritten)."""
    metrics = run_dir / "metrics.jsonl"
    return (bool(candidates(run_dir, quiet=True)) or (run_dir / "summary.json").exists()
            or (run_dir / "model").exists() or (metrics.is_file() and metrics.stat().st_size > 0)
            or (run_dir / "pipeline.json").exists() or (run_dir / ROUNDS).exists())


def progress(run_dir: Path) -> tuple:
    """What a resume adds to: its newest checkpoint, its summary, a run in rounds' record of where it stands."""
    rounds = run_dir / ROUNDS
    return ([p.name for p in candidates(run_dir, quiet=True)][:1], (run_dir / "summary.json").exists(),
            rounds.read_bytes() if rounds.is_file() else None)


# The paths a run writes, and what each must be if it is already there (checked before any write).
WRITES = {
    "config.yaml": "file", "metrics.jsonl": "file", ".metrics.jsonl.tmp": "file", "summary.json": "file",
    ".summary.json.tmp": "file", "report.html": "file", ".report.html.tmp": "file", "verifier.log": "file",
    "samples": "folder", "model": "folder", "checkpoints": "folder", "checkpoints/latest": "file",
    "checkpoints/.latest.tmp": "file", "data": "folder", "pipeline.json": "file", "env.log": "file",
    "agent.log": "file", ROUNDS: "file", f".{ROUNDS}.tmp": "file",
}
# The logs a failed start keeps when they hold its code's output: its error line names them (recipes/guard.py)
LOGS = ("verifier.log", "env.log", "agent.log")
# What else a start writes at the top of its folder: rlpost.Trainer's pickled functions and their loader
# modules (recipes/api.py: Registry), the loggers' folders (observe/loggers.py)
FUNCS_PREFIX = "rlpost_funcs_"
LOGGER_FOLDERS = ("tensorboard", "mlruns", "wandb")


def leftover(name: str) -> bool:
    """Whether a top-level entry of a run folder is one a start writes (what a start that got nowhere left)."""
    return (name in {rel.partition("/")[0] for rel in WRITES} or name in LOGGER_FOLDERS
            or name.startswith(FUNCS_PREFIX) or (name.startswith("config.resume-") and name.endswith(".yaml"))
            or re.fullmatch(r"round_\d+", name) is not None)  # a run in rounds' round folders


def check_writes(run_dir: Path) -> None:
    """ConfigError naming the first path a run writes that is there as something else."""
    for rel, kind in WRITES.items():
        path = run_dir / rel
        if path.is_symlink() and not path.exists():
            raise ConfigError(f"{path}: a broken symbolic link where the run writes a {kind}; remove it")
        if path.exists() and (path.is_dir() if kind == "file" else not path.is_dir()):
            other = "a folder" if path.is_dir() else "a file" if path.is_file() else "not a regular file"
            raise ConfigError(f"{path}: {other} where the run writes a {kind}; move it away")


class RunFolder:
    """A claimed run folder (``claim``); ``write_config`` records the configs it writes."""

    def __init__(self, path: Path, mode: str, kind: str):
        self.path, self.mode, self.kind = path, mode, kind
        self.created = False  # this command made the folder (a failed start removes it)
        self.before: set[str] = set()  # the entries that were there (a failed start keeps exactly them)
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


def _make(path: Path, key: str, kind: str) -> bool:
    """Create the folder (and its parents); True if this call created it."""
    if folders.check_folder(path, kind, key, OUT_DIR.get(key, "")):
        return False
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
        raise HeldElsewhere(f"{path}: another rlpost command (pid {holder}) is using this run folder; "
                          "wait for it to finish, or pick another run.name") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


OUT_DIR = {"run.name": "run.out_dir"}  # the key naming a run folder's parent


def check_new(path: Path, refuse_hint: str, key: str, kind: str = "run") -> None:
    """What ``claim(path, 'new')`` refuses, checked without writing (before a start spends time)."""
    if folders.check_folder(path, kind, key, OUT_DIR.get(key, "")) and has_run_data(path):
        raise ConfigError(f"{key}: {path} already holds a run; {refuse_hint}")


def made_by(path: Path) -> str | None:
    """The command that made a run folder where it was not `rlpost train`: its marker's ``command`` (sft, rsft, dpo,
    rm; cmd_offline and a pipeline's stages write it), else a finished run's summary ``kind`` (which only those
    write). None for an RL run."""
    for name, key in ((folders.MARKER, "command"), ("summary.json", "kind")):
        try:
            found = json.loads((path / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(found, str) and found:
            return found
    return None


def check_resume(path: Path, command: str = "train") -> None:
    """That ``path`` is a run folder `rlpost COMMAND --resume` may go on with: one that command made
    (train: an RL run; sft, rsft, dpo, rm: their own runs, by the folder's marker)."""
    if not path.is_dir():
        raise ConfigError(f"--resume {path}: {'no such folder' if not path.exists() else 'not a folder'}")
    owner = folders.kind_of(path)
    if owner not in (None, "run"):  # None: a run of an rlpost older than the marker and the lock
        raise ConfigError(f"--resume {path}: an rlpost {owner} folder, not a run folder")
    if not (path / "config.yaml").is_file():
        if path.parent.name == "checkpoints":  # a checkpoint's folder: the run is two up
            raise ConfigError(f"--resume {path}: a checkpoint, not a run folder; resume its run, {path.parent.parent} "
                              "(it goes on from its newest intact checkpoint)")
        raise ConfigError(f"--resume {path}: no config.yaml there; is it a run folder?")
    made = made_by(path) or "train"  # --start-over would write an RL run over an sft run's model, and so on
    if made != command:
        raise ConfigError(f"--resume {path}: an rlpost {made} run, and rlpost {command} --resume continues "
                          f"{'RL' if command == 'train' else command} runs only (rlpost {made} --resume {path} "
                          "continues it)")


@contextmanager
def claim(path: str | Path, mode: str, refuse_hint: str = "pick another run.name", *, kind: str = "run",
          key: str = "run.name", command: str = "train") -> Iterator[RunFolder]:
    """Hold ``path`` for the command's life. ``mode``: 'new' (a new run: refuses a folder holding
    a run, with ``refuse_hint``), 'resume' (an existing run folder), 'reuse' (create if needed,
    continue what is there: a pipeline's folder and its stages). ``kind``: the marker's kind
    ('run', 'pipeline'); ``key``: what the user set that named the folder (error messages); ``command``:
    the command resuming it (check_resume)."""
    rf = RunFolder(Path(path), mode, kind)
    if mode == "resume":
        check_resume(rf.path, command)
    else:
        rf.created = _make(rf.path, key, kind)
    rf.before = set() if rf.created else set(os.listdir(rf.path))
    try:
        rf.fd = _lock(rf.path)
    # Held by another command: what appeared in the folder since the listing above (or the folder itself, when
    # this call made it just before the holder looked) is that command's work, so nothing is removed.
    except HeldElsewhere:
        raise
    except BaseException:
        _remove_new(rf)
        raise
    try:
        if mode == "new" and has_run_data(rf.path):
            raise ConfigError(f"{key}: {rf.path} already holds a run; {refuse_hint}")
        check_writes(rf.path)
        if mode == "new":
            _clear_leftovers(rf)
        if mode != "resume":
            folders.mark(rf.path, kind)
    except BaseException:
        _release(rf)
        _remove_new(rf)
        raise
    before = progress(rf.path)
    try:
        yield rf
    except BaseException:
        _undo_failed_start(rf, before)
        raise
    finally:
        _release(rf)


def _clear_leftovers(rf: RunFolder) -> None:
    """A new run in its own folder holding no run (checked under the lock): remove what an earlier start
    left there. A folder then holding nothing but rlpost's marker and lock is treated as made by this
    start, so that a failure removes it whole."""
    stale = sorted(n for n in rf.before if leftover(n))
    if not stale:
        return
    say(f"run folder {rf.path}: removing what an earlier start that got nowhere left there ({folders.listing(stale)})")
    remove_entries(rf.path, stale)
    rf.before -= set(stale)
    rf.created = folders.MARKER in rf.before and rf.before <= {folders.MARKER, LOCK}


def _undo_failed_start(rf: RunFolder, before: tuple) -> None:
    """After a failure: remove what this command added if the run got nowhere (no step's metrics,
    no checkpoint, no summary), but a log holding the failing code's output (LOGS) and the marker that
    makes the folder rlpost's; a run that did get somewhere keeps everything."""
    if rf.mode == "resume":
        if progress(rf.path) == before:
            for path in rf.written:
                path.unlink(missing_ok=True)
        return
    if has_run_data(rf.path) or (rf.kind == "pipeline" and any(  # a pipeline's work is in its stages' folders
            has_run_data(stage) for stage in rf.path.iterdir() if stage.is_dir() and not stage.is_symlink())):
        return
    logs = {name for name in LOGS if name not in rf.before and (rf.path / name).is_file()
            and (rf.path / name).stat().st_size > 0}
    _remove_new(rf, logs | {folders.MARKER} if logs else set())


def _remove_new(rf: RunFolder, keep: set[str] = frozenset()) -> None:
    """Remove every entry this command added (the whole folder when it made it and keeps nothing)."""
    if not rf.path.is_dir():
        return
    if rf.created and not keep:
        shutil.rmtree(rf.path, ignore_errors=True)
        return
    remove_entries(rf.path, set(os.listdir(rf.path)) - (set() if rf.created else rf.before) - keep)


def remove_entries(folder: Path, names) -> None:
    """Remove each named entry of ``folder``: a folder with what is in it, a file, or a link (not what it
    points to)."""
    for name in names:
        entry = folder / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _release(rf: RunFolder) -> None:
    if rf.fd is not None:
        os.close(rf.fd)  # closing the descriptor drops the flock
        rf.fd = None
