"""Removing what a sandboxed program left on the host, without letting it steer the removal.

Only the rlimits backend leaves a host directory (bubblewrap's working directory is a tmpfs that
dies with the run). Everything in it was made by the program, so every name, link, mode and
depth in it is hostile:

* **Never follows a symlink, never climbs.** Each directory is opened relative to its parent's
  descriptor with ``O_DIRECTORY | O_NOFOLLOW`` and listed with ``os.scandir(fd)``; entries are
  removed with ``unlink``/``rmdir`` relative to that descriptor. Nothing goes through ``..`` and
  no path is resolved from the top again, so a directory moved or swapped for a link while the
  removal runs can only make it fail, never make it act outside the tree.
* **Bounded descriptors, linear work.** Each directory is listed once. Descendants deeper than
  MAX_OPEN are cut off: renamed (an O(1) rename inside the tree) to the top under a name the
  program cannot guess, and removed from there, so a million-deep chain holds MAX_OPEN
  descriptors at most. (The removal it replaces listed a directory again after each
  subdirectory: ~20k empty directories took 25-36 s.)
* **Bounded time.** A deadline; past it the removal stops and says so (the slot's registry keeps
  the directory, and the next run on the slot goes on from there).
* **With the program's own rights.** As root, the removal runs in a child process with the
  sandbox's uid (``remove_tree_as``): whatever the tree makes it do, it can do no more than the
  program could. Only the empty top directory is then removed as root, in a parent directory
  that no other uid can write.

A directory made unreadable or unwritable (``chmod 000``) is opened through an ``O_PATH``
descriptor and made 0700 through that descriptor, which names the directory itself, never a
link. This file imports only the standard library: ``remove_tree_as`` runs it with the system
interpreter in isolated mode (``-I -S``), as a script.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import subprocess
import sys
import time

MAX_OPEN = 64  # directories open at once; deeper ones are cut off and moved to the top
CHECK_EVERY = 16  # entries between two looks at the clock
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Overdue(TimeoutError):
    """The removal ran past its deadline; what is left is still there."""


def _open_dir(name: str, dir_fd: int | None) -> int:
    """The directory `name` (relative to dir_fd) opened for listing, never through a link, with
    owner rwx so that its entries can be removed."""
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except PermissionError:  # chmod 000: reach it through an O_PATH descriptor, which needs no permission
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)  # the magic link names this very directory
            fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        finally:
            os.close(path_fd)
    if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
        os.fchmod(fd, 0o700)  # the directory opened, not a name: writable and searchable by its owner
    return fd


class _Clock:
    def __init__(self, deadline: float | None):
        self.deadline, self.count = deadline, 0

    def tick(self) -> None:
        self.count += 1
        if self.deadline is not None and self.count % CHECK_EVERY == 0 and time.monotonic() > self.deadline:
            raise Overdue(f"removal past its deadline after {self.count} entries")


def _clear(fd: int, clock: _Clock) -> list[str]:
    """Unlink every non-directory in the open directory fd and rmdir its empty directories (one
    call each: most of a directory bomb); return the names of the directories left to open."""
    subdirs = []
    with os.scandir(fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        clock.tick()
        try:
            if is_dir:
                os.rmdir(name, dir_fd=fd)  # rmdir never follows a link; it fails on one, and on a full directory
            else:
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR):
                subdirs.append(name)
            elif e.errno == errno.ENOTDIR:  # swapped for a file or a link since it was listed
                os.unlink(name, dir_fd=fd)
            else:
                raise
    return subdirs


def empty_tree(top_fd: int, deadline: float | None = None) -> int:
    """Remove everything inside the open directory top_fd (which stays, and stays open); returns
    how many entries were listed. Raises Overdue past the deadline, OSError on what it cannot do."""
    clock, token = _Clock(deadline), secrets.token_hex(8)
    cut = 0
    stack = [(top_fd, "", _clear(top_fd, clock))]  # (directory fd, its name in its parent, subdirs left)
    try:
        while stack:
            fd, name, pending = stack[-1]
            if pending:
                sub = pending.pop()
                clock.tick()
                try:
                    child = _open_dir(sub, fd)  # also makes it 0700: a directory is renamed only if writable
                except FileNotFoundError:
                    continue
                except OSError as e:
                    if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    os.unlink(sub, dir_fd=fd)  # swapped for a file or a link since it was listed: never followed
                    continue
                if len(stack) >= MAX_OPEN:  # cut the chain: move the subtree to the top, O(1)
                    os.close(child)
                    moved = f".rlpost-cut-{token}-{cut}"
                    cut += 1
                    os.rename(sub, moved, src_dir_fd=fd, dst_dir_fd=top_fd)
                    stack[0][2].append(moved)
                    continue
                stack.append((child, sub, []))
                stack[-1][2].extend(_clear(child, clock))
                continue
            stack.pop()
            if stack:
                os.close(fd)
                try:
                    os.rmdir(name, dir_fd=stack[-1][0])
                except FileNotFoundError:  # moved away while it was emptied: what was in it is gone all the same
                    pass
    finally:
        for fd, _, _ in stack[1:]:
            os.close(fd)
    return clock.count


def remove_tree(path: str, deadline: float | None = None, keep_top: bool = False) -> int:
    """Delete the directory `path` and everything under it (``keep_top``: leave `path` itself,
    empty). `path` itself must not be a link (O_NOFOLLOW); its parent is the caller's to trust."""
    top = _open_dir(path, None)
    try:
        n = empty_tree(top, deadline)
    finally:
        os.close(top)
    if not keep_top:
        os.rmdir(path)
    return n


def remove_tree_as(path: str, uid: int, seconds: float, python: str = sys.executable, spawn=subprocess.Popen,
                   forget=lambda proc: None) -> None:
    """remove_tree(path) within `seconds`, acting as `uid` when we are root and it is another uid:
    a child process with that uid empties the tree, then the empty top is removed here (its
    parent is ours and not writable by `uid`). Raises OSError (Overdue past the time).
    spawn and forget: how the child is started and, once reaped, let go (the sandbox registers
    it, so that reaping another run's orphans never takes its exit status)."""
    if os.geteuid() != 0 or uid == os.geteuid():
        remove_tree(path, time.monotonic() + seconds)
        return
    with open(__file__) as f:
        source = f.read()
    proc = spawn([python, "-I", "-S", "-B", "-c", source, path, str(seconds)], user=uid, group=uid,
                 extra_groups=[], cwd="/", env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, close_fds=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=seconds + 2.0)  # its own deadline stops it first
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise Overdue(f"removal as uid {uid} did not finish in {seconds:g} s") from None
    finally:
        if proc.returncode is not None:
            forget(proc)
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines() or [f"exit status {proc.returncode}"]
        raise (Overdue if "Overdue" in lines[-1] else OSError)(f"removal as uid {uid}: {lines[-1][:300]}")
    os.rmdir(path)


if __name__ == "__main__":  # remove_tree_as's child: python -I -S -c SOURCE PATH SECONDS
    remove_tree(sys.argv[1], time.monotonic() + float(sys.argv[2]), keep_top=True)
