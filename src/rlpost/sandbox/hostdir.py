"""The rlimits backend's working directory on the host: made where no other uid can plant or
swap anything, sized like bubblewrap's where the kernel lets us, and removed without acting on
what the program put there with more rights than the program had.

* **Where.** A private directory of ours (0711 as root, so the sandbox's uid can reach its own
  working directory by name but not list or change the others; 0700 otherwise) under an
  unpredictable name, ``{TMPDIR}/rlpost-work-{euid}-XXXXXXXX`` (mkdtemp): any local user could make a
  fixed name in the world-writable temp directory first, and every run would then be refused. It is
  made once per temp directory and recorded in the private slot directory (slots.py,
  ``work-roots``), so every process of ours uses the same one, and an old one stays
  removable by the next holder of a slot that lists a working directory in it. Each run's working
  directory is a fresh name in it, recorded in the slot's registry (slots.py) before it exists.
* **As root: a tmpfs of its own.** The working directory is a tmpfs mount of ``max_disk_mb``
  (and INODES_PER_MB inodes per MiB), owned by the run's uid: the disk quota holds, as under
  bubblewrap, and removing it is one lazy unmount, whatever the program built in it. Where mounts are refused (a
  container without CAP_SYS_ADMIN), a plain directory, removed by cleanup.remove_tree_as with the run's uid, within a
  deadline.
* **Not root:** a plain directory, removed by cleanup.remove_tree within a deadline. (The
  program runs with our uid then, so it could remove our files itself; the removal still never
  follows a link or leaves the tree.)
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import secrets
import stat
import tempfile

from rlpost.sandbox import cleanup, isolation, slots
from rlpost.sandbox.launch import python_path

INODES_PER_MB = 256  # a 64 MiB working directory holds up to 16384 files and directories
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8
_mounts_refused: list[bool] = []  # non-empty once a mount was refused: do not ask again


RECORD = "work-roots"  # in the slot directory: {temp directory: our working directories' root in it}
_roots: dict[str, str] = {}  # this process's copy of it, checked before each use


def work_root() -> str:
    """The root every run's working directory is made in, in the current temp directory (see the
    module docstring)."""
    temp = tempfile.gettempdir()
    if _is_work_root(_roots.get(temp, ""), temp):
        return _roots[temp]
    fd = os.open(os.path.join(slots.slot_dir(), RECORD), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one process makes it; the others read what it recorded
        try:
            roots = json.loads(os.pread(fd, 1 << 20, 0) or b"{}")
        except ValueError:
            roots = {}
        roots = {k: v for k, v in roots.items() if isinstance(v, str)} if isinstance(roots, dict) else {}
        if not _is_work_root(roots.get(temp, ""), temp):
            roots[temp] = tempfile.mkdtemp(prefix=f"rlpost-work-{os.geteuid()}-", dir=temp)  # 0700, unforeseeable
            if os.geteuid() == 0:
                os.chmod(roots[temp], 0o711)
            data = json.dumps(roots).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
    _roots[temp] = roots[temp]
    return roots[temp]


def _is_work_root(folder: str, parent: str | None = None) -> bool:
    """Is `folder` a work root of ours (recorded, in any temp directory, or under the old fixed name
    by an older rlpost): named so, a directory of our uid that no other uid can write (and in
    `parent`, when given)."""
    name, prefix = os.path.basename(folder), f"rlpost-work-{os.geteuid()}"
    if (name != prefix and not name.startswith(prefix + "-")) or (parent and os.path.dirname(folder) != parent):
        return False
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(path: str, uid: int, size_mb: int) -> bool:
    """A tmpfs of size_mb owned by uid at path; False where the kernel refuses us mounts."""
    if _mounts_refused:
        return False
    options = f"size={int(size_mb)}m,nr_inodes={max(64, int(size_mb) * INODES_PER_MB)},mode=0700,uid={uid},gid={uid}"
    if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) == 0:
        return True
    _mounts_refused.append(True)
    return False


def make(files: dict[str, str], slot: slots.Slot, max_disk_mb: int) -> dict:
    """The run's working directory holding `files`, owned by the slot's uid; returns its registry
    entry (already recorded)."""
    path = os.path.join(work_root(), f"{slot.index}-{secrets.token_hex(8)}")
    root = os.geteuid() == 0
    entry = {"kind": "workdir", "path": path, "uid": slot.uid, "mount": root and not _mounts_refused}
    slots.record(slot, add=entry)
    os.mkdir(path, 0o700)
    if entry["mount"] and not _mount_tmpfs(path, slot.uid, max_disk_mb):
        entry["mount"] = False
        slots.record(slot)
    for name, text in files.items():  # nothing of the program's has run yet: this tree is ours alone
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    if root:
        for folder, dirnames, filenames in os.walk(path):
            for name in [folder, *(os.path.join(folder, n) for n in dirnames + filenames)]:
                os.chown(name, slot.uid, slot.uid, follow_symlinks=False)
    return entry


def remove(entry: dict, seconds: float) -> None:
    """Remove a working directory named by a registry entry (ours, or a dead holder's); raises
    OSError with what is left (cleanup.Overdue past `seconds`)."""
    path = entry["path"]
    if not _is_work_root(os.path.dirname(path)):
        raise OSError(f"{path}: not a working directory of ours")
    if not os.path.lexists(path):
        return
    if entry.get("mount"):
        if _libc().umount2(path.encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0 and ctypes.get_errno() != errno.EINVAL:
            raise OSError(ctypes.get_errno(), f"umount {path}: {os.strerror(ctypes.get_errno())}")
        try:
            os.rmdir(path)  # the mount point: ours, empty once the tmpfs is gone
            return
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
    cleanup.remove_tree_as(path, int(entry["uid"]), seconds, python_path(), isolation.popen, isolation.forget)


def can_mount() -> bool:
    """Whether this process may mount the working directories' tmpfs (root, and not refused by a
    container's policy); probed once with a 1 MiB tmpfs."""
    if os.geteuid() != 0:
        return False
    if not _probed:
        _probed.append(True)
        probe = os.path.join(work_root(), f"probe-{secrets.token_hex(8)}")
        os.mkdir(probe, 0o700)
        try:
            if _mount_tmpfs(probe, os.geteuid(), 1):
                _libc().umount2(probe.encode(), MNT_DETACH | UMOUNT_NOFOLLOW)
        finally:
            os.rmdir(probe)
    return not _mounts_refused


_probed: list[bool] = []
