"""Environment worker processes (envs/worker.py says why processes): calls go in with ``submit``
and come back from ``poll`` as they finish, so the rollout (roles/rollout_env.py) decodes some
episodes while the environment steps others.

Each call has a deadline (task.env_timeout_s): one past it is killed with its worker's process
group and comes back as ('timeout',); a worker that dies or sends garbage gives ('died', why); a
call the environment's code failed gives ('error', message). A fresh worker takes over. Workers
start on demand, up to ``workers``; the first is started when the pool is built, and its import
of the environment's module is the dry start that turns a bad task.env into one line before any
model loads. Their output (what the environment prints, and every traceback) goes to the log.
"""

from __future__ import annotations

import json
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

from rlpost.console import say
from rlpost.types.errors import ConfigError
from rlpost.wire import FrameReader, frame, kill_tree, write_all


@dataclass
class _Proc:
    popen: subprocess.Popen
    req: int  # requests, pool -> worker
    rep: int  # replies, worker -> pool (non-blocking here)
    watchdog: int  # held open; the worker exits when it reads EOF
    deadline: float  # monotonic time by which the next frame must be complete
    state: str = "starting"  # starting -> idle <-> busy; dropped once killed
    key: object = None  # the call in flight
    failure: str = ""
    # plain values only: a reply naming a class (one of the environment module's own) is refused, so
    # unpickling it never imports that module here (wire.py)
    reader: FrameReader = field(default_factory=lambda: FrameReader(plain=True))


class EnvPool:
    """Runs environment calls in worker processes, each with a deadline; never raises for what a call does."""

    # Importing an environment's module can take seconds (verifiers: ~10 s on a loaded 2-core
    # machine); that is start-up, given once per worker, never to a call.
    IMPORT_GRACE_S = 60.0

    def __init__(self, path: str, kwargs: dict, timeout_s: float, *, workers: int = 1, memory_mb: int = 0,
                 log_path: str | Path | None = None, import_paths: tuple = (), key: str = "task.env"):
        self.path, self.kwargs, self.timeout_s, self.key = path, json.dumps(kwargs), timeout_s, key
        self.workers = max(1, workers)
        self.memory_mb = memory_mb or default_memory_mb(self.workers)
        self.log_path = str(log_path or os.devnull)
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(
            [*map(str, import_paths), *(p for p in sys.path if p)])))
        self.procs: list[_Proc] = []
        self.queue: deque = deque()  # (key, request) not yet sent
        self.failed_starts = 0
        first = self._spawn()
        while first.state == "starting":
            for _, outcome in self._poll([first], None):
                if outcome[0] == "died":
                    raise ConfigError(f"{key}: cannot import {path!r} ({outcome[1]})")

    def _spawn(self) -> _Proc:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        wd_r, wd_w = os.pipe()
        main = threading.current_thread() is threading.main_thread()
        args = [req_r, rep_w, wd_r, os.getpid(), int(main), self.memory_mb, self.path, self.kwargs]
        with open(self.log_path, "ab") as log:
            popen = subprocess.Popen(
                [sys.executable, "-c", "from rlpost.envs.worker import serve; serve()", *map(str, args)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(req_r, rep_w, wd_r), env=self.env,
                start_new_session=True,  # its own process group: a timeout kills whatever it started too
            )
        for fd in (req_r, rep_w, wd_r):
            os.close(fd)
        os.set_blocking(rep_r, False)
        proc = _Proc(popen, req_w, rep_r, wd_w, time.monotonic() + self.IMPORT_GRACE_S)
        self.procs.append(proc)
        return proc

    def _kill(self, proc: _Proc, failure: str = "") -> None:
        kill_tree(proc.popen.pid)  # what the environment started, a setsid() daemon included (wire.py)
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.popen.wait()
        for fd in (proc.req, proc.rep, proc.watchdog):
            os.close(fd)
        if proc.state == "starting":
            proc.failure = failure
            self.failed_starts += 1
        self.procs.remove(proc)

    def _why_dead(self, proc: _Proc) -> str:
        try:
            code = proc.popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return f"the environment worker closed its reply pipe (its output is in {self.log_path})"
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"the environment worker {how} (its output is in {self.log_path})"

    # --- calls -----------------------------------------------------------------------------------

    def submit(self, key, request: dict) -> None:
        """Queue one call (op 'rows', 'reset' or 'step'); its outcome comes back from poll under key."""
        self.queue.append((key, request))

    def pending(self) -> int:
        return len(self.queue) + sum(p.state == "busy" for p in self.procs)

    def poll(self, timeout: float | None = None) -> list[tuple[object, tuple]]:
        """(key, outcome) for calls that finished: ('ok', payload), ('error', message), ('timeout',)
        or ('died', why). Waits until at least one finishes (or nothing is pending), at most
        ``timeout`` seconds when given (0: only what has finished already)."""
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

    def run(self, requests: list[dict]) -> list[tuple]:
        """Every request's outcome, in order (the calls run in parallel across the workers)."""
        for i, request in enumerate(requests):
            self.submit(("run", i), request)
        results: list = [None] * len(requests)
        while any(r is None for r in results):
            for (_, i), outcome in self.poll():
                results[i] = outcome
        return results

    def _dispatch(self) -> list[tuple[object, tuple]]:
        """Start workers while calls wait, hand the waiting calls to idle workers. When workers keep
        failing to start, the waiting calls fail instead of waiting for ever."""
        busy = sum(p.state != "idle" for p in self.procs)
        while self.queue and len(self.procs) < min(self.workers, len(self.queue) + busy) and self.failed_starts < 3:
            self._spawn()
            busy += 1
        for proc in [p for p in self.procs if p.state == "idle"]:
            if self.queue:
                key, request = self.queue.popleft()
                request["cpu_s"] = self.timeout_s + 1.0
                try:
                    write_all(proc.req, frame(request))
                except OSError:  # it died while idle: the reply pipe shows EOF at the next poll
                    pass
                proc.state, proc.key, proc.deadline = "busy", key, time.monotonic() + self.timeout_s
        if self.procs or not self.queue:
            return []
        failed = [(key, ("died", f"no environment worker could start ({self.failed_starts} tries)"))
                  for key, _ in self.queue]
        self.queue.clear()
        return failed

    def _poll(self, watched: list[_Proc], until: float | None) -> list[tuple[_Proc, tuple]]:
        """One select over the watched workers, until the first deadline (or ``until``, if sooner)."""
        wait = min([p.deadline for p in watched] + ([until] if until is not None else [])) - time.monotonic()
        wait = max(0.0, wait)
        ready, _, _ = select.select([p.rep for p in watched], [], [], wait)
        out = []
        for proc in watched:
            if proc.rep in ready:
                try:
                    data = os.read(proc.rep, 1 << 20)
                    frames = proc.reader.feed(data) if data else None
                    why = None if data else self._why_dead(proc)
                except pickle.UnpicklingError as e:  # a class in the reply: refused, the worker too (as garbage)
                    frames, why = None, f"the environment's reply was refused: {e}"
                except Exception as e:  # noqa: BLE001 - garbage on the pipe: a protocol error
                    frames, why = None, f"the environment worker sent garbage ({type(e).__name__}: {e})"
                if frames is None:
                    self._kill(proc, why)
                    out.append((proc, ("died", why)))
                    continue
                out += [(proc, self._on_frame(proc, f)) for f in frames]
            elif time.monotonic() >= proc.deadline:
                starting = proc.state == "starting"
                self._kill(proc, f"importing it took more than {self.IMPORT_GRACE_S:.0f} s")
                out.append((proc, ("died", proc.failure) if starting else ("timeout",)))
        return out

    def _on_frame(self, proc: _Proc, f: tuple) -> tuple:
        if f[0] == "ready":
            proc.state, self.failed_starts = "idle", 0
            return ("started",)
        if f[0] == "import_error":
            self._kill(proc, f[1])
            return ("died", f[1])
        proc.state = "idle"
        return f if f[0] == "ok" else ("error", f[1])

    def close(self) -> None:
        for proc in list(self.procs):
            self._kill(proc)
        self.queue.clear()


def default_memory_mb(workers: int) -> int:
    """Each worker's address-space cap: the machine's memory shared by the workers and the trainer, at least 2 GiB."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    return max(2048, total // (workers + 1))


def warn_once(reported: set, kind: str, path: str, text: str) -> None:
    """The first failure of each kind, printed once; the rest are counted (env/errors, env/timeouts)."""
    if kind not in reported:
        reported.add(kind)
        say(f"environment {path} failed (the first {kind}; later ones are only counted, in env/{kind}s): {text}")
