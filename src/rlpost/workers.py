"""The one worker pool: calls of the user's code, a reward function's (rewards/runner.py) or an
environment's (envs/pool.py), run in worker processes, each call with a deadline, and the pool
never raises for what a call does. Every rule about those processes is written here, once, and
tested once (tests/test_workers.py); a handler (the module whose ``serve`` the worker runs:
rewards/worker.py, envs/worker.py) only says what a call does and what its reply holds.

Outcomes (``poll``, ``run``), one per call: the worker's reply, ``("ok", ...)`` or ``("error",
message, traceback)`` where the user's code failed; ``("timeout",)`` when it ran past its
deadline: the worker is killed with everything it started; ``("died", why)`` when the worker
exited, was killed, or sent something that is no reply (bytes that are not a frame, a frame
naming a class, which is refused unread so the user's module is never imported here, a frame
nobody asked for). After a timeout or a death a fresh worker takes over; a call's deadline covers
its whole reply, which is read without blocking.

Start-up. Workers start on demand, up to ``workers``; the first is started when the pool is built,
and its import of the user's module is the dry start: a failure is one ConfigError line naming the
config key, before any model loads. A start gets ``grace_s`` once (importing a library can take
seconds); a call never does. After three starts in a row that failed, the waiting calls fail
instead of waiting for ever.

Killing and reaping. Each worker is a process group and session of its own and the subreaper of
what it starts (wire.py). A kill stops and kills its descendants (``kill_tree``), then its
group, then waits for it. Where this process is itself a child subreaper (a supervisor's choice),
what the kill orphaned was handed to it: those are reaped here by pid, once dead, and nothing else
(another child's Popen would read a stolen status), so no zombie is left. A worker's end is seen
by its pidfd, not only by EOF on its pipe, which a child it forked may hold open. Beyond reach: a
daemon in a session of its own, left by a worker that then exits by itself (no kill found it alive).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from rlpost.types.errors import ConfigError
from rlpost.wire import FrameReader, ProtocolError, frame, kill_tree, processes, write_all

# The worker's command. `python -c` puts '' (the current directory) first on sys.path; it is dropped
# before anything is imported from there, so a module left in the folder the run starts in is
# imported only where the caller put that folder on the import path. The handler's module name
# stays in the command line: that is how a process is told to be a worker (tests/helpers.py).
MAIN = "import sys; sys.path[:] = [p for p in sys.path if p]; from {} import serve; serve()"
MAX_FAILED_STARTS = 3


@dataclass
class _Proc:
    """One worker process and the pool's end of its pipes."""

    popen: subprocess.Popen
    req: int  # requests, pool -> worker
    rep: int  # replies, worker -> pool (non-blocking here)
    watchdog: int  # held open; the worker exits when it reads EOF
    deadline: float  # monotonic time by which the next frame must be complete
    pidfd: int  # readable once the process has ended: its pipe may stay open in a child it left running
    state: str = "starting"  # starting -> idle <-> busy; dropped once killed
    key: object = None  # the call in flight
    # plain values only: a reply naming a class is refused, so unpickling it never imports the user's module
    reader: FrameReader = field(default_factory=lambda: FrameReader(plain=True))


class WorkerPool:
    """Runs calls in worker processes of ``handler`` (a module with ``serve``) that load ``path``."""

    def __init__(self, handler: str, path: str, timeout_s: float, *, what: str, key: str, workers: int = 1,
                 memory_mb: int = 0, log_path: str | Path | None = None, import_paths: tuple = (),
                 grace_s: float = 20.0, args: tuple = ()):
        """``what``: the worker as error lines name it ('verifier process'). ``key``: the config key
        that named ``path`` (the dry start's line). ``import_paths``: the workers' PYTHONPATH, in
        order. ``args``: more strings for the handler's load (after the path on the command line)."""
        self.handler, self.path, self.timeout_s, self.what, self.key = handler, path, timeout_s, what, key
        self.workers, self.grace_s, self.args = max(1, workers), grace_s, tuple(args)
        self.memory_mb = memory_mb or default_memory_mb(self.workers)
        self.log_path = str(log_path or os.devnull)
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(map(str, import_paths))))
        self.procs: list[_Proc] = []
        self.queue: deque = deque()  # (key, request, seconds) not yet sent
        self.failed_starts = 0  # starts in a row that failed (the module broke mid-run?)
        self.hello = None  # what the first worker said it loaded (a reward function's calling convention)
        first = self._spawn()
        while first.state == "starting":
            for _, outcome in self._poll([first], None):
                if outcome[0] == "died":
                    raise ConfigError(f"{key}: cannot import {path!r} ({outcome[1]})")

    # --- processes -------------------------------------------------------------------------------

    def _spawn(self) -> _Proc:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        wd_r, wd_w = os.pipe()
        main = threading.current_thread() is threading.main_thread()
        argv = [req_r, rep_w, wd_r, os.getpid(), int(main), self.memory_mb, self.path, *self.args]
        with open(self.log_path, "ab") as log:
            popen = subprocess.Popen(
                [sys.executable, "-c", MAIN.format(self.handler), *map(str, argv)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(req_r, rep_w, wd_r), env=self.env,
                start_new_session=True,  # its own process group: a kill reaches whatever it started too
            )
        for fd in (req_r, rep_w, wd_r):
            os.close(fd)
        os.set_blocking(rep_r, False)
        proc = _Proc(popen, req_w, rep_r, wd_w, time.monotonic() + self.grace_s, os.pidfd_open(popen.pid))
        self.procs.append(proc)
        return proc

    def _kill(self, proc: _Proc) -> None:
        """Stop the worker and everything it started, reap it, and drop it: its descendants first (it
        is their subreaper, so a setsid() daemon is one of them), then its process group. Once it
        has been reaped (its end was read) its pid may be another's: what it left is in its group."""
        killed = kill_tree(proc.popen.pid) if proc.popen.returncode is None else set()
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.popen.wait()
        reap_orphans(proc.popen.pid, killed)
        for fd in (proc.req, proc.rep, proc.watchdog, proc.pidfd):
            os.close(fd)
        self.failed_starts += proc.state == "starting"
        self.procs.remove(proc)

    def _why_dead(self, proc: _Proc) -> str:
        """What ended a worker whose reply pipe closed (it exits right after, or is made to)."""
        try:
            code = proc.popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return f"the {self.what} closed its reply pipe; it was killed{self.output_hint()}"
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        hint = " (over its CPU limit)" if code == -signal.SIGXCPU else ""
        return f"the {self.what} {how}{hint}{self.output_hint()}"

    def output_hint(self) -> str:
        """Where the worker's output is, when it wrote any (a worker killed at once wrote none)."""
        if self.log_path == os.devnull:  # the caller keeps no log
            return ""
        try:
            wrote = os.path.getsize(self.log_path) > 0
        except OSError:
            wrote = False
        return f" (its output is in {self.log_path})" if wrote else " (it wrote no output)"

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.procs]

    def close(self) -> None:
        for proc in list(self.procs):
            self._kill(proc)
        self.queue.clear()

    # --- calls -----------------------------------------------------------------------------------

    def submit(self, key, request: dict, seconds: float | None = None) -> None:
        """Queue one call, with ``seconds`` to answer (default: timeout_s); poll gives its outcome under ``key``."""
        self.queue.append((key, request, self.timeout_s if seconds is None else seconds))

    def pending(self) -> int:
        return len(self.queue) + sum(p.state == "busy" for p in self.procs)

    def run(self, requests: list[dict], seconds: float | None = None) -> list[tuple]:
        """Every request's outcome, in order (the calls run in parallel across the workers)."""
        for i, request in enumerate(requests):
            self.submit(("run", i), request, seconds)
        results: list = [None] * len(requests)
        while any(r is None for r in results):
            for (_, i), outcome in self.poll():
                results[i] = outcome
        return results

    def poll(self, timeout: float | None = None) -> list[tuple[object, tuple]]:
        """(key, outcome) for calls that finished. Waits until at least one finishes (or nothing is
        pending), at most ``timeout`` seconds when given (0: only what has finished already)."""
        out: list = []
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            out += self._dispatch()
            watched = [p for p in self.procs if p.state in ("starting", "busy")]
            if not watched:
                return out
            for proc, outcome in self._poll(watched, 0.0 if out else until):
                if proc.key is not None and outcome[0] != "started":
                    out.append((proc.key, outcome))
                    proc.key = None
            if out or (until is not None and time.monotonic() >= until):
                return out + self._dispatch()

    def _dispatch(self) -> list[tuple[object, tuple]]:
        """Start workers while calls wait, hand the waiting calls to idle workers. When workers keep
        failing to start, the waiting calls fail instead of waiting for ever. An idle worker with
        something to read (EOF: it died; bytes nobody asked for) is dropped first, so that no call
        is charged for it nor given a stale frame as its reply."""
        idle = [p for p in self.procs if p.state == "idle"]
        ready = select.select([fd for p in idle for fd in (p.rep, p.pidfd)], [], [], 0)[0]
        for proc in [p for p in idle if p.rep in ready or p.pidfd in ready]:
            self._kill(proc)
        busy = sum(p.state != "idle" for p in self.procs)
        while (self.queue and len(self.procs) < min(self.workers, len(self.queue) + busy)
               and self.failed_starts < MAX_FAILED_STARTS):
            self._spawn()
            busy += 1
        for proc in [p for p in self.procs if p.state == "idle"]:
            if self.queue:
                key, request, seconds = self.queue.popleft()
                request["cpu_s"] = seconds + 1.0  # RLIMIT_CPU backs the deadline, should this process stall
                try:
                    write_all(proc.req, frame(request))
                except OSError:  # it died while idle: the reply pipe shows EOF at the next poll
                    pass
                proc.state, proc.key, proc.deadline = "busy", key, time.monotonic() + seconds
        if self.procs or not self.queue:
            return []
        why = f"no {self.what} could start ({self.failed_starts} tries)"
        failed = [(key, ("died", why)) for key, _, _ in self.queue]
        self.queue.clear()
        return failed

    def _poll(self, watched: list[_Proc], until: float | None) -> list[tuple[_Proc, tuple]]:
        """One select over the watched workers, until the first deadline (or ``until``, if sooner).
        A worker that is ready becomes idle here; one that dies, misbehaves or times out is killed."""
        wait = min([p.deadline for p in watched] + ([until] if until is not None else [])) - time.monotonic()
        ready, _, _ = select.select([fd for p in watched for fd in (p.rep, p.pidfd)], [], [], max(0.0, wait))
        out = []
        for proc in watched:
            if proc.rep in ready or proc.pidfd in ready:  # what it wrote is read first; then its end is seen
                try:
                    data = os.read(proc.rep, 1 << 20) if proc.rep in ready else b""
                    if not data:
                        raise EOFError
                    out += [(proc, self._on_frame(proc, f)) for f in proc.reader.feed(data)]
                except Exception as e:  # noqa: BLE001 - whatever it was, this worker is done
                    why = (self._why_dead(proc) if isinstance(e, EOFError) else
                           f"the {self.what}'s reply was refused: {e}" if isinstance(e, pickle.UnpicklingError) else
                           f"the {self.what} sent garbage ({type(e).__name__}: {e})")
                    if proc in self.procs:
                        self._kill(proc)
                    out.append((proc, ("died", why)))
            elif time.monotonic() >= proc.deadline:
                starting = proc.state == "starting"
                self._kill(proc)
                out.append((proc, ("died", f"importing it took more than {self.grace_s:.0f} s") if starting
                            else ("timeout",)))
        return out

    def _on_frame(self, proc: _Proc, f) -> tuple:
        """A frame's outcome; one that is no reply to what the worker was asked is a protocol error."""
        head = f[0] if isinstance(f, tuple) and f else None
        if proc.state == "starting" and head == "ready":
            proc.state, self.failed_starts = "idle", 0
            self.hello = f[1] if self.hello is None else self.hello
            return ("started",)
        if proc.state == "starting" and head == "import_error":
            self._kill(proc)
            return ("died", str(f[1]))
        if proc.state == "busy" and head in ("ok", "error"):
            proc.state = "idle"
            return f if head == "ok" else ("error", str(f[1]), str(f[2]) if len(f) > 2 else "")
        raise ProtocolError(f"{str(f)[:80]!r} when {'a reply' if proc.state == 'busy' else 'nothing'} was due")


def reap_orphans(group: int, killed: set[int]) -> None:
    """Reap what a kill handed to this process: members of the worker's process group and the
    descendants ``kill_tree`` killed, each once dead, and only where this process became their
    parent (it is a child subreaper). First every member of the group is waited out (killed, they
    die at once), so that no orphan is handed over after the look."""
    me, stop = os.getpid(), time.monotonic() + 2.0
    while time.monotonic() < stop and any(p.state not in "ZX" for p in processes() if p.pgrp == group):
        time.sleep(0.002)
    for p in processes():
        if p.ppid == me and p.state in "ZX" and (p.pgrp == group or p.pid in killed):
            try:
                os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else meanwhile
                pass


def default_memory_mb(workers: int) -> int:
    """Each worker's address-space cap: the machine's memory shared by the workers and the trainer, at least 2 GiB."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    return max(2048, total // (workers + 1))
