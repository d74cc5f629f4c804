"""Slots: how many sandboxes run at once on the machine, the uid each run gets, and the registry
of what each slot's runs made on the host.

A run holds one of N machine-wide slots (a lock file under flock) while it runs. The
slot bounds how many sandboxes run at once on the machine, across every verifier worker process,
and, when we are root, names a uid of its own (SLOT_UID_BASE + index) that no other concurrent
run and no real user has. A program can then signal, ptrace or read the files of no other run,
and RLIMIT_NPROC counts only its own processes. The kernel drops the lock when its holder dies,
so a killed worker never leaks a slot; whatever it left running under the slot's uid is killed
by the next run that takes the slot, before that run starts. Each slot has a registry (below)
of what its runs made on the host, so that the next holder removes exactly that.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field

SLOT_UID_BASE = 1_900_000_000  # far above real users, /etc/subuid ranges and nobody (65534)


@dataclass
class Slot:
    index: int
    uid: int  # the run's uid outside any namespace: its own when we are root, else ours
    fd: int  # the flock-ed lock file; the slot is held while this is open
    block: int  # the uid block; the lock file's byte at this offset is b"1" while a run is in it
    dirty: bool  # that byte was already b"1": the last holder died mid-run and may have left processes
    folder: str  # the private directory of the lock files and the registries
    entries: list[dict] = field(default_factory=list)  # the registry: what this slot's holders made and did not remove


def private_dir(path: str, mode: int = 0o700) -> str:
    """`path`, made if missing, after checking that it is a directory of ours that no other uid can
    write (someone else could have made it first, in a shared /tmp). mode 0711 lets other uids
    (the sandbox's) reach what is inside by name, never list or change it."""
    os.makedirs(path, mode=mode, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{path}: not a private directory of uid {os.geteuid()}; remove it")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    return path


def slot_dir() -> str:
    """A directory only we can write, for the lock files (programs must not be able to hold one),
    the registries and the record of the working directories' root (hostdir.py). Every process of one
    uid must find the same one, so its name is fixed: root's under /run; another user's under the
    per-user runtime directory the login manager made for it (XDG_RUNTIME_DIR, which no other uid
    can write) where there is one, because a fixed name in a shared /tmp can be made first by any
    other user, and then this uid could never sandbox anything there."""
    if os.geteuid() == 0 and os.access("/run", os.W_OK):
        return private_dir("/run/rlpost-sandbox")
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and _ours(runtime):
        return private_dir(os.path.join(runtime, "rlpost-sandbox"))
    return private_dir(os.path.join(tempfile.gettempdir(), f"rlpost-sandbox-{os.geteuid()}"))


def _ours(path: str) -> bool:
    """A directory of this uid that no other uid can write."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def acquire_slot(n: int, uid_block: int = 0, poll_s: float = 0.005) -> Slot:
    """Wait for one of slots 0..n-1 (lowest first, so few distinct uids are ever used); its uid
    is SLOT_UID_BASE + 1024 * uid_block + index. Backends use different blocks: a bwrap run's
    exited init lingers as a zombie until the kernel's init reaps it, and zombies count against
    RLIMIT_NPROC of their uid, which only the rlimits backend relies on. The slot's registry
    comes with it: what an earlier holder made and could not remove (it died, or its removal
    failed), which the new holder removes before its own run."""
    folder = slot_dir()
    while True:
        for i in range(max(1, n)):
            fd = os.open(f"{folder}/slot-{i}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            uid = SLOT_UID_BASE + 1024 * uid_block + i if os.geteuid() == 0 else os.getuid()
            dirty = os.pread(fd, 1, uid_block) == b"1"
            os.pwrite(fd, b"1", uid_block)
            return Slot(i, uid, fd, uid_block, dirty, folder, read_registry(fd))
        time.sleep(poll_s)


def release_slot(slot: Slot, clean: bool = True) -> None:
    """Give the slot back; `clean` = nothing of the run is left (else the next holder looks)."""
    if clean and not slot.entries:
        os.pwrite(slot.fd, b"0", slot.block)
    os.close(slot.fd)


# --- the registry: what a slot's runs made on the host ------------------------------------------
# A stale-sandbox sweep that looked for names in /tmp (or cgroups named after a dead pid) acted
# on whatever anyone planted under that name, and judged "dead" by a pid that another pid
# namespace can reuse. The registry instead lists exactly what this slot's runs made, written only
# by the slot's holder (the flock), into the slot's own lock file in the private slot directory:
# an entry is added before the thing exists and dropped once it is gone, so a holder that dies
# leaves the list of what to remove, and the next holder (the lock says the last one is gone)
# removes exactly that. One pwrite per change, at REGISTRY_AT: a length and the JSON list. (A
# separate file replaced by rename cost ~4 ms per change on this machine's ext4, ~20 ms a run.)

REGISTRY_AT = 4096  # past the dirty bytes of every uid block
HEADER = 8  # the JSON's length, little-endian


def read_registry(fd: int) -> list[dict]:
    """The entries in an open lock file; [] where there are none or they do not parse."""
    size = int.from_bytes(os.pread(fd, HEADER, REGISTRY_AT).ljust(HEADER, b"\0"), "little")
    if not 0 < size < 1 << 24:
        return []
    try:
        entries = json.loads(os.pread(fd, size, REGISTRY_AT + HEADER))
    except ValueError:
        return []
    ok = isinstance(entries, list) and all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in entries)
    return entries if ok else []


def record(slot: Slot, add: dict | None = None, drop: list[dict] = ()) -> None:
    """Add an entry to the slot's registry and drop others; written through before returning."""
    if add is not None:
        slot.entries.append(add)
    slot.entries[:] = [e for e in slot.entries if not any(e is d for d in drop)]
    data = json.dumps(slot.entries).encode() if slot.entries else b""
    os.pwrite(slot.fd, len(data).to_bytes(HEADER, "little") + data, REGISTRY_AT)  # one call: all of it or none
