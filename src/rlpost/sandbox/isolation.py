"""What the kernel enforces around one sandbox run, seen from the host: a cgroup, a seccomp
filter and a kill that finds everything.

run.py decides *how* a program runs (bubblewrap or plain rlimits); this module holds the host
resources that make the limits real whichever backend runs it:

* **Cgroups.** Where we may create cgroups (root, or a delegated v2 subtree named by
  RLPOST_CGROUP), each run gets its own: a memory cap that counts everything the program can make
  the kernel hold (heap, memfd, tmpfs files, SysV/POSIX shared memory, page tables), a pids cap
  that counts every process and thread, and a kill of the whole group at the end, which finds
  processes that left the session and the process group. cgroup v2 is used when memory and pids
  are enabled for our subtree; otherwise the v1 memory and pids hierarchies (hybrid hosts), with
  the v2 tree beside them used only for ``cgroup.kill`` when it has one.
* **Seccomp.** A filter that refuses the keyring calls (the session keyring is inherited across
  exec, and a key in it is readable by whoever *possesses* it, whatever its uid, bwrap or not) and
  ptrace / process_vm_readv (no reading another process's memory, not even bwrap's own init), and
  kills the process on a foreign syscall ABI (i386 ``int 0x80`` or x32 numbers would bypass a
  filter keyed on x86_64 numbers).

The slots (and their registries) are slots.py's; removing a directory the program wrote is cleanup.py's.
"""

from __future__ import annotations

import functools
import os
import re
import select
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass

from rlpost import wire
from rlpost.sandbox.slots import SLOT_UID_BASE

KILL_WAIT_S = 2.0


# --- finding and killing processes ----------------------------------------------------------


# A worker that runs programs is a child subreaper (wire.die_with): every process a run orphans becomes its child,
# and no init reaps it. Under bwrap that is each run's pid 1 (the outer bwrap exits on the program's status without
# waiting for it); under rlimits, what the program forked. Unreaped, each is a zombie that counts against the slot
# uid's process limit, the worker's pids cgroup and the machine's pid_max until bwrap cannot fork and every later run
# fails. So every run ends by reaping what it orphaned (reap_pidfd for bwrap's pid 1, reap_adopted for the rest),
# and never a child this process launched and still waits for (its Popen would read a stolen status as 0): those are
# registered under LAUNCHING, and of the rest only what a sandbox made (sandbox_made) is reaped.
LAUNCHING = threading.Lock()
LAUNCHED: set[int] = set()


def popen(*args, **kwargs) -> subprocess.Popen:
    """subprocess.Popen, the child's pid registered as ours before reap_adopted can see it."""
    with LAUNCHING:
        proc = subprocess.Popen(*args, **kwargs)
        LAUNCHED.add(proc.pid)
    return proc


def forget(proc: subprocess.Popen) -> None:
    """After the launched child was reaped by its Popen."""
    LAUNCHED.discard(proc.pid)


def sandbox_made(pid: int, uid: int) -> bool:
    """Is our exited child `pid` (real uid `uid`) something a sandbox run made, not a child of the
    code around it? As root every run's processes have a slot uid (bwrap's pid 1 included) and
    nothing else of ours has; otherwise every run starts in a session of its own (and a daemon in
    another), while what the verifier itself starts stays in ours (unless it asks for a new session)."""
    if os.geteuid() == 0:
        return uid >= SLOT_UID_BASE
    try:
        return wire.stat(pid).session != os.getsid(0)
    except (OSError, ValueError, IndexError):
        return False


def reap_adopted() -> int:
    """waitpid every exited child that a sandbox made and this process did not launch (LAUNCHED);
    returns how many. One waitid call when no child has exited (the usual case after a run), a
    scan of /proc otherwise."""
    with LAUNCHING:
        try:
            first = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # peek: reaps nothing
        except ChildProcessError:
            return 0
        if first is None:
            return 0
        me, reaped = os.getpid(), 0
        for proc in wire.processes():
            if proc.pid in LAUNCHED or proc.state != "Z" or proc.ppid != me:
                continue
            try:
                if sandbox_made(proc.pid, wire.real_uid(proc.pid)):
                    reaped += os.waitpid(proc.pid, os.WNOHANG)[0] == proc.pid
            except (OSError, ValueError, StopIteration):
                continue
        return reaped


def reap_pidfd(fd: int, wait_s: float = KILL_WAIT_S) -> bool:
    """Wait up to wait_s for the (killed) process behind pidfd `fd` to exit, and reap it if it is
    our child: bwrap's pid 1, adopted when the outer bwrap exits before it. False if it is still
    running. One that is not ours (reaped by the outer bwrap, or adopted by init) is left alone."""
    if not select.select([fd], [], [], wait_s)[0]:
        return False
    try:
        os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
    except OSError:  # ECHILD: not ours; EINVAL: a kernel before 5.4 (reap_adopted finds it then)
        pass
    return True


def kill_matching(uid: int | None = None, session: int | None = None, wait_s: float = KILL_WAIT_S,
                  reap_wait_s: float = 0.0) -> int:
    """SIGKILL every live process with real uid `uid` (any session), or in session `session`
    owned by our own uid, until none is left; returns how many survived `wait_s` (0 = all gone).
    Repeated because a process that is forking when the signal lands can leave a child behind.

    reap_wait_s: then also wait that long for their zombies to be reaped. Orphans go to init (or to
    this process, a child subreaper: reap_adopted), which may reap them only after a second or more,
    and until then they still count against RLIMIT_NPROC of their uid: the next run on this slot
    would find fork() refused."""
    me, now = os.getuid(), time.monotonic()
    stop, reap_stop = now + wait_s, now + wait_s + reap_wait_s
    while True:
        mine = [p for p in wire.processes(uids=True) if p.pid != os.getpid() and
                ((uid is not None and p.uid == uid) or (session is not None and (p.session, p.uid) == (session, me)))]
        alive = [p.pid for p in mine if p.state not in "ZX"]
        if alive and time.monotonic() > stop:
            return len(alive)
        if not alive and (not mine or time.monotonic() > reap_stop or not reap_wait_s):
            return 0
        if not alive:
            reap_adopted()
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002 if alive else 0.02)


def kill_process_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group until it is empty, then reap the leader. Repeated because a
    member that is mid-fork can produce a child after a signal went out; stops for good at the
    first ESRCH, since once the group is empty its id may be reused."""
    stop = time.monotonic() + KILL_WAIT_S
    while not getattr(proc, "group_gone", False) and time.monotonic() < stop:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.group_gone = True
            break
        try:
            proc.wait(timeout=0.01)  # reap the leader; orphans: init or reap_adopted
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(proc.pid):  # only zombies left, waiting to be reaped
            proc.group_gone = True
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:  # unkillable (D state): leave it to the kernel, never hang
        pass


def _group_alive(pgid: int) -> bool:
    """Does any process in group `pgid` still run? (killpg also "succeeds" on zombies.)"""
    return any(p.pgrp == pgid and p.state not in "ZX" for p in wire.processes())


# --- cgroups --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupHost:
    version: int  # 2: one v2 tree with memory and pids; 1: the v1 memory and pids hierarchies
    memory: str  # folder under which run cgroups get their memory cap
    pids: str  # ... their pids cap (the same folder on v2)
    kill: str | None  # v2 folder whose children have cgroup.kill (v2, or the v2 tree of a hybrid host)
    cpu: str | None  # v1 cpu hierarchy, where there is one: a group per run shares the CPU per run,
    # not per process, so a fork bomb's 30 spinning processes get no more CPU than one honest run


def cgroup_mounts() -> list[tuple[str, list[str], str, str]]:
    """Every cgroup filesystem mounted here: (type, its options, mount root, mount point)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, options = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((fstype, options.split(","), *left.split()[3:5]))
    return found


def own_cgroup_dirs() -> dict[str, str]:
    """Hierarchy ('memory', 'pids', or '' for v2) -> the folder of this process's cgroup in it."""
    mounts = {}  # hierarchy -> (mount root, mount point)
    for fstype, options, root, point in cgroup_mounts():
        for ctl in ("memory", "pids", "cpu") if fstype == "cgroup" else ("",):
            if not ctl or ctl in options:
                mounts.setdefault(ctl, (root, point))
    dirs = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctls, path = line.rstrip("\n").split(":", 2)
            for ctl in (ctls.split(",") if ctls else [""]):
                if ctl in mounts:
                    root, point = mounts[ctl]
                    rel = path[len(root):] if path.startswith(root) else path
                    dirs[ctl] = os.path.normpath(point + "/" + rel)
    return dirs


def _can_make_child(base: str, needs: tuple[str, ...]) -> bool:
    probe = os.path.join(base, f"rlpost-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return all(os.path.exists(os.path.join(probe, n)) for n in needs)
    finally:
        os.rmdir(probe)


@functools.cache
def cgroup_host() -> CgroupHost | None:
    """Where run cgroups can be made on this machine, or None (probed once per process)."""
    try:
        dirs = own_cgroup_dirs()
    except OSError:
        return None
    v2 = os.environ.get("RLPOST_CGROUP") or dirs.get("")
    if v2:
        for ctl in ("+memory", "+pids", "+cpu"):  # a delegated, empty subtree may not have them on yet
            try:
                _write(f"{v2}/cgroup.subtree_control", ctl)
            except OSError:
                pass
        if _can_make_child(v2, ("memory.max", "pids.max", "cgroup.kill")):
            return CgroupHost(2, v2, v2, v2, None)  # cpu.weight, where enabled, is per group already
    if "memory" in dirs and "pids" in dirs and _can_make_child(dirs["memory"], ("memory.limit_in_bytes",)) \
            and _can_make_child(dirs["pids"], ("pids.max",)):
        kill = v2 if v2 and _can_make_child(v2, ("cgroup.kill",)) else None
        cpu = dirs["cpu"] if "cpu" in dirs and _can_make_child(dirs["cpu"], ("cpu.shares",)) else None
        return CgroupHost(1, dirs["memory"], dirs["pids"], kill, cpu)
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


class RunCgroup:
    """One run's cgroup(s): created with its caps, the run placed in it, killed, removed."""

    def __init__(self, host: CgroupHost, name: str, memory_bytes: int, max_pids: int, on_make=lambda path: None):
        """on_make(path) runs before each folder is made (the slot's registry records it)."""
        self.host, self.dirs, self.kill_dir, self.on_make = host, [], None, on_make
        self.made: list[str] = []  # every folder made, removed or not
        try:
            if host.version == 2:
                self.mem = self.pids = self._make(host.memory, name)
                _write(f"{self.mem}/memory.max", str(memory_bytes))
                if os.path.exists(f"{self.mem}/memory.swap.max"):
                    _write(f"{self.mem}/memory.swap.max", "0")  # swap would be memory beyond the cap
                _write(f"{self.pids}/pids.max", str(max_pids))
                self.kill_dir = self.mem
            else:
                self.mem, self.pids = self._make(host.memory, name), self._make(host.pids, name)
                _write(f"{self.mem}/memory.limit_in_bytes", str(memory_bytes))
                if os.path.exists(f"{self.mem}/memory.memsw.limit_in_bytes"):  # memory + swap together
                    _write(f"{self.mem}/memory.memsw.limit_in_bytes", str(memory_bytes))
                _write(f"{self.pids}/pids.max", str(max_pids))
                if host.cpu:
                    self._make(host.cpu, name)
                if host.kill:
                    self.kill_dir = self._make(host.kill, name)
        except OSError:
            self.remove()
            raise

    def _make(self, base: str, name: str) -> str:
        path = os.path.join(base, name)
        self.on_make(path)
        os.mkdir(path)
        self.made.append(path)
        self.dirs.append(path)
        return path

    def place(self, pid: int) -> None:
        for d in self.dirs:
            _write(f"{d}/cgroup.procs", str(pid))

    def kill(self) -> bool:
        """Kill everything in the group; True once it is empty."""
        return _kill_group(self.pids, self.kill_dir)

    def wait_reaped(self, wait_s: float) -> bool:
        """Wait until every process of the group has been reaped, not just killed: a zombie keeps
        its pids charge (and its RLIMIT_NPROC count) until its parent (init, or this process: reap_adopted) reaps it."""
        stop = time.monotonic() + wait_s
        while int(_read(f"{self.pids}/pids.current")) > 0:
            if time.monotonic() > stop:
                return False
            reap_adopted()
            time.sleep(0.01)
        return True

    def peak_mb(self) -> float | None:
        name = "memory.peak" if self.host.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int(_read(f"{self.mem}/{name}")) / (1 << 20)
        except (OSError, ValueError):
            return None  # memory.peak needs Linux 5.19

    def oom_killed(self) -> bool:
        name = "memory.events" if self.host.version == 2 else "memory.oom_control"
        try:
            m = re.search(r"^oom_kill (\d+)", _read(f"{self.mem}/{name}"), re.M)
        except OSError:
            return False
        return bool(m and int(m[1]) > 0)

    def remove(self) -> None:
        """rmdir every folder; exiting processes can keep a group busy for a few ms."""
        while self.dirs:
            _rmdir_when_empty(self.dirs[-1])
            self.dirs.pop()


def _kill_group(procs_dir: str, kill_dir: str | None, wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL every process of a cgroup: one write to cgroup.kill where there is one (atomic, so
    forks cannot outrun it), else pids.max = 0 (no new processes) and kill what is listed until
    the list is empty. True once it is."""
    if kill_dir:
        _write(f"{kill_dir}/cgroup.kill", "1")
    else:
        _write(f"{procs_dir}/pids.max", "0")
    return _kill_listed(procs_dir, wait_s)


def _kill_listed(procs_dir: str, wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL what a cgroup's cgroup.procs lists until the list is empty; True once it is."""
    stop = time.monotonic() + wait_s
    while True:
        left = [int(p) for p in _read(f"{procs_dir}/cgroup.procs").split()]
        if not left or time.monotonic() > stop:
            return not left
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)


def _rmdir_when_empty(path: str, wait_s: float = KILL_WAIT_S) -> None:
    stop = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > stop:
                raise
            time.sleep(0.002)


def remove_stale_cgroup(path: str) -> None:
    """Kill everything in a cgroup a slot's registry names (its maker died or failed to remove it)
    and remove it. Only a folder named like ours (rlpost-...) inside a cgroup filesystem is touched:
    under one of our bases, or under the cgroup of another process tree on this host that held the
    slot before (slots are host-wide). One already gone is done."""
    points = [point for *_, point in cgroup_mounts()]
    real = os.path.realpath(path)
    if not os.path.basename(path).startswith("rlpost-") or not any(real.startswith(p + "/") for p in points):
        raise OSError(f"{path}: not a run cgroup")
    if not os.path.isdir(path):
        return
    if os.path.exists(f"{path}/cgroup.kill"):
        _kill_group(path, path)
    elif os.path.exists(f"{path}/pids.max"):
        _kill_group(path, None)
    else:  # a v1 memory or cpu folder: kill what it lists
        _kill_listed(path)
    _rmdir_when_empty(path)


# --- seccomp --------------------------------------------------------------------------------

# arch -> (AUDIT_ARCH value, syscall numbers to refuse: add_key request_key keyctl ptrace
# process_vm_readv process_vm_writev). From the kernel's syscall tables.
SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, (248, 249, 250, 101, 310, 311)),
    "aarch64": (0xC00000B7, (217, 218, 219, 117, 270, 271)),
}


@functools.cache
def seccomp_filter() -> bytes | None:
    """The classic-BPF program (struct sock_filter[]) described in the module docstring, or None
    on an architecture whose numbers we do not carry."""
    arch = SECCOMP_ARCHES.get(os.uname().machine)
    if arch is None:
        return None
    audit_arch, denied = arch
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, kill, eperm = 0x7FFF0000, 0x80000000, 0x00050000 | 1  # SECCOMP_RET_*; ERRNO(EPERM)
    ins = [(ld_abs, 0, 0, 4),  # seccomp_data.arch
           (jeq, 1, 0, audit_arch), (ret, 0, 0, kill),
           (ld_abs, 0, 0, 0)]  # seccomp_data.nr
    if audit_arch == 0xC000003E:
        ins += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]  # x32 ABI numbers
    for i, nr in enumerate(denied):  # jump to the EPERM return at the end
        ins.append((jeq, len(denied) - i, 0, nr))
    ins += [(ret, 0, 0, allow), (ret, 0, 0, eperm)]
    return b"".join(struct.pack("HBBI", *i) for i in ins)
