"""What a worker process and its parent share, whatever the worker runs (a reward function,
rewards/worker.py; an environment, envs/worker.py): frames on private pipes, dying with the
parent, resource limits, finding the user's object by import path, and the worker's loop
(``serve``). The parent's side, the one pool that starts, times, kills and restarts workers of
either kind, is workers.py.

Kept free of torch and of the rest of rlpost, so that starting (or restarting) a worker takes tens
of milliseconds. Frames are ``b"RLPV"`` + a 4-byte little-endian length + a pickle; a frame with
another magic or a length over MAX_FRAME is a protocol error (the parent kills the worker), never a
huge read. The parent reads replies with ``FrameReader(plain=True)``: a reply that names any class
(an object of the user's module) is a protocol error, so unpickling one never imports that module
into the trainer; what a worker sends of the user's values it first makes plain data (``plain``).

A worker is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever the user's code starts stays its
descendant, a double-forked ``setsid()`` daemon included, so ``kill_tree`` finds and stops it, and
the worker stops it too when its parent dies. The price: what the user's code orphans (``sh -c
'cmd &'``, a tool's background job) is the worker's child once its own parent exits, and no init
reaps it. So after each request, and every REAP_EVERY_S on a thread of its own (an episode may run
for minutes), the worker reaps its exited children that its own code did not start
(``reap_orphans``), and never one that it did: ``own_children`` records the pid of every child the
worker's code starts (``os.fork``, ``os.posix_spawn``, subprocess, multiprocessing), whose exit
status is its Popen's to read. A child started some other way (a C library's own ``fork()``) is
not recorded, and could have its status read first by the reaper.
"""

from __future__ import annotations

import _posixsubprocess
import ctypes
import fcntl
import importlib
import importlib.util
import io
import math
import numbers
import os
import pickle
import resource
import signal
import struct
import sys
import threading
import time
import traceback
from typing import NamedTuple

MAGIC = b"RLPV"
HEADER = struct.Struct("<4sI")
MAX_FRAME = 256 << 20  # a reply bigger than this is garbage, not a reward or an observation
REAP_EVERY_S = 0.5  # how often a worker reaps what the user's code orphaned, besides after each request


class ProtocolError(Exception):
    """Bytes on the reply pipe that are not a frame."""


def frame(obj) -> bytes:
    data = pickle.dumps(obj)
    return HEADER.pack(MAGIC, len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _PlainUnpickler(pickle.Unpickler):
    """Plain values only: a reply naming any class (a user module's own) is a protocol error."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the reply holds a {module}.{name} object; only plain values are accepted")


def plain(value, depth: int = 0):
    """``value`` as plain data (None, bool, int, float, str, list, dict with string keys): what a
    reply may carry. numpy scalars become numbers; any other object its repr, cut at 200 characters."""
    if value is None or type(value) in (bool, str, int, float):
        return value
    if isinstance(value, str):  # a subclass of str would pickle as its class
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if depth < 20 and isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if depth < 20 and isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return plain(value.item(), depth + 1)
    return repr(value)[:200]


class FrameReader:
    """Frames out of a byte stream that arrives in pieces (the parent reads without blocking).
    ``plain``: refuse a frame that would import a class to unpickle (the parent's side)."""

    def __init__(self, plain: bool = False):
        self.buf = bytearray()
        self.plain = plain

    def feed(self, data: bytes) -> list:
        self.buf += data
        out = []
        while len(self.buf) >= HEADER.size:
            magic, n = HEADER.unpack_from(self.buf)
            if magic != MAGIC or n > MAX_FRAME:
                raise ProtocolError(f"bad frame header {bytes(self.buf[:HEADER.size])!r}")
            if len(self.buf) < HEADER.size + n:
                break
            data = bytes(self.buf[HEADER.size:HEADER.size + n])
            out.append(_PlainUnpickler(io.BytesIO(data)).load() if self.plain else pickle.loads(data))
            del self.buf[:HEADER.size + n]
        return out


def read_frame(fd: int):
    """One frame, blocking (the worker's side: its requests come from the parent, which it trusts)."""
    reader = FrameReader()
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            raise EOFError
        got = reader.feed(data)
        if got:
            return got[0]


def import_object(path: str, kind: str = "function"):
    """The object named by 'package.module:name' or '/path/to/file.py:name' (a function, a class): how
    task.verifier, task.reward_funcs and task.env are found (verl names its reward function by file;
    config loading made the path absolute, defaults.py). The module is imported in the worker only."""
    module, _, name = path.rpartition(":")
    if not module or not name:
        raise ValueError(f"{path!r}: expected 'module:{kind}'")
    if module.endswith(".py"):
        spec = importlib.util.spec_from_file_location(os.path.basename(module)[:-3], module)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = loaded  # pickling and dataclasses look an object's module up by name
        spec.loader.exec_module(loaded)
    else:
        loaded = importlib.import_module(module)
    return getattr(loaded, name)


class Proc(NamedTuple):
    """One process as /proc/PID/stat shows it; uid (the real uid, from /proc/PID/status) only where asked for."""

    pid: int
    state: str  # R, S, D, Z (exited, not yet reaped), X, ...
    ppid: int
    pgrp: int
    session: int
    uid: int | None = None


def stat(pid: int) -> Proc:
    """/proc/PID/stat's fields (OSError if the process is gone, ValueError/IndexError if unreadable)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()  # after "pid (comm)": a comm may hold spaces and ")"
    return Proc(pid, fields[0].decode("ascii"), int(fields[1]), int(fields[2]), int(fields[3]))


def real_uid(pid: int) -> int:
    """The real uid of `pid`, from its status file: not the /proc/PID owner, which shows a non-dumpable process as
    root (OSError if it is gone, StopIteration/ValueError if unreadable)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def processes(uids: bool = False) -> list[Proc]:
    """Every process, from /proc (the one scan of it in rlpost); with uids=True each with its real uid. Those that
    vanish during the scan are skipped."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            proc = stat(int(entry))
            out.append(proc._replace(uid=real_uid(proc.pid)) if uids else proc)
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return out


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for proc in processes():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_tree(pid: int) -> set[int]:
    """SIGKILL every descendant of ``pid`` (not ``pid`` itself), and wait until they are gone: each
    is stopped first (SIGSTOP), and the tree looked at again until no new one appears, so none
    forks past the kill. Returns their pids (whoever becomes their parent reaps them: workers.py)."""
    stopped: set[int] = set()
    for _ in range(20):
        new = descendants(pid) - stopped
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        stopped |= new
    for p in stopped:
        _signal(p, signal.SIGKILL)
    deadline = time.monotonic() + 2.0  # SIGKILL is delivered asynchronously
    while any(_running(p) for p in stopped) and time.monotonic() < deadline:
        time.sleep(0.005)
    return stopped


def _running(pid: int) -> bool:
    """Not ended: present in /proc and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # gone already
        pass


def die_with(parent: int, watchdog: int, main_thread: bool) -> None:
    """Exit when the parent does, after killing what the user's code started: PR_SET_PDEATHSIG (the
    kernel signals when the thread that started us exits, so only when that was the parent's main
    thread; SIGTERM, handled here) and a watchdog thread that reads a pipe only the parent holds
    open: EOF means the parent is gone. Becomes a child subreaper first (see the module docstring)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of what we start stay ours (kill_tree)

    def gone(*_):
        kill_tree(os.getpid())
        os._exit(0)

    signal.signal(signal.SIGTERM, gone)
    if main_thread:
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above ran
        gone()

    def watch():
        while os.read(watchdog, 1):
            pass
        gone()

    threading.Thread(target=watch, daemon=True).start()


# The children the worker's own code started, by pid: theirs to wait for, never reaped by reap_orphans. STARTING is
# held from a fork to the pid's record (and by reap_orphans), so no exited child is mistaken for an orphan meanwhile.
STARTING = threading.RLock()
STARTED: set[int] = set()


def own_children() -> None:
    """Record every child this process starts from now on, in STARTED: os.fork, os.forkpty, os.posix_spawn[p]
    and _posixsubprocess.fork_exec (subprocess.Popen, multiprocessing's spawn and forkserver) wrapped."""
    def record(fn, pid_of=lambda out: out):
        def started(*args, **kwargs):
            with STARTING:
                out = fn(*args, **kwargs)
                if pid_of(out) > 0:  # 0: the forked child itself
                    STARTED.add(pid_of(out))
                return out
        return started

    for name in ("fork", "posix_spawn", "posix_spawnp"):
        setattr(os, name, record(getattr(os, name)))
    os.forkpty = record(os.forkpty, lambda out: out[0])
    _posixsubprocess.fork_exec = record(_posixsubprocess.fork_exec)
    if hasattr(sys.modules.get("subprocess"), "_fork_exec"):  # Python 3.12+ binds it at import
        sys.modules["subprocess"]._fork_exec = record(sys.modules["subprocess"]._fork_exec)


def reap_orphans() -> int:
    """Reap this process's exited children that it did not start (STARTED): what the user's code orphaned,
    handed to this subreaper. Returns how many. One waitid call when no child has exited."""
    with STARTING:
        try:
            if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:  # peek: reaps nothing
                return 0
        except ChildProcessError:
            STARTED.clear()
            return 0
        me, reaped, ours = os.getpid(), 0, set()
        for proc in processes():
            if proc.ppid != me:
                continue
            if proc.pid in STARTED:
                ours.add(proc.pid)
            elif proc.state == "Z":
                try:
                    reaped += os.waitpid(proc.pid, os.WNOHANG)[0] == proc.pid
                except ChildProcessError:  # reaped meanwhile by the user's own os.wait()
                    pass
        STARTED.intersection_update(ours)  # a pid already waited for is forgotten: it may be an orphan's next
        return reaped


def private(fd: int) -> int:
    """The fd moved above the low numbers user code might touch, and closed on exec."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
    os.close(fd)
    return new


def set_cpu_limit(seconds: float) -> None:
    """RLIMIT_CPU counts the process's whole life, so each call gets its budget on top of what
    was used so far (soft limit: SIGXCPU ends the worker; the parent restarts it)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(used.ru_utime + used.ru_stime + seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def set_memory_limit(memory_mb: int) -> None:
    """RLIMIT_AS: a runaway allocation is a MemoryError in the worker, not the machine's problem."""
    if memory_mb:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def start_worker(argv: list[str]) -> tuple[int, int, str]:
    """A worker's first lines: ``REQ REP WATCHDOG PARENT MAIN_THREAD MEMORY_MB PATH`` from its
    argv, the pipes moved out of reach, death with the parent arranged, the memory capped.
    Returns (request fd, reply fd, the import path)."""
    req, rep, watchdog, parent, main_thread, memory_mb = map(int, argv[1:7])
    req, rep, watchdog = private(req), private(rep), private(watchdog)
    die_with(parent, watchdog, bool(main_thread))
    own_children()

    def reaping():
        while True:
            time.sleep(REAP_EVERY_S)
            reap_orphans()

    threading.Thread(target=reaping, daemon=True).start()
    set_memory_limit(memory_mb)
    return req, rep, argv[7]


def serve(load, handle) -> None:
    """A worker's whole life, after ``python -c '...; serve()' REQ REP WATCHDOG PARENT MAIN_THREAD
    MEMORY_MB PATH [ARG...]`` (workers.py starts it so): ``load(path, args)`` imports the user's
    object and returns (what ``handle`` is given, the hello the pool keeps), then each request is
    answered by ``handle(loaded, request)`` under its CPU budget, until the parent closes the pipe.
    Any failure of the load is one ``import_error`` reply, the dry start's line in the parent."""
    req, rep, path = start_worker(sys.argv)
    try:
        loaded, hello = load(path, sys.argv[8:])
    except BaseException as e:  # noqa: BLE001 - the user's module: any failure is reported, in one line
        write_all(rep, frame(("import_error", f"{type(e).__name__}: {e}", traceback.format_exc())))
        return
    write_all(rep, frame(("ready", hello)))
    while True:
        try:
            request = read_frame(req)
        except EOFError:
            return
        set_cpu_limit(request["cpu_s"])
        reply = handle(loaded, request)
        reap_orphans()
        try:
            data = frame(reply)
        except Exception as e:  # noqa: BLE001 - an info dict that does not pickle
            data = frame(("error", f"the reply could not be pickled ({type(e).__name__}: {e})", ""))
        write_all(rep, data)
