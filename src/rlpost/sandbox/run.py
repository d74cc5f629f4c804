"""Run model-written Python without letting it touch the trainer, the machine, the network or
another run.

A code-task reward means executing whatever the policy wrote. During RL the policy explores, so
sooner or later it writes an infinite loop, a fork bomb, a 10 GB allocation or a
``print`` in a ``while True``; and a policy that finds it can read the tests, the user's SSH key
or the trainer's memory will learn to. ``run_python`` runs one program under a set of limits and
always returns a ``Result``; nothing the program does can raise in, block or kill the caller.

Two backends (``backend=`` or ``RLPOST_SANDBOX=auto|bwrap|rlimits``; the code task names one
explicitly and refuses to start without bubblewrap unless told ``task.sandbox=rlimits``):

bwrap (bubblewrap), wherever it exists *and* a trivial program actually runs under it
(containers often disable user namespaces, so the binary being present proves nothing):
  * new user, pid, network, ipc, uts, cgroup and mount namespaces (``--unshare-all``): no network
    at all, not even the host's localhost; no SysV/POSIX shared memory or message queue of the
    host or of another run; the pid namespace hides every outside process, and when the outer
    bwrap dies the kernel kills everything inside;
  * the root is an empty tmpfs, remounted read-only, with read-only binds of /usr and the /lib*,
    /bin links: no /etc, no /home, no /tmp, no host path at all. The working directory /sandbox is
    a tmpfs of ``max_disk_mb`` (``--size``): written files are RAM inside the sandbox, never the
    host disk, and vanish with its mount namespace. The program's files enter through ``--file``
    from memfds, so there is no host directory to clean up either;
  * the program runs as uid 65534 inside; outside, bwrap runs as the run's slot uid (isolation.py),
    never root: a process whose real uid is 0 ignores RLIMIT_NPROC;
  * rlimits are set *inside* the sandbox by a tiny boot shim that then execs the program, so
    RLIMIT_NPROC counts only processes in the sandbox's own user namespace;
  * bwrap installs isolation.seccomp_filter(): no keyring calls, no ptrace, no process_vm_*.
  The interpreter is the system /usr/bin/python3 (stdlib only): it lives under /usr, which is
  bound anyway, whereas sys.executable is often a venv under $HOME, and binding $HOME is exactly
  what must not happen. Only when /usr/bin/python3 is missing is sys.base_prefix bound read-only.

rlimits (only when asked for, and as root only with allow_root): a plain subprocess in a new
session, through the same boot shim (same rlimits, and the seccomp filter installed by the shim
itself), with a scrubbed environment and a fresh host directory (hostdir.py: as root a tmpfs of
max_disk_mb of its own, removed by one unmount; cleanup.py removes a plain one). When we are root
it runs as the slot's own uid, so it cannot signal, ptrace or read the files of the trainer or of
another run, RLIMIT_NPROC counts only its own processes, and at the end every process of the run
is killed (its cgroup, else its uid), daemons included. It has no network isolation, the
filesystem stays readable (a world-readable data file with the expected answers included) and
world-writable places like /tmp writable, and the host's SysV IPC is shared. As a non-root user
it also shares the trainer's uid: it can read the trainer's memory through /proc, kill it, and
write whatever we can. ``guarantees()`` says exactly which properties hold, ``unprotected()`` says
it in words, and the first such run warns with them (the code task says it on the console).

Whatever a run leaves on the host (its cgroups, its working directory) is listed in its slot's
registry (slots.py) before it exists; a run killed mid-way leaves the list, and the next holder of
the slot removes exactly what it names.

Both backends, where cgroups can be made (isolation.py): a cgroup per run caps the memory of the
whole run (``total_memory_mb``: processes, memfd, tmpfs, shared memory) and its process count,
and kills it whole at the end. Without one, memory_mb caps each process's *address space* only,
which memfd and shmem pages escape, and ``guarantees()`` says so.

Cost: one run of a trivial program takes ~45-60 ms on 2 cores (benchmarks/sandbox.py), ~8 ms
of it the kernel moving the held run into its cgroup; the bwrap probe is one such run, once per
process.
"""

from __future__ import annotations

import functools
import os
import secrets
import selectors
import signal
import subprocess
import time
import warnings

from rlpost.sandbox import hostdir, isolation, launch, slots
from rlpost.sandbox.launch import MAIN
from rlpost.sandbox.limits import Limits, Result

KILL_WAIT_S = 2.0  # after a kill, how long to wait for the pipes to close
REAP_WAIT_S = 5.0  # rlimits as root: how long to wait for a run's orphans to be reaped (see kill_matching)
CLEANUP_S = 10.0  # rlimits without a tmpfs mount: the longest a run's working directory may take to remove
LEFTOVER_S = 2.0  # the longest a run spends on what earlier holders of its slot left (the rest waits)
ALLOW_ROOT_ENV = "RLPOST_SANDBOX_ALLOW_ROOT"
BACKENDS = ("bwrap", "rlimits")
INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap)"


class SandboxUnavailable(RuntimeError):
    """The asked-for backend cannot run here (bubblewrap missing or blocked)."""


# --- backend choice -------------------------------------------------------------------------


@functools.cache
def bwrap_works() -> bool:
    """Probe once per process: does a trivial program really run under our bwrap command, with
    the flags we asked bwrap about (``bwrap --help``) known?"""
    if launch.bwrap_path() is None or launch.bwrap_flags() is None:
        return False
    res = run_python("print(6 * 7)", limits=Limits(wall_s=20), backend="bwrap", _probe=True)
    return res.status == "ok" and res.stdout.strip() == "42"


def resolve_backend(choice: str | None = None) -> str:
    """The backend to use: `choice`, else RLPOST_SANDBOX, else bwrap if it works, else rlimits.

    Naming bwrap where it cannot run raises SandboxUnavailable; nothing falls back silently."""
    choice = choice or os.environ.get("RLPOST_SANDBOX", "auto")
    choice = "rlimits" if choice == "rlimit" else choice  # the old spelling
    if choice not in ("auto", *BACKENDS):
        raise ValueError(f"sandbox backend {choice!r}: expected auto, bwrap or rlimits")
    if choice == "auto":
        return "bwrap" if bwrap_works() else "rlimits"
    if choice == "bwrap" and not bwrap_works():
        raise SandboxUnavailable(f"bubblewrap is missing or cannot create namespaces here: {INSTALL_HINT}, "
                                 "or set task.sandbox=rlimits to accept a weaker sandbox")
    return choice


def guarantees(backend: str | None = None) -> dict[str, bool]:
    """Which isolation properties hold for `backend` (default: the resolved one) on this machine."""
    backend = "rlimits" if backend == "rlimit" else backend or resolve_backend()
    bw, own_uid = backend == "bwrap", os.geteuid() == 0  # root: every run gets a uid of its own
    cgroup, seccomp = isolation.cgroup_host() is not None, isolation.seccomp_filter() is not None
    flags = (launch.bwrap_flags() or frozenset()) if bw else frozenset()
    return {
        "wall_time": True, "cpu_time": True, "output_cap": True, "memory_per_process": True,
        "memory_total": cgroup,  # memfd, tmpfs and shmem pages: only a cgroup counts them
        "process_count": bw or own_uid or cgroup,  # counts this run's processes, not the trainer's
        # bwrap: a tmpfs of --size; rlimits: a tmpfs mount of its own as root, else RLIMIT_FSIZE per file only
        "disk_quota": "--size" in flags if bw else own_uid and hostdir.can_mount(),
        "tree_kill": bw or own_uid or cgroup,  # rlimits as non-root: a setsid() daemon survives
        "network_isolated": bw,
        "fs_read_isolated": bw,  # rlimits: every world-readable file, task data included
        "fs_write_isolated": bw,  # rlimits: /tmp, /dev/shm and the host disk
        "ipc_isolated": bw,  # rlimits: the host's SysV shared memory, semaphores, queues
        "userns_blocked": "--disable-userns" in flags,  # no nested namespaces
        "keyring_isolated": seccomp,
        "ptrace_blocked": seccomp,
        "parent_protected": bw or own_uid,  # rlimits as non-root: same uid as the trainer
        "runs_isolated": bw and cgroup,  # nothing one run does can change another's result
    }


# What each missing guarantee leaves the program free to do, in the words the console uses.
UNPROTECTED = {
    "memory_total": "memory held in memfd, tmpfs and shared memory (no cgroup: only each process's address space is "
                    "capped)",
    "process_count": "process count (shared with your uid's other processes)",
    "disk_quota": "disk use (files go to the host disk, capped per file only)",
    "tree_kill": "daemons that leave the session (they outlive the run)",
    "network_isolated": "the network, localhost included",
    "fs_read_isolated": "reading every world-readable file, the task's data with its answers included",
    "fs_write_isolated": "writing /tmp, /dev/shm and every other world-writable place",
    "ipc_isolated": "the host's SysV shared memory, semaphores and message queues",
    "userns_blocked": "nested user namespaces",
    "keyring_isolated": "the session keyring",
    "ptrace_blocked": "ptrace and process_vm_readv",
    "parent_protected": "this process and your files: the program runs with your uid, so it can read this process's "
                        "memory, kill it, and change anything you can write, the Python packages the verifier imports "
                        "included",
    "runs_isolated": "other runs: what one run does can change another's result",
}

ROOT_REFUSAL = ("refusing to run model-written code under task.sandbox=rlimits as root: it would run with resource "
                "limits and a uid of its own only, beside a grader that creates and removes its files as root; "
                "install bubblewrap (task.sandbox=bwrap), or set task.sandbox_allow_root=true "
                f"({ALLOW_ROOT_ENV}=1 outside a code task) to accept that")


def unprotected(backend: str) -> list[str]:
    """What a program run under `backend` here is not kept from, one phrase per missing guarantee."""
    return [UNPROTECTED[k] for k, ok in guarantees(backend).items() if not ok]


@functools.cache
def _warn_missing(backend: str) -> None:
    missing = unprotected(backend)
    if missing:
        warnings.warn(f"rlpost.sandbox: running model-written code under {backend} without protection against: "
                      f"{'; '.join(missing)} (see docs/environments.md)"
                      + (f"; {INSTALL_HINT} for the full sandbox" if backend == "rlimits" else ""),
                      RuntimeWarning, stacklevel=4)


# --- one run --------------------------------------------------------------------------------


def run_python(code: str, stdin: str = "", limits: Limits = Limits(), files: dict[str, str] | None = None,
               backend: str | None = None, parallel: int = 0, allow_root: bool | None = None,
               _probe: bool = False) -> Result:
    """Run `code` as main.py in a fresh directory holding `files`; never raises for what `code` does.

    backend: "bwrap" or "rlimits"; default resolve_backend(). parallel: how many sandboxes may run
    at once on this machine (the slot pool); 0 = the number of CPU cores. allow_root: run the
    rlimits backend as root (refused otherwise, SandboxUnavailable); None = RLPOST_SANDBOX_ALLOW_ROOT=1."""
    backend = "bwrap" if _probe else resolve_backend(backend)
    if backend == "rlimits" and os.geteuid() == 0 and not root_allowed(allow_root):
        raise SandboxUnavailable(ROOT_REFUSAL)
    if not _probe:
        _warn_missing(backend)
    files = {**(files or {}), MAIN: code}
    for name in files:
        if os.path.isabs(name) or os.path.normpath(name).split(os.sep)[0] in ("..", ".", ""):
            raise ValueError(f"sandbox file name {name!r} must be relative and stay inside the directory")
    slot = slots.acquire_slot(parallel or os.cpu_count() or 1, uid_block=BACKENDS.index(backend))
    res = None
    try:
        res = _run_in_slot(backend, files, stdin, limits, slot)
        return res
    finally:
        isolation.reap_adopted()  # whatever the run orphaned to this process, on every way out (isolation.py)
        slots.release_slot(slot, clean=res is not None and not res.cleanup)


def root_allowed(allow_root: bool | None) -> bool:
    return allow_root if allow_root is not None else os.environ.get(ALLOW_ROOT_ENV, "") in ("1", "true")


def _run_in_slot(backend: str, files: dict[str, str], stdin: str, limits: Limits, slot: slots.Slot) -> Result:
    if slot.entries or (backend == "rlimits" and os.geteuid() == 0 and slot.dirty):
        _clear_leftovers(slot, backend)  # what a holder killed mid-run (or a failed removal) left
    cgroup, workdir, problems = _make_cgroup(limits, slot), None, []
    try:
        if backend == "rlimits":
            workdir = hostdir.make(files, slot, limits.max_disk_mb)
        t0 = time.monotonic()
        proc = launch.spawn(backend, files, stdin, limits, slot, workdir and workdir["path"])
        try:
            launch.release(proc, cgroup)
            out, err, why = _collect(proc, limits, t0 + limits.wall_s, lambda: _kill_all(proc, cgroup, slot, backend))
        finally:
            problems += _kill_all(proc, cgroup, slot, backend)
            began = launch.started(proc)
            _finish(proc)
        wall = time.monotonic() - t0
        peak = cgroup.peak_mb() if cgroup else None
        oom = cgroup.oom_killed() if cgroup else False
    finally:
        problems += _cleanup(cgroup, workdir, slot)
    rc = proc.returncode
    if backend == "bwrap" and rc is not None and rc > 128:
        rc = 128 - rc  # bwrap exits 128 + N when the program died of signal N (sys.exit(130) looks the same)
    stdout, stderr = (b.decode("utf-8", errors="replace") for b in (out, err))
    status = why or ("memory" if oom and rc != 0 else _classify(rc, stderr))
    said = stderr.strip()[-200:] or "no message"
    failed = "" if began else f"the sandbox never started the program ({status}: {said})"
    return Result(status, rc, stdout, stderr, wall, backend, peak, "; ".join(problems), failed)


def _clear_leftovers(slot: slots.Slot, backend: str) -> None:
    """Remove what the slot's registry lists, within LEFTOVER_S: the holder that made it is gone
    (we hold the slot's lock), so nothing there is anyone's live run. The processes of its uids go
    first (as root: only sandbox uids). What cannot be removed in time stays listed for the next
    holder; it never fails this run."""
    if os.geteuid() == 0:
        uids = {int(e["uid"]) for e in slot.entries if e.get("kind") == "workdir" and "uid" in e}
        if backend == "rlimits" and slot.dirty:
            uids.add(slot.uid)
        for uid in sorted(u for u in uids if u >= slots.SLOT_UID_BASE):
            isolation.kill_matching(uid=uid, reap_wait_s=REAP_WAIT_S)
    deadline, done = time.monotonic() + LEFTOVER_S, []
    for entry in list(slot.entries):
        try:
            if entry.get("kind") == "cgroup":
                isolation.remove_stale_cgroup(entry["path"])
            elif entry.get("kind") == "workdir":
                hostdir.remove(entry, max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - stays listed; the next holder goes on from here
            continue
        done.append(entry)
    slots.record(slot, drop=done)


def _make_cgroup(limits: Limits, slot: slots.Slot) -> isolation.RunCgroup | None:
    host = isolation.cgroup_host()
    if host is None:
        return None
    total = limits.total_memory_mb or limits.memory_mb + limits.max_disk_mb
    # +3 pids: the outer bwrap, the sandbox's init, and the boot shim that becomes the program
    return isolation.RunCgroup(host, f"rlpost-slot{slot.index}-{secrets.token_hex(6)}", int(total) << 20,
                               int(limits.max_processes) + 3,
                               on_make=lambda path: slots.record(slot, add={"kind": "cgroup", "path": path}))


def _collect(proc: subprocess.Popen, limits: Limits, deadline: float, kill) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr incrementally until both close; (out, err, status override or None).

    Reads at most cap + 64 KiB per stream before killing, so gigabytes of output cost nothing."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    cap = limits.max_output_bytes
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    why, exited_at = None, None
    while sel.get_map():
        now = time.monotonic()
        if now >= deadline:
            why = "timeout"
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now  # main process gone: kill stragglers still holding the pipes
            kill()
        if exited_at is not None and now - exited_at > KILL_WAIT_S:
            break
        for key, _ in sel.select(timeout=min(0.1, deadline - now)):
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fd)
                continue
            bufs[key.fd] += chunk
            if len(bufs[key.fd]) > cap:
                why = "output_limit"
        if why:
            break
    sel.close()
    if why is None and exited_at is None:  # it closed both pipes but may still be running
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            why = "timeout"
    out, err = (bytes(b[:cap]) for b in bufs.values())
    return out, err, why


def _kill_all(proc: subprocess.Popen, cgroup, slot: isolation.Slot, backend: str) -> list[str]:
    """Kill every process of the run, by every handle we have; returns what could not be killed.

    bwrap: first the sandbox's pid 1, whose death tears down the pid namespace and everything in
    it. The outer bwrap exits on the program's status, often before pid 1 is gone, and a worker
    (a child subreaper) inherits it: it is reaped here, once dead (isolation.reap_pidfd). Then the
    cgroup (where there is one), which holds everything, even processes that left the session;
    then the process group. rlimits: every process of the run's own uid (root), else of its session."""
    problems = []
    if proc.pid1_fd is not None:
        try:
            signal.pidfd_send_signal(proc.pid1_fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            problems.append("the sandbox's init did not die")
        else:  # the outer bwrap is gone: its pid 1, if still unreaped, is init's or ours (a subreaper's) now
            if not isolation.reap_pidfd(proc.pid1_fd):
                problems.append("the sandbox's init did not die")
    if cgroup is not None and not getattr(proc, "cgroup_emptied", False):
        try:
            proc.cgroup_emptied = cgroup.kill()
        except OSError as e:
            problems.append(f"cgroup kill: {e}")
    isolation.kill_process_group(proc)
    if backend == "rlimits":
        # The run that made the zombies waits for them to be reaped, not the next run on this
        # slot (zombies count against RLIMIT_NPROC). The cgroup's pids count says it without a
        # scan of /proc; without a cgroup, every process of the run's uid (root) or session.
        own = os.geteuid() == 0
        if getattr(proc, "cgroup_emptied", False):
            if not cgroup.wait_reaped(REAP_WAIT_S):
                problems.append("the run's zombies were not reaped")
        elif isolation.kill_matching(uid=slot.uid if own else None, session=None if own else proc.pid,
                                     reap_wait_s=REAP_WAIT_S if own else 0.0):
            problems.append("processes of the run survived SIGKILL")
    return problems


def _finish(proc: subprocess.Popen) -> None:
    isolation.forget(proc)
    for f in (proc.stdout, proc.stderr):
        f.close()
    for name in ("info_fd", "pid1_fd", "started_fd"):
        if getattr(proc, name) is not None:
            os.close(getattr(proc, name))
            setattr(proc, name, None)


def _cleanup(cgroup, workdir: dict | None, slot: slots.Slot) -> list[str]:
    """Remove the cgroup and the host directory, and drop them from the slot's registry. A failure
    is reported, never raised: the program's result stands, and what is left stays listed for the
    next holder of the slot, so a mess one program made never costs the next one its reward."""
    problems = []
    if cgroup is not None:
        try:
            cgroup.remove()
        except OSError as e:
            problems.append(f"cgroup: {e}")
        slots.record(slot, drop=[e for e in slot.entries if e.get("kind") == "cgroup" and e["path"] in cgroup.made
                                 and e["path"] not in cgroup.dirs])
    if workdir is not None:
        try:
            hostdir.remove(workdir, CLEANUP_S)
            slots.record(slot, drop=[workdir])
        except Exception as e:  # noqa: BLE001 - whatever the program built, the caller must not see it
            problems.append(f"workdir: {type(e).__name__}: {e}")
    return problems


def _classify(rc: int | None, stderr: str) -> str:
    """Status from how the process ended (the caller already handled wall time and output)."""
    sig = -rc if rc is not None and rc < 0 else None
    tail = stderr[-4000:]
    if rc == 0:
        return "ok"
    if sig == signal.SIGXCPU:
        return "timeout"  # RLIMIT_CPU
    if "MemoryError" in tail or "Cannot allocate memory" in tail or "bad_alloc" in tail:
        return "memory"  # RLIMIT_AS: Python raises MemoryError
    if sig is not None:
        return "killed"
    return "error"
