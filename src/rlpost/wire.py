"""What a worker process and its parent share, whatever the worker runs (a reward function in
rewards/worker.py, an environment in envs/worker.py): frames on private pipes, dying with the
parent, resource limits, and finding the user's object by import path.

Kept free of torch and of the rest of rlpost, so that starting (or restarting) a worker takes tens
of milliseconds. Frames are ``b"RLPV"`` + a 4-byte little-endian length + a pickle; a frame with
another magic or a length over MAX_FRAME is a protocol error (the parent kills the worker), never a
huge read.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib
import importlib.util
import math
import os
import pickle
import resource
import signal
import struct
import sys
import threading

MAGIC = b"RLPV"
HEADER = struct.Struct("<4sI")
MAX_FRAME = 256 << 20  # a reply bigger than this is garbage, not a reward or an observation


class ProtocolError(Exception):
    """Bytes on the reply pipe that are not a frame."""


def frame(obj) -> bytes:
    data = pickle.dumps(obj)
    return HEADER.pack(MAGIC, len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class FrameReader:
    """Frames out of a byte stream that arrives in pieces (the parent reads without blocking)."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data: bytes) -> list:
        self.buf += data
        out = []
        while len(self.buf) >= HEADER.size:
            magic, n = HEADER.unpack_from(self.buf)
            if magic != MAGIC or n > MAX_FRAME:
                raise ProtocolError(f"bad frame header {bytes(self.buf[:HEADER.size])!r}")
            if len(self.buf) < HEADER.size + n:
                break
            out.append(pickle.loads(self.buf[HEADER.size:HEADER.size + n]))
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


def die_with(parent: int, watchdog: int, main_thread: bool) -> None:
    """Exit when the parent does: PR_SET_PDEATHSIG (the kernel signals when the thread that
    started us exits, so only when that was the parent's main thread) and a watchdog thread that
    reads a pipe only the parent holds open: EOF means the parent is gone."""
    if main_thread:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above ran
        os._exit(0)

    def watch():
        while os.read(watchdog, 1):
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


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
    set_memory_limit(memory_mb)
    return req, rep, argv[7]
