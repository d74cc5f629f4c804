"""A worker for tests/test_workers.py that misbehaves on request: the pool's rules (workers.py)
are tested against it, once, for every handler. Its path argument says how it starts (``ok``,
``exit3``, ``raise``, ``slow``, ``garbage``, ``once:FILE``: starts only while FILE is absent);
each request's ``op`` says what the call does. It writes its pipes by hand, as hostile user code
in a worker could, where a real handler lets ``wire.serve`` write them."""

import multiprocessing
import os
import pickle
import resource
import subprocess
import sys
import time

from rlpost.wire import HEADER, MAGIC, MAX_FRAME, frame, read_frame, set_cpu_limit, start_worker, write_all


class Secret:
    """A class of this module: a reply holding one must be refused unread by the pool."""


def start(path: str) -> None:
    if path == "exit3":
        os._exit(3)
    if path == "raise":
        raise ValueError("no such thing")
    if path == "slow":
        time.sleep(600)
    if path.startswith("once:"):
        if os.path.exists(path[5:]):
            os._exit(4)
        open(path[5:], "w").close()


def fork_child(pid_file: str, new_session: bool) -> None:
    """A child (a double-forked setsid() daemon when ``new_session``) that sleeps on after the call."""
    if os.fork() == 0:
        if new_session:
            os.setsid()
            if os.fork():
                os._exit(0)
        with open(pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
            f.flush()
        time.sleep(600)
        os._exit(0)


KEPT = []  # children a call started and a later call waits for: ("popen", Popen) or ("fork", pid)


def children(state: bytes) -> list[int]:
    """This process's children in ``state`` (b"Z": zombies), from /proc."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] == state:
            out.append(int(pid))
    return out


def call(rep: int, request: dict):
    """The reply to one request, or None where the op wrote (or will never write) its own."""
    op, value = request["op"], request.get("value")
    if op == "echo":
        return ("ok", value, os.getpid())
    if op == "sleep":
        time.sleep(value)
        return ("ok", value, os.getpid())
    if op == "error":
        return ("error", "RuntimeError: broken", "Traceback ...")
    if op == "hang":
        if value:
            open(value, "w").close()  # the test's sign that the call is running
        time.sleep(600)
    if op == "die_mid_reply":
        write_all(rep, frame(("ok", "x" * 1000))[:50])
        os._exit(5)
    if op == "garbage":
        write_all(rep, b"this is no frame at all")
    elif op == "huge":  # a header announcing more than any reply may hold: refused before any of it is read
        write_all(rep, HEADER.pack(MAGIC, MAX_FRAME + 1))
    elif op == "slow_frame":  # half a frame, then nothing: the deadline covers the whole reply
        write_all(rep, frame(("ok", "x" * 1000))[:100])
        time.sleep(600)
    elif op == "class":
        data = pickle.dumps(("ok", Secret()))
        write_all(rep, HEADER.pack(MAGIC, len(data)) + data)
    elif op == "stale":  # its reply, then a frame nobody asked for, then a sign for the test
        write_all(rep, frame(("ok", value, os.getpid())))
        write_all(rep, frame(("ok", "stale", os.getpid())))
        open(request["sign"], "w").close()
    elif op == "exit_after_reply":
        write_all(rep, frame(("ok", value, os.getpid())))
        os._exit(0)
    elif op == "flood":  # megabytes to fd 1 and 2, then an honest reply
        for fd in (1, 2):
            write_all(fd, b"flood " * ((value << 20) // 6))
        return ("ok", value, os.getpid())
    elif op == "spin":  # a CPU limit of its own, a second from now: SIGXCPU ends it
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))
        while True:
            pass
    elif op == "allocate":
        try:
            bytearray(value << 20)
        except MemoryError as e:
            return ("error", f"MemoryError: {e}", "")
        return ("ok", value, os.getpid())
    elif op == "orphan":  # shell jobs left running as the shell exits: each is handed to the worker, its subreaper
        for _ in range(value):
            subprocess.run(["sh", "-c", "sleep 0.01 & exit 0"], check=True)
        return ("ok", value, os.getpid())
    elif op == "keep":  # children of its own, exited at once, left for a later call to wait for (their statuses)
        KEPT.append(("popen", subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])))
        KEPT.append(("popen", subprocess.Popen(["/bin/sh", "-c", "exit 5"], close_fds=False)))  # os.posix_spawn
        pid = os.fork()
        if pid == 0:
            os._exit(6)
        KEPT.append(("fork", pid))
        ctx = multiprocessing.get_context("spawn")  # _posixsubprocess.fork_exec, not subprocess
        proc = ctx.Process(target=sys.exit, args=(8,))
        proc.start()
        KEPT.append(("process", proc))
        return ("ok", value, os.getpid())
    elif op == "wait_kept":
        codes = [x.wait() if how == "popen" else os.waitstatus_to_exitcode(os.waitpid(x, 0)[1]) if how == "fork"
                 else (x.join(), x.exitcode)[1] for how, x in KEPT]
        return ("ok", codes, os.getpid())
    elif op == "zombies":
        return ("ok", len(children(b"Z")), os.getpid())
    elif op == "fork":  # a child in its group (or a daemon in a session of its own), then a reply, an exit or a hang
        fork_child(request["pids"], request["daemon"])
        while not (os.path.exists(request["pids"]) and os.path.getsize(request["pids"])):  # the child runs
            time.sleep(0.001)
        if request["then"] == "reply":
            return ("ok", value, os.getpid())
        if request["then"] == "exit":
            os._exit(7)
        time.sleep(600)
    return None


def serve() -> None:
    req, rep, path = start_worker(sys.argv)
    if path == "garbage":
        write_all(rep, b"garbage before the hello")
        time.sleep(600)
    try:
        start(path)
    except ValueError as e:
        write_all(rep, frame(("import_error", f"ValueError: {e}", "")))
        return
    write_all(rep, frame(("ready", f"toy {path}")))
    while True:
        try:
            request = read_frame(req)
        except EOFError:
            return
        set_cpu_limit(request["cpu_s"])
        reply = call(rep, request)
        if reply is not None:
            write_all(rep, frame(reply))
